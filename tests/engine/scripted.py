"""A scripted recognizer and synthetic "speech" for fast engine tests.

:class:`ScriptedRecognizer` fills the engine's ``Recognizer`` slot without a model: each stream
has a script of timed words (seconds of the stream's clock), and a window ``[start_s, end_s)``
hears the scripted words whose end lies inside it — a perfect listener. By default it also
checks the audio it was handed: a word is heard only if the window's log-mel frames over the
word hold speech-band energy, so a window whose time label does not match its audio (a gap
filled in the wrong place, a lost frame offset after a model swap) loses words instead of
passing silently. Every request is recorded so that tests can assert on what the engine asked.

:func:`render_speech` turns a script into audio the engine's VAD takes for speech: five tones
across the speech band plus white noise, about -20 dBFS, where the script has words; room noise at -70 dBFS
elsewhere. :func:`feed` hands audio over in chunks on a simulated clock, stepping after each.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from captioner.audio.synthetic import noise, tone
from captioner.engine.policy.words import Hypothesis, Word, normalize_word
from captioner.engine.recognizer import WindowRequest
from captioner.engine.simulate import SimClock
from captioner.engine.vad import band_energy_db, speech_band
from captioner.errors import UserError
from captioner.events import FRAMES_PER_S, SAMPLE_RATE_HZ, CaptionUpdate

SPEECH_DBFS = -20.0
ROOM_DBFS = -70.0
HEARD_MIN_DB = -40.0
"""Speech-band energy (dB re a full-scale sine) a word's frames need for the listener to hear it:
the rendered speech sits near -20 dB, the room near -70 dB."""


@dataclass(frozen=True, slots=True)
class ScriptWord:
    """One scripted word and where it lies on the stream's clock."""

    text: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class SeenRequest:
    """What the engine asked for in one row of one ``decode`` call."""

    call: int
    """Index of the ``decode`` call (one batched model step) this row belonged to."""
    stream: str
    start_s: float
    n_frames: int
    n_mels: int
    prompt: str
    language: str | None

    @property
    def end_s(self) -> float:
        return self.start_s + self.n_frames / FRAMES_PER_S


def phrase(text: str, start_s: float, word_s: float = 0.3, gap_s: float = 0.1) -> list[ScriptWord]:
    """The words of ``text`` spoken from ``start_s`` on, each ``word_s`` long with ``gap_s``
    between them (short dips keep the VAD's noise floor low, as the gaps in real speech do)."""
    words = []
    t_s = start_s
    for token in text.split():
        words.append(ScriptWord(token, round(t_s, 6), round(t_s + word_s, 6)))
        t_s += word_s + gap_s
    return words


def script_end_s(words: Iterable[ScriptWord]) -> float:
    return max((w.end_s for w in words), default=0.0)


Rejecter = Callable[[WindowRequest, tuple[Word, ...]], str | None]
"""Given a request and the words the listener heard, a guard's reason to reject the hypothesis
(e.g. ``"no_speech"``) or ``None`` to pass it."""


class ScriptedRecognizer:
    """A ``Recognizer`` that answers from a script; see the module docstring.

    ``script``: stream label -> its words. ``segment_gap_s``: a silence at least this long
    between two words starts a new decoder segment (what Whisper does at a pause); a segment
    whose next word lies beyond the window is open (its end is ``inf``, not a safe cut).
    ``reject``: a :data:`Rejecter` that turns hypotheses into rejected ones. ``check_audio``:
    hear a word only when its frames hold speech energy. ``languages``: the codes a
    multilingual script accepts; the first is what it "detects" when a request names none.
    """

    def __init__(
        self,
        script: dict[str, Sequence[ScriptWord]],
        *,
        name: str = "scripted",
        n_mels: int = 80,
        is_multilingual: bool = False,
        languages: Sequence[str] = ("en", "de", "fr"),
        segment_gap_s: float = 0.3,
        reject: Rejecter | None = None,
        check_audio: bool = True,
    ) -> None:
        self.script = {label: sorted(words, key=lambda w: w.end_s) for label, words in script.items()}
        self.name = name
        self.provider = "ScriptedExecutionProvider"
        self.device_name = "script"
        self.n_mels = n_mels
        self.is_multilingual = is_multilingual
        self.languages = tuple(languages) if is_multilingual else ("en",)
        self.segment_gap_s = segment_gap_s
        self.reject = reject
        self.check_audio = check_audio
        self.requests: list[SeenRequest] = []
        self.calls: list[tuple[SeenRequest, ...]] = []
        self.rejected: list[SeenRequest] = []
        self._band = speech_band(n_mels)

    # -- the Recognizer protocol ------------------------------------------------------------------
    def check_language(self, language: str | None) -> str | None:
        if language in (None, "", "auto"):
            return None
        if not self.is_multilingual and language == "en":
            return None
        if language not in self.languages:
            raise UserError(f"the scripted model {self.name!r} has no language {language!r}")
        return language

    def decode(self, requests: list[WindowRequest]) -> list[Hypothesis]:
        call = len(self.calls)
        seen = []
        hypotheses = []
        for r in requests:
            log_mel = r.log_mel.get() if hasattr(r.log_mel, "get") else np.asarray(r.log_mel)  # CuPy: a copy
            if log_mel.ndim != 2 or log_mel.shape[0] != self.n_mels:
                raise AssertionError(f"{self.name}: stream {r.stream!r} sent log-mel of shape {log_mel.shape}, "
                                     f"this model takes {self.n_mels} mel bands")
            request = SeenRequest(call, r.stream, r.start_s, int(log_mel.shape[1]), self.n_mels, r.prompt, r.language)
            seen.append(request)
            hypotheses.append(self._hypothesis(r, request, log_mel))
        self.requests += seen
        self.calls.append(tuple(seen))
        return hypotheses

    # -- the listener -----------------------------------------------------------------------------
    def _hypothesis(self, r: WindowRequest, request: SeenRequest, log_mel: np.ndarray) -> Hypothesis:
        start_s, end_s = request.start_s, request.end_s
        script = self.script.get(r.stream, [])
        inside = [i for i, w in enumerate(script) if start_s <= w.end_s < end_s + 1e-9]
        heard = [i for i in inside if not self.check_audio or self._audible(script[i], start_s, log_mel)]
        words: list[Word] = []
        segment_ends: list[float] = []
        segment = -1
        for i in heard:
            w = script[i]
            if segment < 0 or w.start_s - script[i - 1].end_s >= self.segment_gap_s or i - 1 not in heard:
                segment += 1
                segment_ends.append(w.end_s)
            segment_ends[segment] = w.end_s
            words.append(Word(" " + w.text, w.start_s, w.end_s, segment))
        if heard:
            # The last segment is closed only if the script pauses after it (or ends): a phrase
            # cut by the window's end is no safe place to trim the buffer.
            after = heard[-1] + 1
            if after < len(script) and script[after].start_s - script[after - 1].end_s < self.segment_gap_s:
                segment_ends[-1] = float("inf")
        language = r.language or self.languages[0]
        reason = self.reject(r, tuple(words)) if self.reject is not None else None
        if reason:
            self.rejected.append(request)
            return Hypothesis(tuple(words), start_s, end_s, tuple(segment_ends), rejected=True, reason=reason,
                              language=language)
        return Hypothesis(tuple(words), start_s, end_s, tuple(segment_ends), language=language)

    def _audible(self, word: ScriptWord, window_start_s: float, log_mel: np.ndarray) -> bool:
        """Whether the window's frames over ``word`` (the part of it inside the window) hold
        speech-band energy."""
        first = max(0, int(round((word.start_s - window_start_s) * FRAMES_PER_S)))
        stop = min(log_mel.shape[1], int(round((word.end_s - window_start_s) * FRAMES_PER_S)))
        # Frames at a word's edges straddle the room noise: look at the word's middle.
        first, stop = first + min(2, (stop - first) // 4), stop - min(2, (stop - first) // 4)
        if stop <= first:
            return False
        energy = band_energy_db(np, log_mel[:, first:stop], self._band)
        return float(np.median(energy)) >= HEARD_MIN_DB


# -- audio ----------------------------------------------------------------------------------------
_SPEECH_TONES_HZ = (300.0, 650.0, 1100.0, 1900.0, 2900.0)


@functools.lru_cache(maxsize=8)
def _texture(seed: int, speech_dbfs: float, room_dbfs: float) -> tuple[np.ndarray, np.ndarray]:
    """One second of "speech" (RMS ``speech_dbfs``: half of its power in five tones across the
    speech band, half in white noise) and of room noise; whole-hertz tones repeat every second,
    so tiling them makes long audio cheaply."""
    rms = 10 ** (speech_dbfs / 20)
    tone_amplitude = rms * np.sqrt(2 * 0.5 / len(_SPEECH_TONES_HZ))  # a tone's RMS is amplitude / sqrt 2
    rng = np.random.default_rng(seed)
    sound = noise(1.0, amplitude=rms * np.sqrt(0.5), seed=seed + 1)
    for f_hz in _SPEECH_TONES_HZ:
        sound += tone(f_hz, 1.0, amplitude=tone_amplitude, phase_rad=float(rng.uniform(0, 2 * np.pi)))
    return sound, noise(1.0, amplitude=10 ** (room_dbfs / 20), seed=seed)


def render_speech(words: Iterable[ScriptWord], duration_s: float, seed: int = 0,
                  speech_dbfs: float = SPEECH_DBFS, room_dbfs: float = ROOM_DBFS) -> np.ndarray:
    """16 kHz float32 audio of ``duration_s``: room noise at ``room_dbfs`` everywhere, and a
    speech-like sound at about ``speech_dbfs`` over each word's span, with 5 ms ramps at its
    edges."""
    n = int(round(duration_s * SAMPLE_RATE_HZ))
    envelope = np.zeros(n, dtype=np.float32)
    for w in words:
        first = int(round(w.start_s * SAMPLE_RATE_HZ))
        stop = min(n, int(round(w.end_s * SAMPLE_RATE_HZ)))
        if stop > first:
            edge = np.arange(stop - first, dtype=np.float32)
            envelope[first:stop] = np.minimum(1.0, np.minimum(edge, edge[::-1]) / 80.0)
    sound, room = _texture(seed, speech_dbfs, room_dbfs)
    repeats = -(-n // SAMPLE_RATE_HZ)
    return np.tile(room, repeats)[:n] + envelope * np.tile(sound, repeats)[:n]


def click(at_s: float, length_s: float, duration_s: float, seed: int = 0) -> np.ndarray:
    """Room noise with one loud burst (a click, a knock) of ``length_s`` at ``at_s``."""
    return render_speech([ScriptWord("<click>", at_s, at_s + length_s)], duration_s, seed=seed, speech_dbfs=-12.0)


# -- driving a captioner --------------------------------------------------------------------------
def feed(live, clock: SimClock, audio: dict[str, np.ndarray], chunk_s: float = 0.05,
         start_s: float = 0.0, stop_s: float | None = None) -> list[CaptionUpdate]:
    """Hand each stream (label -> 16 kHz samples) its audio between ``start_s`` and ``stop_s``
    in ``chunk_s`` chunks as it would arrive live: advance the clock by a chunk, accept the
    chunk with that capture time, step. Returns the updates of every step."""
    chunk = int(round(chunk_s * SAMPLE_RATE_HZ))
    first = int(round(start_s * SAMPLE_RATE_HZ))
    stop = max(a.shape[0] for a in audio.values()) if stop_s is None else int(round(stop_s * SAMPLE_RATE_HZ))
    updates: list[CaptionUpdate] = []
    for at in range(first, stop, chunk):
        clock.advance(chunk_s)
        for label, samples in audio.items():
            piece = samples[at:min(at + chunk, stop)]
            if piece.size:
                live.streams[label].accept_waveform(SAMPLE_RATE_HZ, piece, capture_ns=clock())
        updates += live.step()
    return updates


def finish_all(live, clock: SimClock, max_steps: int = 100) -> list[CaptionUpdate]:
    """Finish every open stream and step until all of them are done."""
    streams = list(live.streams.values())
    for s in streams:
        s.finish()
    updates: list[CaptionUpdate] = []
    for _ in range(max_steps):
        clock.advance(0.01)
        updates += live.step()
        if all(s.done for s in streams):
            return updates
    raise AssertionError(f"streams not done after {max_steps} steps: {[s.label for s in streams if not s.done]}")


def finals(updates: Iterable[CaptionUpdate], stream: str | None = None) -> list[CaptionUpdate]:
    return [u for u in updates if u.kind == "final" and (stream is None or u.stream == stream)]


def keys(text_or_words) -> list[str]:
    """Normalised words of a caption text, or of scripted words."""
    if isinstance(text_or_words, str):
        return [normalize_word(t) for t in text_or_words.split()]
    return [normalize_word(w.text) for w in text_or_words]


class Delivered:
    """What a worker hands out (its ``deliver``), on the worker's thread, read on the test's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._updates: list[CaptionUpdate] = []
        self._items: list = []

    def __call__(self, items: list) -> None:
        with self._lock:
            for item in items:  # caption updates, and the streams' lifecycle events after them
                self._items.append(item)
                if type(item) is CaptionUpdate:
                    self._updates.append(item)

    def in_order(self) -> list:
        """Every update and lifecycle event (``StreamOpened``, ``Refused``, ``StreamDone``) so far,
        as delivered."""
        with self._lock:
            return list(self._items)

    def said(self, labels: Iterable[str]) -> dict[str, list[str]]:
        """Each stream's committed words so far, normalised."""
        with self._lock:
            updates = list(self._updates)
        return {label: keys(" ".join(u.text for u in finals(updates, label))) for label in labels}
