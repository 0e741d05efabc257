"""The server's one link to the engine: a :class:`~captioner.engine.pipeline.Pipeline` per device,
each connection a source of it.

The server drives the engine the way the desktop app and ``captioner listen`` do, through the
pipeline's worker and its typed messages (a connection's stream is opened with ``add_source``,
its audio arrives as ``RawChunk``\\ s in the worker's inbox, or with front-end processes as the
``FramedAudio`` they framed, ``remove_source`` commits and closes it), so whatever runs behind
the pipeline (a worker thread, a model process) serves the network clients too. This module is
all the server knows of the engine.

Threads: the asyncio loop thread calls :meth:`Lease.push`, :meth:`EngineLink.push_framed`,
:meth:`EngineLink.poll` and :meth:`EngineLink.least_loaded`; :meth:`EngineLink.open`,
:meth:`EngineLink.close` and :meth:`EngineLink.start`/``stop`` may block (a full inbox, a model
load) and run on other threads (``asyncio.to_thread``). The engine's work runs on each
pipeline's own worker thread.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from captioner.audio.ingest import pcm16_to_float32
from captioner.audio.source import RawChunk, SourceStats
from captioner.engine.messages import Refused, StreamDone, StreamOpened
from captioner.engine.recognizer import capabilities_of
from captioner.errors import StreamRefused, UserError, one_line
from captioner.events import CaptionUpdate, FramedAudio, PipelineStatus, TelemetrySample
from captioner.languages import WHISPER_LANGUAGES
from captioner.serve.engine_restart import EngineDown, Restarter, down_reason

BATCH_BY_QUEUE_DEPTH = ((300, 0.0), (1500, 0.5), (None, 1.0))
"""How much of a connection's audio is handed to the worker at once, by the depth of the
worker's inbox: each message as it came while the worker keeps up; under load, 0.5 s and then
1 s pieces, so a thousand connections' 100 ms messages do not become ten thousand inbox items
a second (the worker pays per item, and a full inbox drops audio)."""


RESCAN_S = 1.0
"""The pump looks at every lease at least this often even when the engine's status has not changed."""

INBOX_REFUSE_FILL = 0.5
"""A new connection is refused while the engine's inbox is at least this full."""

INBOX_REFUSE_WAIT_S = 1.0
"""...or while the oldest audio in it has waited this much longer than the worker's recent steps
took (front-ends' audio is one item per frame: an inbox far from full can hold seconds of every
connection's audio; a model on the worker's thread leaves its inbox for a whole step, seconds on
a CPU, and that is its pace, not a backlog)."""

DROP_HOLDOFF_S = 10.0
"""...or for this long after a connection's audio was dropped at a full inbox."""


SERVER_MAX_BATCH = 256
"""Most streams in one of a server's model steps: the batch the GPU capacity figures were
measured at (``bench_capacity --max-batch 256``, docs/capacity.md)."""
SERVER_INTERVAL_S = 1.0
"""A server's base update interval: it is sized for many streams, so updates come every 1 s (the
capacity figures of docs/capacity.md), not the desktop's 0.5 s on a GPU, which would halve the
streams one GPU holds."""


SERVER_POLICY = "localagreement"
"""A server's ``--policy auto``: the policy its capacity is measured with. AlignAtt times every
word of every window from the attention on the engine's thread, many times LocalAgreement's host
work per update, which one thread cannot give a thousand streams; ``serve --policy alignatt-gpu``
gives a few streams its better conversation captions (docs/decisions/005-server-policy.md)."""


def server_engine_config(speakers: str = "auto", gpu_memory_bytes: int | None = None, policy: str = "auto"):
    """The engine configuration every server pipeline runs with (``captioner serve``, the Ray
    replica): updates every :data:`SERVER_INTERVAL_S`, warmed up at start, speaker labels as
    ``serve --speakers`` says (``auto``: every stream but a client's microphone, docs/speakers.md),
    each engine's process held under ``serve --gpu-memory`` (``None``: the card's floor only),
    and the streaming policy ``serve --policy`` names (``auto``: :data:`SERVER_POLICY`)."""
    from captioner.engine.admission import AdmissionConfig  # noqa: PLC0415
    from captioner.engine.core import EngineConfig  # noqa: PLC0415 - the engine loads with the pipeline
    from captioner.engine.policy.config import PolicyConfig  # noqa: PLC0415
    from captioner.engine.scheduler import SchedulerConfig  # noqa: PLC0415
    from captioner.engine.speakers import SpeakerConfig, check_mode  # noqa: PLC0415

    # Warm: a server meets every batch shape before its first client, not under load. Up to
    # SERVER_MAX_BATCH streams a step: a thousand streams due once a second over ten ticks make
    # steps of about a hundred, which the desktop's 64 would cut short.
    return EngineConfig(scheduler=SchedulerConfig(base_interval_s=SERVER_INTERVAL_S, max_batch=SERVER_MAX_BATCH),
                        warm_up=True, speakers=SpeakerConfig(mode=check_mode(speakers)),
                        admission=AdmissionConfig(gpu_memory_bytes=gpu_memory_bytes),
                        policy=PolicyConfig(kind=SERVER_POLICY if policy == "auto" else policy))


def server_standby(engines_per_device: int) -> bool:
    """Whether a server's pipelines keep a loaded standby process (``Pipeline(standby=)``): only
    with one engine a device. Each standby is another copy of its engine's GPU memory, and with
    two engines and two standbys the VRAM floor refused streams early
    (benchmarks/results/serve/HISTORY.md, "two engines on one GPU"); with several engines a failed one
    reloads while the others serve."""
    return engines_per_device == 1


def batch_s_for(queue_depth: int) -> float:
    for limit, batch_s in BATCH_BY_QUEUE_DEPTH:
        if limit is None or queue_depth < limit:
            return batch_s
    return BATCH_BY_QUEUE_DEPTH[-1][1]


class NetworkSource:
    """One connection's audio as an engine source: int16 PCM received on the loop thread becomes
    ``RawChunk``\\ s put into the worker's inbox without waiting (``live``: a full inbox drops the
    chunk and counts it, the engine fills the gap with silence, the loop never blocks).
    ``batch_samples`` (set by the link from the inbox's depth) joins messages into bigger chunks."""

    live = True
    origin = "remote"
    """What the client's audio is: ``remote`` (a server's client that did not say: ``speakers="auto"``
    labels its speakers), or what it said with ``source=`` (``microphone``: not labelled under
    ``auto``; ``meeting``, ``file``), docs/speakers.md."""

    def __init__(self, stream: str, rate_hz: int, on_drop: Callable[[], None] | None = None,
                 origin: str = "remote") -> None:
        self.stream = stream
        self.rate_hz = rate_hz
        self.origin = origin
        self.batch_samples = 0
        self._on_drop = on_drop  # told (loop thread) when a chunk found the inbox full
        self._sink = None
        self._lock = threading.Lock()  # push (loop thread) against stop (a helper thread)
        self._next_sample = 0
        self._dropped = 0
        self._pending: list = []  # int16 bytes as received (converted once per chunk, in _flush), or float32 arrays
        self._pending_samples = 0

    def start(self, sink) -> None:
        with self._lock:
            self._sink = sink

    def stop(self) -> None:
        """Hands over what is held, then no chunk of this source reaches the inbox any more (the
        stream's close goes after them: audio after a stream's end would be refused)."""
        with self._lock:
            if self._sink is not None:
                self._flush(time.monotonic_ns())
            self._sink = None

    @property
    def exhausted(self) -> bool:
        return False

    def stats(self) -> SourceStats:
        return SourceStats(delivered_samples=self._next_sample, dropped_blocks=self._dropped)

    def push(self, pcm: bytes, capture_ns: int) -> bool:
        """Loop thread: hands ``pcm`` (whole little-endian int16 samples) to the worker, or holds
        it until ``batch_samples`` are there; False when it was dropped (a full inbox) or the
        source is stopped."""
        with self._lock:
            if self._sink is None:
                return False
            self._pending.append(pcm)
            self._pending_samples += len(pcm) >> 1
            if self._pending_samples < self.batch_samples:
                return True
            return self._flush(capture_ns)

    def push_samples(self, samples: np.ndarray, capture_ns: int) -> bool:
        """Like :meth:`push`, for float32 samples (``bench_serve``'s in-process baseline feeds the
        engine so; a served connection's audio comes as int16, or framed by a front-end)."""
        with self._lock:
            if self._sink is None:
                return False
            self._pending.append(samples)
            self._pending_samples += samples.shape[0]
            if self._pending_samples < self.batch_samples:
                return True
            return self._flush(capture_ns)

    @property
    def taking(self) -> bool:
        """Whether its audio still goes to the engine (started, not stopped)."""
        return self._sink is not None

    def note_framed(self, n_samples: int, taken: bool) -> None:
        """Hub loop thread: ``n_samples`` of this connection's audio went to the worker framed,
        with others' (:meth:`EngineLink.push_framed`), or were dropped with them at a full inbox.
        Framed audio is at 16 kHz whatever the client sends, so for such a connection
        ``delivered_samples`` counts 16 kHz samples."""
        self._next_sample += n_samples
        if not taken:
            self._dropped += 1

    def _flush(self, capture_ns: int) -> bool:
        """With the lock held: what is pending as one chunk into the inbox. The int16 -> float32
        conversion is one NumPy call per chunk (each call on the loop thread may hand the GIL to
        the worker), and a batch of messages is joined as bytes before it. A front-end's float32
        pieces (:meth:`push_samples`) are joined as arrays."""
        if not self._pending:
            return True
        first = self._pending[0]
        if isinstance(first, np.ndarray):
            samples = first if len(self._pending) == 1 else np.concatenate(self._pending)
        else:
            pcm = first if len(self._pending) == 1 else b"".join(self._pending)
            samples = pcm16_to_float32(pcm)
        self._pending, self._pending_samples = [], 0
        chunk = RawChunk(self.stream, self.rate_hz, self._next_sample, capture_ns, samples)
        self._next_sample += samples.shape[0]
        taken = self._sink(chunk)
        if not taken:
            self._dropped += 1
            if self._on_drop is not None:
                self._on_drop()
        return taken


ENDED_STATES = frozenset({"done", "refused", "failed"})
"""A lease's last states: the engine no longer holds its stream, and its callback is let go."""


@dataclass(eq=False)
class Lease:
    """One connection's stream on one engine. ``label`` is the client's, ``key`` the engine's
    (unique on the server). ``state`` goes opening -> open (the engine opened the stream) ->
    closing (its end was sent) -> done (the engine closed it: every final was drained before),
    or to ``refused``/``failed`` with ``reason``."""

    label: str
    key: str
    language: str | None
    source: NetworkSource
    worker: DeviceEngine
    state: str = "opening"
    reason: str = ""
    on_change: Callable[[Lease], None] | None = None
    opened_s: float = field(default_factory=time.monotonic)

    @property
    def live(self) -> bool:
        """Whether its connection is told the engine's status: the engine has opened its stream
        (once it closes it, the lease is done and its connection closes; a status told then
        would say "no streams" to a connection still open)."""
        return self.state in ("open", "closing")

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    def push(self, pcm: bytes, capture_ns: int | None = None) -> bool:
        """Loop thread: ``capture_ns`` is when it was received (default: now)."""
        return self.source.push(pcm, time.monotonic_ns() if capture_ns is None else capture_ns)

    def _set(self, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason
        if self.on_change is not None:
            self.on_change(self)


class DeviceEngine:
    """One device: its pipeline, its telemetry and the leases on it."""

    def __init__(self, device: str | None, index: int, make_pipeline: Callable[[str | None], object],
                 make_sampler: Callable[[str | None], object] | None) -> None:
        self.device = device
        self.index = index
        self.make_pipeline = make_pipeline
        self.pipeline = make_pipeline(device)
        self.sampler = make_sampler(device) if make_sampler is not None else None
        self.leases: dict[str, Lease] = {}
        self.failed = ""
        """Why the engine's pipeline failed ("" while it runs); set until a fresh one replaces it."""
        self.restart_error = ""
        """Why the last try to start a fresh pipeline failed ("" when none did)."""
        self.replacement: tuple | None = None
        """``(pipeline, seconds)``: a fresh pipeline started in the failed one's place, for
        :meth:`EngineLink.poll` to adopt (set by the :class:`~captioner.serve.engine_restart.Restarter`)."""
        self.restarts = 0
        self.last_drop_s: float | None = None
        """``time.monotonic()`` when a connection's audio last found this engine's inbox full."""
        self.scanned: PipelineStatus | None = None
        """The status the connections' batch sizes were last worked out from (:meth:`EngineLink.poll`)."""
        self.scanned_s = 0.0

    @property
    def name(self) -> str:
        """How the log names it: its index and device."""
        return f"{self.index} ({self.device or 'auto'})"

    def note_drop(self) -> None:
        self.last_drop_s = time.monotonic()

    def input_pressure(self, holdoff_s: float) -> str:
        """Why this engine takes no new stream now ("" when it may): its inbox is over
        :data:`INBOX_REFUSE_FILL` full, or audio was dropped within ``holdoff_s``. The model's
        admission sees steps, not the audio waiting for the worker; past what one process can take
        in (docs/serve.md, "Measured"), every stream would lose audio, so the new one is refused
        instead."""
        fill = self.pipeline.inbox_fill
        if fill >= INBOX_REFUSE_FILL:
            return (f"the server is taking in all the audio it can: its engine's input queue is "
                    f"{100 * fill:.0f}% full; try again in a few seconds")
        wait_s = self.pipeline.inbox_wait_s
        if wait_s - self.pipeline.worker_away_s >= INBOX_REFUSE_WAIT_S:
            return (f"the server is taking in all the audio it can: its engine takes its audio in "
                    f"{wait_s:.1f} s late; try again in a few seconds")
        if self.last_drop_s is not None and time.monotonic() - self.last_drop_s < holdoff_s:
            return (f"the server dropped audio {time.monotonic() - self.last_drop_s:.0f} s ago: it takes no "
                    "new stream until it keeps up; try again in a few seconds")
        return ""

    def status(self) -> PipelineStatus | None:
        return self.pipeline.latest_status()

    def scanned_status(self) -> PipelineStatus | None:
        """The status read before the last lifecycle events were drained (the newest one before
        the first :meth:`EngineLink.poll`). A status message told from a newer one could say a
        stream had ended to the connection whose stream it is, before that connection was told
        its stream is done and closed."""
        return self.scanned if self.scanned is not None else self.status()

    def telemetry(self) -> TelemetrySample | None:
        return self.sampler.latest() if self.sampler is not None else None


class CaptionBell:
    """Wakes a server loop's pump when an engine has caption updates, instead of the pump finding
    them on its next round: a round every 20 ms held each caption up to 20 ms on its way out
    (benchmarks/results/serve/HISTORY.md, "Three engines on one GPU with MPS"). The pump still goes
    round when nothing rings, for the streams' states. One ring per wake: the engines' threads ring as
    often as they step, the loop hears it once until the pump has looked."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()
        self._rung = False
        self._rung_ns = 0
        self.heard_ns = 0
        """When the ring that the last :meth:`wait` heard came (``time.monotonic_ns``; 0: it ran
        out instead): when the oldest update the pump drains next reached its outbox."""

    def ring(self) -> None:
        """Any thread: updates are waiting."""
        if self._rung:
            return
        self._rung_ns = time.monotonic_ns()
        self._rung = True
        try:
            self._loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:  # the loop is closed: the server is going, nobody to wake
            pass

    async def wait(self, timeout_s: float) -> None:
        """Loop thread: until a ring, or ``timeout_s``. Updates that come after this returns ring
        again; those before it are in the outboxes the pump drains next."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
        self._event.clear()
        self.heard_ns = self._rung_ns if self._rung else 0
        self._rung = False


class EngineLink:
    """The engines behind the server: one worker (pipeline) per device in ``devices``.

    ``make_pipeline(device)`` builds an unstarted pipeline with no sources (the command passes
    ``Pipeline`` with its model, language and config); ``make_sampler(device)`` a started-later
    telemetry sampler for that device's GPU (``None``: no telemetry). The engine admits streams
    by measurement and refuses what does not fit (:class:`StreamRefused`, reported by the worker);
    ``max_streams_per_device`` is an operator's cap on top of that."""

    def __init__(self, devices: list[str | None], make_pipeline: Callable[[str | None], object],
                 make_sampler: Callable[[str | None], object] | None = None,
                 max_streams_per_device: int | None = None, drop_holdoff_s: float = DROP_HOLDOFF_S) -> None:
        if not devices:
            raise UserError("no device to serve from")
        self.max_streams_per_device = max_streams_per_device
        self.drop_holdoff_s = drop_holdoff_s
        self.workers = [DeviceEngine(d, i, make_pipeline, make_sampler) for i, d in enumerate(devices)]
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # leases change on the loop thread and in open()
        self._ring: Callable[[], None] | None = None
        self._stopped = threading.Event()
        self._notes: deque[str] = deque(maxlen=100)

    def take_notes(self) -> list[str]:
        """Lines for the server's log since the last call (an engine failed, was restarted, could
        not be restarted); the server's loop takes them each round (any thread adds them)."""
        notes = []
        while self._notes:
            notes.append(self._notes.popleft())
        return notes

    def _note(self, line: str) -> None:
        self._notes.append(line)

    # -- lifecycle (any thread but the loop's) -----------------------------------------------------
    def start(self) -> None:
        """Loads the model on every device (in each worker thread); raises ``UserError``."""
        started = []
        try:
            for worker in self.workers:
                if worker.sampler is not None:
                    worker.sampler.start()
                worker.pipeline.start()
                started.append(worker)
        except BaseException:
            for worker in started:
                worker.pipeline.stop()
            for worker in self.workers:
                if worker.sampler is not None:
                    worker.sampler.stop()
            raise

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stopped.set()  # an engine being restarted is not handed over any more
        for worker in self.workers:
            worker.pipeline.stop(timeout_s)
            replacement, worker.replacement = worker.replacement, None
            if replacement is not None:
                replacement[0].stop(timeout_s)
            if worker.sampler is not None:
                worker.sampler.stop()

    @property
    def model(self) -> str:
        status = self.workers[0].status()
        return status.model if status is not None else str(getattr(self.workers[0].pipeline, "model", ""))

    # -- streams -------------------------------------------------------------------------------------
    def least_loaded(self) -> DeviceEngine:
        """The worker for a new stream: the one holding the fewest streams (its status's
        real-time factor breaks ties), among those that have not failed."""
        alive = [w for w in self.workers if not w.failed] or self.workers

        def load(worker: DeviceEngine) -> tuple[int, float]:
            status = worker.status()
            rtf = status.real_time_factor if status is not None and status.real_time_factor is not None else 0.0
            return len(worker.leases), rtf
        return min(alive, key=load)

    def readiness(self) -> str:
        """"" while a new stream would be taken now, else why not (one line; ``/readyz``): every
        engine failed, or each one left is full (``--max-streams``) or cannot take in the audio it
        already has. The engine's own admission (GPU memory, step time) still decides each stream."""
        alive = [w for w in self.workers if not w.failed]
        if not alive:
            return down_reason(self.workers[0].restart_error)
        reasons = []
        for worker in alive:
            limit = self.max_streams_per_device
            reason = (f"the server is full: it takes {limit} stream{'s' if limit != 1 else ''} per device "
                      "(--max-streams)" if limit is not None and len(worker.leases) >= limit
                      else worker.input_pressure(self.drop_holdoff_s))
            if not reason:
                return ""
            reasons.append(reason)
        return reasons[0]

    def open(self, label: str, language: str | None, rate_hz: int,
             on_change: Callable[[Lease], None] | None = None, source: str = "remote") -> Lease:
        """A new stream for a connection (blocks while the inbox is full: not on the loop thread).
        ``source``: what the client said its audio is (``protocol.StreamParams.source``), the
        stream's origin in the engine (whether ``speakers="auto"`` labels it).
        Raises :class:`StreamRefused` when the engine has no room (:class:`EngineDown` while it
        is being restarted), ``UserError`` for a language the model lacks."""
        with self._lock:
            worker = self.least_loaded()
            if worker.failed:
                raise EngineDown(down_reason(worker.restart_error))
            limit = self.max_streams_per_device
            if limit is not None and len(worker.leases) >= limit:
                raise StreamRefused(f"the server is full: it takes {limit} stream{'s' if limit != 1 else ''} "
                                    f"per device (--max-streams)")
            pressure = worker.input_pressure(self.drop_holdoff_s)
            if pressure:
                raise StreamRefused(pressure)
            key = f"{label}#{next(self._ids)}"
            lease = Lease(label, key, self._checked_language(worker, language),
                          NetworkSource(key, rate_hz, on_drop=worker.note_drop, origin=source), worker,
                          on_change=on_change)
            worker.leases[key] = lease
        try:
            worker.pipeline.add_source(lease.source, language=lease.language)
        except BaseException:
            with self._lock:
                worker.leases.pop(key, None)
            raise
        return lease

    @staticmethod
    def _checked_language(worker: DeviceEngine, language: str | None) -> str | None:
        """``language`` as the engine takes it, checked against what the model has before the
        stream reaches the engine (``UserError``: 1008 for this connection only)."""
        if language is None:
            return None
        if language not in WHISPER_LANGUAGES:  # no model's tokenizer has it (the protocol refuses it first)
            raise UserError(f"unknown language {language!r}: use a Whisper language code such as 'en' or 'de', or 'auto'")
        live = getattr(worker.pipeline, "captioner", None)
        check = capabilities_of(getattr(live, "recognizer", None)).check_language
        return check(language) if check is not None else language  # UserError when the model lacks it

    @staticmethod
    def push_framed(worker: DeviceEngine, pieces: list[tuple[Lease, int, int, int, int]], samples: np.ndarray) -> None:
        """Hub loop thread (``--frontends``): several connections' audio, already whole 16 kHz
        frames, into ``worker``'s inbox as one item; ``pieces``: ``(lease, first sample, capture_ns,
        offset in samples, samples)`` each. Never waits: a full inbox drops it (counted per
        connection; the engine fills the gap with silence). A connection that was stopped
        meanwhile is left out (a stream's audio never follows its close)."""
        pieces = [piece for piece in pieces if piece[0].source.taking]
        if not pieces:
            return
        leases, firsts, stamps, offsets, lengths = zip(*pieces)
        # The pieces are in order and apart: as long as the frame, they are all of it.
        if sum(lengths) != samples.shape[0]:  # more than one engine, or a connection left out
            samples = np.concatenate([samples[o:o + n] for o, n in zip(offsets, lengths)])
        item = FramedAudio(tuple(lease.key for lease in leases), firsts, stamps, lengths, samples)
        taken = worker.pipeline.push_framed(item)
        for lease, n_samples in zip(leases, lengths):
            lease.source.note_framed(n_samples, taken)
        if not taken:
            worker.note_drop()

    def close(self, lease: Lease) -> None:
        """The connection's audio has ended (or the connection is gone): what its stream shows
        is committed (blocks while the inbox is full: not on the loop thread). The lease turns
        ``done`` in :meth:`poll` once the engine no longer lists the stream."""
        if lease.state == "closing" or lease.ended:
            return
        lease.state = "closing"
        lease.worker.pipeline.remove_source(lease.key)

    # -- the loop's pump ----------------------------------------------------------------------------
    def ring_on_captions(self, ring: Callable[[], None]) -> None:
        """``ring`` is called, on an engine's thread, whenever that engine has caption updates
        for :meth:`poll` (:class:`CaptionBell`); a restarted engine's too."""
        self._ring = ring
        for worker in self.workers:
            worker.pipeline.on_captions = ring

    def poll(self) -> list[tuple[Lease, CaptionUpdate]]:
        """Loop thread, a few dozen times a second: the caption updates made since the last call,
        each with its lease (the update as the engine made it: its ``stream`` is the lease's key,
        :func:`relabelled` gives the client's label). The leases' states follow the engine's
        lifecycle events, which come in order with the updates: opened, refused, done after the
        stream's last update (their ``on_change`` is called)."""
        out: list[tuple[Lease, CaptionUpdate]] = []
        for worker in self.workers:
            if worker.replacement is not None:
                self._adopt(worker)
            pipeline = worker.pipeline
            # The status before the events: the one told to connections is never newer than
            # what was drained (a newer one could leave out a stream whose done is still to come).
            status = pipeline.latest_status()
            error = pipeline.error
            leases = worker.leases
            for item in pipeline.drain():
                if type(item) is CaptionUpdate:
                    lease = leases.get(item.stream)
                    if lease is not None:
                        out.append((lease, item))
                    continue
                lease = leases.get(item.label)
                if lease is None:
                    continue
                match item:
                    case StreamOpened():
                        if lease.state == "opening":
                            lease._set("open")
                    case Refused(reason=reason):
                        self._end(lease, "refused", reason)
                    case StreamDone():
                        self._end(lease, "done")
            if error is not None and not worker.failed:
                self._failed(worker, one_line(error))
            if worker.failed:
                for lease in list(leases.values()):
                    lease.source.stop()  # its audio no longer goes to the failed engine's inbox
                    self._end(lease, "failed", "the engine failed under the stream; connect again")
            # The connections' batch sizes follow the engine's queue, which changes a few times a
            # second: the leases are looked at when the status did (and once a second regardless),
            # not 50 times a second each.
            now_s = time.monotonic()
            if worker.scanned is status and now_s - worker.scanned_s < RESCAN_S:
                continue
            worker.scanned, worker.scanned_s = status, now_s
            batch_s = batch_s_for(status.queue_depth if status is not None else 0)
            for lease in leases.values():
                lease.source.batch_samples = int(batch_s * lease.source.rate_hz)
        return out

    def _failed(self, worker: DeviceEngine, why: str) -> None:
        """Loop thread: the engine's worker ended with ``why``. No new stream goes to it from now
        (set under the lock :meth:`open` checks it in); its streams end (1011) in this poll, and
        a fresh engine is started in its place, off the loop."""
        with self._lock:
            worker.failed = why
        self._note(f"engine {worker.name} failed: {why}; its {len(worker.leases)} stream(s) end, "
                   "a fresh engine is being started")
        Restarter(worker, self._note, self._stopped).start()

    def _adopt(self, worker: DeviceEngine) -> None:
        """Loop thread: the fresh engine takes the failed one's place."""
        fresh, took_s = worker.replacement
        worker.replacement = None
        if self._ring is not None:
            fresh.on_captions = self._ring
        with self._lock:
            worker.pipeline = fresh
            worker.failed = worker.restart_error = ""
            worker.scanned, worker.last_drop_s = None, None
        worker.restarts += 1
        self._note(f"engine {worker.name} restarted in {took_s:.1f} s: it takes new streams again")

    def _end(self, lease: Lease, state: str, reason: str = "") -> None:
        with self._lock:
            lease.worker.leases.pop(lease.key, None)
        lease._set(state, reason)
        # Its last call: the callback holds the connection, which holds the lease. Let go, the
        # three (and the source) are freed as the connection closes, not left as a cycle for
        # the serving process's next full collection to find (19 objects a connection).
        lease.on_change = None

    def streams(self) -> int:
        return sum(len(w.leases) for w in self.workers)


def export_metrics(metrics, link: EngineLink) -> None:
    """Every engine's newest status, whether it is up, and its GPU's newest telemetry to the
    Prometheus exporter (``--metrics-port``); with several engines each is named by its index (the
    ``engine`` label)."""
    named = len(link.workers) > 1
    update_engine = getattr(metrics, "update_engine", None)
    for worker in link.workers:
        status, sample = worker.status(), worker.telemetry()
        if update_engine is not None:
            update_engine(not worker.failed, worker.restarts, engine=str(worker.index) if named else "")
        if status is not None:
            metrics.update_status(status, engine=str(worker.index) if named else "")
        if sample is not None:
            metrics.update_telemetry(sample)


def relabelled(update: CaptionUpdate, label: str) -> CaptionUpdate:
    """``update`` as of the stream the client named ``label`` (:meth:`EngineLink.poll` hands out
    the engine's own, whose ``stream`` is the lease's key: a copy per caption, at a thousand
    streams, is made only where the label is written, as in a transcript)."""
    return replace(update, stream=label)


def status_fields(worker: DeviceEngine, connections: int) -> dict:
    """The ``status`` message's fields for connections on ``worker``: the engine's status and
    the GPU's telemetry as the app's dashboard shows them (``null`` where not measured)."""
    status = worker.scanned_status()
    sample = worker.telemetry()
    fields: dict = {
        "time_s": round(time.time(), 3),
        "device": worker.device or "auto",
        "connections": connections,
        "streams": len(status.streams) if status is not None else 0,
    }
    if status is not None:
        fields.update({
            "model": status.model, "provider": status.provider, "device_name": status.device_name,
            "step_latency_ms": _round(status.step_latency_ms), "frame_latency_ms": _round(status.frame_latency_ms),
            "caption_latency_s": _round(status.caption_latency_s), "lag_s": _round(status.lag_s),
            "real_time_factor": _round(status.real_time_factor), "batch_size": status.batch_size,
            "dropped_frames": status.dropped_frames, "queue_depth": status.queue_depth, "state": status.state,
        })
    gpu_fields = ("gpu_index", "gpu_name", "temperature_c", "slowdown_temp_c", "power_w", "power_limit_w",
                  "sm_clock_mhz", "mem_clock_mhz", "utilization_pct", "vram_used_bytes", "vram_total_bytes",
                  "vram_process_bytes", "cpu_pct", "process_cpu_pct")
    fields["gpu"] = {name: _round(getattr(sample, name, None)) for name in gpu_fields}
    return fields


def _round(value):
    return round(value, 3) if isinstance(value, float) else value


def telemetry_from_status(fields: dict, time_s: float) -> TelemetrySample:
    """A ``status`` message's GPU readings as a :class:`TelemetrySample` (what the dashboard
    plots), stamped ``time_s`` on the receiver's clock."""
    gpu = fields.get("gpu") or {}
    known = TelemetrySample.__dataclass_fields__
    return TelemetrySample(time_s=time_s, **{k: v for k, v in gpu.items() if k in known and k != "time_s"})
