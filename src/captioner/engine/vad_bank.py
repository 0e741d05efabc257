"""The voice activity detector of :mod:`captioner.engine.vad`, for many streams at once.

:class:`~captioner.engine.vad.VoiceActivity` decides frame by frame in a Python loop, which
alone would take a whole core at a server's stream counts (docs/decisions/002-engine-host-path.md).
:class:`VadBank` keeps the same state for every stream in arrays, one row per stream,
and steps all rows that received frames together: the loop runs over the frames of one push
(10 for 100 ms), each step a few NumPy operations across the rows.

Same decisions, bit for bit (the test holds it to ``VoiceActivity`` on random energies): the
smoothed level is the mean of the last ``smooth_frames`` energies summed oldest first, the
floor the minimum of the last ``floor_window_frames`` smoothed levels (a window kept whole per
row instead of a monotonic queue), the articulation count over the last ``articulation_frames``
(a window of flags kept per row, counted for all frames of a push at once), the share of
articulated loud frames (a short loop over the push's frames), then the same onset, hangover and
voiced-frame counts.

Called only by the engine's thread.
"""

from __future__ import annotations

import numpy as np

from captioner.engine.vad import VadConfig

RAGGED_COUNTS = 3
"""Distinct frame counts among the rows of one :meth:`VadBank.push_ragged` up to which each
count is pushed as it is; past it the rows are pushed by the bits of their counts."""


class VadBank:
    """Voice activity of up to :attr:`capacity` streams (rows); grows on demand."""

    def __init__(self, config: VadConfig | None = None) -> None:
        self.config = config or VadConfig()
        self.capacity = 0
        cfg = self.config
        self.floor_db = np.zeros(0)
        self.frames_seen = np.zeros(0, np.int64)
        self.speaking = np.zeros(0, bool)
        self.last_voiced_frame = np.zeros(0, np.int64)
        self.voiced_frames = np.zeros(0, np.int64)
        self._run = np.zeros(0, np.int64)
        self._hang = np.zeros(0, np.int64)
        self._recent = np.zeros((0, cfg.smooth_frames))
        self._levels = np.zeros((0, cfg.floor_window_frames))
        self._articulated = np.zeros((0, max(0, cfg.articulation_frames - 1)), bool)
        """The articulation flags of each row's last ``articulation_frames - 1`` frames, oldest first."""
        self.articulated_share = np.zeros(0)
        """Each row's :attr:`VoiceActivity.articulated_share`."""
        self._continues = np.zeros(0, bool)
        self._held = np.zeros(0, np.int64)
        self._run_articulated = np.zeros(0, np.int64)
        """Each row's held-sound state (:class:`VoiceActivity`'s, see ``VadConfig.held_max_frames``)."""
        self._free: list[int] = []

    # -- rows ------------------------------------------------------------------------------------
    def acquire(self) -> int:
        """A fresh row (the bank doubles when full)."""
        if not self._free:
            self._grow(max(64, self.capacity))
        row = self._free.pop(0)
        self.reset(row)
        return row

    def release(self, row: int) -> None:
        self._free.append(row)
        self._free.sort()

    def _grow(self, extra: int) -> None:
        old = self.capacity
        pad = lambda a, fill: np.concatenate([a, np.full((extra,) + a.shape[1:], fill, a.dtype)])  # noqa: E731
        self.floor_db = pad(self.floor_db, -120.0)
        self.frames_seen = pad(self.frames_seen, 0)
        self.speaking = pad(self.speaking, False)
        self.last_voiced_frame = pad(self.last_voiced_frame, -1)
        self.voiced_frames = pad(self.voiced_frames, 0)
        self._run = pad(self._run, 0)
        self._hang = pad(self._hang, 0)
        self._recent = pad(self._recent, 0.0)
        self._levels = pad(self._levels, np.inf)
        self._articulated = pad(self._articulated, False)
        self.articulated_share = pad(self.articulated_share, self.config.articulated_share_start)
        self._continues = pad(self._continues, False)
        self._held = pad(self._held, 0)
        self._run_articulated = pad(self._run_articulated, 0)
        self.capacity = old + extra
        self._free = sorted(self._free + list(range(old, self.capacity)))

    def reset(self, row: int) -> None:
        self.floor_db[row] = -120.0
        self.frames_seen[row] = 0
        self.speaking[row] = False
        self.last_voiced_frame[row] = -1
        self.voiced_frames[row] = 0
        self._run[row] = 0
        self._hang[row] = 0
        self._recent[row] = 0.0
        self._levels[row] = np.inf
        self._articulated[row] = False
        self.articulated_share[row] = self.config.articulated_share_start
        self._continues[row] = False
        self._held[row] = 0
        self._run_articulated[row] = 0

    def silence_frames(self, row: int) -> int:
        """Frames since the row's last speech-like frame (all seen frames if there was none)."""
        if self.last_voiced_frame[row] < 0:
            return int(self.frames_seen[row])
        return int(self.frames_seen[row] - 1 - self.last_voiced_frame[row])

    def silence_frames_many(self, rows) -> np.ndarray:
        """:meth:`silence_frames` of many rows at once (int64 array), for the scheduler's
        views of every active stream in one look-up."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        seen = self.frames_seen[rows]
        last = self.last_voiced_frame[rows]
        return np.where(last < 0, seen, seen - 1 - last)

    # -- frames ----------------------------------------------------------------------------------
    def push(self, rows, energy_db, change_db=None) -> np.ndarray:
        """The next ``n`` frame energies of each row (``energy_db[i]`` for ``rows[i]``, shape
        ``[len(rows), n]``, distinct rows) and their spectral changes (the same shape, or
        ``None``: energy alone decides, as :meth:`VoiceActivity.push`); returns their speech
        flags ``[len(rows), n]``."""
        cfg = self.config
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        energy = np.asarray(energy_db, dtype=np.float64).reshape(rows.shape[0], -1)
        n = energy.shape[1]
        flags = np.zeros(energy.shape, dtype=bool)
        if rows.size == 0 or n == 0:
            return flags
        # Work on the rows' own copies; write them back once.
        seen = self.frames_seen[rows]
        recent = self._recent[rows]
        levels = self._levels[rows]
        speaking = self.speaking[rows]
        last_voiced = self.last_voiced_frame[rows]
        voiced_count = self.voiced_frames[rows]
        run = self._run[rows]
        hang = self._hang[rows]
        floor = self.floor_db[rows]
        smooth = cfg.smooth_frames
        # What needs no frame-by-frame state is worked out for all frames of the push at once.
        # The smoothed level of frame i: the mean of the last `smooth` energies, summed oldest
        # first as Python's sum() over the deque adds them (same additions, same order: the
        # same float64 result); a young row's empty places are zeros on the left, adding nothing.
        ext = np.concatenate([recent, energy], axis=1)  # [B, smooth + n]
        total = ext[:, 1:1 + n].copy()
        for k in range(1, smooth):
            total += ext[:, 1 + k:1 + k + n]
        index = seen[:, None] + np.arange(n)  # [B, n] frame numbers
        smoothed = total / np.minimum(index + 1, smooth)
        recent = ext[:, -smooth:]
        floors = _floors(levels, index, smoothed)
        voiced_all = (energy >= floors + cfg.threshold_db) & (energy >= cfg.min_level_db)
        if change_db is None:
            articulated = np.ones(energy.shape, bool)
        else:
            changed = np.asarray(change_db, dtype=np.float64).reshape(energy.shape) >= cfg.change_db
            articulated = changed | (energy < cfg.min_level_db)
        keep = self._articulated.shape[1]
        history = np.concatenate([self._articulated[rows], articulated], axis=1)  # [B, keep + n]
        if change_db is not None and cfg.articulation_min_frames > 0:
            # Articulated frames among the last `articulation_frames` up to each frame of the push.
            counts = np.cumsum(np.concatenate([np.zeros((rows.shape[0], 1), np.int64), history], axis=1), axis=1)
            articulated_recently = counts[:, keep + 1:] - counts[:, :n]
            articulate = articulated_recently >= cfg.articulation_min_frames
            # The share of loud frames that are articulated, frame by frame (an exponential
            # average), and the held sounds that continue articulated speech.
            share = self.articulated_share[rows]
            continues = self._continues[rows]
            held = self._held[rows]
            run_articulated = self._run_articulated[rows]
            speechlike = np.empty(energy.shape, bool)
            for i in range(n):
                loud = voiced_all[:, i]
                share = np.where(loud, share + (articulate[:, i].astype(np.float64) - share)
                                 / cfg.articulated_share_frames, share)
                accepted = articulate[:, i] & (share >= cfg.articulated_share_min)
                run_articulated = np.where(loud, run_articulated + changed[:, i], 0)
                holding = loud & ~accepted & continues & (run_articulated >= cfg.held_after_frames) \
                    & (held < cfg.held_max_frames)
                speechlike[:, i] = accepted | holding
                held = np.where(loud & ~accepted, held + holding, 0)
                continues = loud & (accepted | continues)
            self.articulated_share[rows] = share
            self._continues[rows] = continues
            self._held[rows] = held
            self._run_articulated[rows] = run_articulated
            voiced_all &= speechlike
        if keep:
            self._articulated[rows] = history[:, -keep:]
        voiced_count = voiced_count + voiced_all.sum(axis=1)
        last_in_push = n - 1 - np.argmax(voiced_all[:, ::-1], axis=1)
        last_voiced = np.where(voiced_all.any(axis=1), seen + last_in_push, last_voiced)
        floor = floors[:, -1]
        # Onset and hangover carry state from frame to frame: a short loop of array steps.
        for i in range(n):
            voiced = voiced_all[:, i]
            run = np.where(voiced, run + 1, 0)
            onset = run >= cfg.onset_frames
            newly = onset & ~speaking
            for back in range(1, cfg.onset_frames):
                if i - back >= 0:
                    flags[newly, i - back] = True  # the onset frames themselves are speech too
            holding = speaking & ~onset & (hang > 0)
            speaking = onset | holding
            hang = np.where(onset, cfg.hangover_frames, np.where(holding, hang - 1, hang))
            flags[:, i] = speaking
        self.frames_seen[rows] = seen + n
        self._recent[rows] = recent
        self._levels[rows] = levels
        self.speaking[rows] = speaking
        self.last_voiced_frame[rows] = last_voiced
        self.voiced_frames[rows] = voiced_count
        self._run[rows] = run
        self._hang[rows] = hang
        self.floor_db[rows] = floor
        return flags

    def push_ragged(self, rows, counts, energy_db, change_db=None, frame_flags: bool = False):
        """Rows with different numbers of new frames in one call: ``energy_db`` (and
        ``change_db``) hold the frames of each row one row after another, ``counts[i]`` of them
        for ``rows[i]`` (flat, distinct rows). Returns whether each row had a speech frame; with
        ``frame_flags``, also every frame's speech flag (flat, as ``energy_db``): the speaker
        encoder hears only the speech frames.

        A push steps rows with as many frames together. Rows fed in equal steps (a capture,
        ``bench_capacity``) come as a few counts: one push per count. Network clients deliver
        ragged amounts (3, 8, 10, 40 frames at one step), and a push per distinct count cost the
        engine of a thousand served streams more than its model (docs/serve.md); past
        :data:`RAGGED_COUNTS` distinct counts, round ``2**j`` pushes the next ``2**j`` frames
        of every row whose count has bit ``j``, largest first: each row's frames go in order,
        every push is rectangular, and there are at most as many pushes as bits in the largest
        count. Frame by frame the bank is exact, so pushing a row's frames in pieces decides as
        one push of them all does."""
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        energy = np.asarray(energy_db, dtype=np.float64).reshape(-1)
        change = None if change_db is None else np.asarray(change_db, dtype=np.float64).reshape(-1)
        speech = np.zeros(rows.shape[0], dtype=bool)
        every = np.zeros(energy.shape[0], dtype=bool) if frame_flags else None
        if rows.size == 0:
            return (speech, every) if frame_flags else speech
        next_frame = np.cumsum(counts) - counts  # each row's next frame in the flat arrays
        distinct = np.unique(counts)
        if distinct.size <= RAGGED_COUNTS:
            pieces = [(int(n), np.nonzero(counts == n)[0]) for n in distinct]
        else:
            bits = [1 << j for j in range(int(counts.max()).bit_length() - 1, -1, -1)]
            pieces = [(size, np.nonzero(counts & size)[0]) for size in bits]
        for size, picked in pieces:
            if picked.size and size:
                index = next_frame[picked][:, None] + np.arange(size)
                flags = self.push(rows[picked], energy[index], None if change is None else change[index])
                speech[picked] |= flags.any(axis=1)
                if every is not None:
                    every[index] = flags
                next_frame[picked] += size
        return (speech, every) if frame_flags else speech


def _floors(levels: np.ndarray, index: np.ndarray, smoothed: np.ndarray) -> np.ndarray:
    """The noise floor after each frame of a push, ``[B, n]``: the minimum of the row's window
    of smoothed levels once frame ``index[:, i]`` wrote ``smoothed[:, i]`` into it (column
    ``index % window`` of ``levels``, which is updated in place). A minimum is exact, so
    this equals scanning the window after every frame.

    When the push is no longer than the window, frame ``i`` has evicted the ``i + 1`` oldest
    levels; the window then holds the levels that no frame of this push evicts (one
    minimum), the older levels from age ``i + 1`` on (a suffix minimum over ``n`` of them) and
    the push's levels ``0..i`` (a running minimum): all frames at once, with one scan of the
    window. Longer pushes go frame by frame, rescanning only rows whose evicted level was their
    minimum."""
    rows, n = smoothed.shape
    window = levels.shape[1]
    line = np.arange(rows)[:, None]
    if n <= window:
        columns = index % window  # the push's columns: the n oldest levels, oldest first
        oldest = levels[line, columns]
        levels[line, columns] = np.inf
        kept = levels.min(axis=1)  # what no frame of this push evicts
        levels[line, columns] = smoothed
        suffix = np.empty((rows, n))  # suffix[:, i] = min(oldest[:, i + 1:]), +inf past the end
        suffix[:, n - 1] = np.inf
        if n > 1:
            suffix[:, :n - 1] = np.minimum.accumulate(oldest[:, :0:-1], axis=1)[:, ::-1]
        return np.minimum(np.minimum(kept[:, None], suffix), np.minimum.accumulate(smoothed, axis=1))
    floors = np.empty_like(smoothed)
    low = levels.min(axis=1)
    flat = line[:, 0]
    for i in range(n):
        column = index[:, i] % window
        evicted = levels[flat, column]
        levels[flat, column] = smoothed[:, i]
        rescan = np.nonzero((evicted <= low) | np.isnan(low))[0]
        low = np.minimum(low, smoothed[:, i])
        if rescan.size:
            low[rescan] = levels[rescan].min(axis=1)
        floors[:, i] = low
    return floors
