"""Composition root of the desktop app: turns the window's requests into a running pipeline.

:class:`LiveController` is plain Python: no Qt here. It owns the pipeline, the telemetry sampler
and the optional Prometheus exporter. The GUI entry point (:mod:`captioner.app.gui_main`)
connects the window's requests (start, stop, refresh devices) to its methods; the window pulls
captions, status and telemetry from it (it is the window's *feed*); and it tells the window how a
session goes only through a :class:`~captioner.ui.session_view.SessionView`, never through a
widget.

The pipeline loads its model for seconds (minutes on a first launch, when the ONNX graphs are
built), so start and stop run on a short-lived helper thread and report to the view from there;
the window's implementation of the view queues those calls onto the GUI thread, which never
blocks on a start or a stop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from captioner.errors import UserError, one_line
from captioner.events import CaptionUpdate, PipelineStatus, TelemetrySample
from captioner.ui.run_config import RunConfig, SourceChoice
from captioner.ui.session_view import SessionView

# Builds a pipeline: called like captioner.engine.pipeline.Pipeline (sources, then model=,
# language=, task=, device=, transcript=, progress=); tests pass a fake.
PipelineFactory = Callable[..., Any]


def unique_streams(choices: tuple[SourceChoice, ...]) -> list[tuple[SourceChoice, str]]:
    """Each source with a distinct stream label ("Me", "Me 2", ...): the pipeline needs them."""
    from captioner.engine.pipeline import unique_labels

    return list(zip(choices, unique_labels(c.stream for c in choices)))


def engine_config(policy: str, speakers: str = "auto") -> Any:
    """The local engine's configuration for a session: its defaults, the policy chosen in the
    window (``"auto"``: the one measured better on the engine's device) and which streams'
    speakers are labelled (``"auto"``: a meeting's audio and files, not a microphone)."""
    from captioner.engine.core import EngineConfig
    from captioner.engine.policy.config import PolicyConfig
    from captioner.engine.speakers import SpeakerConfig

    return EngineConfig(policy=PolicyConfig(kind=policy or "auto"), speakers=SpeakerConfig(mode=speakers or "auto"))


def session_speakers(config: RunConfig) -> str:
    """The speaker labels a session asks the engine for: the run's choice, except that the demo
    alone (one voice, the first thing a new user sees) is not labelled under ``"auto"``: the live
    labels split its 11 s of one man in two at times (docs/speakers.md)."""
    if config.speakers == "auto" and config.sources and all(c.demo for c in config.sources):
        return "off"
    return config.speakers


def _takes_config(factory: Any) -> bool:
    """Whether the pipeline factory names a ``config`` parameter (the engine's Pipeline does; a
    stand-in that takes ``**kwargs`` and passes them on to one that does not, is not given it)."""
    import inspect

    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "config" for p in parameters)


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


def check_model(name_or_path: str) -> None:
    """Raises UserError when ``name_or_path`` names no model this machine has (its files are
    found, not loaded: a second, not the minute a first load may take)."""
    from captioner.models.registry import resolve_model

    resolve_model(name_or_path)


def start_failure(exc: Exception) -> str:
    """The sentence the window shows for a start that raised ``exc``."""
    if isinstance(exc, UserError):
        return str(exc)  # already written for the user
    return f"could not start: {type(exc).__name__}: {one_line(exc)}"


def _unsaved(transcript: Any) -> str | None:
    """Once a session stopped: one sentence for the committed lines its transcript never got
    (a disk still full at the end), else ``None``. Closing is the held lines' last try; a
    pipeline that closed the transcript already makes it a no-op."""
    if transcript is None:
        return None
    transcript.close()
    loss = getattr(transcript, "loss", None)
    return loss() if loss is not None else None


class LiveController:
    """One captioning session at a time, behind the window.

    Threads: the public methods run on the GUI thread (they are the window's requests and its
    feed); ``_run_start`` and ``_run_stop`` run on a helper thread each. ``pipeline`` and
    ``busy`` change on both, under one lock.
    """

    def __init__(self, view: SessionView, device: str | None = None, metrics_port: int | None = None,
                 pipeline_factory: PipelineFactory | None = None, server_token: str | None = None) -> None:
        """GUI thread. ``view``: where the session's course is reported (the window's
        ``session``); ``pipeline_factory``: what builds a pipeline (default: the engine's, or a
        client of the `captioner serve` named in the run's ``server``); ``server_token``: that
        server's bearer token."""
        from captioner.engine.pipeline import telemetry_gpu_index
        from captioner.gpu.telemetry import TelemetrySampler

        self.view = view
        self.device = device
        self.pipeline_factory = pipeline_factory
        self.server_token = server_token
        self.pipeline: Any = None
        self._transcript: Any = None
        self._busy = False  # a start or a stop is in flight: the next request waits for it
        self._closing = False
        self._files_only = False
        # Held while pipeline/_busy/_closing change and while the view hears of it, so the view
        # gets the calls in the order of the changes, whichever thread makes them.
        self._lock = threading.Lock()
        # Language notices (an English-only model hearing another language): taken from the
        # pipeline by whichever thread looks first, shown by the window in a banner of their
        # own that outlives the session; their text is kept out of the status messages, which
        # the window clears when a session ends.
        self._notice_lock = threading.Lock()
        self._notices: list[str] = []
        self._notice_messages: set[str] = set()
        self._start_thread: threading.Thread | None = None
        self._stop_thread: threading.Thread | None = None
        self.sampler = TelemetrySampler(gpu_index=telemetry_gpu_index(device))
        self.sampler.start()
        self.metrics = None
        if metrics_port is not None:
            from captioner.app.metrics import MetricsExporter

            self.metrics = MetricsExporter(metrics_port)
            self.metrics.start()

    @property
    def busy(self) -> bool:
        """Any thread: whether a start or a stop is in flight."""
        return self._busy

    # -- the window's feed (GUI thread) --------------------------------------------------------

    def drain_captions(self) -> list[CaptionUpdate]:
        # Under the lock, so a stop's last drain cannot overtake this one: what is drained here
        # reaches the window before the stop's leftovers do.
        with self._lock:
            pipeline = self.pipeline
            if pipeline is None:
                return []
            updates = self._observed(pipeline.drain_captions())
            idle = not self._busy
        if idle:
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
        pipeline = self.pipeline
        status = pipeline.latest_status() if pipeline is not None else None
        if pipeline is not None:
            self._take_notices(pipeline)
        status = self._with_transcript_problem(self._without_notices(status))
        if status is not None and self.metrics is not None:
            self.metrics.update_status(status)
        return status

    def drain_notices(self) -> list[str]:
        """GUI thread: the language notices made since the last call, each once, for the user
        as they are ("this sounds like German; tiny.en is English-only — try --model base");
        also those made as the last session stopped."""
        with self._notice_lock:
            out, self._notices = self._notices, []
        return out

    def _take_notices(self, pipeline: Any) -> None:
        """Any thread: moves the pipeline's new language notices to the window's queue."""
        take = getattr(pipeline, "notices", None)  # a pipeline without a language check has none
        notices = take() if take is not None else []
        if notices:
            with self._notice_lock:
                for notice in notices:
                    message = str(getattr(notice, "message", notice))
                    if message not in self._notice_messages:
                        self._notice_messages.add(message)
                        self._notices.append(message)

    def _without_notices(self, status: PipelineStatus | None) -> PipelineStatus | None:
        """``status`` with the language notices taken out of its message (the engine joins
        them to it with "; "): the window shows them apart."""
        if status is None or not status.message:
            return status
        with self._notice_lock:
            known = set(self._notice_messages)
        if not known:
            return status
        from dataclasses import replace

        parts = status.message.split("; ")
        kept = [part for part in parts if part not in known]
        return status if len(kept) == len(parts) else replace(status, message="; ".join(kept))

    def _with_transcript_problem(self, status: PipelineStatus | None) -> PipelineStatus | None:
        """``status`` whose message says when committed lines are not being saved (a full disk),
        as the banner must, whichever pipeline runs (the engine's says it already; a server's
        client does not)."""
        problem = getattr(self._transcript, "problem", None)
        if status is None or not problem or problem in status.message:
            return status
        from dataclasses import replace

        return replace(status, message="; ".join(m for m in (status.message, problem) if m))

    def latest_telemetry(self) -> TelemetrySample | None:
        """The GPU the captions come from: this machine's, or the server's as its status says."""
        remote = getattr(self.pipeline, "latest_telemetry", None)
        sample = remote() if remote is not None else self.sampler.latest()
        if sample is not None and self.metrics is not None:
            self.metrics.update_telemetry(sample)
        return sample

    def rename_speaker(self, stream: str, speaker: str, name: str) -> None:
        """GUI thread: the person named ``speaker`` ("Speaker 2") of ``stream`` in the session
        running; its transcript writes the name from now on (and, where the writer can, in the
        lines already saved). Nothing runs: nothing to tell (the last session's file is closed)."""
        with self._lock:
            transcript = self._transcript if self.pipeline is not None else None
        rename = getattr(transcript, "rename_speaker", None)  # a writer that predates renaming has none
        if rename is not None:
            rename(stream, speaker, name)

    # -- devices (GUI thread) ------------------------------------------------------------------

    def refresh_devices(self) -> None:
        """Lists the audio inputs for the view; a failure leaves just the default input."""
        error = None
        try:
            from captioner.audio.devices import list_input_devices

            devices = list_input_devices()
        except UserError as exc:
            devices, error = [], f"No audio devices: {exc}"
        except Exception as exc:  # a broken audio stack must not stop the app from opening
            devices, error = [], f"Could not list audio devices: {exc}"
        self.view.devices_listed(devices, error)

    # -- start / stop --------------------------------------------------------------------------

    def start(self, config: RunConfig) -> None:
        """GUI thread: prepares a session on a helper thread; ignored while one runs or starts."""
        with self._lock:
            if self._busy or self._closing or self.pipeline is not None:
                return
            with self._notice_lock:
                self._notice_messages.clear()  # a new session says its own notices again
            self._busy = True
            self._files_only = bool(config.sources) and all(c.kind == "file" for c in config.sources)
            self.view.session_starting(config.model)
            self._start_thread = threading.Thread(target=self._run_start, args=(config,),
                                                  name="captioner-gui-start", daemon=True)
            self._start_thread.start()

    def _new_pipeline(self, sources: list[Any], config: RunConfig, transcript: Any) -> Any:
        factory = self.pipeline_factory
        if factory is None and config.server:
            from functools import partial

            from captioner.serve.client import RemotePipeline

            factory = partial(RemotePipeline, server=config.server, token=self.server_token)
        elif factory is None:
            from captioner.engine.pipeline import Pipeline

            factory = Pipeline
        options = {}
        if not config.server and _takes_config(factory):
            # A server keeps its own policy and speaker labels.
            options["config"] = engine_config(config.policy, session_speakers(config))
        return factory(
            sources,
            model=config.model,
            language=config.language,
            task="translate" if config.translate else "transcribe",
            device=self.device,
            transcript=transcript,
            progress=lambda message, fraction: self.view.session_progress(str(message), float(fraction)),
            **options,
        )

    def _run_start(self, config: RunConfig) -> None:
        """Start helper thread: opens the sources, loads the model, starts capturing."""
        from captioner.app.transcript import TranscriptWriter

        transcript = None
        # Which of the run's settings a failure is about, so the window can say which field
        # to change (and fall back from a saved one that no longer works).
        setting = "model"
        try:
            if not config.server:
                check_model(config.model)  # before the sources: a saved model that is gone is named as such
            setting = "sources"
            sources = open_sources(config)
            setting = "transcript"  # its folder, or a disk too full for its first line
            transcript = TranscriptWriter(title=", ".join(s.stream for s in sources))
            setting = "server" if config.server else ""  # connecting is part of a remote start
            pipeline = self._new_pipeline(sources, config, transcript)
            pipeline.start()
        except Exception as exc:  # show it; the app stays usable to pick something else
            if transcript is not None:
                transcript.close()
            with self._lock:
                self._busy = False
                self.view.session_failed(start_failure(exc), setting)
            return
        with self._lock:
            closing = self._closing
            if not closing:
                self.pipeline = pipeline
                self._transcript = transcript
                self._busy = False
                path = getattr(transcript, "path", None)
                self.view.session_started(str(path) if path else None, self.session_meta())
        if closing:  # the window closed while the model was loading
            pipeline.stop()

    def stop(self, finished: bool = False) -> None:
        """GUI thread: stops the session on a helper thread. ``finished``: every file has played
        to its end (only the wording differs)."""
        with self._lock:
            pipeline = self.pipeline
            if pipeline is None or self._busy:
                return
            self._busy = True
            self.view.session_stopping(finished)
            self._stop_thread = threading.Thread(target=self._run_stop, args=(pipeline,),
                                                 name="captioner-gui-stop", daemon=True)
            self._stop_thread.start()

    def _run_stop(self, pipeline: Any) -> None:
        """Stop helper thread: lets the pipeline commit what is pending, then reports."""
        try:
            pipeline.stop()
        finally:
            unsaved = _unsaved(self._transcript)  # before the lock: it may write what was held
            with self._lock:
                # Once the app quits, the view's queue is no longer read: shutdown() drains the
                # pipeline instead and hands the last words to the window itself.
                if not self._closing:
                    self._report_stopped(pipeline, unsaved)

    def _report_stopped(self, pipeline: Any, unsaved: str | None = None) -> None:
        """Stop helper thread, with the lock held: the session is over; the view gets its end.
        ``unsaved``: the committed lines its transcript never got, in a sentence."""
        self.pipeline = None
        self._transcript = None
        self._busy = False
        leftovers = self._observed(pipeline.drain_captions())
        error = None if pipeline.error is None else str(pipeline.error)
        if unsaved:  # shown but never saved: the session ends on that, not on "Stopped"
            error = f"{error}; {unsaved}" if error else unsaved
        # A check still running when the stream ended reports as it stops (on a busy CPU the
        # check, which yields to the captioning, may finish only then): the window shows it next.
        self._take_notices(pipeline)
        self.view.session_stopped(leftovers, self._without_notices(pipeline.latest_status()), error)

    def session_meta(self) -> dict[str, Any]:
        """Any thread: what a saved trace says about the run's device and back-end."""
        meta: dict[str, Any] = {"device_requested": self.device or "auto"}
        server = getattr(self.pipeline, "server", None)
        if server:
            meta["server"] = server
            sample = self.latest_telemetry()
            if sample is not None and sample.gpu_name:
                meta["device"] = sample.gpu_name
        elif self.sampler.gpu_name:
            meta["device"] = self.sampler.gpu_name
        backend = getattr(self.pipeline, "backend", None)
        if backend is not None:
            meta["backend"] = getattr(backend, "name", str(backend))
        return meta

    def shutdown(self, timeout_s: float = 30.0) -> list[CaptionUpdate]:
        """GUI thread, at exit: stops everything this controller started and joins the threads;
        returns the caption updates that arrived while the pipeline stopped (the view is told
        nothing more)."""
        with self._lock:
            self._closing = True
        # A start or stop in flight owns the pipeline's threads: let it finish first, or the
        # interpreter would exit under a model step still running in native code.
        for thread in (self._start_thread, self._stop_thread):
            if thread is not None:
                thread.join(timeout_s)
        with self._lock:
            pipeline, self.pipeline = self.pipeline, None
        leftovers: list[CaptionUpdate] = []
        if pipeline is not None:
            pipeline.stop(timeout_s)
            leftovers = self._observed(pipeline.drain_captions())
        self.sampler.stop()
        if self.metrics is not None:
            self.metrics.stop()
        return leftovers
