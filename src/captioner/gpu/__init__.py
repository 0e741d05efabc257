"""Arrays and kernels: the array back-end (the one module that imports CuPy), the streaming
log-mel/MFCC kernels with their NumPy twins, and GPU telemetry (NVML). Imports none of
models, audio, engine, app or ui."""
