"""Captioner's icon, shipped with the package: ``captioner.svg`` (the source, hand-written) and
PNG renders of it at the hicolor theme's usual sizes, ``captioner-<N>.png``.

The PNGs are committed, not rendered at install time: `captioner install-desktop` then only copies
files (no Qt, no display needed while setting up), and a desktop that ignores SVG icons still finds
one. ``scripts/render-icons.py`` renders them again after the SVG changes; a test checks they
still match it.
"""

from __future__ import annotations

from pathlib import Path

ICON_NAME = "captioner"
"""The icon's name in an icon theme, and so the desktop entry's ``Icon=``."""

PNG_SIZES = (16, 24, 32, 48, 64, 128, 256)
"""Square sizes in pixels rendered as PNG: the hicolor theme's common application sizes."""

_HERE = Path(__file__).parent


def svg_path() -> Path:
    return _HERE / f"{ICON_NAME}.svg"


def png_path(size: int) -> Path:
    return _HERE / f"{ICON_NAME}-{size}.png"
