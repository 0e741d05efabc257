"""Where the model runs under a :class:`~captioner.engine.supervisor.SupervisedCaptioner`: a
*host* that can fail and be thrown away.

A sticky CUDA error (an illegal memory access) poisons the CUDA context of the whole process:
nothing on that GPU works again in it. So on a GPU the :class:`LiveCaptioner` lives in a child
process of its own (:class:`ProcessHost`, "spawn" start method: a fresh interpreter, no CUDA
state inherited); when it fails, the process is killed and another one takes its streams over.
On the CPU a failed model step poisons nothing, and a fresh process costs more than a fresh
model (docs/reliability.md, "Hot restart"): :class:`InlineHost` keeps the captioner on the
worker thread and makes a new one after a failure.

Both speak :mod:`captioner.engine.messages`: the commands (``OpenStream``, ``CloseStream``,
``SetLanguage``, ``SwapModel``, ``CloseHost``) and framed audio (``FramedAudio``: a chunk of
16 kHz float32 whole frames of several streams, at most one each, in one array) go to the host;
its events come back (``HostReady``, ``LoadProgress``, ``Updates`` with times and segments already
on the supervisor's clock, ``Checkpoint``, ``StreamOpened``, ``Refused``, ``StreamDone``,
``HostStatus``, which is also the heartbeat, ``Notices``, ``HostFailed``, ``HostClosed``).

The fault-injection hook, read only here, in the host: ``CAPTIONER_FAULT_INJECT=step:N`` makes
the N-th model step of the first host fail with a real device fault (on CUDA an illegal-address
kernel, :meth:`~captioner.gpu.backend.Backend.inject_fault`; on the CPU an exception);
``step:N,times:K`` does so in each of the first K hosts. It is meant for the test suite and
``benchmarks/bench_hot_restart.py`` only.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from captioner.engine.messages import (
    Checkpoint,
    CloseHost,
    CloseStream,
    Event,
    HostClosed,
    HostCommand,
    HostFailed,
    HostReady,
    HostStatus,
    LoadProgress,
    Notices,
    OpenStream,
    Refused,
    SetLanguage,
    StreamDone,
    StreamOpened,
    SwapModel,
    Updates,
)
from captioner.engine.recognizer import capabilities_of
from captioner.errors import StreamRefused, UserError, one_line
from captioner.events import FRAME_SAMPLES, SAMPLE_RATE_HZ, CaptionUpdate, FramedAudio
from captioner.heap import freeze_start_up

FAULT_ENV = "CAPTIONER_FAULT_INJECT"
STATUS_PERIOD_S = 0.25
"""How often a host reports its status; the report is also its heartbeat."""
MAX_QUEUED = 500
"""Chunks (about 10 s of one stream's 20 ms chunks; a batch counts each of its chunks) that may
wait for a child before the sender waits..."""
QUEUED_PER_STREAM = 20
"""...and this many more per open stream (:attr:`ProcessHost.streams_open`; 2 s of a network
client's 100 ms chunks). The child reads nothing while it works a model step, and a served
engine's worker that waited for it stopped taking its connections' audio: its inbox filled past
the half at which new connections are refused, and the server took no more
(benchmarks/results/serve/HISTORY.md, "Where the model's process spent its steps")."""
_RECEIVE_WAIT_S = 0.05
BACKLOG_STEP_S = 1.0
"""A stream's audio that may wait for a step on a host whose steps are spaced by
``STEP_SPACING_MAX_S`` (with fewer streams, as much less as its spacing is): a chunk that would
take it past this is stepped after the audio before it. So on a busy host a backlog (a re-feed
after a restart) is worked off, and its captions and the heartbeat sent, a second at a time,
while a live stream's few chunks between two steps (the spacing, a step's time, a network's
jitter) never come near it; with one or a few streams, a backlog is stepped chunk by chunk, its
checkpoints falling in its pauses as they would live.
(When every repeated chunk stepped the ones before it, a busy server made many small model
steps and its engine fell behind: benchmarks/results/serve/HISTORY.md, "A stream's chunks wait
for the step together".)"""
STEP_SPACING_MAX_S = 0.1
STEP_SPACING_PER_STREAM_S = 0.4e-3
"""With N streams a host's steps follow each other by at least min(100 ms, N x 0.4 ms)
(:meth:`HostCore.step_wait_s`): under a millisecond for one or two streams, from 250 streams the
engine's own 100 ms feed (``live.FEED_S``, the tick ``bench_capacity`` measures at). Every step
looks at every stream, pushes features and VAD, and starts a model step for whatever came due
since the last one: spaced more closely, a served engine's model steps were of a few rows, and
it fell further behind by the second (benchmarks/results/serve/HISTORY.md, "Where the model's
process spent its steps")."""
_PARENT_CHECK_S = 0.2


@dataclass(frozen=True)
class HostSpec:
    """What a host needs to make its captioner (pickled into a child process)."""

    model: str
    device: str | None
    language: str | None = None
    task: str = "transcribe"
    config: object = None
    recognizer_factory: object = None
    """``() -> (backend, recognizer)`` instead of loading ``model`` (picklable for a process)."""
    language_check: bool = False
    progress: object = None
    """``(message, fraction)`` callback of the model loading; a child process sends them instead."""
    generation: int = 0
    """0 for the first host of a session, 1 for its first replacement, ..."""
    fault: str = field(default_factory=lambda: os.environ.get(FAULT_ENV, ""))


@dataclass(frozen=True)
class HostInfo:
    """What the parent needs to know of a loaded host."""

    provider: str
    model: str
    device_name: str
    backend_name: str
    is_multilingual: bool
    language_errors: tuple[tuple[str, str], ...]
    """(code, why) for every language code this model refuses."""
    pid: int


def parse_fault(text: str) -> tuple[int, int] | None:
    """``"step:N"`` or ``"step:N,times:K"`` -> (N, K); empty -> None; anything else is a
    one-line ``UserError`` (a typo must not pass for a run without faults)."""
    text = text.strip()
    if not text:
        return None
    fields = dict(part.split(":", 1) for part in text.split(",") if ":" in part)
    try:
        step, times = int(fields["step"]), int(fields.get("times", "1"))
        if step < 1 or times < 1 or len(fields) != len(text.split(",")) or set(fields) - {"step", "times"}:
            raise ValueError
    except (KeyError, ValueError):
        raise UserError(f"{FAULT_ENV}={text!r}: use step:N or step:N,times:K (N, K >= 1)") from None
    return step, times


class _FaultingRecognizer:
    """The host's recognizer, with a device fault at its ``step``-th model step (host thread)."""

    def __init__(self, recognizer, backend, step: int) -> None:
        self._recognizer = recognizer
        self._backend = backend
        self._left = step

    def decode(self, requests):
        if requests:
            self._left -= 1
            if self._left == 0:
                self._backend.inject_fault()
        return self._recognizer.decode(requests)

    def __getattr__(self, name):
        return getattr(self._recognizer, name)


class HostCore:
    """One :class:`~captioner.engine.live.LiveCaptioner` and the message handling around it;
    called by one thread (the child process's main thread, or the worker thread inline)."""

    def __init__(self, spec: HostSpec) -> None:
        from captioner.engine.live import LiveCaptioner

        self.spec = spec
        backend = recognizer = None
        if spec.recognizer_factory is not None:
            backend, recognizer = spec.recognizer_factory()
        self.live = LiveCaptioner(spec.model, spec.device, language=spec.language, task=spec.task,
                                  config=spec.config, progress=spec.progress, recognizer=recognizer,
                                  backend=backend, language_check=spec.language_check)
        fault = parse_fault(spec.fault)
        if fault is not None and spec.generation < fault[1]:
            engine = self.live.engine
            engine.recognizer = _FaultingRecognizer(engine.recognizer, self.live.backend, fault[0])
        self._lead_in_s = self.live.engine.config.lead_in_s
        self._feed_s = self.live.feed_s  # the captioner's own; raised with many streams (``_work``)
        self._base: dict[str, tuple[int, int]] = {}  # label -> (base sample, segment base)
        self._checkpoint: dict[str, int] = {}
        self._history_sent: dict[str, int] = {}  # label -> its committed words when its history was sent
        self._unstepped: dict[str, int] = {}  # streams given audio since the last step -> its samples
        self._last_work_s = 0.0
        self._next_status_s = 0.0
        self.send_updates: Callable[[Event], None] | None = None
        """Where a step's :class:`Updates` go at the step's end, before the
        checkpoints and the status are worked out (a model process's pipe), instead of coming
        back with them."""

    def info(self) -> HostInfo:
        from captioner.languages import WHISPER_LANGUAGES

        recognizer = self.live.recognizer
        errors = []
        check = capabilities_of(recognizer).check_language
        for code in WHISPER_LANGUAGES:
            try:
                if check is not None:
                    check(code)
            except UserError as error:
                errors.append((code, one_line(error)))
        return HostInfo(self.live.provider, recognizer.name, recognizer.device_name,
                        self.live.backend.name, capabilities_of(recognizer).is_multilingual,
                        tuple(errors), os.getpid())

    def apply(self, message: HostCommand | FramedAudio, hand_out: Callable[[Event], None] | None = None) -> list[Event]:
        """One command (or :class:`FramedAudio`) from the parent; returns what goes back
        (updates of a model swap, or of the step it made due: ``hand_out`` as :meth:`step`'s)."""
        # Audio waits for the next step (the spacing, :meth:`step_due`), every stream's together:
        # many streams' features and VAD batched, and ``LiveCaptioner.step`` feeds each stream
        # 100 ms at a time with the model work between, so a pause inside a stream's waiting
        # audio is seen where it lies. What steps first:
        # - a chunk that takes its stream past ``BACKLOG_STEP_S`` of waiting audio (a backlog;
        #   with few streams, past a few ms: their steps follow the chunks);
        # - an open, only when its own label has audio waiting (a server at capacity is sent one
        #   for every retried connection it refuses, 100 a second);
        # - any other message but a close (the stream keeps its waiting audio ahead of its
        #   end, ``CaptionStream.finish``).
        audio = type(message) is FramedAudio
        if audio:
            room = BACKLOG_STEP_S * self._spacing_s() / STEP_SPACING_MAX_S * SAMPLE_RATE_HZ
            waiting = self._unstepped
            again = any(label in waiting and waiting[label] + n > room
                        for label, n in zip(message.streams, message.lengths))
        elif type(message) is OpenStream:
            again = message.label in self._unstepped
        else:
            again = type(message) is not CloseStream
        out = self._work(hand_out) if self._unstepped and again else []
        match message:
            case FramedAudio():
                for label, first, capture_ns, samples in message.pieces():
                    self._accept(label, first, capture_ns, samples)
            case OpenStream(label=label):
                try:
                    self.live.open_stream(label, message.language, readmit=message.readmit,
                                          priority=message.priority, history=message.history, source=message.source)
                except StreamRefused:  # at capacity: this stream only; the host goes on
                    return [*out, *self.live.take_lifecycle()]  # its Refused
                self._base[label] = (message.base_sample, message.segment_base)
                out = [*out, *self.live.take_lifecycle()]  # its StreamOpened
                # The engine's clock of a re-fed stream starts at 0 where the supervisor's stands at
                # ``base_sample``. A model does not care; a recognizer that answers by stream time
                # (the tests' scripted listener) is told.
                starts_at = capabilities_of(self.live.engine.recognizer).clock_starts_at
                if starts_at is not None:
                    starts_at(label, message.base_sample / SAMPLE_RATE_HZ)
            case CloseStream(label=label):
                stream = self.live.streams.get(label)
                if stream is not None:
                    stream.finish()
            case SetLanguage(language=language):
                self.live.set_language(language)
            case SwapModel(model=model):
                return out + self._updates(self.live.set_model(model))
            case _:
                raise TypeError(f"unknown host message {message!r}")
        return out

    def _accept(self, label: str, first: int, capture_ns: int, samples) -> None:
        stream = self.live.streams.get(label)
        if stream is not None:
            stream.accept_frames(first - self._base[label][0], capture_ns, samples)
            self._unstepped[label] = self._unstepped.get(label, 0) + len(samples)

    def _since_work_s(self) -> float:
        return time.monotonic() - self._last_work_s

    def _spacing_s(self) -> float:
        """The least time between two steps with the streams open now (:data:`STEP_SPACING_MAX_S`)."""
        return min(STEP_SPACING_MAX_S, STEP_SPACING_PER_STREAM_S * len(self.live.streams))

    def _work(self, hand_out: Callable[[Event], None] | None = None) -> list[Event]:
        stepped, self._unstepped = set(self._unstepped), {}
        self._last_work_s = time.monotonic()
        # A stream's chunks that came together (a step's spacing of audio, a network's jitter)
        # are fed in one tick: a second tick of the few such streams was a model step of a few rows.
        self.live.feed_s = max(self._feed_s, 2 * self._spacing_s())
        if hand_out is None:
            updates = self.live.step()
            out = self._updates(updates)
            if out and self.send_updates is not None:
                self.send_updates(out[0])
                out = []
        else:
            updates, out = [], []

            def tick_out(made: list[CaptionUpdate]) -> None:
                updates.extend(made)
                for message in self._updates(made):
                    hand_out(message)

            self.live.step(hand_out=tick_out)
        for event in self.live.take_lifecycle():  # the streams closed by this step
            out.append(event)
            if type(event) is StreamDone:
                self._base.pop(event.label, None)
                self._checkpoint.pop(event.label, None)
                self._history_sent.pop(event.label, None)
        # Only a stream given audio or an update can have come to a checkpoint.
        stepped.update(u.stream for u in updates)
        return out + self._checkpoints(stepped)

    def step_wait_s(self) -> float:
        """How long the audio taken since the last step may wait for the next one. A step's
        bookkeeping costs in proportion to the streams open, and a busy host whose inbox
        empties after every few chunks stepped hundreds of times a second (a thousand served
        streams: 65 steps a second where 10 would do); so with many streams the steps are spaced
        by up to ``STEP_SPACING_MAX_S``, with one or a few streams they follow the audio at once."""
        return max(0.0, self._spacing_s() - self._since_work_s())

    def step_due(self) -> bool:
        """Whether to step now: audio was taken and the spacing has passed, or nothing came for
        a while (a pause's close and the status go on without audio)."""
        if self._unstepped:
            return self.step_wait_s() == 0.0
        return self._since_work_s() >= _RECEIVE_WAIT_S

    @property
    def has_unstepped(self) -> bool:
        """Whether audio was taken since the last step."""
        return bool(self._unstepped)

    def step(self, hand_out: Callable[[Event], None] | None = None) -> list[Event]:
        """Run the model work that is due; updates, checkpoints, ended streams and (when due)
        the status go back. ``hand_out``: where each tick's :class:`Updates` go as
        soon as it is made (:meth:`~captioner.engine.live.LiveCaptioner.step`) instead of
        coming back with the rest."""
        return self._work(hand_out) + self.status_due()

    def status_due(self) -> list[Event]:
        """The status (and language notices), when a report is due: the host's heartbeat."""
        now_s = time.monotonic()
        if now_s < self._next_status_s:
            return []
        self._next_status_s = now_s + STATUS_PERIOD_S
        out: list[Event] = [HostStatus(self.live.status())]
        notices = self.live.notices()
        if notices:
            out.append(Notices(notices))
        return out

    def _updates(self, updates: list[CaptionUpdate]) -> list[Event]:
        if not updates:
            return []
        shifted = []
        for u in updates:
            base_sample, segment_base = self._base.get(u.stream, (0, 0))
            base_s = base_sample / SAMPLE_RATE_HZ
            # This engine's stream clock started at the supervisor's ``base_sample``.
            shifted.append(replace(u, start_s=u.start_s + base_s, end_s=u.end_s + base_s,
                                   emitted_audio_s=u.emitted_audio_s + base_s,
                                   emitted_wall_s=u.emitted_wall_s + base_s, segment=u.segment + segment_base,
                                   words=tuple((w, a + base_s, b + base_s) for w, a, b in u.words)))
        return [Updates(shifted)]

    def _checkpoints(self, names: set[str]) -> list[Event]:
        """A stream is at a checkpoint when the engine last saw it idle (no speech since its last
        update, nothing shown or committed in an open segment): its window then starts
        ``lead_in_s`` before the audio end, and a fresh engine given the audio from there on, and
        the committed words as its prompt history, works exactly as this one (the same windows
        and prompts, so the same words where the numbers agree). Only ``names`` are looked at."""
        out = []
        for view in self.live.engine.views(names=names):
            base = self._base.get(view.name)
            if base is None or view.speech_pending or view.pause_pending or view.segment_open \
                    or view.last_update_s != view.audio_end_s:
                continue
            start = int(max(0.0, view.audio_end_s - self._lead_in_s) * SAMPLE_RATE_HZ)
            sample = base[0] + start - start % FRAME_SAMPLES
            if sample > self._checkpoint.get(view.name, -1):
                self._checkpoint[view.name] = sample
                out.append(Checkpoint(view.name, sample, self._history(view.name)))
        return out

    def _history(self, label: str) -> tuple[str, ...] | None:
        """A checkpoint's prompt history, or ``None`` when the stream committed nothing since
        the last one sent: in a pause a stream reaches a checkpoint at every step, and with a
        thousand served streams 40 words each time would be most of what goes to the parent."""
        engine = self.live.engine
        committed = engine.committed_words(label)
        if self._history_sent.get(label) == committed:
            return None
        self._history_sent[label] = committed
        return engine.prompt_history(label)

    def close(self) -> list[Event]:
        return self._updates(self.live.close())


# -- in the worker thread --------------------------------------------------------------------------
_TAKEN_EARLY = (Updates, Checkpoint, StreamOpened, Refused, StreamDone, HostStatus, Notices)
"""The messages a supervisor takes the same way handed out at once as polled (``hand_out``)."""


class InlineHost:
    """The captioner on the calling (worker) thread: a failure is an exception, caught here and
    reported as :class:`HostFailed`; the supervisor then makes a fresh host. Every method is
    called by the worker thread."""

    kind = "inline"

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec
        self.failed: str | None = None
        self.core: HostCore | None = None
        self.info: HostInfo | None = None
        self.streams_open = 0  # as ProcessHost's; nothing queues here
        self._out: list[Event] = []
        self.hand_out: Callable[[Event], None] | None = None
        """Where a step's updates go as each tick ends, whether :meth:`poll` or :meth:`send`
        made it (the latest ``poll``'s): with few streams a host steps on taking a chunk, and
        kept until the next poll, those captions waited for every message the worker took
        after it (benchmarks/results/serve/HISTORY.md, "Captions handed out at once on the CPU")."""

    def start(self) -> None:
        try:
            self.core = HostCore(self.spec)
            self.info = self.core.info()
            self._out.append(HostReady(self.info))
        except UserError:
            raise
        except Exception as error:
            self._fail(error)

    def wait_ready(self, timeout_s: float) -> bool:
        return self.core is not None or self.failed is not None

    @property
    def ready(self) -> bool:
        return self.core is not None and self.failed is None

    def send(self, message: HostCommand | FramedAudio, wait: bool = True, chunks: int = 1) -> None:
        if self.failed is not None or self.core is None:
            return
        try:
            made = self.core.apply(message, self._hand_out_now())  # may hand out what waits in _out
            self._out += made
        except UserError:
            raise  # bad input or an unknown model: the caller's mistake, not a failed host
        except Exception as error:
            self._fail(error)

    def poll(self, hand_out: Callable[[Event], None] | None = None) -> list[Event]:
        """The messages since the last poll, after the model work that is due; ``hand_out``
        (see :meth:`HostCore.step`) gets each tick's updates while the step goes on."""
        if hand_out is not None:
            self.hand_out = hand_out
        if self.failed is None and self.core is not None:
            try:
                # Spaced as a child's steps are: the worker polls every millisecond or so.
                made = self.core.step(self._hand_out_now()) if self.core.step_due() else self.core.status_due()
                self._out += made  # after the step, which may have handed out what waited in _out
            except Exception as error:
                self._fail(error)
        out, self._out = self._out, []
        return out

    def _hand_out_now(self) -> Callable[[Event], None] | None:
        """Where a tick's updates go at once: :attr:`hand_out`, after the messages that still
        wait here for the next poll, which none may overtake. Captions made without it (a
        re-feed sent into a fresh host before its first poll) were overtaken once (seen in CI,
        tiny.en on a restarted host: the poll's step handed out "great sorrow of his life."
        while the re-feed's "It was the first" waited; the seam took the later words for new
        text, and the earlier ones were shown twice); so was a stream's ``StreamOpened`` by its
        first update."""
        hand_out = self.hand_out
        if hand_out is None:
            return None

        def now(message: Event) -> None:
            waiting = [m for m in self._out if type(m) in _TAKEN_EARLY]
            if waiting:
                self._out = [m for m in self._out if type(m) not in _TAKEN_EARLY]
                for earlier in waiting:
                    hand_out(earlier)
            hand_out(message)

        return now

    def _fail(self, error: BaseException) -> None:
        self.failed = one_line(error)
        self._out.append(HostFailed(self.failed))

    def check(self) -> str | None:
        return self.failed

    def close(self, timeout_s: float) -> list[Event]:
        """Commit what the streams show (the updates come back) and release the model."""
        if self.core is None or self.failed is not None:
            return []
        try:
            return self.core.close()
        except Exception as error:
            self._fail(error)
            return []

    def stop(self, wait: bool = True) -> None:
        """Drop the captioner. A failed one is not closed (that would run model work on it);
        only its language-check thread is stopped, which LiveCaptioner.close would do."""
        core, self.core = self.core, None
        check = getattr(core.live, "_language_check", None) if core is not None else None
        if check is not None:
            check.close(timeout_s=1.0)

    def reap(self, timeout_s: float) -> None:
        pass


# -- in a child process ----------------------------------------------------------------------------
def _watch_parent(parent_pid: int) -> None:
    """Ends the child when its parent is gone (a ``kill -9`` of the app leaves no orphan)."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(0)
        time.sleep(_PARENT_CHECK_S)


def _name_process(name: str) -> None:
    """The name ``ps``/``top`` show for this process (Linux; best effort)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except Exception:  # another system: the name is only for people looking
        pass


def _ignore_stop_signals() -> None:
    """The model process outlives a stop signal until its parent closes it (or, the parent gone,
    ``_watch_parent`` ends it; a hard stop is the parent's SIGKILL)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def child_main(inbox, outbox, spec: HostSpec, parent_pid: int) -> None:
    """The child process: makes a :class:`HostCore`, then applies the parent's messages and steps
    until :class:`CloseHost`. Ctrl-C reaches the whole process group, and a service manager's stop
    (systemd's SIGTERM to every process of the unit) the same: the parent decides when this
    process ends — a server drains its streams through it first — so both are ignored here
    (:func:`_ignore_stop_signals`)."""
    _ignore_stop_signals()
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="captioner-parent-watch", daemon=True).start()
    try:
        if spec.progress is not None:  # the parent's callback stayed there: tell it how loading goes
            spec = replace(spec, progress=lambda message, fraction: outbox.send(LoadProgress(str(message),
                                                                                         float(fraction))))
        core = HostCore(spec)
        core.send_updates = outbox.send  # at the step's end, after its (cheap) checkpoints
        freeze_start_up()  # the model and its runtime: no later collection walks them again
        outbox.send(HostReady(core.info()))
    except BaseException as error:
        outbox.send(HostFailed(one_line(error), isinstance(error, UserError)))
        os._exit(3)
    # A step's updates leave in one message at its end, dated then (HostCore.step without
    # hand_out), not tick by tick: sent as each tick ended, a thousand streams' captions reached
    # the hub sooner, but the engines fell further behind their audio
    # (benchmarks/results/serve/HISTORY.md, "handed out tick by tick").
    try:
        while True:
            wait_s = core.step_wait_s() if core.has_unstepped else _RECEIVE_WAIT_S
            if inbox.poll(wait_s):
                message = inbox.recv()
                if type(message) is CloseHost:
                    for item in [*core.close(), HostClosed()]:
                        outbox.send(item)
                    os._exit(0)
                # Sent as soon as made, message by message: a backlog re-fed after a restart
                # must not hold the captions, nor the heartbeat, until all of it is worked off.
                for item in core.apply(message) + core.status_due():
                    outbox.send(item)
                # Nothing more waiting and the step's spacing passed: the chunks taken are
                # stepped now (otherwise the next poll waits out the spacing for more).
                out = core.step() if not inbox.poll(0) and core.step_due() else []
            else:
                out = core.step()
            for item in out:
                outbox.send(item)
    except BaseException as error:  # a device fault, a failed step: the parent takes over
        try:
            outbox.send(HostFailed(one_line(error), isinstance(error, UserError)))
        finally:
            # No clean interpreter exit: a poisoned CUDA context can hang its own teardown.
            os._exit(3)


def main(argv: list[str] | None = None) -> None:
    """``python -m captioner.engine.host IN_FD OUT_FD PARENT_PID NAME``: the child's
    entry. A plain interpreter started this way (rather than multiprocessing's "spawn") does not
    run the parent's main script again, so a caller's script needs no ``__main__`` guard. The
    parent sends ``sys.path`` first (so the child imports what it imports, a test's recognizer
    too), then the :class:`HostSpec`."""
    import faulthandler
    import sys
    from multiprocessing.connection import Connection

    in_fd, out_fd, parent_pid, name = sys.argv[1:5] if argv is None else argv
    _name_process(name)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints where a hung worker is
    inbox, outbox = Connection(int(in_fd), writable=False), Connection(int(out_fd), readable=False)
    _ignore_stop_signals()
    try:
        paths = inbox.recv()
        sys.path[:] = [p for p in paths if p not in sys.path] + sys.path
        spec = inbox.recv()
    except (EOFError, OSError):
        os._exit(3)
    child_main(inbox, outbox, spec, int(parent_pid))


class ProcessHost:
    """A child process (``captioner-host-N``) running a :class:`HostCore`, and two named threads
    of the worker's process that move its messages: ``captioner-host-N-send`` (so the worker
    never blocks on a child that stopped reading) and ``captioner-host-N-recv``. Sends and polls
    are the worker thread's; a dead child shows as :class:`HostFailed` among the polled messages."""

    kind = "process"

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec
        self._progress = spec.progress
        self.name = f"captioner-host-{spec.generation}"
        self.failed: str | None = None
        self.info: HostInfo | None = None
        self.user_error: str | None = None
        self.last_heard_s = time.monotonic()
        self._patience_s = 60.0  # how long ``send`` waits on a child that says nothing
        self._incoming: queue.Queue[Event | None] = queue.Queue()  # None: the child's pipe closed
        self._outgoing: queue.Queue[tuple | None] = queue.Queue()  # (message, chunks of audio)
        self._put_chunks = 0
        self._sent_chunks = 0
        self.streams_open = 0  # set by the owner: the queue's bound grows with it
        self._ready = threading.Event()
        self._closed = threading.Event()
        self.process = None
        self.on_message: Callable[[], None] | None = None
        """Called on the receiving thread once a message waits for :meth:`poll`: the owner's
        thread may be asleep on its own inbox, and the captions in it would wait until that
        woke for other reasons, up to its status period (benchmarks/results/serve/HISTORY.md, "A model
        process's captions wake the worker")."""
        self.while_waiting: Callable[[], None] | None = None
        """Called on the sending thread while :meth:`send` waits for room: the owner takes what
        the child sent meanwhile (its captions need not wait for the child to read)."""

    def start(self) -> None:
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        child_in, to_child = os.pipe()
        from_child, child_out = os.pipe()
        spec = replace(self.spec, progress=True if self._progress is not None else None)
        command = [sys.executable, "-m", "captioner.engine.host", str(child_in), str(child_out),
                   str(os.getpid()), self.name]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            self.process = subprocess.Popen(command, pass_fds=(child_in, child_out), stdin=subprocess.DEVNULL,
                                            env=env)
        finally:
            # Our copies of the child's ends are closed: its death then reads as EOF here.
            os.close(child_in)
            os.close(child_out)
        inbox = Connection(to_child, readable=False)
        outbox_reader = Connection(from_child, writable=False)
        self._outgoing.put((list(sys.path), 0))
        self._outgoing.put((spec, 0))
        self._reader = threading.Thread(target=self._receive, args=(outbox_reader,), name=f"{self.name}-recv",
                                        daemon=True)
        self._writer = threading.Thread(target=self._transmit, args=(inbox,), name=f"{self.name}-send", daemon=True)
        self._reader.start()
        self._writer.start()

    def _receive(self, connection) -> None:
        while True:
            try:
                message = connection.recv()
            except (EOFError, OSError):
                self._incoming.put(None)
                self._ready.set()
                self._tell_owner()
                return
            self.last_heard_s = time.monotonic()
            match message:
                case LoadProgress():
                    if self._progress is not None:
                        self._progress(message.message, message.fraction)
                    continue
                case HostReady(info=info):
                    self.info = info
                    self._ready.set()
                case HostFailed():
                    if message.user_error:
                        self.user_error = message.reason
                    self._ready.set()
                case HostClosed():
                    self._closed.set()
            self._incoming.put(message)
            self._tell_owner()

    def _tell_owner(self) -> None:
        wake = self.on_message
        if wake is not None:
            wake()

    def _transmit(self, connection) -> None:
        while True:
            item = self._outgoing.get()
            if item is None:
                break
            message, chunks = item
            try:
                connection.send(message)
            except (OSError, ValueError):
                break  # the child is gone; the reader reports it
            self._sent_chunks += chunks
        connection.close()

    def wait_ready(self, timeout_s: float) -> bool:
        return self._ready.wait(timeout_s)

    @property
    def ready(self) -> bool:
        return self.info is not None and self.failed is None

    def send(self, message: HostCommand | FramedAudio, wait: bool = True, chunks: int = 1) -> None:
        """Queue ``message`` (``chunks`` of audio, for a batch) for the child. While more than
        :meth:`queue_limit` chunks wait, the caller waits too (a file replay then waits in its
        turn, as it does for a slow worker thread), unless ``wait`` is false (a re-feed, bounded
        by the ring); a host that failed meanwhile takes nothing more."""
        while wait and self._queued_chunks() >= self.queue_limit() and self.failed is None and self._alive():
            if self.while_waiting is not None:
                self.while_waiting()
            time.sleep(0.005)
        if self.failed is None:
            self._put_chunks += chunks
            self._outgoing.put((message, chunks))

    def queue_limit(self) -> int:
        """Chunks that may wait for the child before :meth:`send` waits."""
        return MAX_QUEUED + QUEUED_PER_STREAM * self.streams_open

    def _queued_chunks(self) -> int:
        # Two counters, each written by one thread (this one, the sender): no lock needed.
        return self._put_chunks - self._sent_chunks

    def _alive(self) -> bool:
        return self.process is not None and self.process.poll() is None and \
            time.monotonic() - self.last_heard_s < self._patience_s

    def poll(self, hand_out: Callable[[Event], None] | None = None) -> list[Event]:
        """The child's messages received so far. ``hand_out`` (:meth:`InlineHost.poll`'s) has
        nothing to do here: the child sends a step's updates at its end (see ``child_main``)."""
        out = []
        while True:
            try:
                message = self._incoming.get_nowait()
            except queue.Empty:
                return out
            if message is None:  # the child's pipe closed
                code = self.process.poll() if self.process is not None else None
                if self.failed is None and not self._closed.is_set():
                    self._fail(f"the worker process ended (exit status {code})")
                    out.append(HostFailed(self.failed))
                continue
            if type(message) is HostFailed:
                if self.failed is not None:
                    continue
                self._fail(message.reason)
            out.append(message)

    def check(self, heartbeat_timeout_s: float, load_timeout_s: float) -> str | None:
        """Why this host is to be given up, if it is: it failed, or it has not been heard from
        for too long (a hung model step, a frozen process)."""
        if self.failed is None:
            silent_s = time.monotonic() - self.last_heard_s
            self._patience_s = heartbeat_timeout_s
            limit_s = heartbeat_timeout_s if self.info is not None else load_timeout_s
            if silent_s > limit_s:
                self._fail(f"no word from the worker process for {silent_s:.1f} s")
        return self.failed

    def _fail(self, why: str) -> None:
        self.failed = why

    def close(self, timeout_s: float) -> list[Event]:
        """Ask the child to commit what its streams show and exit; the updates it sends before
        it exits come back (the others are polled as usual)."""
        if self.failed is not None or self.process is None:
            return []
        self.send(CloseHost())
        deadline_s = time.monotonic() + timeout_s
        out = []
        while time.monotonic() < deadline_s:
            out += self.poll()
            if self._closed.is_set():
                out += self.poll()
                break
            if self.failed is not None:
                break
            time.sleep(0.01)
        return out

    def stop(self, wait: bool = True) -> None:
        """Ends the child (killed if it does not exit at once) and joins both threads. With
        ``wait`` false (a failed child, at a restart) the kill is sent and the rest — a poisoned
        CUDA context can take a while to tear down — is left to :meth:`reap`."""
        self._outgoing.put(None)
        if self.process is not None and self.process.poll() is None:
            if self._closed.is_set():
                self._wait_exit(0.5)
            if self.process.poll() is None:
                self.process.kill()
        if wait:
            self.reap(5.0)

    def reap(self, timeout_s: float) -> None:
        """Waits for the child to be gone and for both threads to end."""
        self._wait_exit(timeout_s)
        if getattr(self, "_writer", None) is not None:
            self._writer.join(timeout_s)
            self._reader.join(timeout_s)

    def _wait_exit(self, timeout_s: float) -> None:
        import subprocess

        if self.process is not None:
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass


if __name__ == "__main__":
    # Run from the module under its own name: the values it pickles must name
    # captioner.engine.host, not __main__, for the parent to read them.
    from captioner.engine.host import main as _main

    _main()
