"""The public streaming API: audio of any number of streams in, caption updates out.

    live = LiveCaptioner(model="tiny.en", device="cpu")
    me = live.open_stream("Me")
    me.accept_waveform(16000, samples)     # any rate >= 8 kHz, float32/float64/int16, mono, (n, channels) or (channels, n)
    for update in live.step():             # runs the model work that is due
        print(update.stream, update.kind, update.text)
    me.finish()                            # ...then step() until me.done
    live.close()

No threads of its own: the caller drives :meth:`LiveCaptioner.step`, and every method must be
called from that one thread (on a GPU, the thread that made the captioner works the device).
The desktop app, ``listen`` and the server run the same object on a worker thread
(:mod:`captioner.engine.worker`).

Audio handed in is kept until ``step`` feeds it to the engine, a slice of at most
``FEED_S`` per stream at a time with the due model work run between slices, so a backlog (a
file handed over at once, a slow step, a suspended laptop) is worked through as if it had
arrived live: no speech is skipped, and the feature rings never overflow.

An English-only model (``tiny.en``) is checked against the language it hears: the first
seconds of each stream's speech go to a :class:`~captioner.engine.language_check.LiveLanguageCheck`,
a daemon thread of its own that asks ``base`` on the CPU, so ``step`` never waits for it. A
stream in another language gets one :class:`~captioner.engine.language_check.LanguageNotice`
(:meth:`LiveCaptioner.notices`), and its message joins :meth:`LiveCaptioner.status`'s.

There is no fixed number of streams: :meth:`LiveCaptioner.open_stream` raises
:class:`~captioner.errors.StreamRefused` (one line) when the engine's measured memory or step
time says one more would not fit (:mod:`captioner.engine.admission`, docs/capacity.md); a
stream opened with ``priority="live"`` (the default) is served before ``"replay"`` streams when
compute is short.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from captioner.audio.channels import channels_last
from captioner.audio.ingest import StreamIngest
from captioner.engine.admission import Priority, parse_priority
from captioner.engine.core import Engine, EngineConfig
from captioner.engine.language_check import (
    DetectorLoader,
    LanguageNotice,
    LiveLanguageCheck,
    StreamWatch,
    load_detector,
)
from captioner.engine.messages import (
    Lifecycle,
    LifecycleLog,
    Refused,
    StreamDone,
    StreamOpened,
)
from captioner.engine.recognizer import Recognizer, capabilities_of
from captioner.engine.speakers import check_mode
from captioner.engine.stream_state import BlockSlice
from captioner.errors import StreamRefused, one_line
from captioner.events import (
    FRAME_SAMPLES,
    SAMPLE_RATE_HZ,
    AudioBlock,
    CaptionUpdate,
    FramedAudio,
    PipelineStatus,
)
from captioner.languages import language_code

FEED_S = 0.1
"""Audio of one stream fed to the engine between two scheduler ticks: fine enough that updates
and segment ends fall where they would in a live session (the scheduler's own granularity)."""


def load_recognizer(model: str, device: str | None, task: str = "transcribe", progress=None):
    """The array back-end and the recognizer of ``model`` (by its family,
    :mod:`captioner.engine.families`) on ``device``; the calling thread becomes the one that
    works the GPU. ``device`` is checked as the CLI's ``--device`` is
    (:func:`~captioner.device_check.engine_device`): a GPU that cannot be used is refused with
    the CLI's reason, and "auto" never takes a GPU that only one side of the engine can use."""
    from captioner.device_check import engine_device
    from captioner.engine.families import family_of
    from captioner.gpu.backend import get_backend

    backend = get_backend(engine_device(device))
    backend.use()  # CuPy allocates on the current device: make it this one, for this thread
    return backend, family_of(model).load(model, backend, task, progress)



class CaptionStream:
    """One stream of a :class:`LiveCaptioner` (a microphone, a meeting's audio, a file).

    Made by :meth:`LiveCaptioner.open_stream`; called by the captioner's thread."""

    def __init__(self, owner: LiveCaptioner, label: str, language: str | None, priority: int = Priority.LIVE) -> None:
        self._owner = owner
        self.label = label
        self.language = language
        self.priority = priority
        self._ingest = StreamIngest(label)
        self._pending: deque[AudioBlock] = deque()
        self._head_taken = 0
        """Samples of the oldest pending block already fed to the engine."""
        self._finishing = False
        self._framed = False  # fed by accept_frames
        self._done = False
        self._language_watch: StreamWatch | None = None
        self._speakers = False

    @property
    def done(self) -> bool:
        """True once :meth:`finish` was called and ``step`` has committed everything."""
        return self._done

    @property
    def speakers(self) -> bool:
        """Whether this stream's lines carry speaker labels (``CaptionUpdate.speaker``)."""
        return self._speakers

    @property
    def pending_s(self) -> float:
        """Audio accepted but not yet fed to the engine (a backlog)."""
        return (sum(b.n_samples for b in self._pending) - self._head_taken) / SAMPLE_RATE_HZ

    def accept_waveform(self, sample_rate: int, samples, capture_ns: int | None = None,
                        first_sample: int | None = None) -> None:
        """Hand over audio that follows what came before. ``sample_rate`` ≥ 8000 Hz; ``samples``
        float32/float64 in [-1, 1] or int16, mono ``(n,)``, ``(n, channels)`` or channels first
        ``(channels, n)`` as torchaudio and librosa give it, with at most 8 channels and more than
        8 samples (any other 2-D shape is refused, never guessed: :mod:`captioner.audio.channels`);
        channels are averaged. ``capture_ns`` is when
        the last sample was captured (default: now); ``first_sample``, the index of ``samples[0]``
        on the caller's own clock at ``sample_rate``, lets a jump mark lost audio (it becomes
        silence, so stream time stays exact)."""
        if self._finishing:
            raise ValueError(f"stream {self.label!r} is finished: open a new stream for more audio")
        if self._framed:
            raise ValueError(f"stream {self.label!r} takes framed audio (accept_frames): its clock is the sender's")
        if not isinstance(sample_rate, (int, np.integer)) or isinstance(sample_rate, bool):
            raise ValueError(f"sample_rate must be an integer number of Hz, got {sample_rate!r}")
        when_ns = self._owner.clock_ns() if capture_ns is None else int(capture_ns)
        engine = self._owner.engine
        t0 = engine.host_timer()
        block = self._ingest.accept(int(sample_rate), channels_last(samples), when_ns, first_sample)
        if block is not None:
            self._pending.append(block)
        engine.host_s["ingest"] += engine.host_timer() - t0

    def accept_frames(self, first_sample: int, capture_ns: int, samples: np.ndarray) -> None:
        """Audio that was resampled and framed where it came in (the supervisor of a model's
        process, a server's front-end): whole 10 ms frames of 16 kHz float32 at index
        ``first_sample`` of the stream's clock, taken as they are, not checked and framed a second
        time (the engine fills a gap with silence and drops what overlaps). A stream takes its
        audio this way or by :meth:`accept_waveform`, not both: each keeps its own clock."""
        if self._finishing:
            raise ValueError(f"stream {self.label!r} is finished: open a new stream for more audio")
        if self._ingest.rate_hz is not None:
            raise ValueError(f"stream {self.label!r} takes its audio by accept_waveform, not framed")
        if samples.dtype != np.float32 or samples.ndim != 1 or samples.shape[0] % FRAME_SAMPLES or first_sample < 0:
            raise ValueError(f"framed audio is whole {FRAME_SAMPLES}-sample frames of float32 from a sample "
                             f"index >= 0, got {samples.dtype} {samples.shape} at {first_sample}")
        self._framed = True
        if samples.shape[0]:
            self._pending.append(AudioBlock(self.label, int(first_sample), int(capture_ns), samples))

    def finish(self) -> None:
        """No more audio: the next ``step`` calls commit what the stream still shows, then
        :attr:`done` turns true."""
        if self._finishing:
            return
        self._finishing = True
        tail = self._ingest.flush(self._owner.clock_ns())
        if tail is not None:
            self._pending.append(tail)

    def _take_upto(self, max_samples: int) -> list[AudioBlock | BlockSlice]:
        """The oldest pending audio, at most ``max_samples`` of it, over as many blocks as it takes."""
        taken: list[AudioBlock | BlockSlice] = []
        left = max_samples
        while left > 0 and self._pending:
            block = self._take(left)
            taken.append(block)
            left -= block.samples.shape[0]
        return taken

    def _take(self, max_samples: int) -> AudioBlock | BlockSlice | None:
        """The oldest pending audio, at most ``max_samples`` of it (a block is split if longer:
        the part taken is a :class:`~captioner.engine.core.BlockSlice`; what is left stays where
        it is, an offset into the oldest block, so a backlog of ``k`` slices makes ``k`` slices,
        not ``2 k``)."""
        if not self._pending:
            return None
        block = self._pending[0]
        offset = self._head_taken
        left = block.n_samples - offset
        if left <= max_samples:
            self._pending.popleft()
            self._head_taken = 0
            if offset == 0:
                return block
            return BlockSlice(block.stream, block.first_sample + offset, block.capture_ns, block.samples[offset:])
        self._head_taken = offset + max_samples
        # A block's capture time is its last sample's: this slice ends ``left - max_samples``
        # samples before that. Dated with the block's time, a backlog's first slice moved the
        # stream's clock origin late by the rest of the block, and every caption of the stream
        # then looked that much quicker (and its lag that much shorter) than it was.
        ends_early_ns = (left - max_samples) * 1_000_000_000 // SAMPLE_RATE_HZ
        return BlockSlice(block.stream, block.first_sample + offset, block.capture_ns - ends_early_ns,
                          block.samples[offset:offset + max_samples])


class LiveCaptioner:
    """Live captions for any number of streams, on the CPU or one GPU.

    ``model``: "tiny.en", "base" or a CTranslate2 Whisper folder. ``device``: "cpu", "cuda",
    "cuda:N" or ``None``/"auto" (a usable GPU, else the CPU). ``language``: the default for
    streams opened without one (``None``: English for English-only models, detected per
    segment for multilingual ones). ``task``: "transcribe" or "translate" (to English).

    ``recognizer``/``backend`` replace the model loading (a scripted recognizer in tests, a
    shared one in benchmarks); ``clock_ns`` and ``timer_ns`` are the engine's clocks (a
    simulated replay passes its own).

    ``language_check``: whether streams heard by an English-only model are checked for another
    language (see the module docstring) — on a background thread, so off by default: the API has
    no threads of its own unless asked. ``True`` (the app and the CLI ask for it), ``False``, or
    a function that returns the detector (``None`` to skip), which also turns it on. Streams opened with a
    language other than English are never checked (an English-only model refuses them), nor are
    streams of a multilingual model. Bad arguments raise ``ValueError`` with a one-line message
    (:class:`~captioner.errors.UserError`, which the CLI prints as it is).

    ``light_model`` (e.g. "tiny.en" beside "base"), or ``light_recognizer``: a second model on
    the same device that takes new segments of English streams while the admitted load is high
    (``EngineConfig.admission.light_on_load``) and gives them back when it falls; ``tiny.en`` is
    English-only, so streams in other languages stay on the main model.

    ``speakers``: who said what (``CaptionUpdate.speaker``, docs/speakers.md): ``"auto"`` labels
    the streams opened with ``source="meeting"``, ``"file"`` or ``"remote"`` (a microphone, or a
    stream whose source is not said, is one person); ``"on"`` every stream; ``"off"`` none.
    ``None`` keeps ``config.speakers.mode`` (``"auto"`` by default).
    """

    def __init__(self, model: str = "tiny.en", device: str | None = None, *, language: str | None = None,
                 task: str = "transcribe", config: EngineConfig | None = None, progress=None,
                 recognizer: Recognizer | None = None, backend=None,
                 clock_ns: Callable[[], int] = time.monotonic_ns, timer_ns: Callable[[], int] | None = None,
                 language_check: bool | DetectorLoader = False, light_model: str | None = None,
                 light_recognizer: Recognizer | None = None, speakers: str | None = None) -> None:
        if task not in ("transcribe", "translate"):
            raise ValueError(f"unknown task {task!r}: use 'transcribe' or 'translate'")
        if speakers is not None:
            config = config or EngineConfig()
            config = replace(config, speakers=replace(config.speakers, mode=check_mode(speakers)))
        self.model = model
        self.device = device
        self.task = task
        self.clock_ns = clock_ns
        self._detector_loader: DetectorLoader | None = (
            language_check if callable(language_check) else load_detector if language_check else None)
        self._language_check: LiveLanguageCheck | None = None
        if recognizer is None:
            backend, recognizer = load_recognizer(model, device, task, progress)
        elif backend is None:
            from captioner.gpu.backend import cpu_backend

            backend = cpu_backend()
        self.backend = backend
        config = config or EngineConfig()
        if light_recognizer is None and light_model is not None:
            _, light_recognizer = load_recognizer(light_model, backend.name, task, progress)
        self.engine = Engine(backend, recognizer, config, clock_ns=clock_ns, timer_ns=timer_ns,
                             light_recognizer=light_recognizer)
        self.set_language(language)
        self._streams: dict[str, CaptionStream] = {}
        self._lifecycle = LifecycleLog()
        self._closed = False
        self.feed_s = FEED_S
        """Audio of each stream fed between two ticks (:data:`FEED_S`); a model host with many
        streams raises it to its step spacing's double, so that a stream's two chunks come
        together in a step make one tick, not a second one of the few such streams."""

    # -- properties ------------------------------------------------------------------------------
    @property
    def recognizer(self) -> Recognizer:
        return self.engine.recognizer

    @property
    def provider(self) -> str:
        """Where the model runs, as ONNX Runtime reports it (e.g. "CUDAExecutionProvider")."""
        return self.engine.recognizer.provider

    @property
    def streams(self) -> Mapping[str, CaptionStream]:
        """The open streams by label (finished ones leave once done): a read-only view, not a
        copy, since the worker looks a stream up for every chunk it hands on."""
        return MappingProxyType(self._streams)

    @property
    def pending_s(self) -> float:
        """The largest backlog of any stream: audio accepted but not yet captioned."""
        return max((s.pending_s for s in self._streams.values()), default=0.0)

    def accept_framed(self, audio: FramedAudio) -> None:
        """Several streams' audio at once, already whole 16 kHz frames on each stream's clock (a
        server's front-ends frame it). A stream that is not open, or finished, is left out: its
        audio may have been sent before the close that ended it."""
        for label, first, capture_ns, samples in audio.pieces():
            stream = self._streams.get(label)
            if stream is not None and not stream._finishing:
                stream.accept_frames(first, capture_ns, samples)

    # -- streams ---------------------------------------------------------------------------------
    def open_stream(self, label: str, language: str | None = None, *,
                    priority: int | str = Priority.LIVE, readmit: bool = False,
                    history: Sequence[str] = (), source: str | None = None) -> CaptionStream:
        """A new stream named ``label`` (unique among the open streams). ``language``: a code
        ("en", "de", …), "auto"/``None`` for the captioner's default. ``priority``: ``"live"``
        (a microphone, a meeting; the default), ``"replay"`` (a file) or an integer, higher
        served first when a model step cannot take every due stream. ``readmit``: the stream
        was captioned before by a captioner that failed (a restart re-opens it): only memory
        can refuse it, not the time budget nor the growth limit; ``history``: the words that
        captioner had committed (``engine.prompt_history``), the prompt of its next window.
        ``source``: ``"microphone"``, ``"meeting"``, ``"file"`` or ``"remote"`` (a server's
        client), or ``None``: whether ``speakers="auto"`` labels the stream's speakers.

        Raises :class:`~captioner.errors.StreamRefused` (a one-line ``ValueError``) when the
        engine is at capacity; the streams already open are not touched."""
        self._check_open()
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"a stream needs a non-empty label, got {label!r}")
        if label in self._streams:
            raise ValueError(f"a stream labelled {label!r} is already open")
        code = self._checked_language(language)
        rank = parse_priority(priority)
        try:
            self.engine.add_stream(label, language=code, priority=rank, readmit=readmit, history=history, source=source)
        except StreamRefused as refused:
            self._lifecycle.add(Refused(label, one_line(refused)))
            raise
        stream = CaptionStream(self, label, code, rank)
        stream._speakers = self.engine.speaker_labels(label)
        if self._wants_language_check(language_code(language)):
            stream._language_watch = self._checker().watch(label)
        self._streams[label] = stream
        self._lifecycle.add(StreamOpened(label))
        return stream

    def _wants_language_check(self, requested: str | None) -> bool:
        # An explicit "en" is checked too: it is the only language an English-only model takes,
        # so it is what a menu or a script passes by default, and German speech comes out as the
        # same gibberish whatever was claimed; one notice costs one check on another thread.
        return (self._detector_loader is not None and requested in (None, "en")
                and not capabilities_of(self.engine.recognizer).is_multilingual)

    def _checker(self) -> LiveLanguageCheck:
        if self._language_check is None:
            assert self._detector_loader is not None
            self._language_check = LiveLanguageCheck(self.engine.recognizer.name, self._detector_loader)
        return self._language_check

    def set_language(self, language: str | None) -> None:
        """The default language of every stream opened without one (from the next update on)."""
        self.engine.language = self._checked_language(language)

    def set_recognizer(self, recognizer: Recognizer) -> list[CaptionUpdate]:
        """Another model from the next update on; what the streams show is committed by the old
        one first (those updates are returned)."""
        self._check_open()
        updates = self.engine.replace_recognizer(recognizer)
        if self._language_check is not None:
            if not capabilities_of(recognizer).is_multilingual:
                self._language_check.model = recognizer.name
            else:
                # The notices asked for a multilingual model, and this is one: they are moot.
                self._language_check.close(timeout_s=0.0)
                self._language_check = None
                for stream in self._streams.values():
                    stream._language_watch = None
        return updates

    def set_model(self, model: str) -> list[CaptionUpdate]:
        """Load ``model`` on this captioner's device and switch to it (see :meth:`set_recognizer`)."""
        _, recognizer = load_recognizer(model, self.backend.name, self.task)
        self.model = model
        return self.set_recognizer(recognizer)

    def _checked_language(self, language: str | None) -> str | None:
        code = language_code(language)
        check = capabilities_of(self.engine.recognizer).check_language
        return code if check is None else check(code)  # UserError (a ValueError) when unsupported

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("this LiveCaptioner is closed")

    # -- work ------------------------------------------------------------------------------------
    def step(self, hand_out: Callable[[list[CaptionUpdate]], None] | None = None) -> list[CaptionUpdate]:
        """Feed the audio accepted so far to the engine and run the model work that falls due;
        streams that were finished and have nothing left are committed and closed.

        A backlog is worked through in several ticks, each with its own model step. Without
        ``hand_out``, every tick's updates are returned at the end, each dated then
        (``emitted_wall_s``: nobody could see it before). With ``hand_out``, each tick's updates
        are passed to it as soon as they exist, and ``step`` returns none: a caller that sends
        captions on (the worker, a model host) gets the first tick's out while the next one runs;
        a busy server's step runs several long ticks (benchmarks/results/serve/HISTORY.md, "handed out
        tick by tick")."""
        self._check_open()
        made: list[tuple[int, list[CaptionUpdate]]] = []  # (clock when made, updates), kept for the end

        def out(updates: list[CaptionUpdate]) -> None:
            if not updates:
                return
            if hand_out is not None:
                hand_out(updates)
            else:
                made.append((self.clock_ns(), updates))

        # Only streams with audio waiting are visited, and after the first slice only those that
        # still have some: at real-time pace every stream has one block, and a second pass over
        # all of them to find nothing cost as much as the first.
        waiting = [s for s in self._streams.values() if s._pending]
        if not waiting:
            # No audio, no tick: a step's text work held back for the next one is done now.
            out(self.engine.flush())
        feed_samples = max(FRAME_SAMPLES, int(self.feed_s * SAMPLE_RATE_HZ) // FRAME_SAMPLES * FRAME_SAMPLES)
        while waiting:
            blocks = [block for s in waiting for block in s._take_upto(feed_samples)]
            self._feed_language_check(blocks)
            self.engine.push(blocks)
            out(self.engine.tick())
            waiting = [s for s in waiting if s._pending]
        ended = [s for s in self._streams.values() if s._finishing and not s._pending]
        if ended:  # their last updates in one model step
            out(self.engine.remove_streams([s.label for s in ended]))
        for stream in ended:
            stream._done = True
            if stream._language_watch is not None and self._language_check is not None:
                self._language_check.end(stream._language_watch)
            del self._streams[stream.label]
            self._lifecycle.add(StreamDone(stream.label))
        if not made:
            return []
        end_ns = self.clock_ns()
        return [u for made_ns, updates in made for u in self.engine.dated_later(updates, end_ns - made_ns)]

    def _feed_language_check(self, blocks: list[AudioBlock | BlockSlice]) -> None:
        check = self._language_check
        if check is None:
            return
        for block in blocks:
            watch = self._streams[block.stream]._language_watch
            if watch is not None and not watch.settled:
                check.feed(watch, block.samples)  # a queue put: the check runs on its own thread

    def take_lifecycle(self) -> list[Lifecycle]:
        """Streams opened, refused and closed since the last call, in order: a stream's
        ``StreamDone`` comes once :meth:`step` has handed out its last update. For a caller that
        forwards updates (the worker, a model host): the events follow the updates of the same step."""
        return self._lifecycle.take()

    def notices(self) -> list[LanguageNotice]:
        """Language notices made since the last call: a stream that an English-only model hears
        in another language gets one. Any thread may call this."""
        return self._language_check.notices() if self._language_check is not None else []

    def status(self, **kwargs) -> PipelineStatus:
        """The engine's status now (latency, lag, batch size, …); ``kwargs`` as
        :meth:`~captioner.engine.core.Engine.status` takes them. Its ``message`` is the one
        passed in (the worker's lost inputs), followed by every language notice's message."""
        if self._language_check is not None:
            notes = self._language_check.messages()
            if notes:
                kwargs["message"] = "; ".join(m for m in (kwargs.get("message", ""), *notes) if m)
        return self.engine.status(**kwargs)

    def close(self) -> list[CaptionUpdate]:
        """Finish every stream (what they show is committed and returned) and release the
        captioner; safe to call twice."""
        if self._closed:
            return []
        updates: list[CaptionUpdate] = []
        try:
            for stream in list(self._streams.values()):
                stream.finish()
            updates = self.step()
        finally:
            self._closed = True
            self._streams.clear()
            if self._language_check is not None:
                self._language_check.close()
        return updates

    def __enter__(self) -> LiveCaptioner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        try:
            where = self.provider or "?"
        except Exception as error:  # a repr must never raise
            where = one_line(error)
        return f"LiveCaptioner(model={self.model!r}, provider={where!r}, streams={list(self._streams)!r})"
