"""Builds and runs the desktop app for `captioner gui` (Qt is imported here, not in the CLI).

The one place that knows both sides: the window (Qt, :mod:`captioner.ui`) and the controller
(plain Python, :mod:`captioner.app.gui_app`). The window's requests are Qt signals connected to
the controller's methods; the controller reports through the window's ``session`` view.

A first run with nothing to caption (no microphone, no meeting audio, no file) starts on the
bundled speech sample, as a demo the window's banner explains, so a new user sees live captions
at once instead of an empty window.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def save_screenshots(window, path: str) -> list[Path]:
    """The main window, the dashboard, the overlay (when shown) and, when the platform can, the
    whole screen (the overlay over the window): ``NAME.png``, ``NAME-dashboard.png``, ..."""
    from PySide6.QtWidgets import QApplication

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    stem, suffix = target.with_suffix(""), target.suffix or ".png"
    window.dashboard.refresh(force=True)
    QApplication.processEvents()
    saved = []
    shots = [(target, window.grab()), (Path(f"{stem}-dashboard{suffix}"), window.dashboard.grab())]
    if window.overlay.isVisible():
        shots.append((Path(f"{stem}-overlay{suffix}"), window.overlay.grab()))
        screen = window.screen()
        if screen is not None:
            whole = screen.grabWindow(0)
            if not whole.isNull():
                shots.append((Path(f"{stem}-screen{suffix}"), whole))
    for out, pixmap in shots:
        if pixmap.save(str(out)):
            saved.append(out)
    return saved


def connect_window(window, controller) -> None:
    """GUI thread: the window's requests go to the controller, and the window pulls from it.
    The signals are emitted on the GUI thread, so the controller's methods run there."""
    window.start_requested.connect(controller.start)
    window.stop_requested.connect(controller.stop)
    window.speaker_renamed.connect(controller.rename_speaker)
    window.refresh_devices_requested.connect(controller.refresh_devices)
    window.set_feed(controller)


def open_window(args: argparse.Namespace, pipeline_factory=None):
    """GUI thread, with a QApplication: builds the window and its controller as ``args`` ask,
    shows the window and queues the first start; returns ``(window, controller)``.
    ``pipeline_factory``: what builds a pipeline (tests pass a fake; default: the engine's)."""
    from PySide6.QtCore import QTimer

    from captioner.app.gui_app import LiveController
    from captioner.data import SAMPLE_SPEECH_TITLE, sample_speech_path
    from captioner.ui.main_window import MainWindow
    from captioner.ui.settings import open_settings

    window = MainWindow(open_settings(args.settings))
    controller = LiveController(window.session, device=args.device, metrics_port=args.metrics_port,
                                pipeline_factory=pipeline_factory, server_token=getattr(args, "token", None))
    connect_window(window, controller)
    controller.refresh_devices()  # the list is applied at once: the sources below pick from it
    # For this run only: an option given once must not become every later launch's setting.
    window.apply_command_line(model=args.model, language=args.language, policy=getattr(args, "policy", None),
                              speakers=getattr(args, "speakers", None), server=getattr(args, "server", None),
                              theme=args.theme)
    if args.file:
        choices = [window.controls.add_file(str(Path(path).resolve())) for path in args.file]
        window.controls.select_only([c.key() for c in choices])
        window.remember_sources = False  # next time `captioner` starts on the usual input again
    elif not args.trace and not window.controls.selected_sources():
        # Nothing to caption here (no input device, nothing remembered that still exists):
        # caption the bundled sample rather than fail, and say so in the banner.
        window.use_demo(str(sample_speech_path()), SAMPLE_SPEECH_TITLE)
    if args.trace:
        window.open_trace(args.trace)
        if args.compare:
            window.compare_trace(args.compare)
    if controller.metrics is not None:
        where = f"http://127.0.0.1:{controller.metrics.port}/metrics"
        # On stderr too: with --metrics-port 0 the port is known only now, and a scraper needs it.
        print(f"captioner: Prometheus metrics on {where}", file=sys.stderr, flush=True)
        window.statusBar().showMessage(f"Prometheus metrics on {where}", 10000)
    window.show()
    if args.overlay:
        window.apply_command_line(overlay_visible=True)
    if not args.no_start and (args.file or not args.trace):
        # `captioner` alone starts captioning the chosen (default) input straight away.
        QTimer.singleShot(0, lambda: window.start_requested.emit(window.controls.run_config()))
    return window, controller


def run_app(args: argparse.Namespace) -> int:
    from PySide6.QtCore import QCoreApplication, QEvent, QTimer
    from PySide6.QtWidgets import QApplication

    from captioner.app.desktop_entry import DESKTOP_FILE_NAME
    from captioner.ui.icon import app_icon
    from captioner.ui.settings import APPLICATION, ORGANIZATION

    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)  # also the X11 window class: the entry's StartupWMClass
    # Ties the windows to captioner.desktop (Wayland's app id), so a dock shows the menu's icon
    # and name; the icon itself is every window's default (title bars, the overlay, Alt-Tab).
    app.setDesktopFileName(DESKTOP_FILE_NAME)
    app.setWindowIcon(app_icon())
    window, controller = open_window(args)

    screenshots: list[Path] = []

    def finish() -> None:
        if args.screenshot:
            screenshots.extend(save_screenshots(window, args.screenshot))
        window.close()
        app.quit()

    if args.quit_after is not None:
        QTimer.singleShot(int(args.quit_after * 1000), finish)
    window.closing.connect(app.quit)
    code = app.exec()

    leftovers = controller.shutdown()
    # A stop that ended just before the app quit left its report in the queue the event loop
    # no longer reads: deliver it, then whatever shutdown() drained (only one of them has words).
    QCoreApplication.sendPostedEvents()
    window.apply_captions(leftovers)  # nothing committed at the end is lost
    if args.save_trace:
        count = window.save_trace(args.save_trace)
        print(f"captioner: saved {count} events to {args.save_trace}")
    for path in screenshots:
        print(f"captioner: screenshot {path}")
    # Delete the widgets while Qt and Python are both alive: leaving them to interpreter
    # finalisation crashes PySide6 with the pyqtgraph items still attached.
    window.overlay.deleteLater()
    window.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    QCoreApplication.processEvents()
    return code
