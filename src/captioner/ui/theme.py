"""Light and dark themes: one palette each, applied to Qt widgets and pyqtgraph plots alike."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication


@dataclass(frozen=True)
class Theme:
    name: str
    window: str
    base: str
    text: str
    dim_text: str  # provisional (partial) captions and secondary labels
    accent: str
    plot_background: str
    plot_foreground: str
    stream_colors: tuple[str, ...]  # labels of Me / Meeting / more streams, in order of appearance
    curve_colors: tuple[str, ...]
    alarm: str  # limits: 83 °C, power limit, the 15%-free VRAM line


LIGHT = Theme(
    name="light", window="#f3f3f5", base="#ffffff", text="#15171a", dim_text="#7a7f87",
    accent="#2d6cdf", plot_background="#ffffff", plot_foreground="#3a3d42",
    stream_colors=("#1f62d6", "#b3471d", "#1d8a4a", "#8a3fb8"),
    curve_colors=("#1f62d6", "#d9480f", "#2b8a3e", "#8a3fb8", "#0b7285"),
    alarm="#d62828",
)

DARK = Theme(
    name="dark", window="#1e2024", base="#15171a", text="#eceff3", dim_text="#8b929c",
    accent="#5b9bff", plot_background="#15171a", plot_foreground="#c9ced6",
    stream_colors=("#6aa6ff", "#ff9a62", "#63d68d", "#c792ff"),
    curve_colors=("#6aa6ff", "#ff8c42", "#63d68d", "#c792ff", "#4dd0e1"),
    alarm="#ff5252",
)

THEMES = {"light": LIGHT, "dark": DARK}


def theme_named(name: str) -> Theme:
    return THEMES.get(name, DARK)


def apply_theme(app: QApplication, theme: Theme) -> None:
    """Fusion style with the theme's palette, so every widget follows it on every platform."""
    app.setStyle("Fusion")
    palette = QPalette()
    for role, color in (
        (QPalette.ColorRole.Window, theme.window),
        (QPalette.ColorRole.Base, theme.base),
        (QPalette.ColorRole.AlternateBase, theme.window),
        (QPalette.ColorRole.Button, theme.window),
        (QPalette.ColorRole.ToolTipBase, theme.base),
        (QPalette.ColorRole.WindowText, theme.text),
        (QPalette.ColorRole.Text, theme.text),
        (QPalette.ColorRole.ButtonText, theme.text),
        (QPalette.ColorRole.ToolTipText, theme.text),
        (QPalette.ColorRole.PlaceholderText, theme.dim_text),
        (QPalette.ColorRole.Highlight, theme.accent),
        (QPalette.ColorRole.HighlightedText, "#ffffff"),
        (QPalette.ColorRole.Link, theme.accent),
    ):
        palette.setColor(role, QColor(color))
    palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text, QColor(theme.dim_text))
    palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.ButtonText, QColor(theme.dim_text))
    palette.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText, QColor(theme.dim_text))
    app.setPalette(palette)
