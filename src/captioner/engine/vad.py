"""Voice activity detection on the log-mel frames the feature kernels already computed.

Two parts:

- :func:`band_energy_db` reduces raw log10-mel frames (``[..., n_mels, n_frames]``) to one
  energy per frame over the speech band (about 200-4000 Hz, so hum and hiss count less). It is
  written against the array module ``xp`` (NumPy or CuPy): on the GPU only one float per frame
  leaves the device.
- :func:`spectral_change_db` reduces the same frames to how much the *shape* of the speech
  band's spectrum changed over the last few frames (level changes removed): articulation moves
  formants and pitch all the time, while held notes and chords keep their shape between their
  onsets. Also one float per frame.
- :class:`VoiceActivity` is the per-stream decision on the host: an adaptive noise floor (the
  minimum of the lightly smoothed energy over the last couple of seconds — speech always has
  dips between syllables and words, steady noise has none), speech when a frame stands clear of
  the floor (and of an absolute minimum) and, where the spectral change is given, when the
  recent frames were articulated (see :class:`VadConfig`), an onset that needs a few speech
  frames in a row (clicks are not speech), and a hangover that keeps short gaps between words
  inside the speech.

Why the articulation tests: the energy test alone called most of a minute of synthesised chords
speech (their tones lie in the speech band and decay between onsets, so they rise above the
floor), and Whisper heard " you" in it. Of the last 20 frames, those whose shape changed (4
frames apart) are few on held chords and many on read speech in every language tried; a melody
with drums passes that count at its beats, but far fewer of its loud frames do than speech's
(benchmarks/results/latency/HISTORY.md, "Music, fixed", has the counts).

Conversation adds two cases the count alone got wrong (docs/latency.md, "What the engine does with conversation"):
a telephone line sends digital silence between words, whose spectrum never changes, so the
first frames of every word after it failed the count (and, word after word, pulled the share
of articulated frames under its bar: a call-centre agent's words were lost); and a filled pause or a
drawn-out vowel ("uhhh", "so...") holds its shape for a few hundred milliseconds, as a note does.
So a frame too quiet to be speech says nothing about articulation (it counts as articulated,
as room noise, whose shape changes at random, always did), and a held sound that continues
articulated speech without a break stays speech for up to ``held_max_frames``. A chord or a
note after a pause still has to pass the count on its own.

Levels are in dB of a full-scale 1 kHz sine's band energy (0 dB), so thresholds read like dBFS.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from captioner.gpu.features_ref import mel_band_edges_hz

# Band energy of a full-scale 1 kHz sine in the units below (10*log10 of the mean mel power over
# the speech band), measured with captioner.gpu.features_ref; subtracting it makes levels dBFS-like.
FULL_SCALE_SINE_DB = 8.37


def mel_center_frequencies_hz(n_mels: int) -> np.ndarray:
    """Centre frequency of each Slaney mel band between 0 Hz and Nyquist (as Whisper's filters)."""
    return mel_band_edges_hz(n_mels)[1:-1]


def speech_band(n_mels: int, low_hz: float = 200.0, high_hz: float = 4000.0) -> tuple[int, int]:
    """``(first, stop)`` indices of the mel bands whose centres lie in the speech band."""
    centres = mel_center_frequencies_hz(n_mels)
    inside = np.nonzero((centres >= low_hz) & (centres <= high_hz))[0]
    return int(inside[0]), int(inside[-1]) + 1


def band_energy_db(xp, log_mel, band: tuple[int, int]):
    """Per-frame speech-band energy in dB re a full-scale sine, computed with ``xp``.

    ``log_mel`` is raw ``log10(mel power)`` with the bands on axis -2; returns ``[..., n_frames]``
    float32 in the same array module.
    """
    first, stop = band
    power = xp.power(xp.float32(10.0), log_mel[..., first:stop, :].astype(xp.float32))
    mean_power = xp.mean(power, axis=-2)
    return (10.0 * xp.log10(xp.maximum(mean_power, xp.float32(1e-10))) - FULL_SCALE_SINE_DB).astype(xp.float32)


def spectral_change_db(xp, log_mel, band: tuple[int, int], lag_frames: int, range_db: float):
    """Per-frame change of the speech band's spectral shape in dB, computed with ``xp``.

    ``log_mel`` is raw ``log10(mel power)`` ``[..., n_mels, lag_frames + n]``: the ``n`` frames
    to judge after the ``lag_frames`` before them. Each frame's bands in dB are held to at most
    ``range_db`` below its loudest band (leakage far below the tones would otherwise flicker by
    tens of dB), compared with the frame ``lag_frames`` earlier, the mean difference (a change of
    level: a decaying note, a louder word) taken out; returns the mean absolute remainder,
    ``[..., n]`` float32."""
    first, stop = band
    # In log10 units (tenths of a dB) until the end; the band sums as einsum, which NumPy does
    # several times faster than a sum over the middle axis (the CPU path runs this for every
    # stream every 100 ms).
    level = log_mel[..., first:stop, :].astype(xp.float32, copy=False)
    level = xp.maximum(level, level.max(axis=-2, keepdims=True) - xp.float32(range_db / 10.0))
    diff = level[..., lag_frames:] - level[..., :level.shape[-1] - lag_frames]
    scale = xp.float32(1.0 / (stop - first))
    diff -= (xp.einsum("...bn->...n", diff) * scale)[..., None, :]
    return (xp.einsum("...bn->...n", xp.abs(diff)) * (scale * xp.float32(10.0))).astype(xp.float32)


@dataclass(slots=True)
class VadConfig:
    threshold_db: float = 9.0
    """A frame is speech-like when it stands this far above the noise floor..."""
    min_level_db: float = -55.0
    """...and above this absolute level (dB re full scale): a silent room is never speech."""
    onset_frames: int = 3
    """Speech starts after this many speech-like 10 ms frames in a row."""
    hangover_frames: int = 30
    """Speech goes on this many frames after the last speech-like frame (gaps between words)."""
    floor_window_frames: int = 200
    """The floor is the quietest (smoothed) level of this many recent frames."""
    smooth_frames: int = 5
    """Frames averaged before the minimum is taken, so a single quiet frame of noise does not
    pull the floor down."""
    change_lag_frames: int = 4
    """Spectral change (:func:`spectral_change_db`) is measured between frames this far apart."""
    change_range_db: float = 40.0
    """...over the bands within this many dB of the frame's loudest."""
    change_db: float = 1.5
    """A frame is articulated when its spectral shape changed by at least this much."""
    articulation_frames: int = 20
    articulation_min_frames: int = 10
    """Where the spectral change is given, a frame is speech-like only when at least
    ``articulation_min_frames`` of the last ``articulation_frames`` (itself included; frames
    before the stream count as not articulated) were articulated: speech changes shape in
    nearly every frame, held notes and chords only at their onsets. 0: energy alone decides."""
    held_max_frames: int = 50
    """A loud frame that fails the articulation count is still speech-like when it continues,
    without a quiet frame between, a run of loud frames that passed it, for at most this many
    frames (a filled pause or a drawn-out vowel: held shapes of up to about half a second, on
    the meeting recordings). Music must pass the count to start such a run."""
    held_after_frames: int = 8
    """...and when that run holds at least this many frames whose own shape changed: more than
    the onset of a held note gives (its shape changes against the ``change_lag_frames`` before
    it, spread by the 25 ms window), so a note after a pause is not carried by the quiet before
    it, which counts as articulated."""
    articulated_share_frames: int = 100
    articulated_share_min: float = 0.8
    articulated_share_start: float = 1.0
    """Where the spectral change is given, :attr:`VoiceActivity.articulated_share` follows the
    share of loud frames (those that pass the energy test) that also pass the articulation test,
    an exponential average over about ``articulated_share_frames`` loud frames, from
    ``articulated_share_start``; below ``articulated_share_min`` no frame is speech-like. Speech
    keeps it near 1; music with drums articulates at each beat and note onset but holds its notes
    between them, so its articulated frames do not add up to speech (HISTORY.md, "Music, fixed")."""


class VoiceActivity:
    """Speech/non-speech decision for one stream, frame by frame. Called by the worker thread."""

    def __init__(self, config: VadConfig | None = None) -> None:
        self.config = config or VadConfig()
        self.floor_db = -120.0
        self.frames_seen = 0
        self._recent: deque[float] = deque(maxlen=self.config.smooth_frames)
        self._minima: deque[tuple[int, float]] = deque()  # monotonic queue of (frame, smoothed level)
        self.speaking = False
        self.last_voiced_frame = -1
        """Absolute index of the last speech-like frame (no hangover)."""
        self.voiced_frames = 0
        """Speech-like frames counted so far, hangover excluded: how much speech there really was
        (a click that starts the speech state is a few frames, not the whole hangover)."""
        self._run = 0
        self._hang = 0
        self._articulated: deque[bool] = deque([False] * self.config.articulation_frames,
                                               maxlen=self.config.articulation_frames)
        self.articulated_share = self.config.articulated_share_start
        """The recent share of loud frames that were articulated (see :class:`VadConfig`)."""
        self._continues = False  # the current run of loud frames passed the articulation count
        self._held = 0  # loud frames since, that failed it
        self._run_articulated = 0  # frames of the current loud run whose shape changed

    def push(self, energy_db: np.ndarray, change_db: np.ndarray | None = None) -> np.ndarray:
        """Take the energies of the next frames (and their :func:`spectral_change_db`, or
        ``None``: energy alone decides, those frames count as articulated); return their speech
        flags (bool array)."""
        cfg = self.config
        energy_db = np.asarray(energy_db, dtype=np.float64).ravel()
        if change_db is None:
            articulated = np.ones(energy_db.shape[0], dtype=bool)
        else:
            # A frame under the absolute minimum (digital silence, a quiet room) holds no note.
            changed = np.asarray(change_db, dtype=np.float64).ravel() >= cfg.change_db
            articulated = changed | (energy_db < cfg.min_level_db)
        gated = change_db is not None and cfg.articulation_min_frames > 0
        flags = np.zeros(energy_db.shape[0], dtype=bool)
        minima = self._minima
        for i, e in enumerate(energy_db):
            index = self.frames_seen + i
            self._recent.append(float(e))
            smoothed = sum(self._recent) / len(self._recent)
            while minima and minima[-1][1] >= smoothed:
                minima.pop()
            minima.append((index, smoothed))
            while minima[0][0] <= index - cfg.floor_window_frames:
                minima.popleft()
            self.floor_db = minima[0][1]
            self._articulated.append(bool(articulated[i]))
            voiced = e >= self.floor_db + cfg.threshold_db and e >= cfg.min_level_db
            if gated:
                articulate = sum(self._articulated) >= cfg.articulation_min_frames
                if voiced:
                    self.articulated_share += (float(articulate) - self.articulated_share) / cfg.articulated_share_frames
                accepted = articulate and self.articulated_share >= cfg.articulated_share_min
                if not voiced:
                    self._continues, self._held, self._run_articulated = False, 0, 0
                else:
                    self._run_articulated += bool(changed[i])
                    if accepted:
                        self._continues, self._held = True, 0
                    elif self._continues and self._run_articulated >= cfg.held_after_frames \
                            and self._held < cfg.held_max_frames:
                        # A held sound inside speech. It counts against the share all the same,
                        # so music whose beats pass the count is not carried through its notes.
                        self._held += 1
                        accepted = True
                voiced = voiced and accepted
            self._run = self._run + 1 if voiced else 0
            if voiced:
                self.last_voiced_frame = index
                self.voiced_frames += 1
            if self._run >= cfg.onset_frames:
                if not self.speaking:
                    # The onset frames themselves are speech too.
                    flags[max(0, i - cfg.onset_frames + 1):i] = True
                self.speaking = True
                self._hang = cfg.hangover_frames
            elif self.speaking:
                if self._hang > 0:
                    self._hang -= 1
                else:
                    self.speaking = False
            flags[i] = self.speaking
        self.frames_seen += energy_db.shape[0]
        return flags

    def silence_frames(self) -> int:
        """Frames since the last speech-like frame (all seen frames if there was none)."""
        if self.last_voiced_frame < 0:
            return self.frames_seen
        return self.frames_seen - 1 - self.last_voiced_frame
