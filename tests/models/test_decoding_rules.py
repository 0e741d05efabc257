"""Whisper's decoding rules on crafted logits (no model): suppression, the timestamp rules,
segments from timestamps, and the guards. The real-model checks are in test_transcribe.py."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.models.decoding import (
    DecodingOptions,
    LogitRules,
    RawDecode,
    assess,
    compression_ratio,
    decode_with_fallback,
    find_repetition,
    split_segments,
)
from captioner.models.registry import resolve_model
from captioner.models.tokenizer import WhisperTokenizer


@pytest.fixture(scope="module")
def tok() -> WhisperTokenizer:
    files = resolve_model("base")
    return WhisperTokenizer(files.tokenizer_path, files.config_path, n_vocab=files.dims.n_vocab)


def _logits(tok, rows=1, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (rows, tok.n_vocab)).astype(np.float32)


def _allowed(row: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.isfinite(row))


def test_suppress_lists_and_blank_at_first_step_only(tok):
    rules = LogitRules(tok, DecodingOptions(without_timestamps=True), tok.n_vocab)
    logits = _logits(tok, 2)
    rules.apply(logits, [[], [tok.encode(" Hi")[0]]])
    for b in range(2):
        assert np.all(np.isneginf(logits[b, list(tok.suppress_ids)]))
    assert np.all(np.isneginf(logits[0, list(tok.suppress_ids_begin)]))
    assert np.all(np.isfinite(logits[1, list(tok.suppress_ids_begin)]))
    # Without timestamps, timestamps themselves are not ruled on here.
    assert np.isfinite(logits[0, tok.timestamp_begin + 7])
    off = LogitRules(tok, DecodingOptions(without_timestamps=True, suppress_tokens=False, suppress_blank=False), tok.n_vocab)
    raw = _logits(tok, 1)
    kept = raw.copy()
    off.apply(raw, [[]])
    np.testing.assert_array_equal(raw, kept)


def test_first_token_is_an_early_timestamp(tok):
    rules = LogitRules(tok, DecodingOptions(), tok.n_vocab)
    logits = _logits(tok)
    rules.apply(logits, [[]])
    allowed = _allowed(logits[0])
    assert allowed.min() == tok.timestamp_begin
    assert allowed.max() == tok.timestamp_token(1.0)  # max_initial_timestamp 1.0 s = index 50
    rules = LogitRules(tok, DecodingOptions(max_initial_timestamp_s=0.0), tok.n_vocab)
    logits = _logits(tok)
    rules.apply(logits, [[]])
    assert list(_allowed(logits[0])) == [tok.timestamp_begin]


def test_timestamps_come_in_pairs_and_never_decrease(tok):
    rules = LogitRules(tok, DecodingOptions(), tok.n_vocab)
    word = tok.encode(" hello")[0]
    t = tok.timestamp_token
    logits = _logits(tok, 4)
    logits[:, word] = 50.0  # text far ahead of every timestamp: the mass rule stays quiet
    logits[:, tok.eot] = 50.0
    sampled = [
        [t(0.0), word],  # open segment: text or a timestamp >= 0.00 next
        [t(0.0), word, t(1.2)],  # lone closing timestamp: its partner or the end
        [t(0.0), word, t(1.2), t(1.2)],  # a pair: only text (or the end) follows
        [t(0.5)],  # first timestamp just sampled: it is "a pair" with itself -> text
    ]
    rules.apply(logits, sampled)
    row0, row1, row2, row3 = (logits[i] for i in range(4))
    assert np.isfinite(row0[word]) and np.isfinite(row0[t(0.0)]) and np.isfinite(row0[t(5.0)])
    assert np.isneginf(row0[tok.special.no_timestamps])
    allowed1 = _allowed(row1)
    assert allowed1.min() == tok.eot  # no text after a lone closing timestamp
    assert np.isneginf(row1[t(1.18)]) and np.isfinite(row1[t(1.2)]) and np.isfinite(row1[t(2.0)])
    assert np.all(np.isneginf(row2[tok.timestamp_begin:]))
    assert np.isfinite(row2[word]) and np.isfinite(row2[tok.eot])
    assert np.all(np.isneginf(row3[tok.timestamp_begin:]))
    assert np.isfinite(row3[word])


def test_timestamp_mass_beats_best_text_token(tok):
    rules = LogitRules(tok, DecodingOptions(), tok.n_vocab)
    word = tok.encode(" hello")[0]
    sampled = [[tok.timestamp_token(0.0), word]]
    # Every timestamp a little less likely than the best word, but together far more likely.
    logits = np.full((1, tok.n_vocab), -30.0, dtype=np.float32)
    logits[0, word] = 5.0
    logits[0, tok.timestamp_begin:] = 3.0
    rules.apply(logits, sampled)
    assert np.isneginf(logits[0, word])
    assert np.isfinite(logits[0, tok.timestamp_token(2.0)])
    # And when one word dominates, text stays allowed.
    logits = np.full((1, tok.n_vocab), -30.0, dtype=np.float32)
    logits[0, word] = 12.0
    logits[0, tok.timestamp_begin:] = 3.0
    rules.apply(logits, sampled)
    assert np.isfinite(logits[0, word])


def test_split_segments_by_timestamp_pairs(tok):
    t = tok.timestamp_token
    a, b, c = tok.encode(" One two."), tok.encode(" Three four."), tok.encode(" Five")
    # Two complete segments, the window's text ends with a lone timestamp: all consumed.
    tokens = [t(0.0), *a, t(1.5), t(1.5), *b, t(3.0)]
    segments, consumed = split_segments(tokens, tok, 30.0)
    assert [(s.start_s, s.end_s, s.text) for s in segments] == [(0.0, 1.5, " One two."), (1.5, 3.0, " Three four.")]
    assert consumed is None
    # An unfinished third segment: consumed up to the last complete one.
    tokens = [t(0.0), *a, t(1.5), t(1.5), *b, t(3.0), t(3.2), *c]
    segments, consumed = split_segments(tokens, tok, 30.0)
    assert [s.text for s in segments] == [" One two.", " Three four."]
    assert consumed == pytest.approx(3.0)
    # No pair at all: one segment over the window, ending at the last timestamp.
    segments, consumed = split_segments([t(0.4), *a, t(2.0)], tok, 12.5)
    assert [(s.start_s, s.end_s) for s in segments] == [(pytest.approx(0.4), pytest.approx(2.0))]
    assert consumed is None
    segments, consumed = split_segments([*a], tok, 12.5)
    assert [(s.start_s, s.end_s, s.text) for s in segments] == [(0.0, 12.5, " One two.")] and consumed is None
    assert split_segments([], tok, 30.0) == ([], None)


def test_compression_ratio_flags_loops():
    normal = "And so my fellow Americans, ask not what your country can do for you."
    loop = "I'm sorry. " * 30
    assert compression_ratio(normal) < 1.5
    assert compression_ratio(loop) > 2.4
    assert compression_ratio("") == 0.0


def test_find_repetition():
    assert find_repetition(list(range(40))) is None
    looped = list(range(10)) + [7, 8, 9] * 8
    assert find_repetition(looped) == 7  # the loop 7 8 9 began inside the prefix
    assert find_repetition([1, 2, 3] + [5] * 20) == 3
    # A phrase said three times and then left is speech, not a loop.
    assert find_repetition([4, 5, 6] * 3 + list(range(10, 30))) is None
    # Short repeats below the token floor are allowed ("no, no, no").
    assert find_repetition([1, 2] + [9] * 5) is None


def _window(tok, **kw):
    from captioner.models.decoding import DecodedWindow

    base = dict(tokens=(1, 2), text=" hi", segments=(), consumed_s=None, avg_logprob=-0.3, sum_logprob=-0.9,
                no_speech_prob=0.01, compression_ratio=1.0, language="en", language_probs=None, temperature=0.0,
                hit_length_limit=False)
    base.update(kw)
    return DecodedWindow(**base)


def test_assess(tok):
    options = DecodingOptions()
    assert assess(_window(tok), options).failure == ""
    silent = assess(_window(tok, no_speech_prob=0.9, avg_logprob=-1.5), options)
    assert silent.no_speech and silent.failure == ""
    # Likely text wins over a high no-speech probability (Whisper's rule).
    assert not assess(_window(tok, no_speech_prob=0.9, avg_logprob=-0.2), options).no_speech
    assert assess(_window(tok, compression_ratio=3.0), options).failure == "compression"
    assert assess(_window(tok, repetition=True), options).failure == "repetition"
    assert assess(_window(tok, avg_logprob=-1.4), options).failure == "logprob"
    off = DecodingOptions(no_speech_threshold=None, logprob_threshold=None, compression_ratio_threshold=None)
    assert assess(_window(tok, compression_ratio=3.0, avg_logprob=-3.0, no_speech_prob=0.99), off) == assess(_window(tok), off)


class _ScriptedPasses:
    """A decoding pass whose outputs are given per temperature: drives the fallback loop."""

    def __init__(self, tok, script):
        self.tok, self.script, self.calls = tok, script, []

    def __call__(self, rows, heads, langs, temperature, rng, prefixes):
        self.calls.append((list(rows), temperature, [list(h) for h in heads]))
        self.prefixes = [list(p) for p in prefixes]
        return [self.script(row, temperature, k) for k, row in enumerate(rows)]


def test_fallback_retries_failed_windows_at_higher_temperature(tok):
    good = tok.encode(" A perfectly good sentence.")
    loop = tok.encode(" again") * 40

    def script(row, temperature, k):
        if row == 1 and temperature < 0.4:  # row 1 loops until 0.4
            return RawDecode(list(loop), -2.0, 0.01, "en", None, True)
        # Of the samples at a temperature, the k-th is less likely: the best must be kept.
        return RawDecode(list(good), -1.0 - k, 0.01, "en", None, False)

    passes = _ScriptedPasses(tok, script)
    options = DecodingOptions(best_of=3, language="en")
    out = decode_with_fallback(passes, tok, 2, options, previous_tokens=[[], good])
    assert [w.text for w in out] == [tok.decode(good)] * 2
    assert out[0].temperature == 0.0 and out[0].failures == ()
    assert out[1].temperature == 0.4 and out[1].failures == ("repetition", "repetition")
    # Greedy once for both; then only row 1, sampled best_of times per temperature.
    assert [(rows, t) for rows, t, _ in passes.calls] == [([0], 0.0), ([1], 0.0), ([1, 1, 1], 0.2), ([1, 1, 1], 0.4)]
    # The previous text became <|startofprev|> + tokens for row 1 only.
    assert passes.calls[1][2][0] == [tok.special.sot_prev, *good]


def test_windows_that_keep_failing_lose_their_text(tok):
    loop = tok.encode(" la") * 60
    passes = _ScriptedPasses(tok, lambda row, t, k: RawDecode(list(loop), -5.0, 0.01, "en", None, True))
    out = decode_with_fallback(passes, tok, 1, DecodingOptions(temperatures=(0.0, 0.5), best_of=2, language="en"))
    assert out[0].text == "" and out[0].segments == ()
    assert out[0].dropped == "repetition" and out[0].failures == ("repetition", "repetition")
    silent = _ScriptedPasses(tok, lambda row, t, k: RawDecode(tok.encode(" Thank you."), -6.0, 0.95, "en", None, False))
    out = decode_with_fallback(silent, tok, 1, DecodingOptions(language="en"))
    assert out[0].dropped == "no_speech" and out[0].text == ""
    assert len(silent.calls) == 1  # silence is not retried
    # Unlikely (but not looping) text is kept after the last temperature, as Whisper does.
    unsure = _ScriptedPasses(tok, lambda row, t, k: RawDecode(tok.encode(" Mumble."), -9.0, 0.1, "en", None, False))
    out = decode_with_fallback(unsure, tok, 1, DecodingOptions(temperatures=(0.0, 1.0), best_of=1, language="en"))
    assert out[0].text == " Mumble." and out[0].failures == ("logprob", "logprob") and out[0].dropped == ""


def test_prompts_of_different_lengths_run_in_separate_passes(tok):
    passes = _ScriptedPasses(tok, lambda row, t, k: RawDecode(tok.encode(" ok"), -0.1, 0.0, "en", None, False))
    previous = [tok.encode(" one two"), [], tok.encode(" three four"), tok.encode(" five")]
    lengths = {len(p) for p in previous}
    decode_with_fallback(passes, tok, 4, DecodingOptions(language="en"), previous_tokens=previous)
    assert len(passes.calls) == len({len(p) + (1 if p else 0) for p in previous}) == len(lengths)
    for _rows, _, heads in passes.calls:
        assert len({len(h) for h in heads}) == 1
