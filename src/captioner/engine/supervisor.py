"""Hot restart: a captioner whose model runs in a host that may fail, and is replaced when it does.

:class:`SupervisedCaptioner` stands in for a :class:`~captioner.engine.live.LiveCaptioner`
inside the :class:`~captioner.engine.worker.Worker` thread (same methods: ``open_stream``,
``streams``, ``step``, ``status``, ``close``, ...), so the worker, its inbox and its outbox stay
as they are for the pipeline and the server. The model itself runs in a host
(:mod:`captioner.engine.host`): a child process on a GPU, whose CUDA context a sticky
error (an illegal memory access) poisons for good, or the worker thread itself on the CPU.

What it does, all on the worker thread:

- **keeps each stream's audio since its last checkpoint.** Audio is resampled and framed here
  (16 kHz whole frames on the stream's clock) and kept in a ring, then sent to the host. The
  host reports a checkpoint whenever a stream has nothing open (a pause: everything it showed is
  committed): audio before it is dropped from the ring, which is bounded (``replay_s``, 30 s).
  With it comes the stream's prompt history (its last committed words), kept here too.
- **notices a failure**: an exception in the model step or a device fault (the host says so),
  a child process that died, or one not heard from for ``heartbeat_timeout_s``.
- **restarts**: the failed host is killed and a fresh one takes over — on a GPU the standby
  process, loaded while the first one ran, so a restart waits for no model load. Each stream is
  opened again at its checkpoint (its clock continues: caption times go on where they were),
  prompted by the words committed before it (as the failed host's next window would have
  been), and its ring is re-fed. Text the failed host committed after the checkpoint is heard again by the
  new host; :class:`_Seam` drops it, so no final is shown twice and none is lost.
- **falls back to the CPU** after ``max_failures`` failures within ``failure_window_s``, and
  says so: in the status message (the app's banner), in :meth:`worker_notices` (a line of
  ``listen``) and in ``PipelineStatus.worker_restarts``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from captioner.audio.channels import channels_last
from captioner.audio.ingest import StreamIngest
from captioner.engine.admission import parse_priority
from captioner.engine.host import HostInfo, HostSpec, InlineHost, ProcessHost
from captioner.engine.messages import (
    Checkpoint,
    CloseStream,
    Event,
    HostCommand,
    HostFailed,
    HostStatus,
    Lifecycle,
    LifecycleLog,
    Notices,
    OpenStream,
    Refused,
    SetLanguage,
    StreamDone,
    StreamOpened,
    SwapModel,
    Updates,
)
from captioner.engine.policy.words import normalize_word
from captioner.errors import UserError
from captioner.events import SAMPLE_RATE_HZ, CaptionUpdate, FramedAudio, PipelineStatus
from captioner.languages import language_code

REPLAY_S = 30.0
"""Most audio kept per stream for a re-feed. A stream that speaks on for longer without a pause
(a checkpoint) loses, at a restart, what it showed but had not committed before this."""
HEARTBEAT_TIMEOUT_S = 10.0
"""A GPU host not heard from for this long is hung (its model steps take milliseconds)."""
CPU_HEARTBEAT_TIMEOUT_S = 60.0
"""The same for a CPU host in a process: a small CPU under load takes seconds for one step of
tiny.en (docs/decisions/003-waits-and-bounds.md; a CPU process cannot be poisoned, only slow)."""
LOAD_TIMEOUT_S = 300.0
MAX_FAILURES = 3
FAILURE_WINDOW_S = 60.0
RESTART_NOTE_S = 10.0
"""How long the status message says that the worker was restarted."""
CLOSE_TIMEOUT_S = 60.0
HISTORY_WORDS = 64
"""Most committed words kept as a stream's prompt history when no host said what it is (the
policy's prompt takes its last ``prompt_words``, 40)."""
MAX_BATCH_CHUNKS = 256
"""Most chunks sent to the host in one message (a worker step takes at most 200 inbox items)."""


class _RecognizerInfo:
    """What the pipeline asks of a recognizer it cannot reach (it lives in the host)."""

    def __init__(self, info: HostInfo) -> None:
        self.name = info.model
        self.provider = info.provider
        self.device_name = info.device_name
        self.is_multilingual = info.is_multilingual
        self._errors = dict(info.language_errors)

    def check_language(self, language: str | None) -> str | None:
        code = language_code(language)
        if code is None or (not self.is_multilingual and code == "en"):
            return None
        if code in self._errors:
            raise UserError(self._errors[code])
        return code


class _Seam:
    """The words a failed host committed after its successor's starting point. The successor
    hears them again: the first of its captions that repeat them lose those words (worker
    thread). Words are compared as a reader would (:func:`normalize_word`); a committed word
    the new host does not hear again, or one it hears in addition, is stepped over; text that
    does not follow the committed words at all ends the seam (it is new).

    The committed words may span several of the failed host's segments (audio that came in
    bursts, or a host behind its audio, closes a segment with the next one's speech already in:
    no checkpoint falls between them), and the successor hears them as as many segments of its
    own: a caption after ``last_segment`` is new."""

    def __init__(self, words: list[str], last_segment: int) -> None:
        self.keys = [k for k in (normalize_word(w) for w in words) if k]
        self.last_segment = last_segment

    @property
    def open(self) -> bool:
        return bool(self.keys)

    def _match(self, words: list[str]) -> tuple[int, int, bool]:
        """(words of ``words`` that repeat committed ones, committed words they cover, whether
        they diverge)."""
        keys = self.keys
        i = j = 0
        while i < len(words) and j < len(keys):
            key = normalize_word(words[i])
            if not key:
                i += 1
            elif _same(key, keys[j]):
                i, j = i + 1, j + 1
            elif key in keys[j + 1:j + 3]:
                j = keys.index(key, j + 1)  # committed words not heard again
            elif i + 1 < len(words) and _same(normalize_word(words[i + 1]), keys[j]):
                i += 1  # a word heard in addition, inside the repeated text
            else:
                return i, j, True
        return i, j, False

    def final(self, update: CaptionUpdate) -> CaptionUpdate | None:
        if update.segment > self.last_segment:
            self.keys = []  # the repeated segments closed: what follows is new
            return update
        words = update.text.split()
        i, j, diverged = self._match(words)
        self.keys = [] if diverged else self.keys[j:]
        return _without(update, words, i)

    def partial(self, update: CaptionUpdate) -> CaptionUpdate | None:
        if update.segment > self.last_segment:
            return update
        words = update.text.split()
        i, _, _ = self._match(words)
        # Nothing but repeated words: the partial on screen (the failed host's, after them)
        # stays until the new host has more to say.
        return _without(update, words, i)


def _same(a: str, b: str) -> bool:
    return a == b or bool(a and b and (a.startswith(b) or b.startswith(a)))


def _without(update: CaptionUpdate, words: list[str], n: int) -> CaptionUpdate | None:
    """``update`` without its first ``n`` words (its start moved in proportion); ``None`` when
    nothing is left."""
    if n == 0:
        return update
    rest = words[n:]
    if not rest:
        return None
    start_s = update.start_s + (update.end_s - update.start_s) * n / max(1, len(words))
    if len(update.words) == len(words):  # measured word times, one per word of the text
        timed = update.words[n:]
        start_s = timed[0][1]
    else:
        timed = tuple(w for w in update.words if w[1] >= start_s)
    return replace(update, text=" ".join(rest), start_s=start_s, words=timed)


class SupervisedStream:
    """One stream of a :class:`SupervisedCaptioner`, as the worker sees it (worker thread)."""

    def __init__(self, owner: SupervisedCaptioner, label: str, language: str | None,
                 priority: int | str = "live", source: str | None = None) -> None:
        self._owner = owner
        self.label = label
        self.language = language
        self.priority = priority
        self.source = source  # what the audio is (LiveCaptioner.open_stream): whether speakers are labelled
        self._ingest = StreamIngest(label)
        self.ring: deque[tuple[int, int, np.ndarray]] = deque()  # (first sample, capture_ns, 16 kHz)
        self.ring_samples = 0
        self.checkpoint = 0
        # (end sample, words, segment) of the finals since the checkpoint
        self.committed: list[tuple[int, list[str], int]] = []
        self.history: tuple[str, ...] = ()
        """The host's prompt history at the checkpoint: the words committed before it."""
        self.segment_max = -1
        self.finishing = False
        self.seam: _Seam | None = None
        self.opened = False
        """Whether the host's engine took the stream (it may still refuse it at capacity)."""
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    @property
    def pending_s(self) -> float:
        return 0.0  # the host keeps the backlog

    def accept_waveform(self, sample_rate: int, samples, capture_ns: int | None = None,
                        first_sample: int | None = None) -> None:
        """As :meth:`captioner.engine.live.CaptionStream.accept_waveform`."""
        if self.finishing:
            raise ValueError(f"stream {self.label!r} is finished: open a new stream for more audio")
        when_ns = self._owner.clock_ns() if capture_ns is None else int(capture_ns)
        block = self._ingest.accept(int(sample_rate), channels_last(samples), when_ns, first_sample)
        if block is not None:
            self._owner._audio(self, block.first_sample, block.capture_ns, block.samples)

    def finish(self) -> None:
        if self.finishing:
            return
        self.finishing = True
        tail = self._ingest.flush(self._owner.clock_ns())
        if tail is not None:
            self._owner._audio(self, tail.first_sample, tail.capture_ns, tail.samples)
        self._owner._send(CloseStream(self.label))

    # -- the supervisor's bookkeeping -----------------------------------------------------------
    def keep(self, first: int, capture_ns: int, samples: np.ndarray, limit_samples: int) -> None:
        self.ring.append((first, capture_ns, samples))
        self.ring_samples += samples.shape[0]
        while self.ring_samples - self.ring[0][2].shape[0] >= limit_samples and len(self.ring) > 1:
            dropped = self.ring.popleft()
            self.ring_samples -= dropped[2].shape[0]
            # Speech on with no pause for the whole ring: the checkpoint is moved, not reached,
            # and the finals it passes are the prompt's next words (as the host's, roughly).
            passed = [" " + w for end, words, _ in self.committed if end <= self.ring[0][0] for w in words]
            if passed:  # most blocks pass no final: the history is not rebuilt for them
                self.history = (*self.history, *passed)[-HISTORY_WORDS:]
            self._move_checkpoint(self.ring[0][0])

    def reached(self, sample: int, history: tuple[str, ...] | None = None) -> None:
        """The host says: nothing is open before ``sample``, and its prompt is ``history``
        (``None``: as it said before)."""
        if history is not None:
            self.history = history
        while self.ring and self.ring[0][0] + self.ring[0][2].shape[0] <= sample:
            self.ring_samples -= self.ring.popleft()[2].shape[0]
        # Finals that end later stay: after a restart they are a failed host's, which had gone
        # further than the new host's checkpoints yet.
        self._move_checkpoint(sample)

    def _move_checkpoint(self, sample: int) -> None:
        self.checkpoint = max(self.checkpoint, sample)
        self.committed = [final for final in self.committed if final[0] > sample]

    def replay(self) -> list[tuple[int, int, np.ndarray]]:
        """The ring from the checkpoint on (the first block cut there)."""
        out = []
        for first, capture_ns, samples in self.ring:
            end = first + samples.shape[0]
            if end <= self.checkpoint:
                continue
            if first < self.checkpoint:
                samples, first = samples[self.checkpoint - first:], self.checkpoint
            out.append((first, capture_ns, samples))
        return out


class SupervisedCaptioner:
    """A stand-in for :class:`~captioner.engine.live.LiveCaptioner` whose model runs in a host
    that is restarted when it fails (see the module docstring). Made and called by the worker
    thread, except :meth:`notices` and :meth:`worker_notices` (any thread).

    ``isolation``: "process" (a child process per host, with a loaded standby when ``standby``)
    or "inline" (the worker thread). ``clock_ns``: the capture clock, as for LiveCaptioner."""

    def __init__(self, spec: HostSpec, isolation: str = "process", standby: bool = True,
                 clock_ns: Callable[[], int] = time.monotonic_ns, replay_s: float = REPLAY_S,
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S, load_timeout_s: float = LOAD_TIMEOUT_S,
                 max_failures: int = MAX_FAILURES, failure_window_s: float = FAILURE_WINDOW_S) -> None:
        if isolation not in ("process", "inline"):
            raise ValueError(f"unknown isolation {isolation!r}: use 'process' or 'inline'")
        self.clock_ns = clock_ns
        self.isolation = isolation
        self._use_standby = standby and isolation == "process"
        self._replay_samples = int(replay_s * SAMPLE_RATE_HZ)
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._load_timeout_s = load_timeout_s
        self._max_failures = max_failures
        self._failure_window_s = failure_window_s
        self._spec = spec
        self._generation = spec.generation
        self._streams: dict[str, SupervisedStream] = {}
        self._lifecycle = LifecycleLog()
        self._status: PipelineStatus | None = None
        self._language_notices: deque = deque()
        self._worker_notices: deque[str] = deque()
        self._failures: deque[float] = deque()
        self.restarts = 0
        self.restart_s: list[float] = []
        """Seconds from each failure seen to the next host ready (the failed one stopped)."""
        self.failed_at_s: list[float] = []
        """``time.monotonic()`` when each failure was seen."""
        self.fallback: str | None = None
        self._last_restart_s: float | None = None
        self._last_note = ""
        self._closed = False
        self._failed_hosts: list = []  # killed at their failure, waited for at close
        # Audio framed since the last step, sent as one message (see _flush_audio): label ->
        # (first sample, capture_ns, samples), each stream at most once, so the host's rule "a
        # stream's second chunk steps the first" still holds.
        self._batch: dict[str, tuple[int, int, np.ndarray]] = {}
        self._standby: ProcessHost | None = None
        self.on_host_message: Callable[[], None] | None = None
        """Called (on a host's receiving thread) when a model process has sent something for
        :meth:`step` to pick up: the worker sets it to wake itself (``Worker.wake``)."""
        self.hand_out_now: Callable[[list[CaptionUpdate]], None] | None = None
        """Where captions taken outside :meth:`step` go (:meth:`take_waiting`): the worker sets
        it to its delivery. ``None`` while a step or the close collects updates to return: none
        may go out past them."""
        self._host = self._start_host(spec, isolation)
        # "auto" means what the first host chose; later hosts load in the background, with no
        # progress shown for a session that is already captioning.
        self._spec = replace(spec, device=self._info.backend_name, progress=None)
        self._start_standby()

    # -- hosts ------------------------------------------------------------------------------------
    def _new_host(self, spec: HostSpec, isolation: str):
        host = ProcessHost(spec) if isolation == "process" else InlineHost(spec)
        self._generation = spec.generation + 1
        host.start()
        return host

    def _host_spoke(self) -> None:
        wake = self.on_host_message
        if wake is not None:
            wake()

    def _start_host(self, spec: HostSpec, isolation: str):
        """A host, loaded and ready (raises when it cannot be made)."""
        host = self._new_host(spec, isolation)
        return self._adopt(host)

    def _adopt(self, host):
        """``host`` once it is loaded (raises when it failed to load)."""
        if not host.wait_ready(self._load_timeout_s) and host.kind == "process":
            host.check(self._heartbeat_timeout_s, 0.0)
        messages = host.poll()  # a fresh host has nothing to say but that it is ready
        if host.info is None or host.failed is not None:
            host.stop()
            why = next((m.reason for m in messages if type(m) is HostFailed), host.failed or "it did not start")
            if getattr(host, "user_error", None):
                raise UserError(host.user_error)
            raise RuntimeError(f"the captioning worker could not start: {why}")
        self._info: HostInfo = host.info
        self.recognizer = _RecognizerInfo(self._info)
        if host.kind == "process":  # the host in use, not a standby: only its captions matter
            host.on_message = self._host_spoke
            host.while_waiting = self.take_waiting
        return host

    def _start_standby(self) -> None:
        if self._use_standby and self.fallback is None and self._standby is None and not self._closed:
            self._standby = self._new_host(replace(self._spec, generation=self._generation), "process")

    def _check_standby(self) -> None:
        standby = self._standby
        if standby is None:
            return
        for message in standby.poll():
            if type(message) is HostFailed:  # a standby that failed is not taken; another is made next restart
                standby.stop()
                self._standby = None
                return

    # -- LiveCaptioner's surface -------------------------------------------------------------------
    @property
    def provider(self) -> str:
        return self._info.provider

    @property
    def model(self) -> str:
        return self._spec.model

    @property
    def backend_name(self) -> str:
        return self._info.backend_name

    @property
    def host_pids(self) -> list[int]:
        """Process ids of the worker process and its standby (none when the model runs on the
        worker thread); for tests and benchmarks that kill them."""
        hosts = [h for h in (self._host, self._standby) if h is not None and h.kind == "process"]
        return [h.process.pid for h in hosts if h.process is not None]

    @property
    def streams(self) -> Mapping[str, SupervisedStream]:
        return MappingProxyType(self._streams)

    def open_stream(self, label: str, language: str | None = None, *,
                    priority: int | str = "live", source: str | None = None) -> SupervisedStream:
        if self._closed:
            raise ValueError("this captioner is closed")
        if label in self._streams:
            raise ValueError(f"a stream labelled {label!r} is already open")
        code = self.recognizer.check_language(language) if language_code(language) else None
        parse_priority(priority)  # a bad one is the caller's one-line ValueError, here
        stream = SupervisedStream(self, label, code, priority, source)
        self._streams[label] = stream
        self._send(OpenStream(label, code, priority, source))
        return stream

    def accept_framed(self, audio: FramedAudio) -> None:
        """As :meth:`LiveCaptioner.accept_framed`: the audio, already framed, skips the ingest and
        joins the chunks batched for the host, which the worker's step sends after its inbox
        drain (not one message per front-end frame: some 400 a second per engine)."""
        for label, first, capture_ns, samples in audio.pieces():
            stream = self._streams.get(label)
            if stream is not None and not stream.finishing:
                # A copy, not a view: in the ring a view would keep the whole frame (every stream's
                # audio of its front-end) alive for as long as the longest of their rings, 30 s.
                self._audio(stream, first, capture_ns, samples.copy())

    def set_language(self, language: str | None) -> None:
        code = self.recognizer.check_language(language)
        self._spec = replace(self._spec, language=code)
        self._send(SetLanguage(code))

    def set_model(self, model: str) -> list[CaptionUpdate]:
        """The swap happens in the host; its updates arrive with the next ``step``."""
        self._spec = replace(self._spec, model=model)
        self._send(SwapModel(model))
        if self._standby is not None:  # loaded with the old model
            self._standby.stop()
            self._standby = None
            self._start_standby()
        return []

    def step(self, hand_out: Callable[[list[CaptionUpdate]], None] | None = None) -> list[CaptionUpdate]:
        """The host's updates since the last step, after the model work that is due. With
        ``hand_out``, as :meth:`LiveCaptioner.step <captioner.engine.live.LiveCaptioner.step>`:
        a host on this thread passes each tick's updates to it as soon as they are made, and a
        model process's are passed on as each poll takes them, so that those
        :meth:`take_waiting` takes while the audio's send waits come after them, in order."""
        if hand_out is None:  # collected and returned: nothing may be handed out past them
            now, self.hand_out_now = self.hand_out_now, None
            try:
                updates: list[CaptionUpdate] = []
                self._step(updates.extend, None)
                return updates
            finally:
                self.hand_out_now = now

        def out(updates: list[CaptionUpdate]) -> None:
            if updates:
                hand_out(updates)

        def early(message: Event) -> None:
            out(self._take([message]))

        self._step(out, early)
        return []

    def _step(self, out: Callable[[list[CaptionUpdate]], None], early: Callable[[Event], None] | None) -> None:
        if self._host.kind == "process":
            # A model process's captions are taken before the audio goes: the flush waits for
            # room in the queue to that process while it steps, and they would wait with it (an
            # inline host steps in its poll, which must see this audio first).
            out(self._take(self._host.poll(early)))
        self._flush_audio()
        out(self._take(self._host.poll(early)))
        why = self._host_failure()
        while why is not None:
            self._restart(why)
            out(self._take(self._host.poll(early)))
            why = self._host_failure()
        self._check_standby()

    def take_waiting(self) -> None:
        """Worker thread, between its inbox items, and while a send to the model process waits
        for room: what that process has sent so far is taken now, its captions handed to
        :attr:`hand_out_now`. Otherwise a served caption waited for the worker to work through
        the audio it had taken in and to step (benchmarks/results/serve/HISTORY.md, "A busy worker hands
        out captions between its items"). A failure among the messages is kept by the host for the next
        step to act on."""
        if self._host.kind != "process" or self.hand_out_now is None:
            return
        updates = self._take(self._host.poll())
        if updates:
            self.hand_out_now(updates)

    def take_lifecycle(self) -> list[Lifecycle]:
        """What the host said of our streams since the last call, in order: opened, refused at
        capacity, done (after its last update, which :meth:`step` or :meth:`take_waiting` has
        handed out by then)."""
        return self._lifecycle.take()

    def notices(self) -> list:
        out = []
        while self._language_notices:
            out.append(self._language_notices.popleft())
        return out

    def worker_notices(self) -> list[str]:
        """Lines about the worker since the last call (a restart, the fall-back to the CPU);
        any thread."""
        out = []
        while self._worker_notices:
            out.append(self._worker_notices.popleft())
        return out

    def status(self, queue_depth: int = 0, dropped_blocks: int = 0, state: str = "running",
               message: str = "") -> PipelineStatus:
        base = self._status or PipelineStatus(time.monotonic(), self._info.provider, self._info.model,
                                              self._info.device_name)
        extra = dict(base.extra)
        extra["dropped_blocks"] = float(dropped_blocks)
        notes = "; ".join(m for m in (message, base.message, self._note()) if m)
        # Only the streams the host's engine took: one it may still refuse at capacity is not
        # listed yet (a server would tell its client "ready", then caption nothing).
        streams = tuple(label for label, stream in self._streams.items() if stream.opened)
        return replace(base, streams=streams, queue_depth=queue_depth, state=state, message=notes,
                       extra=tuple(extra.items()), worker_restarts=self.restarts)

    def close(self) -> list[CaptionUpdate]:
        """Finish every stream, wait until the host has committed them, and stop every host."""
        if self._closed:
            return []
        updates: list[CaptionUpdate] = []
        self.hand_out_now = None  # returned in order: the close's sends hand nothing out meanwhile
        try:
            for stream in list(self._streams.values()):
                stream.finish()
            deadline_s = time.monotonic() + CLOSE_TIMEOUT_S
            while self._streams and time.monotonic() < deadline_s:
                updates += self.step()
                if self._streams and self._host.kind == "process":
                    time.sleep(0.01)
            updates += self._take(self._host.close(5.0))
        finally:
            self._closed = True
            self._host.stop()
            if self._standby is not None:
                self._standby.stop()
                self._standby = None
            for host in self._failed_hosts:
                host.reap(5.0)
            self._failed_hosts = []
        return updates

    # -- the host's messages -------------------------------------------------------------------------
    def _send(self, message: HostCommand) -> None:
        self._flush_audio()  # the audio framed before a message goes before it
        self._host.send(message)

    def _audio(self, stream: SupervisedStream, first: int, capture_ns: int, samples: np.ndarray) -> None:
        stream.keep(first, capture_ns, samples, self._replay_samples)
        if stream.label in self._batch or len(self._batch) >= MAX_BATCH_CHUNKS:
            self._flush_audio()
        self._batch[stream.label] = (first, capture_ns, samples)

    def _flush_audio(self, wait: bool = True) -> None:
        """The chunks framed since the last flush, as one :class:`FramedAudio` message: one array
        and one pickle instead of one per chunk. A thousand served streams send ten thousand
        chunks a second, and per message the worker's process pickles and writes, the host's
        reads and unpickles (and both hold their interpreter lock meanwhile)."""
        if not self._batch:
            return
        batch, self._batch = self._batch, {}
        firsts, stamps, pieces = zip(*batch.values())
        lengths = tuple(piece.shape[0] for piece in pieces)
        samples = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        self._host.streams_open = len(self._streams)  # a process host's queue bound grows with them
        self._host.send(FramedAudio(tuple(batch), firsts, stamps, lengths, samples), wait=wait, chunks=len(batch))

    def _host_failure(self) -> str | None:
        if self._host.kind == "process":
            limit_s = self._heartbeat_timeout_s
            if self._info.backend_name == "cpu":
                limit_s = max(limit_s, CPU_HEARTBEAT_TIMEOUT_S)
            return self._host.check(limit_s, self._load_timeout_s)
        return self._host.failed

    def _take(self, messages: list[Event]) -> list[CaptionUpdate]:
        updates: list[CaptionUpdate] = []
        for message in messages:
            match message:
                case Updates():
                    updates += self._filtered(message.updates)
                case Checkpoint(label=label):
                    stream = self._streams.get(label)
                    if stream is not None:
                        stream.reached(message.sample, message.history)
                case StreamOpened(label=label):
                    stream = self._streams.get(label)
                    if stream is not None:
                        stream.opened = True
                        self._lifecycle.add(message)
                case StreamDone(label=label):
                    stream = self._streams.pop(label, None)
                    if stream is not None:
                        stream._done = True
                        self._lifecycle.add(message)
                case HostStatus(status=status):
                    self._status = status
                case Notices(notices=notices):
                    self._language_notices.extend(notices)
                case Refused(label=label):  # the engine's admission said no: the stream is not captioned
                    if self._streams.pop(label, None) is not None:
                        self._lifecycle.add(message)
        return updates

    def _filtered(self, updates: list[CaptionUpdate]) -> list[CaptionUpdate]:
        out = []
        for update in updates:
            stream = self._streams.get(update.stream)
            if stream is not None:
                seam = stream.seam
                if seam is not None:
                    update = seam.final(update) if update.kind == "final" else seam.partial(update)
                    if not seam.open:
                        stream.seam = None
                    if update is None:
                        continue
                stream.segment_max = max(stream.segment_max, update.segment)
                if update.kind == "final":
                    stream.committed.append((int(update.end_s * SAMPLE_RATE_HZ), update.text.split(), update.segment))
            out.append(update)
        return out

    # -- restarts -----------------------------------------------------------------------------------
    def _restart(self, why: str) -> None:
        """Give up the failed host; a fresh one takes every stream over from its checkpoint."""
        t0 = time.monotonic()
        self.failed_at_s.append(t0)
        self._failures.append(t0)
        while self._failures and self._failures[0] < t0 - self._failure_window_s:
            self._failures.popleft()
        self.restarts += 1
        self._host.stop(wait=False)  # the next host need not wait for the failed one to be gone
        self._batch = {}  # in the rings: re-fed below
        self._failed_hosts.append(self._host)
        on_gpu = self._info.backend_name != "cpu"
        if len(self._failures) >= self._max_failures and not on_gpu:
            raise RuntimeError(f"the captioning worker failed {len(self._failures)} times within "
                               f"{self._failure_window_s:.0f} s (last: {why})")
        if on_gpu and len(self._failures) >= self._max_failures:
            self.fallback = (f"the GPU worker failed {len(self._failures)} times within "
                             f"{self._failure_window_s:.0f} s (last: {why}); captioning goes on on the CPU")
            if self._standby is not None:
                self._standby.stop()
                self._standby = None
            self._spec = replace(self._spec, device="cpu")
            # The CPU's model runs on this thread: no CUDA context is left to poison.
            self._host = self._start_host(replace(self._spec, generation=self._generation), "inline")
        elif self._standby is not None:
            standby, self._standby = self._standby, None
            try:
                self._host = self._adopt(standby)
            except (RuntimeError, UserError):
                self._host = self._start_host(replace(self._spec, generation=self._generation), self.isolation)
        else:
            self._host = self._start_host(replace(self._spec, generation=self._generation), self.isolation)
        held_s = time.monotonic() - t0
        self.restart_s.append(held_s)
        for stream in self._streams.values():
            self._refeed(stream)
        self._start_standby()
        self._last_restart_s = time.monotonic()
        self._last_note = f"the captioning worker failed ({why}) and was restarted in {held_s:.1f} s"
        self._worker_notices.append(self._last_note)
        if self.fallback is not None and on_gpu:
            self._worker_notices.append(self.fallback)

    def _refeed(self, stream: SupervisedStream) -> None:
        segment_base = stream.segment_max + 1
        self._host.send(OpenStream(stream.label, stream.language, stream.priority, stream.source,
                                   base_sample=stream.checkpoint, segment_base=segment_base, readmit=True,
                                   history=stream.history))
        for first, capture_ns, samples in stream.replay():
            self._batch[stream.label] = (first, capture_ns, samples)
            self._flush_audio(wait=False)
        if stream.finishing:
            self._host.send(CloseStream(stream.label), wait=False)
        words = [w for _, ws, _ in stream.committed for w in ws]
        segments = len({segment for _, _, segment in stream.committed})  # the new host's from segment_base
        stream.seam = _Seam(words, segment_base + segments - 1) if words else None

    def _note(self) -> str:
        if self.fallback is not None:
            return self.fallback
        if self._last_restart_s is not None and time.monotonic() - self._last_restart_s < RESTART_NOTE_S:
            return self._last_note
        return ""

