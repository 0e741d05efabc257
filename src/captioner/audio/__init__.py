"""Audio in: sources (microphone and monitor capture, file replay, synthetic) that deliver raw
chunks, and the one place that checks, mixes down, resamples and frames them (``ingest``).
No Qt, no CUDA; imports none of gpu, models, engine, app or ui."""
