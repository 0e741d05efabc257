"""The engine of one GPU (or of the CPU): audio frames in, caption updates out.

:class:`Engine` is the synchronous core: ``push`` takes the 10 ms frames of every active stream
into the feature rings (:class:`~captioner.gpu.features.StreamingFeatures`, on the device), runs
the VAD on the new log-mel frames, and ``tick`` asks the scheduler which streams are due, hands
their windows to the recognizer in ONE batched model step, and folds each hypothesis into that
stream's streaming policy. It reads time only through an injected ``clock_ns``, so a replay
with a simulated clock gives the same captions on every run.

How many streams one engine holds is bounded by measurement, not by a fixed number: the
feature rings live in a :class:`~captioner.gpu.features.FeaturePool` that grows in banks, and
:mod:`captioner.engine.admission` refuses a new stream when device memory would fall under its
floor or when the timed model steps say the running streams' update interval would pass its
limit. With a light model beside the main one (``tiny.en`` beside ``base``), new segments of
English streams go to the light one while the admitted load is high.

Two drivers run it: the public API (:class:`~captioner.engine.live.LiveCaptioner`, stepped by its
caller) and the worker thread that owns one GPU (:mod:`captioner.engine.worker`).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from captioner.engine.admission import (
    Admission,
    AdmissionConfig,
    CpuCost,
    LoadEstimate,
    Priority,
    StepCost,
    parse_priority,
    predict,
)
from captioner.engine.audio_front import AudioFront
from captioner.engine.engine_report import EngineReport
from captioner.engine.memory_budget import ProcessMemory
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.local_agreement import LocalAgreementPolicy
from captioner.engine.policy.presets import make_policy
from captioner.engine.policy.presets import resolve as resolve_policy
from captioner.engine.recognizer import Recognizer, WindowRequest, capabilities_of
from captioner.engine.scheduler import (
    Scheduler,
    SchedulerConfig,
    StreamView,
    for_device,
)
from captioner.engine.speakers import (
    SpeakerBank,
    SpeakerConfig,
    check_mode,
    wanted,
)
from captioner.engine.stream_state import StreamState
from captioner.engine.vad import (
    VadConfig,
    speech_band,
)
from captioner.engine.vad_bank import VadBank
from captioner.errors import one_line
from captioner.events import (
    FRAME_SAMPLES,
    FRAMES_PER_S,
    WINDOW_FRAMES,
    CaptionUpdate,
)
from captioner.gpu.features import FeaturePool, RingWindow

_log = logging.getLogger(__name__)

DATED_LATER_MIN_NS = 1_000_000
"""The least shift :meth:`Engine.dated_later` makes: a millisecond, far under any caption's
latency and far over what copying an update costs (docs/decisions/002-engine-host-path.md)."""


@dataclass(slots=True)
class EngineConfig:
    pause_s: float = 0.5
    """Silence after speech that closes a segment (the final update)."""
    lead_in_s: float = 1.0
    """Audio kept before a speech onset: a window does not start inside a word, and Whisper hears
    the first words of a window worse when they begin at its first frames (a caller's short
    answer after the other side spoke, docs/latency.md)."""
    min_speech_s: float = 0.15
    """A segment with less speech than this is dropped without a model step (a click, a cough)."""
    first_update_speech_s: float = 0.3
    """Speech a new segment needs before its first update (a hypothesis of a syllable is noise)."""
    ring_frames: int = 4096
    block_streams: int = 64
    """Feature-ring slots allocated at once when the pool grows (there is no stream cap:
    :attr:`admission` decides)."""
    language: str | None = None
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    vad: VadConfig = field(default_factory=VadConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    ring_kernels: bool = True
    """On CUDA, kernels read the feature rings directly: the VAD's measures of every stream's new
    frames in one launch (:meth:`~captioner.gpu.features.FeaturePool.speech_measures`), and a
    model step's padded, normalised batch in two (``WhisperRecognizer`` with ring windows,
    :meth:`~captioner.gpu.features.FeaturePool.model_input`). Off: the NumPy path's gathers and
    array code, run by CuPy (the specification; benchmarks compare the two)."""
    warm_up: bool = False
    """Meet every batch shape the scheduler can make when the engine starts (on CUDA, seconds for
    256 rows) instead of during the first minutes of service, where each first run of a shape
    stalls a whole batch of streams (:meth:`Engine.warm_up`). A server's engines set it; the
    desktop, with a stream or two, starts captioning at once."""
    overlap_updates: str = "auto"
    """Whether a step's hypotheses are read (text, guards, words: the recognizer's
    ``decode_pending``) and folded into the streams' policies (agreement, commits) while the
    *next* step's encoder runs on the device, rather than between the two steps: ``"auto"``
    where the recognizer overlaps host work with its device work (CUDA,
    :attr:`WhisperRecognizer.overlaps_host_work`) and the load is at least
    :attr:`overlap_min_load`; ``"on"`` always (tests of the bookkeeping on the CPU); ``"off"``
    never. The updates then reach the caller one tick later (under load, when steps follow one
    another); the next tick with nothing due, :meth:`Engine.flush`, and every stream's end fold
    them at once. At many streams this cut the engine thread's time per second of audio and the
    update interval's tail, and captions came sooner (benchmarks/results/capacity/HISTORY.md,
    "Hypotheses read while the next step encodes"); a desktop's stream or two never reach the load where
    it applies."""
    overlap_min_load: float = 0.5
    """The admitted load from which ``overlap_updates="auto"`` defers (the load at which riders
    stop: ``SchedulerConfig.merge_max_load``); under it the desktop's captions never wait."""
    policy_factory: Callable[[str, PolicyConfig], LocalAgreementPolicy] | None = None
    """Makes a stream's streaming policy from its name and :attr:`policy` (``None``: the one
    ``policy.kind`` names, LocalAgreement-2 or AlignAtt); the one place to swap the commit
    policy per engine."""
    speakers: SpeakerConfig = field(default_factory=SpeakerConfig)
    """Speaker labels (:mod:`captioner.engine.speakers`): ``speakers.mode`` ``auto`` labels the
    streams opened as meeting audio, files and server streams; ``on`` every stream, ``off`` none
    (and the feature kernel then leaves the speaker bands out)."""


@dataclass(slots=True)
class _Decoded:
    """A model step's hypotheses, not yet folded into the streams' policies
    (:attr:`EngineConfig.overlap_updates`); the engine's own bookkeeping of those streams is done."""

    streams: list[StreamState]
    ends_s: list[float]
    """Each stream's audio end at the step (stream seconds)."""
    hypotheses: list
    """Per stream its hypothesis, or ``None`` while it is still to be read from :attr:`unread`."""
    closing: list[bool]
    unread: list = field(default_factory=list)
    cut_in_speech: list[bool] = field(default_factory=list)
    """Per stream (empty: none): a closing window whose audio ends inside speech."""
    """``(rows, pending)``: hypotheses decoded but not read yet (a recognizer's
    ``decode_pending``); :meth:`read` reads them, during the next step's encoding."""
    names: frozenset[str] = frozenset()
    """The streams' names: they sit out the scheduler until the fold."""

    def __post_init__(self) -> None:
        self.names = frozenset(s.name for s in self.streams)

    def read(self) -> list[int]:
        """Fill in the unread hypotheses; returns the indices of those read now."""
        read_now = []
        for rows, pending in self.unread:
            for i, hypothesis in zip(rows, pending.hypotheses()):
                self.hypotheses[i] = hypothesis
                read_now.append(i)
        self.unread = []
        return read_now


class Engine(AudioFront, EngineReport):
    """Synchronous engine core. Every method is called by the one thread that owns the engine.
    Its parts by job: the audio side (``push``, the VAD: :class:`AudioFront`), the model steps
    and streams' policies (here), and what it reports (``status``, memory, the measured
    intervals: :class:`EngineReport`)."""

    def __init__(
        self,
        backend,
        recognizer: Recognizer,
        config: EngineConfig | None = None,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        timer_ns: Callable[[], int] | None = None,
        light_recognizer: Recognizer | None = None,
    ) -> None:
        self.backend = backend
        if hasattr(backend, "use"):
            backend.use()  # the thread that makes the engine is the one that works its GPU
        self.recognizer = recognizer
        config = config or EngineConfig()
        on_gpu = bool(getattr(backend, "is_cuda", False))
        self.config = replace(config, scheduler=for_device(config.scheduler, on_gpu))
        self.light_recognizer: Recognizer | None = None
        if light_recognizer is not None:
            self.set_light_recognizer(light_recognizer)
        self.clock_ns = clock_ns
        # Compute cost is timed on a real counter; a simulated replay passes its own clock here
        # so that scheduling decisions do not depend on the machine.
        self.timer_ns = timer_ns or (time.perf_counter_ns if clock_ns is time.monotonic_ns else clock_ns)
        self.last_step_s = 0.0
        check_mode(self.config.speakers.mode)
        self._speaker_bank: SpeakerBank | None = None
        self.speakers_unavailable: str | None = None
        """Why speaker labels are off where ``auto`` would have them (the encoder could not load)."""
        self._build_features(recognizer.n_mels)
        self.scheduler = Scheduler(self.config.scheduler)
        self.language = self.config.language
        self._streams: dict[str, StreamState] = {}
        self.admission = Admission(self.config.admission, on_gpu=on_gpu)
        budget = self.config.admission.gpu_memory_bytes
        self.process_memory = ProcessMemory(getattr(backend, "device_index", None) or 0, budget, self._accounted_bytes) \
            if budget and getattr(backend, "is_cuda", False) else None
        """This engine's own GPU memory against ``--gpu-memory`` (``None``: no budget, or the CPU)."""
        self.vad = VadBank(self.config.vad)
        self._intervals_s: deque[float] = deque(maxlen=4096)
        self._interval_p99: tuple[int, float] | None = None
        self.interval_log: list[float] | None = None
        """Where given (a benchmark), every update interval as admission counts it: between two
        updates of a stream with speech in between, a kept pause left out."""
        self._costs = {"main": StepCost(), "light": StepCost()}
        self.light_steps = 0
        self._frame_latency_ms: deque[float] = deque(maxlen=200)
        self._step_latency_ms: float | None = None
        self._lags: deque[tuple[int, float]] = deque(maxlen=4096)  # (update's end ns, its lag s)
        self._caption_latency_s: float | None = None
        self._busy: deque[tuple[int, float]] = deque()  # (end_ns, busy_s) for the RTF
        self._created_ns = clock_ns()
        self.steps = 0
        self.host_timer: Callable[[], float] = time.perf_counter
        """What :attr:`host_s` is counted in (seconds): real time; a capacity benchmark on a shared
        machine sets ``time.thread_time`` to count the CPU time the work took."""
        self.host_s = {"ingest": 0.0, "features": 0.0, "vad": 0.0, "schedule": 0.0, "speakers": 0.0}
        """Host time spent so far taking audio in (``LiveCaptioner``'s streams add theirs), in
        feature pushes, the VAD and scheduling (real seconds: at thousands of streams this work
        bounds an engine too, and admission counts it, :class:`CpuCost`)."""
        self.audio_pushed_s = 0.0
        """Seconds of audio pushed so far, all streams' together."""
        self.host_cost = CpuCost()
        self.step_s_total = 0.0
        self.last_batch_size = 0
        self._pending: _Decoded | None = None
        self._last_load: float | None = None
        self.overlapped_steps = 0
        """Steps whose predecessor's hypotheses were folded while they encoded."""
        if self.config.overlap_updates not in ("auto", "on", "off"):
            raise ValueError(f"EngineConfig.overlap_updates is auto, on or off, not {self.config.overlap_updates!r}")
        if self.config.warm_up:
            self.warm_up()

    def warm_up(self) -> int:
        """Run each recognizer (and the light one) once at every batch shape up to the
        scheduler's ``max_batch`` (a recognizer without ``warm_up`` needs none). Returns the
        model calls made."""
        calls = 0
        for recognizer in (self.recognizer, self.light_recognizer):
            warm = capabilities_of(recognizer).warm_up
            if warm is not None:
                calls += int(warm(self.config.scheduler.max_batch))
        self._warm_features()
        return calls

    def _warm_features(self) -> None:
        """Push a second of quiet noise through the feature rings and the VAD of a slot no stream
        owns, so that what a first push compiles or captures happens now, not while streams
        wait: on a fresh GPU machine the log-mel kernel's first bank compiles for seconds
        (benchmarks/results/capacity/HISTORY.md, "kernels that read the rings"), and the VAD's kernels
        compile at their first launch too.
        Admission, status and the streams never see it."""
        slot, row = self.features.acquire(), self.vad.acquire()
        s = StreamState("warm-up", slot, row, self._make_policy("warm-up"))
        noise = (1e-3 * np.random.default_rng(0).standard_normal(FRAMES_PER_S * FRAME_SAMPLES)).astype(np.float32)
        try:
            for start, n in ((0, 10), (10, 20), (30, 70)):  # 100, 200 and 700 ms pushes
                self.features.push_batch([slot], noise[None, start * FRAME_SAMPLES:(start + n) * FRAME_SAMPLES])
                self._run_vad([s])
            if self.config.ring_kernels:
                self.features.compile_ring_kernels()
        finally:
            self.features.release(slot)
            self.vad.release(row)

    def _build_features(self, n_mels: int) -> None:
        """A fresh, empty pool of feature rings and the VAD's speech band, for a model with
        ``n_mels`` mel bands."""
        self.features = FeaturePool(self.backend, n_mels=n_mels, ring_frames=self.config.ring_frames,
                                    block_streams=self.config.block_streams,
                                    speaker_bands=self.config.speakers.mode != "off")
        if self._speaker_bank is not None:
            self._speaker_bank.features = self.features
        self._band = speech_band(n_mels)

    def set_light_recognizer(self, recognizer: Recognizer | None) -> None:
        """The model that takes new segments of English streams under load (``None``: none).
        It reads the same feature rings, so it needs the main model's number of mel bands."""
        if recognizer is not None and recognizer.n_mels != self.recognizer.n_mels:
            raise ValueError(f"the light model {recognizer.name} takes {recognizer.n_mels} mel bands, "
                             f"{self.recognizer.name} {self.recognizer.n_mels}: they cannot share feature rings")
        self.light_recognizer = recognizer
        self._costs = {**getattr(self, "_costs", {}), "light": StepCost()}

    # -- streams ---------------------------------------------------------------------------------
    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(self._streams)

    def add_stream(self, name: str, language: str | None = None, priority: int | str = Priority.LIVE,
                   readmit: bool = False, history: Sequence[str] = (), source: str | None = None) -> None:
        """A new stream (a no-op for one already open); ``language`` overrides the engine's;
        ``priority`` ranks it when compute is short (:class:`~captioner.engine.admission.Priority`).

        Raises :class:`~captioner.errors.StreamRefused` when admission says it does not fit
        (see :mod:`captioner.engine.admission`); nothing running changes then. ``readmit``: a
        stream this engine's predecessor held (a worker restart re-opens it): only memory can
        refuse it. ``history``: the words it committed before (:meth:`prompt_history`), which
        prompt the first windows here as they would have there. ``source``: what the stream is
        (``microphone``, ``meeting``, ``file``, ``remote``; ``None``: not said), which decides
        whether ``speakers="auto"`` labels its speakers."""
        if name in self._streams:
            return
        labelled = wanted(self.config.speakers.mode, source)
        rank = parse_priority(priority)
        now_s = self.clock_ns() / 1e9
        if not readmit:
            self.admission.check_growth(name, now_s, len(self._streams))
        new_block_bytes = self.features.block_bytes if self.features.needs_block else 0
        self.admission.check_memory(name, self.memory(), new_block_bytes, len(self._streams))
        if self.process_memory is not None:
            self.admission.check_memory(name, self.process_memory.memory(), new_block_bytes, len(self._streams),
                                        " this engine may use")
        if not readmit:
            base_s = self.config.scheduler.base_interval_s
            self.admission.check_time(name, rank, self.load_estimate(extra=(language, rank), with_host=True),
                                      self.measured_interval_p99_s(), base_s, self.measured_lag_s())
            self.admission.admitted(now_s)
        bank = self._speaker_bank_for(source) if labelled else None  # loaded before anything changes
        slot = self.features.acquire()
        policy = self._make_policy(name)
        policy.resume(history)
        self._streams[name] = StreamState(name, slot, self.vad.acquire(), policy, language=language, priority=rank,
                                      speakers=bank.open(name, slot) if bank is not None else None)

    def _speaker_bank_for(self, source: str | None) -> SpeakerBank | None:
        """The speakers' bank for a stream to label. Asked for (``on``), an encoder that cannot
        load is the stream's error; under ``auto`` the stream is captioned unlabelled instead,
        and :attr:`speakers_unavailable` says why (once: the encoder is not tried again)."""
        if self.speakers_unavailable is not None:
            return None
        try:
            return self._speakers()
        except Exception as error:  # noqa: BLE001 - any failure to load: labels are extra under auto
            if self.config.speakers.mode != "auto":
                raise
            self.speakers_unavailable = f"speaker labels are off: {one_line(error)}"
            _log.warning("%s (a %s stream is captioned without them)", self.speakers_unavailable, source)
            return None

    def _speakers(self) -> SpeakerBank:
        """The voice encoder and its state, loaded with the first stream that is labelled."""
        if self._speaker_bank is None:
            from captioner.models.speaker.encoder import SpeakerEncoder

            # One ONNX Runtime thread on the CPU: a step is a few small matrix products, which
            # more threads only slow down beside Whisper's.
            encoder = SpeakerEncoder(self.backend.name, intra_threads=None if self.backend.is_cuda else 1)
            self._speaker_bank = SpeakerBank(self.backend, self.features, encoder, self.config.speakers)
        return self._speaker_bank

    def speaker_labels(self, name: str) -> bool:
        """Whether the stream's lines carry speaker labels."""
        return self._streams[name].speakers is not None

    def _labelled(self, s: StreamState, updates: list[CaptionUpdate]) -> list[CaptionUpdate]:
        """``updates`` of stream ``s`` with their speakers (when on for it)."""
        if s.speakers is None or not updates:
            return updates
        return [labelled for u in updates for labelled in s.speakers.label(u)]

    def committed_words(self, name: str) -> int:
        """How many words the stream has committed (a cheap test of whether its
        :meth:`prompt_history` changed)."""
        return self._streams[name].policy.committed_words_total

    def prompt_history(self, name: str) -> tuple[str, ...]:
        """The committed words (texts as decoded) that prompt the stream's next window."""
        return self._streams[name].policy.history

    def _make_policy(self, name: str):
        factory = self.config.policy_factory or make_policy
        return factory(name, resolve_policy(self.config.policy, self.recognizer.provider))

    # -- admission -------------------------------------------------------------------------------
    def _english(self, s_language: str | None, last_language: str | None = None) -> bool:
        language = s_language or self.language or last_language
        return language == "en" or (language is None and not capabilities_of(self.recognizer).is_multilingual)

    def _light_eligible(self, s: StreamState) -> bool:
        """Whether the stream's new segments may go to the (English-only) light model."""
        if self.light_recognizer is None:
            return False
        if capabilities_of(self.light_recognizer).is_multilingual:
            return True
        return self._english(s.language, s.last_language)

    def load_estimate(self, extra: tuple[str | None, int] | None = None, all_main: bool = False,
                      with_host: bool = False) -> LoadEstimate:
        """The time budget's estimate for the open streams (and one more, ``(language,
        priority)``, when ``extra`` is given), each on the model that serves it; with
        ``all_main``, as if every stream were on the main model (what decides the light model,
        so that moving streams to it does not move them straight back); ``with_host``: the
        thread's measured host work per stream counted too (admission's view; the scheduler's
        riders and fill rule were tuned on the model's share alone)."""
        light_on = self.admission.light_active and not all_main
        n_light = 0 if not light_on else sum(
            1 for s in self._streams.values()
            if s.segment_model == "light" or (s.segment_model is None and self._light_eligible(s)))
        n_main = len(self._streams) - n_light
        if extra is not None and all_main:
            n_main += 1
        elif extra is not None:
            new_light = light_on and self.light_recognizer is not None and (
                capabilities_of(self.light_recognizer).is_multilingual or self._english(extra[0]))
            n_light, n_main = (n_light + 1, n_main) if new_light else (n_light, n_main + 1)
        cfg = self.config.scheduler
        main, light = self._costs["main"], self._costs["light"]
        if not light.measured:
            light = main  # until the light model has run, charge it like the main one (the safe side)
        return predict([(main, n_main), (light, n_light)], cfg.base_interval_s, cfg.target_busy, cfg.max_batch,
                       self.host_cost.per_audio_s if with_host else 0.0)

    def remove_streams(self, names: list[str]) -> list[CaptionUpdate]:
        """Close streams: the pending text of each is committed first, their last updates
        decoded together (:meth:`_finish_streams`)."""
        streams = [self._streams[name] for name in dict.fromkeys(names) if name in self._streams]
        updates = self._finish_streams(streams)
        for s in streams:
            del self._streams[s.name]
            self.features.release(s.slot)
            self.vad.release(s.vad_row)
            if s.speakers is not None:
                self._speaker_bank.close(s.name)
        return updates

    # -- audio in --------------------------------------------------------------------------------
    # -- model steps -----------------------------------------------------------------------------
    def views(self, active_only: bool = False, names: Iterable[str] | None = None) -> list[StreamView]:
        """What the scheduler sees of each stream (of ``names`` only, when given; unknown names
        are passed over); with ``active_only``, only the streams that could be due (speech
        waiting, or a segment to close): a quiet stream can be neither due nor ride along, and
        at thousands of streams the views are built on every tick. The streams' audio ends and
        silences are read in one array look-up each."""
        first_update_frames = self.config.first_update_speech_s * FRAMES_PER_S
        chosen: list[tuple[StreamState, bool]] = []
        # Streams whose policies have not seen their last hypothesis yet.
        held = self._pending.names if self._pending is not None else ()
        streams = self._streams.values() if names is None else \
            [self._streams[n] for n in names if n in self._streams]
        for s in streams:
            if held and s.name in held:
                continue
            open_text = s.policy.has_pending_text
            if active_only and not open_text and not s.speech_since_update:
                continue
            chosen.append((s, open_text))
        if not chosen:
            return []
        ready = self.features.frames_ready_many([s.slot for s, _ in chosen]).tolist()
        silence = self.vad.silence_frames_many([s.vad_row for s, _ in chosen]).tolist()
        pause_frames = self.config.pause_s * FRAMES_PER_S
        out = []
        for (s, open_text), ready_frames, quiet_frames in zip(chosen, ready, silence):
            paused = quiet_frames >= pause_frames
            # At a pause, an update hears what was said before it (at once); then nothing more is
            # decoded until the speaker goes on (the policy settles the pause, :meth:`_settle`):
            # more silence adds nothing to hear the words before it by.
            out.append(StreamView(
                s.name, (ready_frames + s.frame_offset) / FRAMES_PER_S, s.last_update_s,
                speech_pending=(s.policy.has_uncommitted_text and not paused) or (
                    s.speech_since_update and s.segment_speech_frames >= first_update_frames),
                priority=s.priority,
                pause_pending=paused and s.speech_since_update,
                paused_s=max(0.0, (quiet_frames - pause_frames) / FRAMES_PER_S) if paused else 0.0,
                segment_open=open_text,
                close_step=paused and not s.speech_since_update and s.policy.needs_closing_window,
            ))
        return out

    def tick(self) -> list[CaptionUpdate]:
        """Run one batched model step for the streams that are due (none may be), and settle the
        pauses the last updates already heard."""
        t0 = self.host_timer()
        views = self.views(active_only=True)
        settled = self._settle(views)
        if self._costs["main"].measured:
            self._last_load = self.load_estimate(all_main=True).load
            due = self.scheduler.due(views, self._last_load, self._costs["main"].fit())
        else:
            due = self.scheduler.due(views)
        self.host_s["schedule"] += self.host_timer() - t0
        self.host_cost.record(sum(self.host_s.values()), self.audio_pushed_s)
        if not due:
            return settled + self.flush()  # nothing to overlap the last step's text work with: do it now
        pausing = {v.name for v in views if v.pause_pending}
        # Speech that ends in a pause with (almost) no speech in it (a click, a cough) is dropped
        # without asking the model.
        work = []
        for s in (self._streams[name] for name in due):
            if s.name in pausing and not s.policy.has_pending_text and \
                    s.segment_speech_frames < self.config.min_speech_s * FRAMES_PER_S:
                self._reset_segment(s, self._audio_end_s(s))
            else:
                work.append(s)
        closing = {v.name: v.close_step for v in views}
        return settled + (self._step(work, {s.name: closing.get(s.name, False) for s in work}) if work else self.flush())

    def _settle(self, views: list[StreamView]) -> list[CaptionUpdate]:
        """Pauses the last update heard, past where the policy acts on them without the model
        (:meth:`~captioner.engine.policy.local_agreement.LocalAgreementPolicy.settle`: at
        ``hold_s`` the words shown are committed, at ``long_pause_s`` the segment closes)."""
        out: list[CaptionUpdate] = []
        pause_s = self.config.pause_s
        for v in views:
            if not v.segment_open or v.pause_pending or v.paused_s <= 0.0:
                continue
            s = self._streams[v.name]
            silence_s = v.paused_s + pause_s
            if silence_s < s.policy.settles_at_s():
                continue
            wall_s = (self.clock_ns() - s.start_ns) / 1e9 if s.start_ns is not None else v.audio_end_s
            close_at_s = max(s.policy.buffer_start_s, v.audio_end_s - self.config.lead_in_s)
            out += self._labelled(s, s.policy.settle(silence_s, close_at_s, v.audio_end_s, wall_s))
            if not s.policy.has_pending_text:
                self._reset_segment(s, v.audio_end_s)
        return self.dated_later(out, 0) if out else out

    def _window(self, s: StreamState) -> tuple[int, int]:
        """Feature frames ``[first, ready)`` of the stream's buffer (at most one window)."""
        ready = self.features.frames_ready(s.slot)
        first = int(round(s.policy.buffer_start_s * FRAMES_PER_S)) - s.frame_offset
        first = max(first, ready - WINDOW_FRAMES + 1, self.features.oldest_frame(s.slot), 0)
        return first, ready

    def _windows(self, streams: list[StreamState]) -> list[tuple[int, int]]:
        """:meth:`_window` of several streams, their frame counts read in one look-up."""
        ready = self.features.frames_ready_many([s.slot for s in streams]).tolist()
        ring_frames = self.features.ring_frames
        out = []
        for s, end in zip(streams, ready):
            first = int(round(s.policy.buffer_start_s * FRAMES_PER_S)) - s.frame_offset
            out.append((max(first, end - WINDOW_FRAMES + 1, end - ring_frames, 0), end))
        return out

    def _choose_model(self, s: StreamState) -> str:
        """The model of the stream's open segment, chosen at its first update."""
        if s.segment_model is None:
            load = self.load_estimate(all_main=True).load if self._costs["main"].measured else None
            light = self.admission.light_wanted(load) and self._light_eligible(s)
            s.segment_model = "light" if light else "main"
        if s.segment_model == "light" and self.light_recognizer is None:
            s.segment_model = "main"
        return s.segment_model

    def _step(self, streams: list[StreamState], closing: dict[str, bool]) -> list[CaptionUpdate]:
        t0 = self.timer_ns()
        for s in streams:
            if closing[s.name]:
                s.policy.start_after_committed()  # a closing window holds only uncommitted audio
        spans = self._windows(streams)
        if self.config.ring_kernels and self.features.measures_on_device and all(
                capabilities_of(r).reads_rings for r in (self.recognizer, self.light_recognizer) if r is not None):
            # The recognizer reads the windows from the rings into its batch itself (one launch).
            log_mels = [RingWindow(self.features, s.slot, f, r - f) for s, (f, r) in zip(streams, spans)]
        else:
            # Every window of the step in one read of the rings (one gather per bank).
            log_mels = self.features.log_mel_windows([s.slot for s in streams], [f for f, _ in spans],
                                                     [r - f for f, r in spans])
        groups: dict[str, list[int]] = {}
        requests = []
        cut = self._cut_in_speech(streams, closing)
        for i, (s, (first, _), log_mel) in enumerate(zip(streams, spans, log_mels)):
            model = self._choose_model(s)
            groups.setdefault(model, []).append(i)
            start_s = (first + s.frame_offset) / FRAMES_PER_S
            name = (self.light_recognizer if model == "light" else self.recognizer).name
            # A window cut off inside speech is timed by the attention whatever the policy: the
            # times tell the words heard from those guessed past the cut. A forced prefix is
            # prefilled without attention, so such a window decodes its buffer whole.
            requests.append(WindowRequest(
                s.name, log_mel, start_s, s.policy.prompt_text(),
                s.language or self.language or s.segment_language,
                alignment=getattr(s.policy, "wants_alignment", False) or cut[i],
                prefix=s.policy.forced_prefix(start_s) if s.decoded_by == name and not cut[i] else (),
            ))
        # The previous step's hypotheses, if held back, are read and folded while this step encodes.
        earlier, self._pending = self._pending, None
        defer = self._defer()
        unread: list = []
        folded: list[tuple[StreamState, list[CaptionUpdate]]] = []
        fold_at_ns = [0, 0]  # when the fold ran, and its duration (ns, on the step's timer)

        def fold_earlier() -> None:
            fold_at_ns[0], f0 = self.clock_ns(), self.timer_ns()
            folded.extend(self._fold(earlier, fold_at_ns[0]))
            fold_at_ns[1] = self.timer_ns() - f0

        hook = fold_earlier if earlier is not None else None
        hypotheses: list = [None] * len(streams)
        for model, rows in groups.items():
            recognizer = self.light_recognizer if model == "light" else self.recognizer
            m0 = self.timer_ns()
            batch = [requests[i] for i in rows]
            can = capabilities_of(recognizer)
            overlaps = hook is not None and can.takes_host_work
            work = {"while_encoding": hook} if overlaps else {}
            # Held back, the hypotheses are also read (text, guards, words) at the fold.
            decode_pending = can.decode_pending if defer else None
            if decode_pending is not None:
                unread.append((rows, decode_pending(batch, **work)))
            else:
                for i, hyp in zip(rows, recognizer.decode(batch, **work)):
                    hypotheses[i] = hyp
            for i in rows:
                streams[i].decoded_by = recognizer.name
            model_s = (self.timer_ns() - m0) / 1e9
            if overlaps:
                hook = None
                self.overlapped_steps += 1
                if not recognizer.overlaps_host_work:  # the fold ran beside the model, not during it
                    model_s -= fold_at_ns[1] / 1e9
            self._costs[model].record(len(rows), model_s)
            if model == "light":
                self.light_steps += 1
        if hook is not None:
            hook()  # no recognizer took it
        step_s = (self.timer_ns() - t0) / 1e9
        t1 = self.clock_ns()
        updates = self._emitted(folded, t1 - fold_at_ns[0]) if earlier is not None else []
        ends_s = []
        for s, (_, ready), hyp in zip(streams, spans, hypotheses):
            if s.last_update_ns is not None:
                self._intervals_s.append((t1 - s.last_update_ns) / 1e9)
                if self.interval_log is not None:
                    self.interval_log.append(self._intervals_s[-1])
            s.last_update_ns = t1
            end_s = (ready + s.frame_offset) / FRAMES_PER_S
            ends_s.append(end_s)
            if hyp is not None:
                self._note_language(s, hyp)
            captured = s.capture_ns_at((ready + s.frame_offset) * FRAME_SAMPLES)
            if captured is not None:
                self._lags.append((t1, max(0.0, (t1 - captured) / 1e9)))
        decoded = _Decoded(streams, ends_s, hypotheses, [closing[s.name] for s in streams], unread, cut)
        if defer:
            self._pending = decoded
        else:
            updates += self._emitted(self._fold(decoded, t1), 0)
        for s, end_s, is_closing in zip(streams, ends_s, decoded.closing):
            # The engine's own view of the stream moves on now, folded or not: audio pushed
            # before the fold must count towards the next segment, not be reset by it.
            if is_closing:
                self._reset_segment(s, None)
            s.last_update_s = end_s
            s.speech_since_update = False
        self.last_step_s = step_s
        self.step_s_total += step_s
        self._step_latency_ms = step_s * 1e3
        self._busy.append((t1, step_s))
        self.scheduler.record_step(step_s)
        self.steps += 1
        self.last_batch_size = len(streams)
        return updates

    def _cut_in_speech(self, streams: list[StreamState], closing: dict[str, bool]) -> list[bool]:
        """Per stream: whether its window closes a segment on audio that ends inside speech
        (less than ``pause_s`` of quiet after the last speech: a stream stopped mid-sentence).
        A close at a pause ends in quiet."""
        if not any(closing[s.name] for s in streams):
            return [False] * len(streams)
        quiet = self.vad.silence_frames_many([s.vad_row for s in streams]).tolist()
        pause_frames = self.config.pause_s * FRAMES_PER_S
        return [closing[s.name] and frames < pause_frames for s, frames in zip(streams, quiet)]

    def _defer(self) -> bool:
        """Whether this step's hypotheses wait to be folded during the next step's encoding."""
        mode = self.config.overlap_updates
        if mode != "auto":
            return mode == "on"
        if self._last_load is None or self._last_load < self.config.overlap_min_load:
            return False
        return all(capabilities_of(r).overlaps_host_work for r in (self.recognizer, self.light_recognizer)
                   if r is not None)

    def _note_language(self, s: StreamState, hyp, closed: bool = False) -> None:
        """A multilingual model's language of the stream's open segment, from its first
        accepted hypothesis (``closed``: the segment was closed before the hypothesis was read,
        so it becomes the stream's last language, as closing it would have made it)."""
        if (s.language or self.language) is None and s.segment_language is None and hyp.language and not hyp.rejected \
                and capabilities_of(self.recognizer).is_multilingual:
            if closed:
                s.last_language = hyp.language
            else:
                s.segment_language = hyp.language

    def _fold(self, decoded: _Decoded, at_ns: int) -> list[tuple[StreamState, list[CaptionUpdate]]]:
        """Each hypothesis of ``decoded`` into its stream's policy, dated ``at_ns`` (clock); the
        ones not read yet are read first. Streams closed in between are skipped: their end
        folded them first."""
        streams = self._streams
        for i in decoded.read():
            s = decoded.streams[i]
            if streams.get(s.name) is s:
                self._note_language(s, decoded.hypotheses[i], closed=decoded.closing[i])
        out = []
        lead_in_s = self.config.lead_in_s
        for i, (s, end_s, hyp, is_closing) in enumerate(zip(decoded.streams, decoded.ends_s, decoded.hypotheses,
                                                            decoded.closing)):
            if streams.get(s.name) is not s:
                continue
            wall_s = (at_ns - s.start_ns) / 1e9 if s.start_ns is not None else end_s
            if is_closing:
                mine = s.policy.update(hyp, end_s, wall_s, close_segment=True,
                                       close_at_s=max(s.policy.buffer_start_s, end_s - lead_in_s),
                                       cut_in_speech=bool(decoded.cut_in_speech) and decoded.cut_in_speech[i])
            else:
                mine = s.policy.update(hyp, end_s, wall_s)
            out.append((s, self._labelled(s, mine)))
        return out

    def _emitted(self, folded: list[tuple[StreamState, list[CaptionUpdate]]], later_ns: int) -> list[CaptionUpdate]:
        """The updates of a fold, dated ``later_ns`` after it (when the caller gets them: a fold
        held back runs during the next step, whose end returns them)."""
        return self.dated_later([u for _, mine in folded for u in mine], later_ns)

    def dated_later(self, updates: list[CaptionUpdate], later_ns: int) -> list[CaptionUpdate]:
        """``updates`` dated ``later_ns`` (the clock's nanoseconds) after they were made, for a
        caller that gets them only then; the caption latency follows the newest final among
        them. An update's ``emitted_wall_s`` is when it could first be seen: a date taken
        before the caller has it makes every latency measured from it look shorter. A shift under
        :data:`DATED_LATER_MIN_NS` is left out: it would copy every update of every step (a
        step's last tick is returned microseconds after it) for no visible difference."""
        if later_ns >= DATED_LATER_MIN_NS:
            shift_s = later_ns / 1e9
            updates = [replace(u, emitted_wall_s=round(u.emitted_wall_s + shift_s, 3)) for u in updates]
        for u in reversed(updates):
            if u.kind == "final":
                # Audio end of the newest committed text -> when it was committed.
                self._caption_latency_s = max(0.0, u.emitted_wall_s - u.end_s)
                break
        return updates

    def flush(self) -> list[CaptionUpdate]:
        """Fold the last step's hypotheses if they are still held back (see
        :attr:`EngineConfig.overlap_updates`) and return their updates."""
        decoded, self._pending = self._pending, None
        if decoded is None:
            return []
        return self._emitted(self._fold(decoded, self.clock_ns()), 0)

    def _reset_segment(self, s: StreamState, at_s: float | None) -> None:
        if s.segment_language is not None:
            s.last_language = s.segment_language
        s.segment_language = None
        s.segment_model = None
        s.last_update_ns = None  # the next update starts a segment: no interval to count
        if at_s is not None:
            s.policy.advance_idle(max(0.0, at_s - self.config.lead_in_s))
        s.speech_since_update = False
        s.segment_speech_frames = 0
        s.last_update_s = self._audio_end_s(s)

    def _finish_streams(self, streams: list[StreamState]) -> list[CaptionUpdate]:
        """A last update over what is left of each stream, committed whole (the last step's
        pending hypotheses, any stream's, folded first). The last updates of streams that end
        together are one model step (up to ``max_batch`` rows each): a step of one row costs
        most of what one of a hundred does (benchmarks/results/serve/HISTORY.md, "streams that end
        together share their last model steps"), and a server whose clients come and go, or a close of
        every stream, made one per stream."""
        updates: list[CaptionUpdate] = self.flush()
        last = [s for s in streams if (s.speech_since_update or s.policy.has_uncommitted_text) and (
            s.segment_speech_frames >= self.config.min_speech_s * FRAMES_PER_S or s.policy.has_uncommitted_text)]
        max_batch = max(1, self.config.scheduler.max_batch)
        for first in range(0, len(last), max_batch):
            batch = last[first:first + max_batch]
            updates += self._step(batch, {s.name: True for s in batch})
            updates += self.flush()  # their last hypotheses, before the policies commit the rest
        for s in streams:
            end_s = self._audio_end_s(s)
            wall_s = (self.clock_ns() - s.start_ns) / 1e9 if s.start_ns is not None else end_s
            updates += self._labelled(s, s.policy.flush(end_s, wall_s))
        return updates

    def replace_recognizer(self, recognizer: Recognizer) -> list[CaptionUpdate]:
        """Switch models between steps: open text is committed by the old model first; a model
        with another number of mel bands gets fresh feature rings (stream clocks go on)."""
        updates = self.finish()
        self._costs["main"] = StepCost()  # another model, another cost: measure it afresh
        if self.light_recognizer is not None and recognizer.n_mels != self.light_recognizer.n_mels:
            self.light_recognizer = None  # it could not read the new rings
        if recognizer.n_mels != self.recognizer.n_mels:
            old = self.features
            self._build_features(recognizer.n_mels)
            for s in self._streams.values():
                s.frame_offset += old.frames_ready(s.slot)
                s.slot = self.features.acquire()
                s.vad_frames = 0
                if s.speakers is not None:  # its queued frames were in the old rings
                    s.speakers.slot = s.slot
                    s.speakers.pending.clear()
                    self._speaker_bank.restart(s.speakers)
                # The new ring starts at the old ring's first unfinished frame: hand it the audio
                # taken in since that frame began, so no sample is lost or counted as a gap.
                resume = s.frame_offset * FRAME_SAMPLES
                if s.tail.shape[0] and s.next_sample > resume:
                    self.features.push_batch([s.slot], s.tail[None, -(s.next_sample - resume):])
        self.recognizer = recognizer
        return updates

    def finish(self) -> list[CaptionUpdate]:
        """End of all input: close every stream's open text (the streams stay)."""
        return self._finish_streams(list(self._streams.values()))
