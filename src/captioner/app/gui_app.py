"""Composition root of the desktop app: turns the window's requests into a running pipeline.

:class:`LiveController` owns the pipeline, the telemetry sampler and the optional Prometheus
exporter; the window pulls from it (it is the window's *feed*). The pipeline loads its model for
seconds (minutes on a first launch, when the ONNX graphs are built), so start and stop run on a
short-lived thread and report back through queued Qt signals; the GUI thread never blocks on them.
"""

from __future__ import annotations

import threading
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QMessageBox, QProgressDialog

from captioner.errors import UserError, one_line
from captioner.events import CaptionUpdate, PipelineStatus, TelemetrySample
from captioner.ui.controls import RunConfig, SourceChoice


def unique_streams(choices: tuple[SourceChoice, ...]) -> list[tuple[SourceChoice, str]]:
    """Each source with a distinct stream label ("Me", "Me 2", ...): the pipeline needs them."""
    from captioner.engine.pipeline import unique_labels

    return list(zip(choices, unique_labels(c.stream for c in choices)))


def open_sources(config: RunConfig) -> list[Any]:
    """The audio sources of a run (opened, not started); raises UserError for a bad one."""
    from captioner.audio.file_source import FileSource
    from captioner.audio.microphone import MicrophoneSource

    if not config.sources:
        raise UserError("pick at least one source (a microphone, a meeting's audio, or a file)")
    sources = []
    for choice, stream in unique_streams(config.sources):
        if choice.kind == "file":
            # Real-time pace, so captions appear as the speech is heard (and latency means something).
            sources.append(FileSource(choice.path, stream=stream, realtime=True))
        else:
            sources.append(MicrophoneSource(choice.device, stream=stream))
    return sources


class LiveController(QObject):
    """GUI thread, except the ``_run_*`` bodies which run on a helper thread."""

    started = Signal(object)  # PipelineStatus | None
    failed = Signal(str)
    stopped = Signal()
    progress = Signal(str, float)

    def __init__(self, window, device: str | None = None, metrics_port: int | None = None,
                 interactive: bool = True) -> None:
        super().__init__()
        from captioner.engine.pipeline import telemetry_gpu_index
        from captioner.gpu.telemetry import TelemetrySampler

        self.window = window
        self.device = device
        self.interactive = interactive
        self.pipeline: Any = None
        self._transcript: Any = None
        self._busy = False
        self._closing = False
        self._start_thread: threading.Thread | None = None
        self._stop_thread: threading.Thread | None = None
        self._files_only = False
        self._progress_dialog: QProgressDialog | None = None
        self.sampler = TelemetrySampler(gpu_index=telemetry_gpu_index(device))
        self.sampler.start()
        self.metrics = None
        if metrics_port is not None:
            from captioner.app.metrics import MetricsExporter

            self.metrics = MetricsExporter(metrics_port)
            self.metrics.start()
        self.started.connect(self._on_started, Qt.ConnectionType.QueuedConnection)
        self.failed.connect(self._on_failed, Qt.ConnectionType.QueuedConnection)
        self.stopped.connect(self._on_stopped, Qt.ConnectionType.QueuedConnection)
        self.progress.connect(self._on_progress, Qt.ConnectionType.QueuedConnection)
        window.start_requested.connect(self.start)
        window.stop_requested.connect(self.stop)
        window.controls.refresh_requested.connect(self.refresh_devices)
        window.set_feed(self)

    # -- the window's feed (GUI thread) --------------------------------------------------------

    def drain_captions(self) -> list[CaptionUpdate]:
        pipeline = self.pipeline
        if pipeline is None:
            return []
        updates = self._observed(pipeline.drain_captions())
        if not self._busy:
            if pipeline.error is not None:
                self.stop()  # a failed worker or capture: say so instead of showing a frozen session
            elif self._files_only and pipeline.wait_exhausted(0):
                self.stop(finished=True)  # every file has played to its end: commit what is pending
        return updates

    def _observed(self, updates: list[CaptionUpdate]) -> list[CaptionUpdate]:
        if self.metrics is not None:
            for update in updates:
                if update.text.strip():  # an empty partial clears the line; nothing was shown
                    self.metrics.observe_caption(update)
        return updates

    def latest_status(self) -> PipelineStatus | None:
        status = self.pipeline.latest_status() if self.pipeline is not None else None
        if status is not None and self.metrics is not None:
            self.metrics.update_status(status)
        return status

    def latest_telemetry(self) -> TelemetrySample | None:
        sample = self.sampler.latest()
        if sample is not None and self.metrics is not None:
            self.metrics.update_telemetry(sample)
        return sample

    # -- devices ---------------------------------------------------------------------------

    def refresh_devices(self) -> None:
        try:
            from captioner.audio.devices import list_input_devices

            devices = list_input_devices()
        except UserError as exc:
            self.window.statusBar().showMessage(f"No audio devices: {exc}", 10000)
            devices = []
        except Exception as exc:  # a broken audio stack must not stop the app from opening
            self.window.statusBar().showMessage(f"Could not list audio devices: {exc}", 10000)
            devices = []
        self.window.controls.set_devices(devices)

    # -- start / stop ----------------------------------------------------------------------

    def start(self, config: RunConfig) -> None:
        if self._busy or self.pipeline is not None:
            return
        self._busy = True
        self._files_only = bool(config.sources) and all(c.kind == "file" for c in config.sources)
        self.window.set_running(True, f"Preparing {config.model}…")
        self.window.controls.start_button.setEnabled(False)
        if self.interactive:
            dialog = QProgressDialog(f"Preparing the model {config.model}…", "", 0, 0, self.window)
            dialog.setWindowTitle("captioner")
            dialog.setCancelButton(None)
            dialog.setMinimumDuration(400)  # a warm start finishes before it would show
            dialog.setWindowModality(Qt.WindowModality.WindowModal)
            self._progress_dialog = dialog
        self._start_thread = threading.Thread(target=self._run_start, args=(config,), name="captioner-gui-start",
                                              daemon=True)
        self._start_thread.start()

    def _run_start(self, config: RunConfig) -> None:
        from captioner.engine.pipeline import Pipeline
        from captioner.app.transcript import TranscriptWriter

        transcript = None
        try:
            sources = open_sources(config)
            transcript = TranscriptWriter(title=", ".join(s.stream for s in sources))
            pipeline = Pipeline(
                sources,
                model=config.model,
                language=config.language,
                task="translate" if config.translate else "transcribe",
                device=self.device,
                transcript=transcript,
                progress=lambda message, fraction: self.progress.emit(str(message), float(fraction)),
            )
            pipeline.start()
        except UserError as exc:
            if transcript is not None:
                transcript.close()
            self.failed.emit(str(exc))
            return
        except Exception as exc:  # show it; the app stays usable to pick something else
            if transcript is not None:
                transcript.close()
            self.failed.emit(f"could not start: {type(exc).__name__}: {one_line(exc)}")
            return
        if self._closing:  # the window closed while the model was loading
            pipeline.stop()
            return
        self.pipeline = pipeline
        self._transcript = transcript
        self.started.emit(pipeline.latest_status())

    def stop(self, finished: bool = False) -> None:
        pipeline = self.pipeline
        if pipeline is None or self._busy:
            return
        self._busy = True
        self.window.controls.start_button.setEnabled(False)
        self.window.state_label.setText("Finishing: committing the last words…" if finished else "Stopping…")
        self._stop_thread = threading.Thread(target=self._run_stop, args=(pipeline,), name="captioner-gui-stop",
                                             daemon=True)
        self._stop_thread.start()

    def _run_stop(self, pipeline) -> None:
        try:
            pipeline.stop()
        finally:
            self.stopped.emit()

    def _close_progress(self) -> None:
        if self._progress_dialog is not None:
            self._progress_dialog.reset()
            self._progress_dialog.deleteLater()
            self._progress_dialog = None

    def _on_progress(self, message: str, fraction: float) -> None:
        self.window.state_label.setText(f"{message} ({100 * fraction:.0f}%)")
        dialog = self._progress_dialog
        if dialog is not None:
            dialog.setMaximum(100)
            dialog.setLabelText(message)
            dialog.setValue(int(100 * max(0.0, min(1.0, fraction))))

    def _on_started(self, status) -> None:
        self._busy = False
        self._close_progress()
        self.window.controls.start_button.setEnabled(True)
        path = getattr(self._transcript, "path", None)
        self.window.history.set_transcript_path(str(path) if path else None)
        self.window.set_running(True)
        self.window.record_meta.update(self.session_meta())

    def _on_failed(self, message: str) -> None:
        self._busy = False
        self._close_progress()
        self.window.controls.start_button.setEnabled(True)
        self.window.set_running(False, f"Error: {message}")
        if self.interactive:
            box = QMessageBox(QMessageBox.Icon.Warning, "captioner", message, QMessageBox.StandardButton.Ok, self.window)
            box.setModal(False)
            box.show()

    def _on_stopped(self) -> None:
        pipeline, self.pipeline = self.pipeline, None
        self._busy = False
        if pipeline is not None:
            # The last committed words arrive while stopping: hand them to the window now.
            self.window.apply_captions(self._observed(pipeline.drain_captions()))
            status = pipeline.latest_status()
            if status is not None:
                self.window.apply_status(status)
            error = pipeline.error
        else:
            error = None
        self.window.controls.start_button.setEnabled(True)
        self.window.set_running(False, f"Stopped: {error}" if error else "Stopped")

    def session_meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"device_requested": self.device or "auto"}
        if self.sampler.gpu_name:
            meta["device"] = self.sampler.gpu_name
        backend = getattr(self.pipeline, "backend", None)
        if backend is not None:
            meta["backend"] = getattr(backend, "name", str(backend))
        return meta

    def shutdown(self, timeout_s: float = 30.0) -> list[CaptionUpdate]:
        """Stops everything this controller started and joins the threads (GUI thread, at exit);
        returns the caption updates that arrived while the pipeline stopped."""
        self._closing = True
        # A start or stop in flight owns the pipeline's threads: let it finish first, or the
        # interpreter would exit under a model step still running in native code.
        for thread in (self._start_thread, self._stop_thread):
            if thread is not None:
                thread.join(timeout_s)
        pipeline, self.pipeline = self.pipeline, None
        leftovers: list[CaptionUpdate] = []
        if pipeline is not None:
            pipeline.stop(timeout_s)
            leftovers = self._observed(pipeline.drain_captions())
        self.sampler.stop()
        if self.metrics is not None:
            self.metrics.stop()
        self._close_progress()
        return leftovers
