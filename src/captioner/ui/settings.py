"""Settings that persist between runs, stored with QSettings (the platform's usual place)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from PySide6.QtCore import QByteArray, QSettings

from captioner.ui import overlay
from captioner.ui.caption_view import DEFAULT_FONT_PT

ORGANIZATION = "captioner"
APPLICATION = "captioner"


@dataclass
class AppSettings:
    theme: str = "dark"
    font_pt: int = DEFAULT_FONT_PT
    overlay_visible: bool = False
    overlay_font_pt: int = overlay.DEFAULT_FONT_PT
    overlay_lines: int = overlay.DEFAULT_LINES
    model: str = "tiny.en"
    language: str = "auto"
    translate: bool = False
    policy: str = "auto"  # the streaming commit policy (ui.run_config.POLICIES)
    speakers: str = "auto"  # which streams' speakers are labelled (ui.run_config.SPEAKER_MODES)
    server: str = ""  # a `captioner serve` URL ("": caption on this machine); the token is never stored
    sources: list[str] = field(default_factory=list)  # SourceChoice.key() of the checked sources
    dashboard_visible: bool = True
    window_geometry: bytes = b""
    window_state: bytes = b""
    overlay_geometry: bytes = b""
    overlay_placed: bool = False  # the user dragged the overlay: its saved place is kept


class ChosenSettings:
    """What is saved: the settings as loaded, changed only by what the user chose in the app.

    A value given for one run — a command-line option, or the default a saved value fell back to
    when it failed at start — is shown in the window but not saved: unless the user changes it
    in the app, the next launch finds the saved value again (a ``--server`` given once must not
    become every later launch's server)."""

    def __init__(self, saved: AppSettings) -> None:
        self.saved = replace(saved)
        self._run_only: dict[str, Any] = {}

    def run_only(self, name: str, value: Any) -> None:
        """``name`` is ``value`` for this run only."""
        self._run_only[name] = value

    def is_run_only(self, name: str) -> bool:
        return name in self._run_only

    def forget(self, name: str) -> Any:
        """The saved ``name`` goes back to its default (the user's "reset it"), which is returned."""
        default = getattr(AppSettings(), name)
        setattr(self.saved, name, default)
        self._run_only.pop(name, None)
        return default

    def to_save(self, current: AppSettings) -> AppSettings:
        """``current`` (the window's values now), with the saved value kept for every run-only
        one the user left as it was given."""
        out = replace(current)
        for name, value in self._run_only.items():
            if getattr(current, name) == value:
                setattr(out, name, getattr(self.saved, name))
        return out


def open_settings(path: str | None = None) -> QSettings:
    """The user's settings, or an INI file at ``path`` (tests, portable installs)."""
    if path:
        return QSettings(path, QSettings.Format.IniFormat)
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORGANIZATION, APPLICATION)


def load_settings(store: QSettings) -> AppSettings:
    defaults = AppSettings()
    values = {}
    for f in fields(AppSettings):
        default = getattr(defaults, f.name)
        if not store.contains(f.name):
            values[f.name] = default
            continue
        raw = store.value(f.name)
        try:
            values[f.name] = _convert(raw, default)
        except (TypeError, ValueError):
            values[f.name] = default  # a hand-edited or older file must not stop the app
    return AppSettings(**values)


def _convert(raw, default):
    if isinstance(default, bool):
        if isinstance(raw, str):
            return raw.strip().lower() in ("true", "1", "yes")
        return bool(raw)
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, bytes):
        if isinstance(raw, QByteArray):
            return bytes(raw.data())
        return bytes(raw) if raw else b""
    if isinstance(default, list):
        if raw is None or raw == "":
            return []
        if isinstance(raw, str):
            return [raw]
        return [str(v) for v in raw]
    return str(raw)


def save_settings(store: QSettings, settings: AppSettings, names: tuple[str, ...] | None = None) -> None:
    """Writes ``settings`` (only the fields ``names``, when given) and syncs the file."""
    for f in fields(AppSettings):
        if names is not None and f.name not in names:
            continue
        value = getattr(settings, f.name)
        if isinstance(value, bytes):
            value = QByteArray(value)
        store.setValue(f.name, value)
    store.sync()


def reset_settings(store: QSettings) -> str:
    """Forgets every saved setting; returns the file's path (to tell the user)."""
    store.clear()
    store.sync()
    return store.fileName()
