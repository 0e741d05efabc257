"""captioner: live captions with the heavy work on an NVIDIA GPU, and the CPU when there is none."""

__version__ = "0.1.0"
