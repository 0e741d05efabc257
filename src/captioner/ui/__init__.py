"""PySide6 + pyqtgraph only: caption view, overlay, performance dashboard, settings."""
