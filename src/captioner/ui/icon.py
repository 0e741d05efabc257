"""The app's icon as Qt sees it, made from the packaged renders (``captioner.data.icons``)."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QIcon, QImage, QPainter
from PySide6.QtSvg import QSvgRenderer

from captioner.data.icons import PNG_SIZES, png_path, svg_path


def app_icon() -> QIcon:
    """Every PNG size, so a title bar or task bar gets the pixel-aligned render nearest its size.
    (Qt's SVG icon engine would keep only one added PNG and scale the vector for the rest.)
    The SVG alone if the renders are missing."""
    icon = QIcon()
    for size in PNG_SIZES:
        path = png_path(size)
        if path.is_file():
            icon.addFile(str(path), QSize(size, size))
    return icon if not icon.isNull() else QIcon(str(svg_path()))


def render_icon(size: int) -> QImage:
    """The SVG drawn into a transparent ``size`` x ``size`` image (how the PNGs are made)."""
    renderer = QSvgRenderer(str(svg_path()))
    if not renderer.isValid():
        raise ValueError(f"cannot read the icon {svg_path()}")
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return image
