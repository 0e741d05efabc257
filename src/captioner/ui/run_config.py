"""What the window asks the app to caption: a :class:`RunConfig` of :class:`SourceChoice` values.

Plain Python (no Qt), so the composition root (:mod:`captioner.app.gui_app`) can read a request
without importing the widgets that made it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceChoice:
    """One source to caption. ``kind`` is "device" (``device`` is its index or name, ``None`` for
    the default input) or "file" (``path``)."""

    kind: str
    stream: str
    label: str
    device: int | str | None = None
    path: str | None = None

    def key(self) -> str:
        """Stable text form, for settings."""
        if self.kind == "file":
            return f"file:{self.path}"
        return f"device:{'' if self.device is None else self.device}"


@dataclass(frozen=True)
class RunConfig:
    """One session: its sources (several at once), the model, the spoken language, translate."""

    sources: tuple[SourceChoice, ...]
    model: str = "tiny.en"
    language: str = "auto"
    translate: bool = False
