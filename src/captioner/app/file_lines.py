"""The cues a caption file shows, the same for `captioner transcribe` offline and live.

Called by the thread that writes the file (the command's main thread).
"""

from __future__ import annotations


def file_lines(captions, fmt: str, *, label_streams: bool = False):
    """The captions laid out as cues for reading (:func:`captioner.formats.laid_out`, with the
    live engine's pause), not wherever a window or a commit happened to end. ``fmt`` is the
    file's format; every format gets the same cues (offline JSON Lines too; a live replay's JSON
    Lines, with its partial updates, is left as it came)."""
    from captioner.engine.core import EngineConfig
    from captioner.formats import laid_out

    return laid_out(captions, EngineConfig().pause_s, label_streams=label_streams)
