"""The streaming engine: the heart of captioner.

Audio of any number of streams in, caption updates out. The synchronous core
(:mod:`~captioner.engine.core`: feature rings, VAD, scheduler, one batched model step, the
streaming policy) is driven either by the caller, through the public API
(:mod:`~captioner.engine.live`), or by the worker thread that owns one GPU
(:mod:`~captioner.engine.worker`), which the pipeline (:mod:`~captioner.engine.pipeline`) feeds
from live sources. Offline transcription of whole files is :mod:`~captioner.engine.offline`.

Layer: imports ``audio``, ``gpu`` and ``models``; never ``app`` or ``ui``.
"""
