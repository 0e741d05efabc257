"""Word times and "where the model is listening" from the alignment heads' cross-attention.

Input: per chosen token, the attention of the decoder run that chose it, ``[n, A, frames]``
(:class:`captioner.models.alignment.AttentionRecorder`; one encoder frame is 20 ms).

- :func:`token_times`: Whisper's word-timestamp method: each head's weights standardised over
  the tokens, median-filtered along time (width 7), averaged over the heads; a monotonic path
  through the token x frame matrix by dynamic time warping (DTW) gives each token the frame
  where it starts. Only the frames that hold audio take part. A word that would take in the
  pause before it starts later (:func:`_clip_pauses`, Whisper's rule).
- :func:`attended_frames`: per token, the frame the heads attend to most (padding included):
  the AlignAtt policy's signal. A token chosen while the model looks at the last few hundred
  milliseconds of the audio may still change when more audio comes.

Pure NumPy; called by the thread that runs the recognizer.
"""

from __future__ import annotations

import numpy as np

FRAME_S = 0.02
"""Seconds per encoder frame (Whisper: 1500 frames per 30 s window)."""
MEDIAN_WIDTH = 7


def attended_frames(rows: np.ndarray) -> np.ndarray:
    """``[n]``: per token, argmax over frames of the heads' mean attention."""
    if rows.shape[0] == 0:
        return np.zeros(0, np.int64)
    return np.asarray(rows, np.float32).mean(axis=1).argmax(axis=-1)


def _median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median along the last axis, reflect-padded (as Whisper's ``median_filter``). Width 7 (the
    one used) by a sorting network over seven shifted views: the same values as ``np.median``
    over sliding windows, without copying and sorting every window (most of an AlignAtt update's
    host time was that)."""
    if width <= 1 or x.shape[-1] < width:
        return x
    pad = width // 2
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    if width != 7:
        return np.median(np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1), axis=-1)
    n = x.shape[-1]
    p = [padded[..., k:k + n].copy() for k in range(7)]  # copies: the network writes in place
    low = np.empty_like(p[0])
    # A median-of-7 network (Devillard's opt_med7): 13 compare-exchanges leave it in p[3].
    for a, b in ((0, 5), (0, 3), (1, 6), (2, 4), (0, 1), (3, 5), (2, 6), (2, 3), (3, 6), (4, 5), (1, 4), (1, 3), (3, 4)):
        np.minimum(p[a], p[b], out=low)
        np.maximum(p[a], p[b], out=p[b])
        p[a], low = low, p[a]
    return p[3]


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotonic path from (0, 0) to (N-1, M-1) with steps right, down and
    diagonal: arrays of row and column indices along it.

    Each row is done at once: with ``a[j]`` the best way into (i, j) from row i-1, the row's
    costs are ``S[j] + min_{k<=j}(a[k] - S[k])`` (``S`` the row's running cost sum), a prefix
    minimum instead of a loop over the frames. The way back is found a row at a time too (see
    :func:`_path_back`)."""
    n, m = cost.shape
    total = np.full((n, m), np.inf)
    s = np.cumsum(cost[0])
    total[0] = s
    for i in range(1, n):
        c = cost[i]
        best_in = np.full(m, np.inf)
        best_in[0] = total[i - 1, 0]
        best_in[1:] = np.minimum(total[i - 1, 1:], total[i - 1, :-1])
        a = c + best_in
        s = np.cumsum(c)
        total[i] = s + np.minimum.accumulate(a - s)
    return _path_back(total)


def _path_back(total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The path through ``total`` (the cheapest cost into each cell) from its last cell back to
    (0, 0), taking at each cell the cheapest of diagonal, up and left, in that order on a tie.
    Along a row the path goes left until a cell where the diagonal or the cell above costs no
    more than the cell to its left: one vectorised test per row, not one per step."""
    n, m = total.shape
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    j = m - 1
    for i in range(n - 1, 0, -1):
        up = total[i - 1, :j + 1]
        diag = np.concatenate(([np.inf], total[i - 1, :j]))
        left = np.concatenate(([np.inf], total[i, :j]))
        rise = np.minimum(diag, up) <= left
        rise[0] = True  # the first column: only up
        k = j - int(np.argmax(rise[::-1]))  # the first cell leftwards where the path rises
        cols.append(np.arange(j, k - 1, -1))
        rows.append(np.full(j - k + 1, i))
        j = k - 1 if k > 0 and diag[k] <= up[k] else k
    cols.append(np.arange(j, -1, -1))
    rows.append(np.zeros(j + 1, np.int64))
    return np.concatenate(rows)[::-1].astype(np.int64), np.concatenate(cols)[::-1].astype(np.int64)


def token_times(rows: np.ndarray, n_frames: int, ended: bool, keep: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (seconds from the window's start) of each text token.

    ``rows``: ``[n (+1 with ``ended``: the end token's row), A, frames]``. ``n_frames``: encoder
    frames that hold audio. A token ends where the next one starts; the last one where the end
    token's row starts, or (no end token) at the end of the path. ``keep``: where given, the
    encoder frames the path may run through (those that hold speech): a long silence inside the
    window is then no place a word can be put, which the path through every frame did on a phone
    call's silences (tiny.en put a word seconds after it was said)."""
    n_text = rows.shape[0] - (1 if ended else 0)
    if n_text <= 0:
        return np.zeros(0), np.zeros(0)
    n_frames = int(max(1, min(n_frames, rows.shape[-1])))
    weights = np.asarray(rows[:, :, :n_frames], np.float64).transpose(1, 0, 2)  # [A, n, frames]
    std = weights.std(axis=1, keepdims=True)
    weights = (weights - weights.mean(axis=1, keepdims=True)) / np.where(std > 0, std, 1.0)
    matrix = _median_filter(weights, MEDIAN_WIDTH).mean(axis=0)  # [n, frames]
    columns = None
    if keep is not None:
        keep = np.asarray(keep, dtype=bool)[:n_frames]
        if keep.sum() >= matrix.shape[0]:
            columns = np.flatnonzero(keep)
            matrix = matrix[:, columns]
    path_rows, path_cols = dtw(-matrix)
    if columns is not None:  # back to the window's frames
        path_cols = columns[path_cols]
        n_frames = int(columns[-1]) + 1
    # The frame where each row is first reached.
    first = np.full(matrix.shape[0], n_frames, dtype=np.int64)
    for r, c in zip(path_rows[::-1], path_cols[::-1]):
        first[r] = c
    starts = first[:n_text] * FRAME_S
    if ended:
        ends = first[1:n_text + 1] * FRAME_S
    else:
        ends = np.append(first[1:n_text], path_cols[-1] + 1) * FRAME_S
    return starts.astype(np.float64), np.maximum(ends, starts).astype(np.float64)


_PIECE_RE = r"\s*[^\s-]+-*|\s*-+"  # as policy.words_from_segments: hyphenated parts count apart


def words_with_times(tokens, rows: np.ndarray, ended: bool, segments, decode, eot: int, span_s: float,
                     window_start_s: float, voiced: np.ndarray | None = None, logprobs=()):
    """Words of a decoded window with times from the attention, or ``None`` when the tokens and
    segments cannot be lined up (the caller then spreads times over segments).

    ``tokens``: the window's sampled tokens (timestamps included); ``rows``: their attention
    (one row per token, plus the end token's with ``ended``); ``segments``: the decoder's
    ``TimedSegment``s; ``decode``: token ids -> text. Returns ``(words, segment_ends_s)`` with
    times on the stream's clock; each word's ``attend_s`` is the latest attended time of its
    tokens (padding past the audio included). ``voiced``: where known, the VAD's speech flag per
    10 ms frame of the window (:func:`fit_to_voice`). ``logprobs``: the log-probabilities of the
    last ``len(logprobs)`` tokens (those sampled), which give each word its ``confidence``: the
    probability of its least likely token."""
    import re

    from captioner.engine.policy.words import Word

    text_at = [i for i, t in enumerate(tokens) if int(t) < eot]
    text_tokens = [int(tokens[i]) for i in text_at]
    if rows.shape[0] != len(tokens) + (1 if ended else 0) or not text_at:
        return None
    dtw_rows = rows[text_at + ([len(tokens)] if ended else [])]
    keep = None
    if voiced is not None and np.any(voiced):
        # 10 ms VAD frames -> 20 ms encoder frames: a frame holds speech if either half does.
        flags = np.asarray(voiced, dtype=bool)
        flags = np.pad(flags, (0, flags.shape[0] % 2))
        keep = flags.reshape(-1, 2).any(axis=1)
    starts, ends = token_times(dtw_rows, int(round(span_s / FRAME_S)), ended, keep)
    if voiced is not None:
        starts, ends = fit_to_voice(starts, ends, voiced)
    looked_s = attended_frames(rows[text_at]) * FRAME_S
    first_sampled = len(tokens) - len(logprobs)
    words: list[Word] = []
    seg_ends: list[float] = []
    cursor = 0
    for index, seg in enumerate(segments):
        ids = [int(t) for t in seg.tokens]
        at = next((k for k in range(cursor, len(text_tokens) - len(ids) + 1) if text_tokens[k:k + len(ids)] == ids), None)
        if at is None or not ids:
            return None
        cursor = at + len(ids)
        # Character where each token's text ends, from decoding growing prefixes (a token may
        # hold part of a UTF-8 character: keep the offsets monotonic).
        char_end, reach = [], 0
        for k in range(len(ids)):
            reach = max(reach, len(decode(ids[:k + 1])))
            char_end.append(reach)
        text = seg.text
        for n_piece, match in enumerate(re.finditer(_PIECE_RE, text)):
            a, b = match.start() + (len(match.group()) - len(match.group().lstrip())), match.end()
            first = next((k for k in range(len(ids)) if char_end[k] > a), len(ids) - 1)
            last = next((k for k in range(len(ids)) if char_end[k] >= b), len(ids) - 1)
            piece = match.group()
            if n_piece == 0 and not piece.startswith(" "):
                piece = " " + piece
            t0, t1 = at + first, at + last
            # Inside the segment's own timestamps (Whisper's rule): the DTW path must end at the
            # window's last frame, and the last words of a window whose speech stops well before
            # it (a phone line's silence while the other side talks) were drawn out to its end.
            lo_s, hi_s = float(seg.start_s), max(float(seg.start_s), min(float(seg.end_s), span_s))
            start_s = min(max(float(starts[t0]), lo_s), hi_s)
            end_s = min(max(float(ends[t1]), start_s), hi_s)
            sure = [logprobs[text_at[k] - first_sampled] for k in range(t0, t1 + 1) if text_at[k] >= first_sampled]
            words.append(Word(piece, window_start_s + start_s, window_start_s + end_s, index,
                              attend_s=window_start_s + float(looked_s[t0:t1 + 1].max()),
                              confidence=float(np.exp(min(sure))) if sure else None))
        seg_ends.append(window_start_s + min(float(seg.end_s), span_s))
    return _clip_pauses(words), seg_ends


VAD_FRAME_S = 0.01


def fit_to_voice(starts: np.ndarray, ends: np.ndarray, voiced: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token times moved onto the speech: a token's span that holds speech (``voiced``, one flag
    per 10 ms frame from the window's start) is trimmed to its first and last speech frame. The
    DTW path gives every silence to a token beside it: the last word before the other side of a
    phone call speaks was dated seconds late, at the end of the silence it was given."""
    starts, ends = starts.copy(), ends.copy()
    speech = np.flatnonzero(np.asarray(voiced, dtype=bool))
    if not speech.size:
        return starts, ends
    for k in range(starts.shape[0]):
        lo, hi = int(starts[k] / VAD_FRAME_S), int(np.ceil(ends[k] / VAD_FRAME_S))
        inside = speech[(speech >= lo) & (speech < hi)]
        if inside.size:
            starts[k] = max(starts[k], inside[0] * VAD_FRAME_S)
            ends[k] = min(ends[k], (inside[-1] + 1) * VAD_FRAME_S)
    return starts, ends


MEDIAN_WORD_CAP_S = 0.7


def _clip_pauses(words: list) -> list:
    """Words that do not swallow the pause before them.

    On the DTW path a word starts where the one before it ends, so a pause is counted into the
    word after it ("ask" of JFK's "Americans ... ask not" spanned the pause before it) and
    captions could not end at it. As Whisper's word timestamps do, a word longer
    than twice the median word duration (the median capped at 0.7 s) keeps its end and starts
    that long before it: the pause shows as a gap between the words."""

    durations = [w.end_s - w.start_s for w in words if w.end_s > w.start_s]
    if not durations:
        return words
    max_s = 2 * min(MEDIAN_WORD_CAP_S, float(np.median(durations)))
    return [w._replace(start_s=w.end_s - max_s) if w.end_s - w.start_s > max_s else w for w in words]
