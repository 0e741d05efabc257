"""Audio sources (microphone and monitor capture, file replay, synthetic), framing, resampling. No Qt, no CUDA."""
