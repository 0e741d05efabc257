"""Is an English-only model hearing another language? A one-off check per stream (issue 15).

An English-only Whisper (``tiny.en``) fed German prints confident English-sounding gibberish,
and its own scores are no safe shortcut (on the first seconds of the test recordings, its mean
token log-probability was -0.14 on the Spanish reading, higher than on any of the 16 English
clips, -0.19 to -0.64). So the language is named by a multilingual model instead: ``base``, on
the CPU (ONNX Runtime's CPU provider, one thread), over the first few seconds of a stream's
speech. When it hears another language with probability >= :data:`NOTICE_MIN_PROBABILITY`, a
:class:`LanguageNotice` says so once, with what to do about it.

Parts, and who calls them:

- :func:`load_detector` -> :class:`LanguageDetector`, shared by the process; ``None`` (and a
  debug log line) when ``base`` is not installed or does not load. Any thread.
- :func:`language_notice`: language probabilities -> a notice or ``None``. Pure.
- :class:`SpeechOnset`: collects one stream's audio until it holds enough speech to judge.
  Used by the check thread only.
- :class:`LiveLanguageCheck`: the background thread of a
  :class:`~captioner.engine.live.LiveCaptioner`. The captioner's thread only hands it audio
  (a queue put), so a step never waits for the check, and the thread that works the GPU never
  shares it with ``base``.

The offline path (:func:`~captioner.engine.offline.transcribe_audio`) calls
:func:`check_features` on its first window, on its own thread.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from captioner.events import FRAME_SAMPLES, FRAMES_PER_S, SAMPLE_RATE_HZ
from captioner.languages import language_name

log = logging.getLogger(__name__)

DETECTOR_MODEL = "base"
"""The multilingual model that names the language (installed as a package, see the registry)."""
DETECTOR_THREADS = 1
"""ONNX Runtime threads of the check. One: on a small CPU two threads were no faster
(docs/decisions/004-language-check.md), and one thread leaves the other core to the captioning
model that runs meanwhile."""
NOTICE_MIN_PROBABILITY = 0.5
"""A notice needs a non-English language at least this likely: on the test recordings' checked
windows English and the other languages scored far apart, and 0.5 lies in that gap with a wide
margin each side (docs/decisions/004-language-check.md). It means "more likely this language
than all the others together"."""
CHECK_SPEECH_S = 3.0
"""Voiced audio a live stream gathers before it is checked: enough for every recording above,
little enough that the notice comes within seconds of the first words."""
MIN_SPEECH_S = 1.0
"""A stream that ends (or spreads its speech over a whole window) with less voiced audio than
this is not checked: a cough or a word is not enough to name a language (the shortest test
clips, just over it, were still named right: docs/decisions/004-language-check.md)."""
LEAD_S = 0.5
"""Audio kept before the first speech, as the offline path keeps before a window: onsets are soft."""
WINDOW_S = 30.0
"""Whisper's window: the most audio one check can look at."""



# -- the notice ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LanguageNotice:
    """An English-only model is hearing another language. Made once per stream (offline: once
    per file, ``stream`` empty); crosses threads as it is."""

    stream: str
    language_code: str
    language_name: str
    probability: float
    """How likely ``base`` found that language, over the checked window."""
    message: str
    """For a person, as it is: "this sounds like German; tiny.en is English-only — try --model base"."""


def notice_message(language_name: str, model: str) -> str:
    return f"this sounds like {language_name}; {model} is English-only — try --model {DETECTOR_MODEL}"


def language_notice(stream: str, probabilities: dict[str, float], model: str,
                    min_probability: float = NOTICE_MIN_PROBABILITY) -> LanguageNotice | None:
    """The notice for a window whose language ``probabilities`` (code -> probability) a
    multilingual model gave, heard by the English-only ``model``; ``None`` when the window
    sounds English, or like no language clearly enough."""
    others = [(p, code) for code, p in probabilities.items() if code != "en"]
    if not others:
        return None
    probability, code = max(others)
    if probability < min_probability:
        return None
    name = language_name(code)
    return LanguageNotice(stream, code, name, float(probability), notice_message(name, model))


# -- the detector -------------------------------------------------------------------------------
class LanguageDetector:
    """A multilingual Whisper on the CPU that only names languages. Any thread may call it; a
    lock serialises the calls (a runtime is driven by one thread at a time)."""

    def __init__(self, runtime, tokenizer) -> None:
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.name = str(getattr(runtime, "name", DETECTOR_MODEL))
        self.n_mels = int(runtime.n_mels)
        self._lock = threading.Lock()

    def probabilities(self, features: np.ndarray) -> dict[str, float]:
        """Language code -> probability (most likely first) for one normalised 30 s log-mel
        window ``[n_mels, 3000]`` (or ``[1, n_mels, 3000]``)."""
        from captioner.models.decoding import detect_language

        mel = np.asarray(features, dtype=np.float32)
        mel = mel[None] if mel.ndim == 2 else mel
        with self._lock:
            return detect_language(self.runtime, self.tokenizer, mel)[0]

    def probabilities_of_audio(self, audio_16k: np.ndarray) -> dict[str, float]:
        """As :meth:`probabilities`, for up to 30 s of 16 kHz mono audio."""
        from captioner.gpu.features_ref import whisper_input_features

        return self.probabilities(whisper_input_features(audio_16k, self.n_mels))


_detectors: dict[str, LanguageDetector | None] = {}
_detectors_lock = threading.Lock()


def load_detector(model: str = DETECTOR_MODEL) -> LanguageDetector | None:
    """The process's detector for ``model`` on the CPU, loaded on first use (converted to ONNX
    once per user, see :mod:`captioner.models.onnx_export`); ``None`` when the model is not
    installed or fails to load — the check is a hint, so that is only logged (debug). The answer
    is kept either way: a failed load is not retried for every stream. Any thread; the first
    caller pays the load (docs/decisions/004-language-check.md)."""
    with _detectors_lock:
        if model in _detectors:
            return _detectors[model]
        try:
            from captioner.models.runtime import load_runtime
            from captioner.models.tokenizer import WhisperTokenizer

            runtime = load_runtime(model, device="cpu", intra_threads=DETECTOR_THREADS)
            if not runtime.is_multilingual:
                raise ValueError(f"{model} is English-only: it cannot name a language")
            tokenizer = WhisperTokenizer(runtime.files.tokenizer_path, runtime.files.config_path,
                                         n_vocab=runtime.n_vocab)
            detector: LanguageDetector | None = LanguageDetector(runtime, tokenizer)
        except Exception as error:  # not installed, a broken cache, no memory: skip the check
            log.debug("language check skipped: %s cannot be loaded (%s)", model, error)
            detector = None
        _detectors[model] = detector
        return detector


DetectorLoader = Callable[[], "LanguageDetector | None"]
"""Returns the detector to use, or ``None`` to skip checks (:func:`load_detector` by default;
tests pass their own)."""


def check_features(detector: LanguageDetector | None, features: np.ndarray | None, audio_16k: np.ndarray,
                   model: str, stream: str = "") -> LanguageNotice | None:
    """The notice for one window heard by the English-only ``model``: ``features`` (the
    window's normalised log-mel) are used when the detector takes as many mel bands, else the
    window's ``audio_16k``. ``None`` without a detector, or when the window sounds English.
    Runs on the caller's thread (the offline path)."""
    if detector is None:
        return None
    try:
        if features is not None and features.shape[-2] == detector.n_mels:
            probabilities = detector.probabilities(features)
        else:
            probabilities = detector.probabilities_of_audio(audio_16k)
    except Exception as error:  # a hint must never fail a transcription
        log.debug("language check failed: %s", error)
        return None
    return language_notice(stream, probabilities, model)


# -- when a stream has spoken enough --------------------------------------------------------------
class SpeechOnset:
    """Collects one stream's 16 kHz audio until it holds :data:`CHECK_SPEECH_S` of speech,
    judged by the engine's VAD on the speech-band energy of its own log-mel frames. Keeps only
    a lead-in while there is no speech, and at most a window after it. Called by one thread
    (the check thread)."""

    def __init__(self, n_mels: int = 80, check_speech_s: float = CHECK_SPEECH_S) -> None:
        from captioner.engine.vad import VoiceActivity, speech_band

        self.n_mels = n_mels
        self._band = speech_band(n_mels)
        self._vad = VoiceActivity()
        self._need_frames = int(check_speech_s * FRAMES_PER_S)
        self._lead_frames = int(LEAD_S * FRAMES_PER_S)
        self._window_frames = int(WINDOW_S * FRAMES_PER_S)
        self._buffer = np.zeros(0, np.float32)
        self._buffer_first_sample = 0
        self._frames_analysed = 0
        self._speech_start_frame: int | None = None
        self._voiced_before_speech = 0

    @property
    def voiced_s(self) -> float:
        """Speech-like audio since the speech began (hangover excluded)."""
        if self._speech_start_frame is None:
            return 0.0
        return (self._vad.voiced_frames - self._voiced_before_speech) / FRAMES_PER_S

    def push(self, samples: np.ndarray) -> None:
        """The next samples of the stream (any length)."""
        self._buffer = np.concatenate([self._buffer, np.asarray(samples, dtype=np.float32)])
        self._analyse()
        if self._speech_start_frame is None:
            # Nothing said yet: keep the lead-in, plus the two frames the next STFT reaches back to.
            self._drop_before((self._frames_analysed - self._lead_frames - 2) * FRAME_SAMPLES)
        elif self._frames_analysed - self._speech_start_frame > self._window_frames and \
                self.voiced_s < MIN_SPEECH_S:
            # A window of scattered sounds, not speech: start looking afresh.
            self._speech_start_frame = None
            self._drop_before((self._frames_analysed - self._lead_frames - 2) * FRAME_SAMPLES)

    def ready(self) -> bool:
        """Enough speech for a check (or a whole window with some speech in it)."""
        if self._speech_start_frame is None:
            return False
        spanned = self._frames_analysed - self._speech_start_frame + self._lead_frames
        return self.voiced_s * FRAMES_PER_S >= self._need_frames or \
            (spanned >= self._window_frames and self.voiced_s >= MIN_SPEECH_S)

    def window(self, min_speech_s: float = 0.0) -> np.ndarray | None:
        """The audio to check: from a lead-in before the speech began, at most 30 s; ``None``
        with less than ``min_speech_s`` of speech (or none)."""
        if self._speech_start_frame is None or self.voiced_s < max(min_speech_s, 1e-9):
            return None
        first = max(0, (self._speech_start_frame - self._lead_frames) * FRAME_SAMPLES - self._buffer_first_sample)
        return self._buffer[first:first + int(WINDOW_S * SAMPLE_RATE_HZ)]

    def _drop_before(self, sample: int) -> None:
        cut = sample - self._buffer_first_sample
        if cut > 0:
            self._buffer = self._buffer[cut:]
            self._buffer_first_sample = sample

    def _analyse(self) -> None:
        from captioner.engine.vad import band_energy_db
        from captioner.gpu.features_ref import N_FFT, log_mel_spectrogram

        end_sample = self._buffer_first_sample + self._buffer.shape[0]
        first = self._frames_analysed
        # Frame t is centred on sample 160 t and reaches 200 samples to each side: analyse only
        # frames whose samples have all arrived, starting two frames back so the first new
        # frame sees real audio, not the STFT's reflect padding (except at the stream's start).
        stop = (end_sample - N_FFT // 2) // FRAME_SAMPLES + 1
        if stop <= first:
            return
        start_sample = max(0, (first - 2) * FRAME_SAMPLES)
        piece = self._buffer[start_sample - self._buffer_first_sample:]
        if piece.shape[0] <= N_FFT // 2:
            return
        log_mel = log_mel_spectrogram(piece, self.n_mels)
        skip = first - start_sample // FRAME_SAMPLES
        energy_db = band_energy_db(np, log_mel[:, skip:skip + stop - first], self._band)
        voiced_before = self._vad.voiced_frames
        flags = self._vad.push(energy_db)
        self._frames_analysed = first + energy_db.shape[0]
        if self._speech_start_frame is None and flags.any():
            self._speech_start_frame = first + int(np.argmax(flags))
            self._voiced_before_speech = voiced_before


CHECK_NICENESS = 10
"""How much the check thread yields the CPU to the captioning thread: niced, the check barely
slows the captioning model's steps, and takes longer itself instead (its notice is not urgent,
captions are; docs/decisions/004-language-check.md)."""


def _lower_priority() -> None:
    """Make the calling thread yield to the others of the process (Linux sets niceness per
    thread; elsewhere this does nothing)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), CHECK_NICENESS)
    except (AttributeError, OSError):  # no setpriority (Windows), or not permitted
        pass


# -- the live check thread ----------------------------------------------------------------------
class StreamWatch:
    """One stream's check, as the captioner's thread holds it (a stream label may be reused
    after its stream ended, so the thread keys its state by this object, not by the label)."""

    __slots__ = ("label", "settled")

    def __init__(self, label: str) -> None:
        self.label = label
        self.settled = False
        """Set by the check thread once the stream was checked (or will not be): no more audio."""


_END = object()
_STOP = object()
INBOX_ITEMS = 3000
"""Audio items the check thread may have waiting while it loads its model (a minute of the 20 ms
chunks a microphone delivers, under 4 MB): the bound keeps a stalled check from hoarding
memory; audio beyond it is dropped (from the check only), which at worst delays the notice."""


EXIT_POLL_S = 0.5
"""How often the idle check thread looks whether the program is exiting."""


class LiveLanguageCheck(threading.Thread):
    """The background thread that checks the language of each watched stream once.

    The captioner's thread calls :meth:`watch`, :meth:`feed` and :meth:`end` (each a queue put
    or less: never a wait) and :meth:`close`; any thread may call :meth:`notices` and
    :meth:`messages`. This thread loads the detector (``loader``) when it starts, runs the
    VAD and the check, and records notices.
    """

    def __init__(self, model: str, loader: DetectorLoader = load_detector, *,
                 min_probability: float = NOTICE_MIN_PROBABILITY, check_speech_s: float = CHECK_SPEECH_S,
                 name: str = "captioner-language-check") -> None:
        # Not a daemon: a daemon thread still inside ONNX Runtime (loading base, or checking a
        # window) when the interpreter exits is cut off mid-call, and the runtime's own threads
        # then abort the process ("terminate called without an active exception": seen on a
        # loaded 2-core machine when a short replay ended before its check did). The thread
        # instead finishes what it is on and leaves once the main thread has ended.
        super().__init__(name=name, daemon=False)
        self.model = model
        """The English-only model the notices name (the captioner updates it on a model swap)."""
        self._loader = loader
        self._min_probability = min_probability
        self._check_speech_s = check_speech_s
        self._inbox: queue.Queue = queue.Queue(maxsize=INBOX_ITEMS)
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self._new: list[LanguageNotice] = []
        self._all: list[LanguageNotice] = []
        self._unavailable = False
        self._launched = False
        self.checks = 0
        """Windows checked so far (for tests and status)."""

    # -- the captioner's thread ------------------------------------------------------------------
    def watch(self, label: str) -> StreamWatch:
        """Check the stream ``label`` once it has spoken enough."""
        watch = StreamWatch(label)
        if self._unavailable or self.stop_event.is_set():
            watch.settled = True
            return watch
        if not self._launched:  # the first stream to check starts the thread (and the model load)
            self._launched = True
            self.start()
        self._put((watch, None))
        return watch

    def feed(self, watch: StreamWatch, samples: np.ndarray) -> None:
        """The stream's next 16 kHz samples (as the engine took them); ignored once settled."""
        if not watch.settled:
            self._put((watch, samples))

    def end(self, watch: StreamWatch) -> None:
        """The stream ended: check what it said if it said enough, else let it go."""
        if not watch.settled:
            self._put((watch, _END))

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread: a check in progress finishes (one window's check), those still to
        come are skipped."""
        self.stop_event.set()
        if self.is_alive():
            try:
                self._inbox.put_nowait(_STOP)
            except queue.Full:
                pass  # the thread sees stop_event after the item it is on
            self.join(timeout_s)

    def _put(self, item) -> None:
        try:
            self._inbox.put_nowait(item)
        except queue.Full:
            pass  # see INBOX_ITEMS

    # -- any thread ------------------------------------------------------------------------------
    def notices(self) -> list[LanguageNotice]:
        """The notices made since the last call."""
        with self._lock:
            new, self._new = self._new, []
        return new

    def messages(self) -> list[str]:
        """Every notice's message so far, each once, oldest first."""
        with self._lock:
            return list(dict.fromkeys(n.message for n in self._all))

    # -- this thread -----------------------------------------------------------------------------
    def run(self) -> None:
        _lower_priority()
        detector = self._loader()
        if detector is None:
            self._unavailable = True
        onsets: dict[StreamWatch, SpeechOnset] = {}
        while not self.stop_event.is_set():
            try:
                item = self._inbox.get(timeout=EXIT_POLL_S)
            except queue.Empty:
                if not threading.main_thread().is_alive():
                    break  # the program is exiting without having closed the check
                continue
            if item is _STOP:
                break
            watch, samples = item
            if watch.settled:
                continue
            if detector is None:
                watch.settled = True
                continue
            if samples is None:
                onsets[watch] = SpeechOnset(detector.n_mels, self._check_speech_s)
                continue
            onset = onsets.get(watch)
            if onset is None:
                continue
            try:
                if samples is _END:
                    self._check(detector, watch, onset.window(MIN_SPEECH_S))
                else:
                    onset.push(samples)
                    if onset.ready():
                        self._check(detector, watch, onset.window())
            except Exception as error:  # a hint must never take the captioner down: drop this stream's check
                log.debug("language check of %r failed: %s", watch.label, error)
                watch.settled = True
            if watch.settled:
                del onsets[watch]

    def _check(self, detector: LanguageDetector, watch: StreamWatch, audio: np.ndarray | None) -> None:
        watch.settled = True
        if audio is None or self.stop_event.is_set():
            return
        probabilities = detector.probabilities_of_audio(audio)
        self.checks += 1
        notice = language_notice(watch.label, probabilities, self.model, self._min_probability)
        top = next(iter(probabilities.items()), ("?", 0.0))
        log.debug("language check of %r: %s %.3f", watch.label, *top)
        if notice is not None:
            with self._lock:
                self._new.append(notice)
                self._all.append(notice)
