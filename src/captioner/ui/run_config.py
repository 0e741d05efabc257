"""What the window asks the app to caption: a :class:`RunConfig` of :class:`SourceChoice` values.

Plain Python (no Qt), so the composition root (:mod:`captioner.app.gui_app`) can read a request
without importing the widgets that made it.
"""

from __future__ import annotations

from dataclasses import dataclass

LANGUAGES = (
    ("auto", "Detect"), ("en", "English"), ("de", "German"), ("fr", "French"), ("es", "Spanish"),
    ("it", "Italian"), ("pt", "Portuguese"), ("nl", "Dutch"), ("pl", "Polish"), ("ru", "Russian"),
    ("uk", "Ukrainian"), ("tr", "Turkish"), ("ar", "Arabic"), ("hi", "Hindi"), ("ja", "Japanese"),
    ("ko", "Korean"), ("zh", "Chinese"),
)
"""The spoken languages offered (code, name); "auto" detects."""

POLICIES = (("auto", "Automatic"), ("localagreement", "LocalAgreement"), ("alignatt", "AlignAtt"),
            ("alignatt-gpu", "AlignAtt, GPU-tuned"))
"""The streaming commit policies offered (``--policy`` name, label); "auto" takes the one
measured better on the engine's device (docs/latency.md); "alignatt-gpu" is AlignAtt's setting
for a fast GPU step (:data:`captioner.engine.policy.presets.PRESETS`)."""

SPEAKER_MODES = (("auto", "Meeting audio and files"), ("on", "Every source"), ("off", "Off"))
"""Who-said-what labels (``--speakers`` name, label; docs/speakers.md): "auto" labels a meeting's
audio (a monitor of an output) and files and leaves a microphone ("Me": one person) unlabelled;
"on" labels every source, "off" none."""


@dataclass(frozen=True)
class SourceChoice:
    """One source to caption. ``kind`` is "device" (``device`` is its index or name, ``None`` for
    the default input) or "file" (``path``). ``stream`` labels its captions; ``label`` names it in
    the source list. ``demo``: the bundled sample, played when there is nothing else to caption
    (never remembered as the user's choice)."""

    kind: str
    stream: str
    label: str
    device: int | str | None = None
    path: str | None = None
    demo: bool = False

    def key(self) -> str:
        """Stable text form, for settings."""
        if self.kind == "file":
            return f"file:{self.path}"
        return f"device:{'' if self.device is None else self.device}"


@dataclass(frozen=True)
class RunConfig:
    """One session: its sources (several at once), the model, the spoken language, translate;
    ``server``: a `captioner serve` URL to caption on (``""``: this machine); ``policy``: when a
    word is final (a :data:`POLICIES` name; a server keeps its own); ``speakers``: which streams'
    speakers are labelled (a :data:`SPEAKER_MODES` name; a server keeps its own)."""

    sources: tuple[SourceChoice, ...]
    model: str = "tiny.en"
    language: str = "auto"
    translate: bool = False
    server: str = ""
    policy: str = "auto"
    speakers: str = "auto"
