"""Where the caption overlay goes when the user has not placed it: at the bottom edge of the
screen the app is on (where TV and film subtitles are, and where Windows Live Captions docks),
and never over the app's own window, whose captions it would only repeat and whose plots it
would hide.

Plain geometry on Qt rectangles, no widgets, so the rule can be read and tested on its own.
"""

from __future__ import annotations

from PySide6.QtCore import QRect, QSize

EDGE_MARGIN_PX = 24
"""Room left between the overlay and the screen's edge (a taskbar's shadow, the mouse corner)."""


def default_overlay_rect(screen: QRect, window: QRect, size: QSize, min_width_px: int = 320) -> QRect:
    """The overlay's rectangle on ``screen`` (its available geometry), away from ``window`` (the
    app's frame), ``size`` wide and high where it fits (narrower, down to ``min_width_px``, where
    only that fits beside the window).

    Tried in order: centred on the bottom edge; the bottom edge beside the window (left or right,
    whichever is wider); centred on the top edge; beside it on the top. A window that leaves no
    such room (maximised) gets the overlay on the bottom edge over it: the only place left, and
    the one a reader looks at."""
    width = min(size.width(), screen.width() - 2 * EDGE_MARGIN_PX)
    height = min(size.height(), screen.height() // 3)
    bottom_y = screen.bottom() - EDGE_MARGIN_PX - height + 1
    top_y = screen.top() + EDGE_MARGIN_PX
    centred_x = screen.center().x() - width // 2
    candidates = []
    for y in (bottom_y, top_y):
        candidates.append(QRect(centred_x, y, width, height))
        # Beside the window on that edge: the free strips to its left and right.
        left = QRect(screen.left() + EDGE_MARGIN_PX, y, window.left() - screen.left() - 2 * EDGE_MARGIN_PX, height)
        right = QRect(window.right() + 1 + EDGE_MARGIN_PX, y, screen.right() - window.right() - 2 * EDGE_MARGIN_PX, height)
        for strip in sorted((left, right), key=lambda r: -r.width()):
            if strip.width() >= min_width_px:
                w = min(width, strip.width())
                candidates.append(QRect(strip.center().x() - w // 2, y, w, height))
    for rect in candidates:
        if not rect.intersects(window) and screen.contains(rect):
            return rect
    return candidates[0]
