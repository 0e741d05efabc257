"""GPU side: the array back-end (the one module that imports CuPy), feature kernels with their NumPy twins, telemetry (NVML), workers."""
