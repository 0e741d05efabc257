"""A live captioning session: sources -> the worker's inbox -> worker -> outboxes.

One path, no polling:

- each source delivers its audio from its own thread (the PortAudio callback, or a replay
  thread) straight into the worker's inbox — a live device never waits (a full inbox drops the
  chunk and the source counts it; the engine fills the gap with silence), a file replay waits
  for room, so it never loses audio;
- ``captioner-worker`` (:class:`~captioner.engine.worker.Worker`) feeds each chunk to its
  stream of the captioner (where resampling and framing happen) and steps it. The captioner is a
  :class:`~captioner.engine.supervisor.SupervisedCaptioner`: on a GPU the model runs in a child
  process that a CUDA error may poison, and is replaced (the streams re-fed from their last
  checkpoint) when it fails; on the CPU it runs on this thread and is remade after a failed
  step (``isolation``, below);
- ``captioner-transcript`` appends and fsyncs every committed line before the update reaches
  the outbox (a caption on screen is a caption on disk), so a slow disk never holds up the
  thread that drives the GPU;
- ``captioner-inputs`` (:class:`_InputWatch`) keeps the live inputs that can come back
  (:class:`~captioner.audio.source.RecoverableSource`, e.g. a microphone or a sound server's
  monitor) alive: it asks each one's health a few times a second, tells the worker when one is
  lost (its stream stays open and runs on in silence; the others go on), and looks for the
  device again after 0.5 s, then 1, 2, 4 and every 5 s, until a fresh source for it delivers.

The GUI or the CLI drains the outboxes without blocking (:meth:`Pipeline.drain_captions`,
:meth:`Pipeline.latest_status`); the methods that change a running session (add or remove a
source, change language or model) send typed messages to the worker, which applies them
between model steps.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace

from captioner.audio.source import (
    RawChunk,
    RecoverableSource,
    SourceEnd,
    live_sink_into,
    replay_sink_into,
)
from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.messages import (
    CloseStream,
    InputBack,
    InputLost,
    Lifecycle,
    OpenStream,
    Refused,
    SetLanguage,
    SwapModel,
)
from captioner.engine.recognizer import capabilities_of
from captioner.engine.supervisor import SupervisedCaptioner
from captioner.engine.transcript_thread import TranscriptThread
from captioner.engine.worker import InboxItem, InputLoss, Worker
from captioner.errors import StreamRefused, UserError, one_line
from captioner.events import (
    MIN_FREE_VRAM_FRACTION,
    CaptionUpdate,
    FramedAudio,
    PipelineStatus,
)
from captioner.languages import language_code

INBOX_ITEMS = 3000
"""Chunks that may wait for the worker (about a minute of 20 ms chunks) before a live source's
audio is dropped (and counted) or a replay waits."""


def source_priority(source) -> int | str:
    """How a source's stream ranks when compute is short: what the source says (a file replay
    says ``"replay"``), else live (a microphone, a meeting, a network client)."""
    return getattr(source, "priority", "live")


def source_origin(source) -> str | None:
    """What a source's audio is (``microphone``, ``meeting``, ``file``, ``remote``; ``None`` when
    it does not say): whether ``speakers="auto"`` labels its speakers (docs/speakers.md)."""
    return getattr(source, "origin", None)


_WAIT_FOR_ROOM_S = 0.1

WATCH_PERIOD_S = 0.2
"""How often the live inputs' health is asked (a stall shows after ``STALL_S`` plus this)."""
RECOVERY_FIRST_S = 0.5
RECOVERY_MAX_S = 5.0
"""A lost input's device is looked for after 0.5 s, then at twice the previous wait, at most 5 s."""
_CLOSE_WAIT_S = 1.0
"""How long ``stop`` waits for lost sources still being closed (a frozen sound server holds a
close for a minute: those are left to finish on their own daemon threads)."""


def check_room_for_stream(status: PipelineStatus | None) -> None:
    """Refuse a new stream while the GPU has under ``MIN_FREE_VRAM_FRACTION`` of its memory free
    (as the worker last measured it); the CPU, or no measurement yet, never refuses."""
    free = dict(status.extra).get("vram_free_fraction") if status is not None else None
    if free is not None and free < MIN_FREE_VRAM_FRACTION:
        raise StreamRefused(
            f"GPU memory is {100 * free:.0f}% free, under the {100 * MIN_FREE_VRAM_FRACTION:.0f}% kept "
            "for the streams already captioned: close another program on the GPU or stop a stream first"
        )


def unique_labels(labels: Iterable[str]) -> list[str]:
    """The labels made distinct, as the pipeline needs them: a repeat is numbered ("Me", "Me 2")."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} {seen[label]}")
    return out


def telemetry_gpu_index(device: str | None) -> int:
    """The GPU whose telemetry goes with ``device``: N for "cuda:N", else 0 (where "auto" runs);
    a bad name is left for the pipeline to refuse with its own message."""
    from captioner.compute import parse_device

    try:
        _, index = parse_device(device) if device and device != "auto" else ("auto", None)
    except UserError:
        return 0
    return index or 0


class _Feed:
    """The sink of one started source of a recoverable input, called by its PortAudio callback.

    Chunks go to the worker's inbox without waiting (a full inbox refuses them; the source
    counts the drop). The source's end (its device went away) goes to the watch thread, which
    tells the worker. A retired feed takes everything and passes nothing on: a lost source's
    last blocks must not run into the clock of the source that replaces it."""

    __slots__ = ("_inbox", "_wake", "ended", "retired")

    def __init__(self, inbox: queue.Queue, wake: threading.Event) -> None:
        self._inbox = inbox
        self._wake = wake
        self.ended: str | None = None
        self.retired = False

    def __call__(self, item: RawChunk | SourceEnd) -> bool:
        if self.retired:
            return True
        if isinstance(item, SourceEnd):
            self.ended = item.error or "input device stopped"
            self._wake.set()
            return True
        try:
            self._inbox.put_nowait(item)
            return True
        except queue.Full:
            return False


class _Recovery:
    """One recoverable input as the watch thread keeps it: the source delivering now, and after
    a loss why, and when to look for its device again."""

    __slots__ = ("label", "source", "feed", "lost", "retry_at_s", "delay_s")

    def __init__(self, source: RecoverableSource, feed: _Feed) -> None:
        self.label = source.stream
        self.source = source
        self.feed = feed
        self.lost: str | None = None
        self.retry_at_s = 0.0
        self.delay_s = RECOVERY_FIRST_S


class _InputWatch(threading.Thread):
    """``captioner-inputs``: notices a recoverable input that stopped, tells the worker
    (:class:`~captioner.engine.worker.InputLost`), and opens a fresh source for it once its
    device is back (:class:`~captioner.engine.worker.InputBack` goes first, so the worker knows
    where the fresh source's clock starts). The lost source is closed on a short-lived thread of
    its own: on a frozen sound server a close waits a minute, and nothing here may wait on it.

    ``retire(source)`` and ``adopt(fresh)`` are the pipeline's: they take a lost source out of
    its list and put the fresh one in (``adopt`` says False once the pipeline is stopping; the
    fresh source is then stopped again)."""

    def __init__(self, inbox: queue.Queue, stopping: threading.Event,
                 retire: Callable[[object], None], adopt: Callable[[object], bool]) -> None:
        super().__init__(name="captioner-inputs", daemon=True)
        self.wake = threading.Event()
        self._inbox = inbox
        self._stopping = stopping
        self._retire = retire
        self._adopt = adopt
        self._lock = threading.Lock()
        self._inputs: dict[str, _Recovery] = {}
        self._closers: list[threading.Thread] = []

    # -- the pipeline's thread ---------------------------------------------------------------------
    def feed_for(self, source: RecoverableSource) -> _Feed:
        """A sink for ``source`` that reports its end here; from now on it is watched."""
        feed = _Feed(self._inbox, self.wake)
        with self._lock:
            self._inputs[source.stream] = _Recovery(source, feed)
        return feed

    def forget(self, label: str) -> None:
        """The input was removed: no more watching, no reopening."""
        with self._lock:
            entry = self._inputs.pop(label, None)
        if entry is not None:
            entry.feed.retired = True

    def close(self, timeout_s: float) -> None:
        """Stops watching (``stopping`` is already set); waits a little for lost sources
        still being closed."""
        self.wake.set()
        if self.is_alive():
            self.join(timeout_s)
        deadline_s = time.monotonic() + _CLOSE_WAIT_S
        for closer in self._closers:
            closer.join(max(0.0, deadline_s - time.monotonic()))

    # -- the watch thread ----------------------------------------------------------------------------
    def run(self) -> None:
        while not self._stopping.is_set():
            self.wake.wait(WATCH_PERIOD_S)
            self.wake.clear()
            with self._lock:
                entries = list(self._inputs.values())
            for entry in entries:
                if self._stopping.is_set():
                    break
                if entry.lost is None:
                    why = entry.feed.ended or self._health(entry.source)
                    if why is not None:
                        self._lose(entry, why)
                elif time.monotonic() >= entry.retry_at_s:
                    self._reopen(entry)

    @staticmethod
    def _health(source: RecoverableSource) -> str | None:
        try:
            return source.health()
        except Exception as error:  # a source that cannot tell is taken at its word next time
            return f"its health check failed: {one_line(error)}"

    def _lose(self, entry: _Recovery, why: str) -> None:
        entry.feed.retired = True  # nothing more from this source reaches the worker
        # An end from PortAudio says only "stopped": the source may know better now.
        if entry.feed.ended is not None and why == entry.feed.ended:
            why = self._health(entry.source) or why
        entry.lost = why
        entry.delay_s = RECOVERY_FIRST_S
        entry.retry_at_s = time.monotonic() + entry.delay_s
        self._send(InputLost(entry.label, why))
        old = entry.source
        self._retire(old)
        closer = threading.Thread(target=old.stop, name=f"captioner-close-{entry.label}", daemon=True)
        closer.start()
        self._closers = [t for t in self._closers if t.is_alive()] + [closer]

    def _reopen(self, entry: _Recovery) -> None:
        try:
            fresh = entry.source.reopen()
        except Exception:  # the system could not say: as if not back yet
            fresh = None
        if fresh is not None and not self._stopping.is_set():
            feed = _Feed(self._inbox, self.wake)
            self._send(InputBack(entry.label))  # before any of its chunks
            try:
                fresh.start(feed)
            except Exception:  # listed but not openable yet (a server still starting)
                feed.retired = True
                fresh = None
            if fresh is not None:
                with self._lock:
                    current = self._inputs.get(entry.label) is entry
                if not current or not self._adopt(fresh):
                    feed.retired = True
                    fresh.stop()
                    return
                entry.source, entry.feed, entry.lost = fresh, feed, None
                entry.delay_s = RECOVERY_FIRST_S
                return
        entry.delay_s = min(2 * entry.delay_s, RECOVERY_MAX_S)
        entry.retry_at_s = time.monotonic() + entry.delay_s

    def _send(self, message) -> None:
        """Into the inbox, waiting for room: a loss must reach the worker (chunks may be dropped, this may not)."""
        while not self._stopping.is_set():
            try:
                self._inbox.put(message, timeout=_WAIT_FOR_ROOM_S)
                return
            except queue.Full:
                continue


class Pipeline:
    """Owns the sources and threads of one captioning session.

    ``sources``: audio sources (:class:`~captioner.audio.source.AudioSource`), each with a
    distinct ``stream`` label. ``recognizer_factory``: optional ``() -> (backend, recognizer)``
    to use instead of loading ``model`` (tests, benchmarks). ``transcript``: an object with
    ``write(update)`` and ``close()`` (e.g. :class:`captioner.app.transcript.TranscriptWriter`)
    that gets every committed line, on a thread of its own.

    ``isolation``: where the model runs. "process": a child process (a standby one loaded
    beside it), replaced when it fails — what a GPU needs, since a sticky CUDA error poisons
    its process; "inline": the worker thread, the captioner remade after a failed step;
    "none": a bare :class:`LiveCaptioner` on the worker thread, nothing restarted. "auto" (the
    default): "process" on a GPU, "inline" on the CPU, "none" with a ``recognizer_factory``
    (which must then be picklable for "process"). ``standby``: whether "process" keeps a loaded
    standby beside the model's process (a quick restart, for a second copy of the model's memory,
    large on a GPU once its arenas have grown: docs/serve.md, "Running it"); without one, a failed
    process is replaced by a fresh one, loaded then.
    """

    def __init__(
        self,
        sources: Iterable,
        model: str = "tiny.en",
        language: str | None = None,
        task: str = "transcribe",
        device: str | None = None,
        config: EngineConfig | None = None,
        transcript=None,
        recognizer_factory: Callable[[], tuple] | None = None,
        inbox_items: int = INBOX_ITEMS,
        progress=None,
        isolation: str = "auto",
        standby: bool = True,
    ) -> None:
        if isolation not in ("auto", "process", "inline", "none"):
            raise ValueError(f"unknown isolation {isolation!r}: use 'auto', 'process', 'inline' or 'none'")
        self.sources = list(sources)
        names = [s.stream for s in self.sources]
        if len(set(names)) != len(names):
            raise UserError(f"two sources have the same label: {names}")
        # A source's stream the engine refuses (its time budget or memory, decided after
        # add_source returned) ends like a source that failed: said once, its audio dropped.
        self._own_streams = set(names)
        self._refused: dict[str, str] = {}
        self.model = model
        self.language = language_code(language)
        self.task = task
        self.device = device
        self.config = config or EngineConfig()
        self.transcript = transcript
        self._factory = recognizer_factory
        self._progress = progress
        self._inbox: queue.Queue[InboxItem] = queue.Queue(maxsize=inbox_items)
        self._live_sink = live_sink_into(self._inbox)  # one for every live source
        self._captions: deque[CaptionUpdate | Lifecycle] = deque()
        self._captions_lock = threading.Lock()
        self.on_captions: Callable[[], None] | None = None
        """Called (on the worker's or the transcript writer's thread) each time caption updates
        reach the outbox: a server's loop drains them then, not on its next polling round."""
        self._status: PipelineStatus | None = None
        self._status_lock = threading.Lock()
        self._worker: Worker | None = None
        self._writer: TranscriptThread | None = None
        self._watch: _InputWatch | None = None
        self._sources_lock = threading.Lock()  # self.sources changes on the watch thread too
        self._retired_drops = 0  # blocks dropped by sources that were lost and replaced
        self._stopping = threading.Event()
        self._started = False
        self.isolation = isolation
        self.standby = standby
        self.backend = None

    # -- lifecycle (owner thread) -----------------------------------------------------------------
    def start(self, timeout_s: float = 600.0) -> None:
        """Load the model (in the worker thread), start capturing; raises ``UserError`` when the
        model or a device cannot be used."""
        if self._started:
            return

        isolation = self._isolation()

        def make_supervised() -> SupervisedCaptioner:
            from captioner.engine.host import HostSpec

            spec = HostSpec(self.model, self.device, language=self.language, task=self.task, config=self.config,
                            recognizer_factory=self._factory, language_check=self._factory is None,
                            progress=self._progress)
            return SupervisedCaptioner(spec, isolation=isolation, standby=self.standby)

        def make_captioner() -> LiveCaptioner:
            backend = recognizer = None
            if self._factory is not None:
                backend, recognizer = self._factory()
            live = LiveCaptioner(self.model, self.device, language=self.language, task=self.task,
                                 config=self.config, progress=self._progress, recognizer=recognizer,
                                 backend=backend,
                                 # A person is watching: tell them when tiny.en hears German.
                                 language_check=self._factory is None)
            self.backend = live.backend
            return live

        if self.transcript is not None:
            transcript = self.transcript
            self._writer = TranscriptThread("captioner-transcript", lambda key, title: transcript, then=self._to_outbox)
            self._writer.start()
        self._worker = Worker(make_captioner if isolation == "none" else make_supervised, self._inbox,
                              self._deliver, self._publish, source_drops=self._source_drops)
        for source in self.sources:  # before any audio: the inbox keeps the order
            self._inbox.put(OpenStream(source.stream, priority=source_priority(source), source=source_origin(source)))
        self._watch = _InputWatch(self._inbox, self._stopping, self._retire, self._adopt)
        self._worker.start()
        self._worker.ready.wait(timeout_s)
        if self._worker.error is not None:
            self._worker.join(5)
            self._close_writer(5)
            error = self._worker.error
            if isinstance(error, UserError):
                raise error
            raise UserError(f"the captioning engine could not start: {one_line(error)}") from error
        started = []
        try:
            for source in self.sources:
                source.start(self._sink_for(source))
                started.append(source)
        except BaseException:
            self._stopping.set()
            for source in started:
                source.stop()
            self._worker.stop_event.set()
            self._worker.join(10)
            self._close_writer(10)
            raise
        self._watch.start()
        self._started = True

    def _isolation(self) -> str:
        """What "auto" means here: a GPU gets a process, the CPU the worker thread (a failed CPU
        step poisons nothing, and a fresh process costs more than a fresh model there: measured
        in docs/reliability.md)."""
        if self.isolation != "auto":
            return self.isolation
        if self._factory is not None:
            return "none"
        from captioner.compute import parse_device, requested_device

        wanted = requested_device(self.device)
        if wanted == "auto":
            from captioner.gpu.backend import cuda_usable

            return "process" if cuda_usable() else "inline"
        return "inline" if parse_device(wanted)[0] == "cpu" else "process"

    def _sink_for(self, source) -> Callable[[RawChunk | SourceEnd], bool]:
        if getattr(source, "live", True) and isinstance(source, RecoverableSource) and self._watch is not None:
            return self._watch.feed_for(source)  # its end goes to the watch thread, not the worker
        if getattr(source, "live", True):
            return self._live_sink
        return replay_sink_into(self._inbox, self._stopping, _WAIT_FOR_ROOM_S)  # a replay thread

    @property
    def inbox_fill(self) -> float:
        """How full the worker's inbox is, 0..1 (any thread; a server refuses new streams while
        it is deep)."""
        return self._inbox.qsize() / max(1, self._inbox.maxsize)

    @property
    def worker_away_s(self) -> float:
        """How long the worker's recent steps kept it from its inbox, the longest (any thread)."""
        return self._worker.away_s if self._worker is not None else 0.0

    @property
    def inbox_wait_s(self) -> float:
        """How long the oldest audio in the worker's inbox has waited since it was captured (0
        when none is at its head; any thread). A server's framed audio is one item per front-end
        frame, so how full the inbox is says little about how late its audio is."""
        try:
            head = self._inbox.queue[0]  # a peek: an estimate, read without the queue's lock
        except IndexError:
            return 0.0
        if type(head) is FramedAudio:
            captured_ns = min(head.capture_ns)
        elif type(head) is RawChunk:
            captured_ns = head.capture_ns
        else:
            return 0.0
        return max(0.0, (time.monotonic_ns() - captured_ns) / 1e9)

    def wait_exhausted(self, timeout_s: float | None = None) -> bool:
        """Block until every stream has ended and been committed (finite sources only)."""
        if self._worker is None:
            return True
        return self._worker.all_ended.wait(timeout_s)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop capturing, let the worker commit what is pending, join every thread."""
        if not self._started:
            return
        self._started = False
        assert self._worker is not None
        self._stopping.set()
        if self._watch is not None:
            self._watch.close(timeout_s=5.0)  # no source is reopened from here on
        with self._sources_lock:
            sources = list(self.sources)
        for source in sources:
            source.stop()  # no source calls its sink after this returns
        self._worker.stop_event.set()
        self._worker.join(timeout_s)
        self._close_writer(timeout_s)

    def _close_writer(self, timeout_s: float) -> None:
        if self._writer is not None:  # kept: its error is still read after the stop
            self._writer.close(timeout_s)
            self.transcript.close()  # closed by the thread, unless it is still stuck on the disk

    @property
    def captioner(self) -> LiveCaptioner | SupervisedCaptioner | None:
        return self._worker.captioner if self._worker is not None else None

    @property
    def worker_restarts(self) -> int:
        """How often the model's worker failed and was replaced (0 without isolation)."""
        return getattr(self.captioner, "restarts", 0)

    def worker_notices(self) -> list[str]:
        """Lines about the model's worker since the last call: each restart after a failure, and
        the fall-back to the CPU after repeated GPU failures; any thread."""
        live = self.captioner
        return live.worker_notices() if isinstance(live, SupervisedCaptioner) else []

    @property
    def provider(self) -> str:
        """Where the model runs (e.g. "CUDAExecutionProvider"), once started."""
        live = self.captioner
        return live.provider if live is not None else ""

    @property
    def running(self) -> bool:
        """False once stopped, or once the worker has failed."""
        return self._started and self._worker is not None and self._worker.is_alive()

    @property
    def error(self) -> BaseException | None:
        return self._worker.error if self._worker is not None else None

    @property
    def source_errors(self) -> dict[str, str]:
        """Streams whose source ended early for good, with the one-line reason (a damaged file,
        a device that cannot be opened again, a stream the engine refused); their streams were
        committed, the others go on."""
        errors = dict(self._worker.source_errors) if self._worker is not None else {}
        return {**errors, **self._refused}  # a refusal's reason names its stream

    @property
    def lost_inputs(self) -> dict[str, str]:
        """Live inputs whose device stopped and is being looked for, with the one-line reason;
        their streams stay open (the others go on) and take audio again once it is back."""
        return dict(self._worker.lost_inputs) if self._worker is not None else {}

    @property
    def input_losses(self) -> dict[str, InputLoss]:
        """Per stream, how often its live input was lost so far and for how long in all."""
        return dict(self._worker.input_losses) if self._worker is not None else {}

    @property
    def failure(self) -> str | None:
        """One line for a command to exit with: the worker's error, else the first source's."""
        if self.error is not None:
            return one_line(self.error)
        errors = self.source_errors
        return next(iter(errors.values())) if errors else None

    @property
    def transcript_error(self) -> BaseException | None:
        """Why the transcript stopped being written (the captions go on), if it did."""
        return self._writer.error if self._writer is not None else None

    # -- changes while running (any thread) ----------------------------------------------------------
    def _send(self, message) -> None:
        if self._worker is None:
            raise RuntimeError("pipeline not started")
        self._inbox.put(message)

    def add_source(self, source, language: str | None = None) -> None:
        """Caption another source from now on (refused while the GPU is short of memory);
        ``language``: its stream's own language (a code the model has: check it first),
        else the session's."""
        with self._sources_lock:
            taken = {s.stream for s in self.sources} | set(self.lost_inputs)
        if source.stream in taken:
            raise UserError(f"a source labelled {source.stream!r} is already captioned")
        check_room_for_stream(self.latest_status())
        with self._sources_lock:
            self._own_streams.add(source.stream)
        self._send(OpenStream(source.stream, language_code(language), source_priority(source), source_origin(source)))
        source.start(self._sink_for(source))
        with self._sources_lock:
            self.sources.append(source)

    def push_framed(self, item: FramedAudio) -> bool:
        """Several streams' audio, already framed (a server's front-ends frame it), into the
        inbox without waiting; False when the inbox is full (the item is dropped)."""
        try:
            self._inbox.put_nowait(item)
            return True
        except queue.Full:
            return False

    def remove_source(self, label: str) -> None:
        """Stop a source; what its stream shows is committed."""
        if self._watch is not None:
            self._watch.forget(label)  # a lost input is no longer looked for
        with self._sources_lock:
            leaving = [s for s in self.sources if s.stream == label]
            self.sources[:] = [s for s in self.sources if s.stream != label]
        for source in leaving:
            source.stop()
        self._send(CloseStream(label))

    def set_language(self, language: str | None) -> None:
        """A language code or "auto"; refused at once (``UserError``) when the model lacks it."""
        code = language_code(language)
        live = self.captioner
        check = capabilities_of(live.recognizer if live is not None else None).check_language
        self._send(SetLanguage(check(code) if check is not None else code))

    def set_model(self, model: str) -> None:
        """Switch to another model between steps (open text is committed by the old one)."""
        self._send(SwapModel(model))

    # -- outboxes ------------------------------------------------------------------------------------
    def drain(self) -> list[CaptionUpdate | Lifecycle]:
        """Every caption update since the last call, and the streams' lifecycle events in order
        with them (:data:`~captioner.engine.messages.Lifecycle`: opened, refused, done after
        its last update); never blocks."""
        with self._captions_lock:
            out = list(self._captions)
            self._captions.clear()
        return out

    def drain_captions(self) -> list[CaptionUpdate]:
        """Every caption update since the last call (never blocks); lifecycle events left out."""
        return [item for item in self.drain() if type(item) is CaptionUpdate]

    def notices(self) -> list:
        """Language notices made since the last call (an English-only model hearing another
        language), each once; any thread."""
        live = self.captioner
        return live.notices() if live is not None else []

    def latest_status(self) -> PipelineStatus | None:
        """The worker's latest status; its message also says when the transcript is paused (in
        the transcript's own words: the app's banner shows them)."""
        with self._status_lock:
            status = self._status
        notes = list(self._refused.values())  # each names its stream
        note = getattr(self.transcript, "problem", None) if self.transcript is not None else None
        notes += [note] if note else []
        if status is not None and notes:
            status = replace(status, message="; ".join(m for m in (status.message, *notes) if m))
        return status

    # -- worker-thread callbacks -------------------------------------------------------------------
    def _deliver(self, updates: list[CaptionUpdate | Lifecycle]) -> None:
        refused = [e for e in updates if type(e) is Refused]
        if refused:
            self._note_refusals(refused)
        if self._writer is not None and self._writer.is_alive():
            self._writer.put(updates)  # on to the outbox once the finals are on disk
        else:
            self._to_outbox(updates)  # no transcript, or a worker that outlived the stop

    def _note_refusals(self, events: list[Refused]) -> None:
        with self._sources_lock:
            ours = {e.label: e.reason for e in events if e.label in self._own_streams}
        if ours:  # replaced, never changed in place: any thread reads it
            self._refused = {**self._refused, **ours}

    def _to_outbox(self, updates: list[CaptionUpdate | Lifecycle]) -> None:
        with self._captions_lock:
            self._captions.extend(updates)
        ring = self.on_captions
        if updates and ring is not None:
            ring()

    def _publish(self, status: PipelineStatus) -> None:
        with self._status_lock:
            self._status = status

    def _source_drops(self) -> int:
        with self._sources_lock:
            sources = list(self.sources)
        return self._retired_drops + sum(source.stats().dropped_blocks for source in sources)

    # -- watch-thread callbacks ----------------------------------------------------------------------
    def _retire(self, source) -> None:
        """A lost source leaves the list (its drops are kept); the watch thread closes it."""
        with self._sources_lock:
            if source in self.sources:
                self.sources.remove(source)
                self._retired_drops += source.stats().dropped_blocks

    def _adopt(self, fresh) -> bool:
        """The fresh source of a lost input joins the list, unless the pipeline is stopping."""
        with self._sources_lock:
            if self._stopping.is_set():
                return False
            self.sources.append(fresh)
            return True
