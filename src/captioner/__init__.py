"""captioner: live captions with the heavy work on an NVIDIA GPU, and the CPU when there is none.

The public API::

    import captioner

    live = captioner.LiveCaptioner(model="tiny.en", device="cpu")   # or "cuda:0"; a name or a folder
    me = live.open_stream("Me")                                      # any number of streams
    me.accept_waveform(16000, samples)                               # float32/int16, any rate >= 8 kHz
    for update in live.step():                                       # CaptionUpdate: stream, kind, text, start_s, end_s
        print(update.stream, update.kind, update.text)
    me.finish()                                                      # then step() until me.done
    live.close()

    result = captioner.transcribe("talk.wav", model="base", language="auto")   # .text, .segments

See docs/api.md. The names are loaded on first use, so ``import captioner`` stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"

_EXPORTS = {
    "LiveCaptioner": "captioner.engine.live",
    "CaptionStream": "captioner.engine.live",
    "transcribe": "captioner.engine.offline",
    "Transcription": "captioner.engine.offline",
    "Segment": "captioner.engine.offline",
    "LanguageNotice": "captioner.engine.language_check",
    "CaptionUpdate": "captioner.events",
    "PipelineStatus": "captioner.events",
    "EngineConfig": "captioner.engine.core",
    "UserError": "captioner.errors",
    "StreamRefused": "captioner.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'captioner' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
