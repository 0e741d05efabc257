"""The lines a transcript file shows, the same for `captioner transcribe` offline and live.

Called by the thread that writes the file (the command's main thread).
"""

from __future__ import annotations


def file_lines(captions, fmt: str):
    """Lines that end at a sentence end or a pause as long as the live engine's
    (:func:`captioner.formats.sentence_lines`), not wherever a window or a commit happened to
    end. ``fmt`` is the file's format; every format gets the same lines (offline JSON Lines
    too; a live replay's JSON Lines, with its partial updates, is left as it came)."""
    from captioner.engine.core import EngineConfig
    from captioner.formats import sentence_lines

    return sentence_lines(captions, EngineConfig().pause_s)
