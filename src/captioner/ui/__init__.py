"""PySide6 + pyqtgraph only: caption view, overlay, performance dashboard, settings.

Two modules are plain Python, so the app's controller can use them without importing Qt: the
window's requests (:mod:`captioner.ui.run_config`) and what the window is told about a session
(:mod:`captioner.ui.session_view`).
"""
