"""Whisper decoding over a :class:`~captioner.models.runtime.WhisperRuntime`: greedy search (or
temperature sampling for fallbacks), Whisper's token rules, timestamps -> segments, language
detection, and the guards against Whisper's failure modes.

The rules are CTranslate2's implementation of Whisper's (the test oracle runs the same
``model.bin``), applied in the same order so that the same logits give the same tokens:

1. ``suppress_ids`` from ``config.json`` (non-speech symbols and task/start specials), always;
2. ``suppress_ids_begin`` (a blank, ``<|endoftext|>``) at the first sampled position;
3. timestamp rules: no ``<|notimestamps|>``; the first token is a timestamp no later than
   ``max_initial_timestamp_s``; timestamps come in pairs (after a lone timestamp only a
   timestamp or the end, after a pair only text); timestamps never decrease; and where the
   probability mass of all timestamps beats the best text token, a timestamp is forced.

Guards (see :func:`assess`): a window whose ``<|nospeech|>`` probability is high and whose
tokens are unlikely is silence; a window whose text compresses too well (zlib) or ends in an
n-gram loop has looped. Failed windows are decoded again at rising temperatures (real sampling,
best of N) and, if every attempt fails, their text is dropped and the reason reported.

Greedy passes run the same rules as array code over the decoder's array module
(:mod:`captioner.models.device_rules`, ``DecodingOptions.decode_on="device"``): with CuPy on
CUDA the logits stay on the GPU and per step only the chosen token ids and their
log-probabilities reach the host. ``LogitRules`` here stays the specification (and the path of
``decode_on="host"`` and of sampling); tests hold the two to the same tokens.

All functions here run on whichever thread owns the runtime (the GPU worker, or the CLI's
main thread); nothing here keeps state between calls.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from captioner.models.decode_choice import DEVICE, HOST, DecodeChooser
from captioner.models.device_rules import (
    DeviceRules,
    rule_tokens,
    to_host,
    token_logprobs,
)
from captioner.models.tokenizer import WhisperTokenizer

WINDOW_S = 30.0
N_TEXT_CTX = 448
DECODE_ON = ("auto", "device", "host")
DEVICE_DECODING_MIN_BATCH = 16
"""``decode_on="auto"`` rules on the device from this many rows up: the device's fixed cost per
step only pays off once the host's per-row NumPy work outgrows it (docs/decoding.md, "Measured").
Below it, a recognizer's :class:`~captioner.models.decode_choice.DecodeChooser` times both paths
and keeps the faster (the rules have since become one kernel a step, so that measurement has aged)."""


class Runtime(Protocol):
    """What decoding needs of GRAPH's ``WhisperRuntime`` (or any model with the same calls)."""

    n_vocab: int
    n_text_ctx: int
    is_multilingual: bool

    def encode(self, mel): ...

    def start(self, enc, prompt_tokens: np.ndarray, xp=None): ...

    def step(self, state, tokens: np.ndarray, xp=None) -> np.ndarray: ...


@dataclass(frozen=True)
class DecodingOptions:
    task: str = "transcribe"
    language: str | None = None
    """A language code, or ``None`` to detect it (multilingual models) / English."""
    without_timestamps: bool = False
    suppress_blank: bool = True
    suppress_tokens: bool = True
    max_initial_timestamp_s: float = 1.0
    """The first timestamp is at most this (Whisper's ``max_initial_timestamp``, index 50)."""
    sample_len: int | None = None
    """Most tokens sampled per window; ``None``: half the text context (224), as Whisper."""
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    """Tried in order while a window fails its checks; ``(0.0,)`` turns fallback off."""
    best_of: int = 5
    """Samples drawn per window at a temperature above 0; the most likely one is kept."""
    seed: int = 0
    no_speech_threshold: float | None = 0.6
    logprob_threshold: float | None = -1.0
    compression_ratio_threshold: float | None = 2.4
    repetition_max_ngram: int = 12
    """Loops of n-grams up to this length are looked for at the end of a window's text."""
    repetition_min_tokens: int = 16
    """A loop counts when its repeats cover at least this many tokens (and 3 repeats)."""
    max_previous_tokens: int = 223
    decode_on: str = "auto"
    """Where greedy passes apply the rules and choose tokens: ``"auto"`` (the device for batches
    of ``DEVICE_DECODING_MIN_BATCH`` rows or more, else the host), ``"device"`` (vectorised array
    code over the decoder's array module, :mod:`captioner.models.device_rules`: on CUDA the
    logits never leave the GPU) or ``"host"`` (``LogitRules`` row by row in NumPy, the
    specification). Sampling passes (temperature > 0) always run on the host."""
    drop_finished: bool = True
    """Greedy passes on the device move the rows still decoding into a smaller batch once enough
    rows have finished (runtimes with ``compact``: the fixed-cache decoder), so finished rows
    stop costing steps. The tokens do not change."""

    def __post_init__(self) -> None:
        if self.decode_on not in DECODE_ON:
            raise ValueError(f"decode_on must be one of {', '.join(DECODE_ON)}, not {self.decode_on!r}")


@dataclass(frozen=True)
class TimedSegment:
    """Text between two timestamp tokens; times in seconds from the window's start."""

    start_s: float
    end_s: float
    tokens: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class DecodedWindow:
    """One window's result. ``tokens`` are the sampled tokens (timestamps included, the final
    ``<|endoftext|>`` not). ``text`` is empty when ``dropped`` says why (``"no_speech"``,
    ``"repetition"``, ``"compression"``)."""

    tokens: tuple[int, ...]
    text: str
    segments: tuple[TimedSegment, ...]
    consumed_s: float | None
    """Where the last complete segment ends (seconds from the window's start), or ``None`` when
    the window's text ended cleanly and the whole window is consumed (Whisper's seek rule)."""
    avg_logprob: float
    sum_logprob: float
    no_speech_prob: float
    compression_ratio: float
    language: str
    language_probs: dict[str, float] | None
    temperature: float
    hit_length_limit: bool
    repetition: bool = False
    dropped: str = ""
    failures: tuple[str, ...] = field(default=())
    """Reasons of every failed attempt, in order (empty when the first attempt passed)."""
    token_logprobs: tuple[float, ...] = ()
    """Each sampled token's log-probability, for the tokens after the forced prefix (empty where
    the decoder gives none)."""
    end_logprob: float | None = None
    """The log-probability of the ``<|endoftext|>`` the window ended with (``None``: it reached
    its length limit, or the decoder gives none)."""


def compression_ratio(text: str) -> float:
    """Bytes of UTF-8 text over bytes of its zlib compression (Whisper's loop detector)."""
    data = text.encode("utf-8")
    if not data:
        return 0.0
    return len(data) / len(zlib.compress(data))


def find_repetition(tokens: Sequence[int], max_ngram: int = 12, min_tokens: int = 16, min_repeats: int = 3) -> int | None:
    """Where a loop starts in ``tokens``: the index at which some n-gram (n <= ``max_ngram``)
    begins to repeat back to back, at least ``min_repeats`` times and over at least
    ``min_tokens`` tokens, up to the end of the sequence. ``None`` when there is no loop.

    Only loops that run to the end matter: Whisper loops until the length limit, while a
    phrase that is repeated and then left ("no, no, no, I said") is speech.
    """
    tokens = list(tokens)
    n_tokens = len(tokens)
    best: int | None = None
    for n in range(1, min(max_ngram, n_tokens // min_repeats) + 1):
        tail = tokens[n_tokens - n:]
        start = n_tokens - n
        while start - n >= 0 and tokens[start - n:start] == tail:
            start -= n
        # A partial repeat may precede the first whole one (the loop began mid-n-gram).
        while start > 0 and tokens[start - 1] == tokens[start - 1 + n]:
            start -= 1
        covered = n_tokens - start
        if covered >= max(min_tokens, min_repeats * n) and (best is None or start < best):
            best = start
    return best


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float32, copy=False)
    peak = np.max(x, axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    shifted = x - peak
    with np.errstate(divide="ignore"):
        return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def _token_logprobs(logits: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``log_softmax(logits)[b, tokens[b]]`` per row, with one pass over the vocabulary."""
    peak = np.max(logits, axis=-1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    total = np.sum(np.exp(logits - peak), axis=-1)
    picked = logits[np.arange(len(tokens)), tokens]
    with np.errstate(divide="ignore"):
        return picked - peak[:, 0] - np.log(total)


def softmax(logits: np.ndarray) -> np.ndarray:
    return np.exp(log_softmax(logits))


class LogitRules:
    """Whisper's token rules for one decode call (see the module docstring for the order)."""

    def __init__(self, tokenizer: WhisperTokenizer, options: DecodingOptions, n_vocab: int):
        (self.eot, self.no_timestamps, self.ts_begin, self.ts_end, self.timestamps,
         self.max_initial) = rule_tokens(tokenizer, options, n_vocab)
        self.suppress = np.array(tokenizer.suppress_ids if options.suppress_tokens else (), dtype=np.int64)
        self.suppress_begin = np.array(tokenizer.suppress_ids_begin if options.suppress_blank else (), dtype=np.int64)

    def apply(self, logits: np.ndarray, sampled: Sequence[Sequence[int]], active: Sequence[bool] | None = None) -> None:
        """Mask ``logits`` ``[B, V]`` in place; ``sampled[b]`` are row b's tokens so far."""
        neg = -np.inf
        if self.suppress.size:
            logits[:, self.suppress] = neg
        first_rows = [b for b, seq in enumerate(sampled) if len(seq) == 0]
        if first_rows and self.suppress_begin.size:
            logits[np.ix_(first_rows, self.suppress_begin)] = neg
        if not self.timestamps:
            return
        ts, te = self.ts_begin, self.ts_end
        check: list[int] = []
        for b, seq in enumerate(sampled):
            if active is not None and not active[b]:
                continue
            row = logits[b]
            row[self.no_timestamps] = neg
            if not seq:
                row[:ts] = neg
                row[self.max_initial + 1:te + 1] = neg
                continue
            last = seq[-1]
            if last >= ts:
                penultimate = seq[-2] if len(seq) >= 2 else last
                if penultimate >= ts:
                    row[ts:te + 1] = neg  # a pair just closed: text (or the end) follows
                else:
                    row[:self.eot] = neg  # a lone timestamp: its partner or the end follows
                    check.append(b)
            else:
                check.append(b)
            for token in reversed(seq):
                if token >= ts:
                    row[ts:token] = neg
                    break
        for b in check:
            # Whisper compares log-softmax values; both sides share the row's normaliser, so
            # the raw (masked) logits compare the same way without a pass over the vocabulary.
            stamps = logits[b, ts:te + 1]
            peak = stamps.max()
            if not np.isfinite(peak):
                continue
            timestamp_mass = peak + np.log(np.sum(np.exp(stamps - peak)))
            if timestamp_mass > logits[b, :ts].max():
                logits[b, :ts] = neg


def split_segments(tokens: Sequence[int], tokenizer: WhisperTokenizer, window_s: float) -> tuple[list[TimedSegment], float | None]:
    """Whisper's reading of a window's tokens: text between consecutive timestamp tokens makes
    segments. Returns the segments and how far the window is consumed (``None``: all of it).

    Text after the last complete pair (the model ran out of window or length) is left for the
    next window, which starts at the last complete timestamp.
    """
    ts, eot = tokenizer.timestamp_begin, tokenizer.eot  # read once: this runs for every hypothesis
    tokens = [t for t in map(int, tokens) if t != eot]
    if not tokens:
        return [], None
    is_ts = [t >= ts for t in tokens]
    single_ending = len(tokens) >= 2 and not is_ts[-2] and is_ts[-1]
    cuts = [i for i in range(1, len(tokens)) if is_ts[i] and is_ts[i - 1]]
    segments: list[TimedSegment] = []

    def segment(piece: list[int], start_s: float, end_s: float) -> None:
        text_ids = [t for t in piece if t < eot]
        text = tokenizer.decode(text_ids)
        if text.strip():
            segments.append(TimedSegment(start_s, end_s, tuple(text_ids), text))

    if cuts:
        if single_ending:
            cuts.append(len(tokens))
        last = 0
        for cut in cuts:
            piece = tokens[last:cut]
            segment(piece, tokenizer.timestamp_s(piece[0]), tokenizer.timestamp_s(piece[-1]))
            last = cut
        if single_ending:
            return segments, None
        return segments, tokenizer.timestamp_s(tokens[last - 1])
    # No pair closed: one segment over the whole window, ending at the last timestamp if any.
    stamps = [t for t in tokens if t >= ts]
    end_s = window_s
    if stamps and stamps[-1] != ts:
        end_s = tokenizer.timestamp_s(stamps[-1])
    start_s = tokenizer.timestamp_s(stamps[0]) if stamps and tokens[0] >= ts else 0.0
    segment(tokens, start_s, end_s)
    return segments, None


def _language_ids(tokenizer: WhisperTokenizer) -> tuple[list[str], np.ndarray]:
    codes = list(tokenizer.language_ids)
    return codes, np.array([tokenizer.language_ids[c] for c in codes], dtype=np.int64)


def _detect(logits: np.ndarray, tokenizer: WhisperTokenizer) -> list[dict[str, float]]:
    codes, ids = _language_ids(tokenizer)
    return _language_probs(logits[:, ids], codes)


def _language_probs(language_logits: np.ndarray, codes: list[str]) -> list[dict[str, float]]:
    """Per row, language code -> probability (most likely first), from the language tokens' logits."""
    probs = softmax(language_logits)
    return [dict(sorted(zip(codes, map(float, row)), key=lambda kv: -kv[1])) for row in probs]


def detect_language(runtime: Runtime, tokenizer: WhisperTokenizer, mel) -> list[dict[str, float]]:
    """Per window, language code -> probability (most likely first), from the logits right after
    ``<|startoftranscript|>`` over the language tokens. Multilingual models only."""
    if not tokenizer.is_multilingual:
        raise ValueError("language detection needs a multilingual model")
    enc = runtime.encode(mel)
    batch = int(mel.shape[0])
    logits, _state = runtime.start(enc, np.full((batch, 1), tokenizer.special.sot, dtype=np.int64))
    return _detect(np.asarray(logits, dtype=np.float32), tokenizer)


def _max_new_tokens(options: DecodingOptions, n_text_ctx: int, prompt_len: int) -> int:
    limit = options.sample_len if options.sample_len is not None else n_text_ctx // 2
    # The last sampled token is never fed back, so prompt + samples may reach n_text_ctx + 1.
    return max(1, min(limit, n_text_ctx + 1 - prompt_len))


def _choose(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> np.ndarray:
    if temperature <= 0:
        return np.argmax(logits, axis=-1)
    probs = softmax(logits / np.float32(temperature)).astype(np.float64)
    choices = np.empty(len(probs), dtype=np.int64)
    for b, row in enumerate(probs):
        total = row.sum()
        choices[b] = rng.choice(len(row), p=row / total) if total > 0 else int(np.argmax(logits[b]))
    return choices


@dataclass
class RawDecode:
    """What one decoding pass gives for one window, before it is read and judged. ``tokens``
    begin with the row's forced prefix (``forced`` tokens), whose log-probabilities are not in
    ``sum_logprob``."""

    tokens: list[int]
    sum_logprob: float
    no_speech_prob: float
    language: str
    language_probs: dict[str, float] | None
    hit_length_limit: bool
    forced: int = 0
    token_logprobs: list[float] = field(default_factory=list)
    """The log-probability of each sampled token (those after the forced prefix), and of the end
    token last where the row ended with one."""


def _decode_once(
    runtime: Runtime,
    tokenizer: WhisperTokenizer,
    mel,
    options: DecodingOptions,
    previous: Sequence[Sequence[int]],
    languages: Sequence[str | None],
    temperature: float,
    rng: np.random.Generator,
    xp=None,
    prefixes: Sequence[Sequence[int]] | None = None,
    overlap=None,
    chooser: DecodeChooser | None = None,
) -> list[RawDecode]:
    """One pass over a batch whose prompts have equal lengths (the caller groups them), or any
    lengths where the runtime takes ragged prompts (``runtime.ragged_prompts``).

    ``prefixes[b]``: tokens that row b's text must begin with (timestamps included), decoded as if
    the row had sampled them: the rules see them, their log-probabilities are not counted, and
    the row's tokens come back beginning with them. A stream's committed words are fed this way
    so that an update decodes only what follows them. Where the runtime takes ragged prompts
    they go into the prompt's one prefill (the no-speech probability is read at the row's
    ``<|startoftranscript|>``, ``probe``), unless a row's language is still to be detected: then
    none are used (the language token comes before them). Elsewhere every row's prefix is cut to
    the shortest one and fed as one run after the forced tokens.

    Greedy passes with ``options.decode_on == "device"`` rule and choose on ``xp`` (the array
    module the runtime's logits are asked to stay on; NumPy when ``None``); the rest on the host.
    ``overlap``: a :class:`~captioner.models.runtime.Overlap`, host work done while the device
    encodes (its runtime must take it). ``chooser``: with ``decode_on == "auto"``, picks the
    greedy path of a batch under ``DEVICE_DECODING_MIN_BATCH`` rows by the decoder steps it
    timed (:mod:`captioner.models.decode_choice`), and is told this pass's time; without one the
    host decodes such a batch."""
    special = tokenizer.special
    batch = int(mel.shape[0])
    ragged = bool(getattr(runtime, "ragged_prompts", False))
    assert ragged or len({len(p) for p in previous}) == 1, "rows of one pass need prompts of one length"
    head = [list(p) + [special.sot] for p in previous]  # up to <|startoftranscript|>
    known = not tokenizer.is_multilingual or all(lang is not None for lang in languages)
    prefixes = _usable_prefixes(prefixes, batch, ragged, known)
    chosen_path = chooser.path(batch) if chooser is not None and options.decode_on == "auto" and temperature <= 0 else None
    wants_device = options.decode_on == "device" or (options.decode_on == "auto" and batch >= DEVICE_DECODING_MIN_BATCH) \
        or chosen_path == DEVICE
    on_device = wants_device and temperature <= 0
    xp = (xp if xp is not None else np) if on_device else None
    extra = [special.no_timestamps] if options.without_timestamps else []
    enc = runtime.encode(mel) if overlap is None else runtime.encode(mel, overlap)
    langs: list[str] = [lang or "en" for lang in languages]
    forced = [tokenizer.sot_sequence(langs[b], options.task)[1:] + extra for b in range(batch)] if known else None
    one_prefill = ragged and forced is not None and any(prefixes)
    if one_prefill:
        # Prompt, <|startoftranscript|>, the forced tokens and the prefix in one prefill.
        full = [head[b] + forced[b] + list(prefixes[b]) for b in range(batch)]
        logits, state = runtime.start(enc, full, probe=[len(h) - 1 for h in head], **_where(xp))
        sot_logits = state.probe_logits
    else:
        logits, state = runtime.start(enc, head if ragged else np.array(head, dtype=np.int64), **_where(xp))
        sot_logits = logits
    if on_device:
        # <|nospeech|> probability at <|startoftranscript|>, from the raw logits (as Whisper),
        # with the same float32 operations as softmax() below, on the logits' device.
        no_speech = to_host(xp.exp(token_logprobs(xp, sot_logits, xp.full((batch,), special.no_speech, dtype=xp.int64))))
    else:
        sot_logits = np.array(sot_logits, dtype=np.float32)
        no_speech = softmax(sot_logits)[:, special.no_speech]
        logits = sot_logits if not one_prefill else np.array(logits, dtype=np.float32)

    language_probs: list[dict[str, float] | None] = [None] * batch
    if forced is None:
        codes, ids = _language_ids(tokenizer)
        # Only the language tokens' logits ([B, ~100]) are needed on the host.
        detected = _language_probs(to_host(sot_logits[:, xp.asarray(ids)]) if on_device else sot_logits[:, ids], codes)
        for b, lang in enumerate(languages):
            if lang is None:
                language_probs[b] = detected[b]
                langs[b] = next(iter(detected[b]))
        forced = [tokenizer.sot_sequence(langs[b], options.task)[1:] + extra for b in range(batch)]
    if not one_prefill:
        for column in range(len(forced[0])):
            logits = runtime.step(state, np.array([f[column] for f in forced], dtype=np.int64), **_where(xp))
            if not on_device:
                logits = np.array(logits, dtype=np.float32)
        if any(prefixes):  # one length here (see _usable_prefixes): one run
            logits = runtime.extend(state, np.array(prefixes, dtype=np.int64), **_where(xp))
            if not on_device:
                logits = np.array(logits, dtype=np.float32)
    # Rows with longer prompts may reach the end of the text context sooner.
    n_text_ctx = getattr(runtime, "n_text_ctx", N_TEXT_CTX)
    limits = np.array([_max_new_tokens(options, n_text_ctx, len(head[b]) + len(forced[b]) + len(prefixes[b]))
                       for b in range(batch)])

    started_s = time.perf_counter()
    if on_device:
        sampled, sums, hit_limit, steps, logprobs = _greedy_on_device(runtime, tokenizer, options, state, logits, xp,
                                                                      batch, limits, prefixes)
    else:
        sampled, sums, hit_limit, steps, logprobs = _sample_on_host(runtime, tokenizer, options, state, logits, batch,
                                                                    limits, temperature, rng, prefixes)
    if chosen_path is not None:
        chooser.record(batch, DEVICE if on_device else HOST, time.perf_counter() - started_s, steps)
    return [
        RawDecode(sampled[b], float(sums[b]), float(no_speech[b]), langs[b], language_probs[b], bool(hit_limit[b]),
                  forced=len(prefixes[b]), token_logprobs=logprobs[b])
        for b in range(batch)
    ]


def _usable_prefixes(prefixes, batch: int, ragged: bool, known: bool) -> list[list[int]]:
    """The prefixes one pass can force (see :func:`_decode_once`): every row's own in one
    prefill (ragged prompts, languages known), none while a language is detected in a ragged
    pass, else all cut to the shortest."""
    rows = [list(p) for p in prefixes] if prefixes is not None else [[] for _ in range(batch)]
    if len(rows) != batch:
        raise ValueError("prefixes needs one entry per window")
    if ragged:
        return rows if known else [[] for _ in range(batch)]
    common = min(len(r) for r in rows) if rows else 0
    return [r[:common] for r in rows]


def _where(xp) -> dict:
    """Keyword arguments asking the runtime for logits on ``xp`` (none: host NumPy, as before)."""
    return {} if xp is None else {"xp": xp}


def _sample_on_host(runtime, tokenizer, options, state, logits, batch, limits, temperature, rng, prefixes):
    """The specification: ``LogitRules`` row by row on host logits, then argmax or sampling.
    ``limits[b]``: most tokens row b may sample after its prefix ``prefixes[b]``. Returns the
    rows' tokens, log-probability sums and length-limit flags, and the steps it ran."""
    eot = tokenizer.special.eot
    rules = LogitRules(tokenizer, options, logits.shape[1])
    sampled: list[list[int]] = [list(p) for p in prefixes]
    logprobs: list[list[float]] = [[] for _ in prefixes]
    sums = np.zeros(batch, dtype=np.float64)
    done = np.zeros(batch, dtype=bool)
    hit_limit = np.zeros(batch, dtype=bool)
    for step in range(int(limits.max())):  # limits are >= 1: the loop runs
        rules.apply(logits, sampled, active=~done)
        chosen = _choose(logits, temperature, rng)
        chosen_logprobs = _token_logprobs(logits, chosen)
        _record(chosen, chosen_logprobs, eot, step == limits - 1, sampled, sums, done, hit_limit, logprobs=logprobs)
        if done.all():
            break
        feed = np.where(done, eot, chosen).astype(np.int64)
        logits = np.array(runtime.step(state, feed), dtype=np.float32)
    return sampled, sums, hit_limit, step + 1, logprobs


def _greedy_on_device(runtime, tokenizer, options, state, logits, xp, batch, limits, prefixes):
    """Greedy search with the rules applied where the logits lie: per step only the chosen
    tokens and their log-probabilities ([B] each, in one copy) come to the host. Each row's
    rules start from its prefix. Returns what :func:`_sample_on_host` returns."""
    eot = tokenizer.special.eot
    rules = DeviceRules(xp, tokenizer, options, int(logits.shape[1]))
    rows = rules.new_state(batch, prefixes)
    sampled: list[list[int]] = [list(p) for p in prefixes]
    logprobs: list[list[float]] = [[] for _ in prefixes]
    sums = np.zeros(batch, dtype=np.float64)
    done = np.zeros(batch, dtype=bool)
    hit_limit = np.zeros(batch, dtype=bool)
    current = np.arange(batch)  # the window of each row of the decoder's batch
    # Only the runtime's own class compacts: a wrapper (the attention recorder) keeps its rows.
    compact = options.drop_finished and callable(getattr(type(runtime), "compact", None))
    for step in range(int(limits.max())):  # limits are >= 1: the loop runs
        last_step = step == limits[current] - 1
        # Rules, choice and the rows' state update (one kernel launch on CUDA), one copy back.
        both = rules.choose_and_advance(logits, rows, last_step)
        chosen = both[0].astype(np.int64)
        _record(chosen, both[1], eot, last_step, sampled, sums, done, hit_limit, current, logprobs)
        if done.all():
            break
        live = np.flatnonzero(~done[current])
        if compact and runtime.can_compact(state, len(live)):
            state = runtime.compact(state, live)
            rows = rules.take(rows, xp.asarray(live))
            chosen, current = chosen[live], current[live]
        feed = np.where(done[current], eot, chosen).astype(np.int64)
        logits = runtime.step(state, feed, xp=xp)
    return sampled, sums, hit_limit, step + 1, logprobs


def _record(chosen, chosen_logprobs, eot, last_step, sampled, sums, done, hit_limit, current=None,
            logprobs=None) -> None:
    """Add one step's choices to the windows still decoding (in place); a window ends on
    ``<|endoftext|>`` or when it reaches its length limit (``last_step[j]``: this is its last).
    Row j of the step is window ``current[j]`` (default: window j).

    Array operations across the rows, and plain ints for the appends: it runs once per decoder
    step for every row of a server's large batches, where a loop over NumPy scalars costs far
    more per row."""
    windows = np.arange(len(chosen)) if current is None else np.asarray(current)
    live = np.flatnonzero(~done[windows])
    if not live.size:
        return
    rows = windows[live]  # distinct windows
    tokens = np.asarray(chosen)[live]
    token_logprobs = np.asarray(chosen_logprobs, dtype=np.float64).reshape(-1)[live]
    sums[rows] += token_logprobs
    ended = tokens == eot
    kept = ~ended
    if logprobs is None:
        for b, token in zip(rows[kept].tolist(), tokens[kept].tolist()):
            sampled[b].append(token)
    else:  # each token's own log-probability too (how sure the model was of each word)
        for b, token, lp in zip(rows[kept].tolist(), tokens[kept].tolist(), token_logprobs[kept].tolist()):
            sampled[b].append(token)
            logprobs[b].append(lp)
        for b, lp in zip(rows[ended].tolist(), token_logprobs[ended].tolist()):
            logprobs[b].append(lp)  # the end token's: the last entry of a row that ended
    at_limit = kept & np.broadcast_to(np.asarray(last_step, dtype=bool), (len(chosen),))[live]
    hit_limit[rows[at_limit]] = True
    done[rows[ended | at_limit]] = True


def _finish(raw: RawDecode, tokenizer: WhisperTokenizer, options: DecodingOptions, window_s: float, temperature: float) -> DecodedWindow:
    text = tokenizer.decode(raw.tokens)
    segments, consumed_s = split_segments(raw.tokens, tokenizer, window_s)
    eot = tokenizer.eot
    text_tokens = [t for t in raw.tokens if t < eot]
    loop_at = find_repetition(text_tokens, options.repetition_max_ngram, options.repetition_min_tokens)
    return DecodedWindow(
        tokens=tuple(raw.tokens),
        text=text,
        segments=tuple(segments),
        consumed_s=consumed_s,
        avg_logprob=raw.sum_logprob / (len(raw.tokens) - raw.forced + 1),  # the sampled ones and the end
        sum_logprob=raw.sum_logprob,
        no_speech_prob=raw.no_speech_prob,
        compression_ratio=compression_ratio(text),
        language=raw.language,
        language_probs=raw.language_probs,
        temperature=temperature,
        hit_length_limit=raw.hit_length_limit,
        repetition=loop_at is not None,
        token_logprobs=tuple(raw.token_logprobs[:len(raw.tokens) - raw.forced]),
        end_logprob=raw.token_logprobs[len(raw.tokens) - raw.forced]
        if len(raw.token_logprobs) > len(raw.tokens) - raw.forced else None,
    )


@dataclass(frozen=True)
class Verdict:
    no_speech: bool
    """The window is silence/noise: show nothing."""
    failure: str
    """Why the text is not trusted (``"compression"``, ``"repetition"``, ``"logprob"``), or ``""``."""


def assess(window: DecodedWindow, options: DecodingOptions) -> Verdict:
    """Whisper's checks on one decoded window (thresholds ``None`` turn a check off)."""
    failure = ""
    if window.repetition:
        failure = "repetition"
    elif options.compression_ratio_threshold is not None and window.compression_ratio > options.compression_ratio_threshold:
        failure = "compression"
    elif options.logprob_threshold is not None and window.avg_logprob < options.logprob_threshold:
        failure = "logprob"
    no_speech = (
        options.no_speech_threshold is not None
        and window.no_speech_prob > options.no_speech_threshold
        and (options.logprob_threshold is None or window.avg_logprob < options.logprob_threshold)
    )
    if no_speech:
        failure = ""  # silence is not a failed decode: no fallback, just no text
    return Verdict(no_speech, failure)


def _drop(window: DecodedWindow, reason: str, failures: tuple[str, ...]) -> DecodedWindow:
    return replace(window, text="", segments=(), consumed_s=None, dropped=reason, failures=failures)


def _previous_head(tokenizer: WhisperTokenizer, previous: Sequence[int], limit: int) -> list[int]:
    """``<|startofprev|>`` + the last ``limit`` tokens of ``previous`` (or nothing). Text and
    timestamp tokens are kept (Whisper conditions on both); other specials are dropped."""
    text = [int(t) for t in previous if int(t) < tokenizer.eot or tokenizer.is_timestamp(int(t))]
    if not text or limit <= 0:
        return []
    return [tokenizer.special.sot_prev, *text[-limit:]]


PassFn = Callable[[list[int], list[list[int]], list["str | None"], float, np.random.Generator, list[list[int]]],
                  list[RawDecode]]
"""One decoding pass: (window indices, prompt heads, languages, temperature, rng, forced prefixes)
-> results."""


def decode_with_fallback(decode_pass: PassFn, tokenizer: WhisperTokenizer, batch: int, options: DecodingOptions,
                         **kwargs) -> list[DecodedWindow]:
    """The temperature-fallback loop and guards around any decoding pass (ours, or the
    CTranslate2 oracle's), so both are judged by the same rules: :func:`decode_passes` (which
    takes the keyword arguments), every window read and judged."""
    return decode_passes(decode_pass, tokenizer, batch, options, **kwargs).windows()


def decode_passes(
    decode_pass: PassFn,
    tokenizer: WhisperTokenizer,
    batch: int,
    options: DecodingOptions,
    *,
    previous_tokens: Sequence[Sequence[int]] | None = None,
    languages: Sequence[str | None] | None = None,
    window_s: Sequence[float] | float = WINDOW_S,
    ragged: bool = False,
    prefixes: Sequence[Sequence[int]] | None = None,
) -> PendingWindows:
    """Every decoding pass of the temperature-fallback loop, with the reading and judging of
    the last attempt's rows left to :meth:`PendingWindows.windows`: they decide no further pass,
    so a caller may do that host work later (the engine does it while the device encodes its
    next step). Earlier attempts are read and judged here, since their verdicts decide which
    rows are decoded again. ``ragged``: the pass takes rows with prompts of different lengths
    (one pass, one encoder run, for all of them). ``prefixes[b]``: the tokens window b's text is
    forced to begin with (see :func:`_decode_once`), at every temperature."""
    previous = [list(p) for p in (previous_tokens if previous_tokens is not None else [[]] * batch)]
    if len(previous) != batch:
        raise ValueError("previous_tokens needs one entry per window")
    forced = [[int(t) for t in p] for p in (prefixes if prefixes is not None else [[]] * batch)]
    if len(forced) != batch:
        raise ValueError("prefixes needs one entry per window")
    if any(t >= tokenizer.eot and not tokenizer.is_timestamp(t) for p in forced for t in p):
        raise ValueError("a forced prefix holds text and timestamp tokens only")
    langs = list(languages) if languages is not None else [options.language] * batch
    langs = [None if lang in (None, "", "auto") else lang for lang in langs]
    if not tokenizer.is_multilingual:
        for lang in langs:
            tokenizer.sot_sequence(lang, options.task)  # UserError: English-only model
        langs = [None] * batch
    else:
        for lang in langs:
            if lang is not None:
                tokenizer.language_token(lang)  # UserError: unknown language
    spans = [float(window_s)] * batch if np.isscalar(window_s) else [float(x) for x in window_s]
    heads = [_previous_head(tokenizer, p, options.max_previous_tokens) for p in previous]
    rng = np.random.default_rng(options.seed)
    temperatures = options.temperatures or (0.0,)

    pending_windows = PendingWindows(tokenizer, options, spans)
    pending = list(range(batch))
    for attempt, temperature in enumerate(temperatures):
        if not pending:
            break
        repeats = 1 if temperature <= 0 else max(1, options.best_of)
        last_attempt = attempt == len(temperatures) - 1
        # Rows of one pass need prompts of one length (unless ragged): group them.
        groups: dict[int, list[int]] = {}
        for b in pending:
            groups.setdefault(0 if ragged else len(heads[b]), []).append(b)
        still: list[int] = []
        for rows in groups.values():
            expanded = [b for b in rows for _ in range(repeats)]
            raws = decode_pass(expanded, [heads[b] for b in expanded], [langs[b] for b in expanded], temperature, rng,
                               [forced[b] for b in expanded])
            for i, b in enumerate(rows):
                candidates = raws[i * repeats:(i + 1) * repeats]
                # Whisper ranks samples by mean log probability (no length penalty).
                best = max(candidates, key=lambda r: r.sum_logprob / max(1, len(r.tokens)))
                if last_attempt:
                    pending_windows.put_off(b, best, temperature)
                elif pending_windows.judge(b, best, temperature, last_attempt=False):
                    still.append(b)
        pending = sorted(still)
    return pending_windows


class PendingWindows:
    """The windows of one :func:`decode_passes` call: those already judged, and the last
    attempt's raw rows, read (text, segments, guards) when :meth:`windows` is first called."""

    def __init__(self, tokenizer: WhisperTokenizer, options: DecodingOptions, spans_s: list[float]) -> None:
        self._tokenizer = tokenizer
        self._options = options
        self._spans_s = spans_s
        self._results: list[DecodedWindow | None] = [None] * len(spans_s)
        self._failures: list[tuple[str, ...]] = [()] * len(spans_s)
        self._raw: list[tuple[int, RawDecode, float]] = []

    def put_off(self, b: int, raw: RawDecode, temperature: float) -> None:
        """Row ``b``'s last attempt, read later."""
        self._raw.append((b, raw, temperature))

    def judge(self, b: int, raw: RawDecode, temperature: float, last_attempt: bool) -> bool:
        """Read row ``b``'s attempt and keep its result; ``True`` when it failed and another
        attempt follows."""
        window = _finish(raw, self._tokenizer, self._options, self._spans_s[b], temperature)
        verdict = assess(window, self._options)
        failures = self._failures[b]
        if verdict.no_speech:
            self._results[b] = _drop(window, "no_speech", failures)
        elif verdict.failure:
            failures = self._failures[b] = failures + (verdict.failure,)
            if not last_attempt:
                return True
            if verdict.failure in ("repetition", "compression"):
                self._results[b] = _drop(window, verdict.failure, failures)  # loops are never shown
            else:
                self._results[b] = replace(window, failures=failures)  # unlikely text is kept, as Whisper does
        else:
            self._results[b] = replace(window, failures=failures)
        return False

    def windows(self) -> list[DecodedWindow]:
        """Every window's result, in the batch's order (the put-off rows read now, once)."""
        raw, self._raw = self._raw, []
        for b, attempt, temperature in raw:
            self.judge(b, attempt, temperature, last_attempt=True)
        return [r for r in self._results if r is not None]


class RuntimeDecoder:
    """Decodes windows with a ``WhisperRuntime`` (our ONNX Runtime model)."""

    def __init__(self, runtime: Runtime, tokenizer: WhisperTokenizer, xp=None, chooser: DecodeChooser | None = None):
        """``xp``: the array module greedy passes rule on with ``decode_on="device"`` (CuPy keeps
        the logits on the GPU; ``None`` or NumPy: the same vectorised rules on host arrays).
        ``chooser``: the greedy path of small batches under ``decode_on="auto"``, by measurement
        (:func:`_decode_once`); one per recognizer, so that its times carry over."""
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.xp = xp
        self.chooser = chooser
        self.n_mels = int(getattr(runtime, "n_mels", 80))
        self.is_multilingual = tokenizer.is_multilingual
        self.name = str(getattr(runtime, "name", "model"))

    def decode(self, mel, options: DecodingOptions = DecodingOptions(), **kwargs) -> list[DecodedWindow]:
        """Decode a batch of windows ``mel`` ``[B, n_mels, 3000]`` (NumPy or CuPy): every window
        read and judged (:meth:`decode_pending`, whose keyword arguments it takes)."""
        return self.decode_pending(mel, options, **kwargs).windows()

    def decode_pending(
        self,
        mel,
        options: DecodingOptions = DecodingOptions(),
        *,
        previous_tokens: Sequence[Sequence[int]] | None = None,
        languages: Sequence[str | None] | None = None,
        window_s: Sequence[float] | float = WINDOW_S,
        prefixes: Sequence[Sequence[int]] | None = None,
        overlap=None,
    ) -> PendingWindows:
        """Decode a batch of windows ``mel`` ``[B, n_mels, 3000]`` (NumPy or CuPy), the last
        attempt's reading put off (:func:`decode_passes`): every model run is done when this
        returns, the host's text work when ``windows()`` is called.

        ``previous_tokens[b]`` is row b's prompt text (last committed tokens, fed after
        ``<|startofprev|>``); ``languages[b]`` overrides ``options.language`` per row;
        ``window_s[b]`` is how much of the 30 s holds audio (for the end of an open segment);
        ``prefixes[b]``, tokens row b's text is forced to begin with (a stream's committed words:
        see :func:`_decode_once`); ``overlap``, host work done while the device encodes the
        first pass (:class:`~captioner.models.runtime.Overlap`).
        Windows that fail the checks are decoded again at the next temperature; windows that
        still fail, or hold no speech, come back with empty ``text`` and ``dropped`` set."""
        batch = int(mel.shape[0])

        def decode_pass(rows, heads, langs, temperature, rng, prefixes):
            sub_mel = mel if rows == list(range(batch)) else mel[rows]
            raws = _decode_once(self.runtime, self.tokenizer, sub_mel, options, heads, langs, temperature, rng, self.xp,
                                prefixes, overlap=overlap, chooser=self.chooser)
            end_pass = getattr(self.runtime, "end_pass", None)  # an attention recorder's
            if end_pass is not None:
                end_pass(list(rows))
            return raws

        return decode_passes(
            decode_pass, self.tokenizer, batch, options,
            previous_tokens=previous_tokens, languages=languages, window_s=window_s,
            ragged=bool(getattr(self.runtime, "ragged_prompts", False)), prefixes=prefixes,
        )

    def detect_language(self, mel) -> list[dict[str, float]]:
        return detect_language(self.runtime, self.tokenizer, mel)


def decode(runtime: Runtime, tokenizer: WhisperTokenizer, mel, options: DecodingOptions = DecodingOptions(), *, xp=None,
           **kwargs) -> list[DecodedWindow]:
    """``RuntimeDecoder(runtime, tokenizer, xp).decode(mel, options, **kwargs)``."""
    return RuntimeDecoder(runtime, tokenizer, xp).decode(mel, options, **kwargs)
