#!/usr/bin/env python3
"""Renders src/captioner/data/icons/captioner.svg to the PNGs shipped beside it, one per size in
captioner.data.icons.PNG_SIZES. Run it after changing the SVG:  .venv/bin/python scripts/render-icons.py
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # no display needed to draw into an image
    from PySide6.QtGui import QGuiApplication

    from captioner.data.icons import PNG_SIZES, png_path
    from captioner.ui.icon import render_icon

    app = QGuiApplication.instance() or QGuiApplication([sys.argv[0]])  # noqa: F841 (Qt needs one alive)
    for size in PNG_SIZES:
        path = png_path(size)
        if not render_icon(size).save(str(path), "PNG"):
            print(f"render-icons: cannot write {path}", file=sys.stderr)
            return 1
        print(f"render-icons: {path} ({size}x{size})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
