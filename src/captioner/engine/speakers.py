"""Who said what, live: the voice encoder over each stream's speech frames, and the speaker of
every committed line.

The features kernel writes the voice encoder's 40 mel bands beside Whisper's log-mel
(:class:`~captioner.gpu.features.FeaturePool` with ``speaker_bands``). After each push, every
stream with speakers on hands the frames its VAD judged speech (hangover included: resemblyzer
trims only longer silences) to its :class:`SpeakerTrack`, and :class:`SpeakerBank` advances all
tracks' LSTM state through them in one encoder run per round (:mod:`captioner.models.speaker`):
causal, frame by frame, as the audio comes.

A track hears its speech as resemblyzer's partial utterances: two rows of state, one starting
every :data:`HOP_FRAMES` speech frames, each finishing after :data:`PARTIAL_FRAMES` (1.6 s, what
the model was trained on) with an embedding of that stretch. A pause of ``pause_frames`` ends the
run: the next voice may be someone else's, so no partial straddles it (the unfinished ones that
heard enough are kept as shorter partials). The level the network sees is the stream's speech
raised to resemblyzer's -30 dBFS (never lowered), from the running level of its speech frames.

A committed line's speaker comes from the partials over its audio (weighted by overlap) by
:class:`~captioner.engine.speaker_clusters.OnlineClusters`; a line with measured word times in
which the partials follow another voice for at least :data:`SPLIT_MIN_S` is split there first,
each part labelled on its own. Partial (provisional) lines carry the stream's last speaker.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from captioner.engine.speaker_clusters import (
    DEFAULT_THRESHOLD,
    OnlineClusters,
    speaker_label,
)
from captioner.events import FRAME_SAMPLES, FRAMES_PER_S, CaptionUpdate

PARTIAL_FRAMES = 160
HOP_FRAMES = PARTIAL_FRAMES // 2
MIN_PARTIAL_FRAMES = 40
"""An unfinished partial counts (at a pause, or for the line being committed) once it has heard
this much speech (0.4 s)."""
SPLIT_MIN_S = 1.0
"""The least speech of either part of a line split at a change of speaker."""
PARTIALS_KEPT = 400
"""Finished partials a track keeps (about 5 minutes of speech): far more than a line looks back."""
MODES = ("auto", "on", "off")
SOURCES = ("microphone", "meeting", "file", "remote")


@dataclass(slots=True)
class SpeakerConfig:
    mode: str = "auto"
    """``on``: every stream is labelled; ``off``: none; ``auto``: meeting audio, files and
    server streams are, a microphone (one person: "Me") and a stream of unknown source are not."""
    threshold: float = DEFAULT_THRESHOLD
    """Cosine similarity to a speaker's centroid from which a line is theirs (measured:
    docs/speakers.md)."""
    new_min_frames: int = 80
    """Speech (frames) the partials under a line must have heard for it to make a new speaker; a
    line on less that matches no one is the last speaker's."""
    pause_frames: int = 15
    """Silence (frames the VAD calls silence, after its 0.3 s hangover) that ends a run of
    partials: a pause of about 0.45 s, where turns change."""
    target_dbfs: float = -30.0
    """The speech level the network hears (resemblyzer's), raised to, never lowered."""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"speakers must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def wanted(mode: str, source: str | None) -> bool:
    """Whether a stream from ``source`` (one of :data:`SOURCES`, ``None`` when not said) is
    labelled under ``mode``."""
    check_mode(mode)
    if source is not None and source not in SOURCES:
        raise ValueError(f"a stream's source is one of {', '.join(SOURCES)}, got {source!r}")
    if mode != "auto":
        return mode == "on"
    return source in ("meeting", "file", "remote")


@dataclass(slots=True)
class Partial:
    """A stretch of a stream's speech and its embedding: stream frames ``first..last`` (silence
    inside it, not heard, included), ``frames`` of them heard."""

    first: int
    last: int
    frames: int
    embedding: np.ndarray


@dataclass(slots=True)
class _Row:
    frames: int = 0
    first: int = 0
    last: int = 0
    embedding: np.ndarray | None = None

    def partial(self) -> Partial:
        return Partial(self.first, self.last, self.frames, self.embedding)


@dataclass
class SpeakerTrack:
    """One stream's speakers (the engine's thread only)."""

    name: str
    pair: int
    """Its rows in the bank's state: ``2 pair`` and ``2 pair + 1``."""
    config: SpeakerConfig
    slot: int = 0
    """Its slot in the feature pool."""
    pending: deque = field(default_factory=deque)
    """Speech to hear: runs ``(feature_frame, count, stream_frame)``, ``None`` for a pause."""
    run_frames: int = 0
    rows: list = field(default_factory=lambda: [_Row(), _Row()])
    partials: deque = field(default_factory=lambda: deque(maxlen=PARTIALS_KEPT))
    silence_frames: int = 1 << 30
    speech_power_sum: float = 0.0
    speech_power_frames: int = 0
    energies: np.ndarray = field(default_factory=lambda: np.zeros(1024))
    """Mean square of each 10 ms block, by feature frame modulo its length."""
    clusters: OnlineClusters | None = None
    last_label: str = ""

    def __post_init__(self) -> None:
        self.clusters = OnlineClusters(self.config.threshold, self.config.new_min_frames)

    # -- audio -----------------------------------------------------------------------------------
    def add_samples(self, first_frame: int, samples: np.ndarray) -> None:
        """The level of each whole 10 ms block of ``samples``, the first being feature frame
        ``first_frame`` (kept until the VAD has judged the frames)."""
        n = samples.shape[0] // FRAME_SAMPLES
        if n == 0:
            return
        blocks = samples[: n * FRAME_SAMPLES].reshape(n, FRAME_SAMPLES)
        power = np.einsum("ij,ij->i", blocks, blocks, dtype=np.float64) / FRAME_SAMPLES
        size = self.energies.shape[0]
        index = (first_frame + np.arange(n)) % size
        self.energies[index[-size:]] = power[-size:]

    def add_frames(self, first_frame: int, flags: np.ndarray, frame_offset: int) -> None:
        """The VAD's verdict on feature frames ``first_frame ..`` (``flags``): the speech ones
        are queued to be heard, a long enough silence before them ends the run."""
        flags = np.asarray(flags, dtype=bool)
        if not flags.size:
            return
        edges = np.diff(np.concatenate([[False], flags, [False]]).astype(np.int8))
        starts, stops = np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]
        at = 0
        for start, stop in zip(starts.tolist(), stops.tolist()):
            self.silence_frames += start - at
            if self.silence_frames >= self.config.pause_frames and (self.run_frames or self.pending):
                self.pending.append(None)
            self.silence_frames = 0
            frame = first_frame + start
            self.pending.append((frame, stop - start, frame + frame_offset))
            size = self.energies.shape[0]
            self.speech_power_sum += float(self.energies[(frame + np.arange(stop - start)) % size].sum())
            self.speech_power_frames += stop - start
            at = stop
        self.silence_frames += flags.size - at

    @property
    def gain_log10(self) -> float:
        """``log10`` of the power gain that brings the stream's speech to the target level."""
        if not self.speech_power_frames:
            return 0.0
        level_dbfs = 10.0 * math.log10(max(self.speech_power_sum / self.speech_power_frames, 1e-12))
        return max(0.0, (self.config.target_dbfs - level_dbfs) / 10.0)

    def take(self, limit: int) -> list[tuple[int, int, int]]:
        """Up to ``limit`` frames of the queued speech, as runs (no pause among them)."""
        out = []
        while limit > 0 and self.pending and self.pending[0] is not None:
            frame, count, stream_frame = self.pending[0]
            n = min(count, limit)
            out.append((frame, n, stream_frame))
            if n == count:
                self.pending.popleft()
            else:
                self.pending[0] = (frame + n, count - n, stream_frame + n)
            limit -= n
        return out

    def end_run(self) -> list[int]:
        """A pause: the unfinished partials that heard enough are kept; the rows start over.
        Returns the rows whose state must be zeroed."""
        for row in self.rows:
            if row.frames >= MIN_PARTIAL_FRAMES and row.embedding is not None:
                self.partials.append(row.partial())
        self.rows = [_Row(), _Row()]
        self.run_frames = 0
        return [0, 1]

    # -- labels ----------------------------------------------------------------------------------
    def _evidence(self, first: int, last: int) -> list[tuple[Partial, int]]:
        """Partials (finished, and the rows still hearing that heard enough) over stream frames
        ``first..last``, each with its overlap in frames."""
        out = []
        candidates = list(self.partials) + [r.partial() for r in self.rows
                                            if r.frames >= MIN_PARTIAL_FRAMES and r.embedding is not None]
        for p in candidates:
            overlap = min(p.last, last) - max(p.first, first) + 1
            if overlap > 0:
                out.append((p, overlap))
        return out

    def embedding_of(self, start_s: float, end_s: float) -> tuple[np.ndarray | None, int]:
        """The embedding of a stretch of the stream (unit length; ``None`` when no partial covers
        it), each partial over it weighted by its overlap, and how much speech it rests on: the
        most any of those partials heard (a short line is judged by the 1.6 s around it)."""
        first, last = int(round(start_s * FRAMES_PER_S)), max(int(round(end_s * FRAMES_PER_S)) - 1, 0)
        evidence = self._evidence(first, max(first, last))
        if not evidence:
            return None, 0
        total = sum(w * p.embedding.astype(np.float64) for p, w in evidence)
        norm = float(np.linalg.norm(total))
        if norm == 0.0:
            return None, 0
        return total / norm, max(p.frames for p, _ in evidence)

    def _label_of(self, start_s: float, end_s: float) -> str:
        embedding, frames = self.embedding_of(start_s, end_s)
        if embedding is None:
            return self.last_label or speaker_label(0)
        return speaker_label(self.clusters.assign(embedding, frames).index)

    def label(self, update: CaptionUpdate) -> list[CaptionUpdate]:
        """``update`` with its speaker: a final labelled (split first where the voice changes
        inside it), a partial or clear with the stream's last speaker."""
        if update.kind != "final":
            return [replace(update, speaker=self.last_label or speaker_label(0))]
        out = []
        for part in self._split(update):
            labelled = replace(part, speaker=self._label_of(part.start_s, part.end_s))
            self.last_label = labelled.speaker
            out.append(labelled)
        return out

    def _split(self, update: CaptionUpdate) -> list[CaptionUpdate]:
        """``update`` cut where the partials under its words follow another voice for at least
        :data:`SPLIT_MIN_S` on both sides (only with measured word times that spell its text)."""
        from captioner.layout import join, spelled

        words = update.words
        if len(words) < 2 or words[-1][2] - words[0][1] < 2 * SPLIT_MIN_S or not len(self.clusters):
            return [update]
        spelt = spelled(" ".join(update.text.split()), words)
        if spelt is None:
            return [update]
        voices = [self._voice_at((a + b) / 2) for _, a, b in words]
        runs: list[list[int]] = []  # [voice, first word, last word]
        for i, voice in enumerate(voices):
            if runs and runs[-1][0] == voice:
                runs[-1][2] = i
            else:
                runs.append([voice, i, i])
        # Runs shorter than SPLIT_MIN_S join the run before them (the first, the one after it).
        merged: list[list[int]] = []
        for run in runs:
            span = words[run[2]][2] - words[run[1]][1]
            if merged and (span < SPLIT_MIN_S or run[0] == merged[-1][0]):
                merged[-1][2] = run[2]
            else:
                merged.append(run)
        if len(merged) > 1 and words[merged[0][2]][2] - words[merged[0][1]][1] < SPLIT_MIN_S:
            merged[1][1] = merged[0][1]
            merged.pop(0)
        # A line is split between words only, never inside one ("715-|139-0787", "42|line"):
        # the cut moves on to the next space.
        whole: list[list[int]] = []
        for voice, first, last in merged:
            while whole and first <= last and _inside_a_word(spelt, first):
                whole[-1][2] = first
                first += 1
            if first <= last:
                whole.append([voice, first, last])
        merged = whole
        if len(merged) < 2:
            return [update]
        parts = []
        for _, a, b in merged:
            piece = words[a:b + 1]
            parts.append(replace(update, text=join(spelt[a:b + 1]), words=piece,
                                 start_s=update.start_s if a == 0 else piece[0][1],
                                 end_s=update.end_s if b == len(words) - 1 else piece[-1][2]))
        return parts

    def _voice_at(self, time_s: float) -> int:
        """The known speaker the partial nearest ``time_s`` (centre to centre, among those over
        it) sounds like; -1 when it sounds like none of them."""
        frame = int(round(time_s * FRAMES_PER_S))
        over = [p for p, _ in self._evidence(frame, frame)]
        if not over:
            return self.clusters.last if self.clusters.last is not None else -1
        nearest = min(over, key=lambda p: abs((p.first + p.last) / 2 - frame))
        best, similarity = self.clusters.closest(nearest.embedding)
        return best if best is not None and similarity >= self.config.threshold else -1


def _inside_a_word(spelt, at: int) -> bool:
    """Whether a cut before ``spelt[at]`` would fall inside a word as the reader sees it: no
    space before it, a hyphen before it, or a number going on."""
    before, after = spelt[at - 1].text, spelt[at].text
    return spelt[at].joined or before.endswith("-") or (before[-1:].isdigit() and after[:1].isdigit())


class SpeakerBank:
    """The voice encoder's state for every track, and the runs that advance it (the engine's
    thread). ``features``: the engine's :class:`~captioner.gpu.features.FeaturePool` (with
    speaker bands); ``encoder``: a :class:`~captioner.models.speaker.encoder.SpeakerEncoder`."""

    def __init__(self, backend, features, encoder, config: SpeakerConfig) -> None:
        self.backend = backend
        self.xp = backend.xp if encoder.on_device else np
        self.features = features
        self.encoder = encoder
        self.config = config
        self.tracks: dict[str, SpeakerTrack] = {}
        self._free: list[int] = []
        self._pairs = 0
        self._h, self._c = encoder.zero_state(0, self.xp)
        self.runs = 0
        self.frames_heard = 0

    def open(self, name: str, slot: int) -> SpeakerTrack:
        if not self._free:
            grow = max(4, self._pairs)
            h, c = self.encoder.zero_state(2 * grow, self.xp)
            with self.backend.activate():
                self._h = self.xp.concatenate([self._h, h], axis=1)
                self._c = self.xp.concatenate([self._c, c], axis=1)
            self._free = list(range(self._pairs, self._pairs + grow))
            self._pairs += grow
        pair = self._free.pop(0)
        self._zero([2 * pair, 2 * pair + 1])
        track = self.tracks[name] = SpeakerTrack(name, pair, self.config, slot=slot)
        return track

    def close(self, name: str) -> None:
        track = self.tracks.pop(name, None)
        if track is not None:
            self._free.append(track.pair)
            self._free.sort()

    def restart(self, track: SpeakerTrack) -> None:
        """The track's run ends here (its audio goes on in new feature rings)."""
        self._zero([2 * track.pair + r for r in track.end_run()])

    def _zero(self, rows: list[int]) -> None:
        if rows:
            with self.backend.activate():
                index = self.xp.asarray(rows)
                self._h[:, index] = 0.0
                self._c[:, index] = 0.0

    def run(self) -> None:
        """Hear every track's queued speech: rounds of one encoder run each, every round taking
        each track up to its next partial boundary (its rows start and finish only there)."""
        tracks = [t for t in self.tracks.values() if t.pending]
        while tracks:
            work, zero = [], []
            for t in tracks:
                while t.pending and t.pending[0] is None:
                    t.pending.popleft()
                    zero += [2 * t.pair + r for r in t.end_run()]
                runs = t.take(HOP_FRAMES - t.run_frames % HOP_FRAMES)
                if runs:
                    work.append((t, runs))
            self._zero(zero)
            if work:
                self._step(work)
            tracks = [t for t in tracks if t.pending]

    def _step(self, work: list[tuple[SpeakerTrack, list[tuple[int, int, int]]]]) -> None:
        xp = self.xp
        pieces = [(t.slot, frame, n) for t, runs in work for frame, n, _ in runs]
        counts = np.array([sum(n for _, n, _ in runs) for _, runs in work])
        n_rows = 2 * len(work)
        longest = int(counts.max())
        # Where each gathered frame goes: frame j of track i to position j of rows 2i and 2i + 1.
        track_of = np.repeat(np.arange(len(work)), counts)
        position = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        active = np.array([[True, t.run_frames >= HOP_FRAMES] for t, _ in work]).reshape(-1)
        lengths = np.where(active, np.repeat(counts, 2), 0).astype(np.int32)
        rows = np.array([2 * t.pair + r for t, _ in work for r in (0, 1)])
        gains = np.repeat(np.array([t.gain_log10 for t, _ in work], np.float32), 2)
        with self.backend.activate():
            frames = self.features.speaker_frames(*map(np.asarray, zip(*pieces)))
            if xp is not self.backend.xp:  # a CPU encoder beside device features
                frames = self.backend.asnumpy(frames)
            batch = xp.zeros((longest, n_rows, frames.shape[1]), dtype=xp.float32)
            for r in (0, 1):
                batch[xp.asarray(position), xp.asarray(2 * track_of + r)] = frames
            index = xp.asarray(rows)
            h, c, embedding = self.encoder.step(batch, xp.asarray(gains), xp.asarray(lengths) if xp is not np else lengths,
                                                self._h[:, index], self._c[:, index], xp=xp)
            self._h[:, index] = h
            self._c[:, index] = c
            embedding = self.backend.asnumpy(embedding) if xp is not np else embedding
        self.runs += 1
        self.frames_heard += int(counts.sum())
        finished = []
        for i, ((t, runs), n) in enumerate(zip(work, counts.tolist())):
            first_stream, last_stream = runs[0][2], runs[-1][2] + runs[-1][1] - 1
            for r, row in enumerate(t.rows):
                if not active[2 * i + r]:
                    continue
                if row.frames == 0:
                    row.first = first_stream
                row.frames += n
                row.last = last_stream
                row.embedding = np.array(embedding[2 * i + r], dtype=np.float32)
            t.run_frames += n
            for r, row in enumerate(t.rows):
                if row.frames >= PARTIAL_FRAMES:
                    t.partials.append(row.partial())
                    t.rows[r] = _Row()
                    finished.append(2 * t.pair + r)
        self._zero(finished)
