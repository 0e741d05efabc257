"""Online clustering of a stream's voice embeddings: who is speaking, as "Speaker 1", "Speaker 2", ...

Each committed line brings one embedding (unit length) and how much speech it rests on. It joins
the known speaker it is most like when its cosine similarity to that speaker's centroid reaches
``threshold``; otherwise, if it rests on enough speech (``new_min_frames``), it is a new speaker;
a short line that matches no one is given the speaker before it (a word or two is too little to
tell a new voice by). A speaker's number never changes once given, and a line's speaker is
decided once, when it is committed. Plain NumPy: no model, no engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_THRESHOLD = 0.74
"""Cosine similarity to a speaker's centroid from which a line is theirs. Measured on the tuning
set (benchmarks/bench_speakers.py --tune; docs/speakers.md), not on the measured conversations."""


def speaker_label(index: int) -> str:
    """The label of the ``index``-th speaker a stream heard (0 -> "Speaker 1")."""
    return f"Speaker {index + 1}"


@dataclass
class Assignment:
    """Where a line went: its speaker's index, the similarity that decided it, and whether the
    line made a new speaker."""

    index: int
    similarity: float
    new: bool


class OnlineClusters:
    """The speakers of one stream. ``max_weight_frames`` caps how much a centroid remembers, so a
    voice that drifts (a speaker warming up, a microphone moved) is followed."""

    def __init__(self, threshold: float = DEFAULT_THRESHOLD, new_min_frames: int = 100,
                 max_weight_frames: int = 3000) -> None:
        if not -1.0 <= threshold <= 1.0:
            raise ValueError(f"a cosine similarity threshold is in [-1, 1], got {threshold}")
        self.threshold = threshold
        self.new_min_frames = new_min_frames
        self.max_weight_frames = max_weight_frames
        self._sums: list[np.ndarray] = []  # weighted sums of unit embeddings
        self._weights: list[float] = []
        self.last: int | None = None
        """The speaker of the last line assigned."""

    def __len__(self) -> int:
        return len(self._sums)

    def centroids(self) -> np.ndarray:
        """``[speakers, dim]`` unit vectors."""
        if not self._sums:
            return np.zeros((0, 0))
        sums = np.stack(self._sums)
        return sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)

    def similarities(self, embedding: np.ndarray) -> np.ndarray:
        """Cosine similarity of ``embedding`` (unit) to every speaker's centroid."""
        if not self._sums:
            return np.zeros(0)
        return self.centroids() @ np.asarray(embedding, np.float64)

    def closest(self, embedding: np.ndarray) -> tuple[int | None, float]:
        """The speaker ``embedding`` is most like and how much, without changing anything."""
        sims = self.similarities(embedding)
        if sims.size == 0:
            return None, -1.0
        best = int(np.argmax(sims))
        return best, float(sims[best])

    def assign(self, embedding: np.ndarray, frames: int) -> Assignment:
        """The speaker of a line whose embedding (unit length) rests on ``frames`` speech frames;
        the speaker's centroid takes it in."""
        best, similarity = self.closest(embedding)
        if best is not None and similarity >= self.threshold:
            index, new = best, False
        elif best is None or frames >= self.new_min_frames:
            index, new = len(self._sums), True
            self._sums.append(np.zeros(np.asarray(embedding).shape[0]))
            self._weights.append(0.0)
        else:  # too little to tell: the speaker before it, whose centroid it does not move
            index = self.last if self.last is not None else best
            self.last = index
            return Assignment(index, similarity, False)
        self._take_in(index, embedding, frames)
        self.last = index
        return Assignment(index, similarity, new)

    def _take_in(self, index: int, embedding: np.ndarray, frames: int) -> None:
        weight = self._weights[index]
        if weight + frames > self.max_weight_frames and weight > 0:
            # Past the cap the old part fades: scale it so old and new together weigh the cap.
            keep = max(0.0, self.max_weight_frames - frames) / weight
            self._sums[index] = self._sums[index] * keep
            weight *= keep
        self._sums[index] = self._sums[index] + frames * np.asarray(embedding, np.float64)
        self._weights[index] = weight + frames
