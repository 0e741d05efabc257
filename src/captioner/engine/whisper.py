"""Whisper as the engine's recognizer: windows of raw log-mel frames in, timed words out.

One call is one batched model step for every due stream: the windows are padded to Whisper's
30 s as Whisper pads audio (silence frames, ``log10(1e-10)``), normalised per window on the
device they live on, encoded together and decoded greedily together (see
:mod:`captioner.models.decoding`). Each stream's recent committed text is its prompt. The
decoder's guards decide what may be shown: a window judged silent, looping or over-compressible
comes back as a rejected hypothesis.

Shorter encoder windows (``runtime.audio_contexts``, off unless the runtime enables them): a
window is padded only to the shortest enabled context that holds its audio plus
``context_margin_s`` of silence (Whisper was trained with padding after the speech; a window
filled to the last frame loses its last words more often), and the batch is split into one
group per context, each encoded and decoded on its own. Timestamps and attention frames are 20 ms
positions from the window's start in every context, so nothing downstream changes.

Called only by the thread that owns the runtime (the worker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.words import WORD_PIECES as _WORD_PIECES
from captioner.engine.policy.words import Hypothesis, words_from_segments
from captioner.engine.recognizer import WindowRequest
from captioner.engine.wordtiming import words_with_times
from captioner.gpu.features import RingWindow
from captioner.languages import language_code
from captioner.models.alignment import AttentionRecorder
from captioner.models.decode_choice import DEVICE, HOST, DecodeChooser
from captioner.models.decoding import (
    DEVICE_DECODING_MIN_BATCH,
    DecodingOptions,
    RuntimeDecoder,
    TimedSegment,
)
from captioner.models.registry import N_AUDIO_FRAMES
from captioner.models.runtime import Overlap, bucket_size, encoder_rows, load_runtime
from captioner.models.tokenizer import WhisperTokenizer

WINDOW_FRAMES = N_AUDIO_FRAMES  # what WhisperRuntime.encode requires
LOG_FLOOR = -10.0  # log10(1e-10): what Whisper's zero padding turns into
REJECT = ("no_speech", "repetition", "compression")
PROMPT_CACHE_SIZE = 16384
"""Prompt texts whose tokens are kept (a few per stream are live at a time)."""
CONTEXT_MARGIN_S = 1.0
"""Silence after a window's audio that a shorter encoder context must still hold."""


def default_streaming_options(task: str = "transcribe") -> DecodingOptions:
    # No temperature fallback: sampling five candidates per failed window costs more than an
    # update interval, and the next update re-decodes the same audio anyway.
    return DecodingOptions(task=task, temperatures=(0.0,), sample_len=128)


class PendingHypotheses:
    """A model step's hypotheses, decoded but not yet read (:meth:`WhisperRecognizer.decode_pending`):
    :meth:`hypotheses` reads them once, in the requests' order. It touches no device."""

    def __init__(self, groups: list[tuple[list[int], Callable[[], list[Hypothesis]]]]) -> None:
        self._groups = groups
        self._hypotheses: list[Hypothesis] | None = None

    def hypotheses(self) -> list[Hypothesis]:
        if self._hypotheses is None:
            out: list[Hypothesis | None] = [None] * sum(len(rows) for rows, _ in self._groups)
            for rows, read in self._groups:
                for b, hypothesis in zip(rows, read()):
                    out[b] = hypothesis
            self._hypotheses = out  # type: ignore[assignment]
            self._groups = []
        return self._hypotheses


def merged_widths(widths: list[int], min_rows: int) -> list[int]:
    """Each row's context once the contexts fewer than ``min_rows`` rows need are moved up to the
    next wider context the batch has, narrowest first (so merged rows may move on again); the
    widest group stays whatever its size. Padding a window wider only adds silence after it,
    as the 30 s window of the original Whisper does."""
    out = list(widths)
    present = sorted(set(out))
    for narrow, wide in zip(present, present[1:]):
        rows = [b for b, width in enumerate(out) if width == narrow]
        if len(rows) < min_rows:
            for b in rows:
                out[b] = wide
    return out


class WhisperRecognizer:
    """Adapts a ``WhisperRuntime`` + tokenizer to the engine's ``Recognizer`` protocol."""

    reads_rings = True
    """Windows may come as :class:`~captioner.gpu.features.RingWindow`: the batch is then read
    from the feature rings in one launch instead of from arrays the engine gathered."""

    def __init__(self, runtime, tokenizer, xp=np, task: str = "transcribe",
                 options: DecodingOptions | None = None, prompt_tokens: int = 48, synchronize=None,
                 decode_on: str | None = None, context_margin_s: float = CONTEXT_MARGIN_S,
                 merge_widths: bool = False, choose_paths: bool | None = None) -> None:
        """``decode_on``: ``"device"`` (the token rules and greedy choice run on ``xp`` where the
        logits lie; on CUDA only token ids and log-probabilities reach the host) or ``"host"``
        (NumPy row by row, the specification) or ``"auto"`` (the device from
        ``decoding.DEVICE_DECODING_MIN_BATCH`` rows up, and below that the path whose decoder
        steps this recognizer timed faster, :attr:`decode_chooser`); ``None`` keeps
        ``options.decode_on``. ``choose_paths``: whether ``"auto"`` times the two paths below
        16 rows (``None``: on a CUDA runtime only; elsewhere the host decodes such batches, as
        before: on the CPU both paths run on the same cores, the row loop was the faster at every
        size measured, docs/decoding.md, and a choice by timing would only make the CPU's
        captions depend on the machine's load).
        ``context_margin_s``: see :data:`CONTEXT_MARGIN_S` (used only with shorter contexts).
        ``merge_widths``: windows of a context that fewer than ``DEVICE_DECODING_MIN_BATCH`` rows
        of a batch need are padded to the next wider context of the batch instead of decoded
        apart (:func:`merged_widths`), so that fewer groups decode, each larger. Only with
        shorter encoder windows on (without them every window has the one 30 s context). Off:
        never measured with them on; the run that was meant to compare them ran without, so its
        two sides were the same code (benchmarks/results/capacity/HISTORY.md, "Correction")."""
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.xp = xp
        self.options = options or default_streaming_options(task)
        if self.options.task != task:
            self.options = replace(self.options, task=task)
        if decode_on is not None:
            self.options = replace(self.options, decode_on=decode_on)  # ValueError when unknown
        self.prompt_tokens = prompt_tokens
        # Small batches' greedy path under "auto", by this recognizer's own timings (one device).
        if choose_paths is None:
            choose_paths = str(runtime.provider).startswith("CUDA")
        self.decode_chooser = DecodeChooser(DEVICE_DECODING_MIN_BATCH) \
            if self.options.decode_on == "auto" and choose_paths else None
        self._prompt_cache: dict[str, tuple[int, ...]] = {}
        # ONNX Runtime reads the input on its own CUDA stream: the array work that built it
        # must be finished first.
        self._synchronize = synchronize
        tokenizer.sot_sequence(None, task)  # an English-only model cannot translate: UserError now
        self.name = runtime.name
        self.provider = runtime.provider
        self.device_name = runtime.device_name
        self.n_mels = runtime.n_mels
        self.is_multilingual = runtime.is_multilingual
        # Mel frames -> the padded input of that width, reused while the batch size stays (one
        # buffer per width: batch sizes vary from tick to tick, keeping each would pile up memory).
        self._batches: dict[int, object] = {}
        self._ring_batches: dict[int, object] = {}  # the same for batches read from the rings
        # Mel frames of each audio context the runtime encodes (3000 alone unless shorter ones are on).
        contexts = getattr(runtime, "audio_contexts", (WINDOW_FRAMES // 2,))
        self.context_frames = tuple(sorted(2 * int(n) for n in contexts))
        self._margin_frames = int(round(context_margin_s * 100))
        self.merge_widths = merge_widths

    def check_language(self, language: str | None) -> str | None:
        """The language code to decode with (``None``: detect / English), or a ``UserError``
        naming what this model cannot do."""
        language = language_code(language)
        if language is None or (not self.is_multilingual and language == "en"):
            return None
        self.tokenizer.sot_sequence(language, self.options.task)  # raises UserError when unsupported
        return language

    def _prompt_tokens(self, text: str) -> tuple[int, ...]:
        """The last ``prompt_tokens`` tokens of a prompt text. Cached: a stream's prompt changes
        only when its buffer is trimmed or a segment closes, and encoding it at every update
        showed in the engine thread's profile (benchmarks/results/capacity/HISTORY.md, "kernels that
        read the rings")."""
        tokens = self._prompt_cache.get(text)
        if tokens is None:
            if len(self._prompt_cache) >= PROMPT_CACHE_SIZE:
                self._prompt_cache.clear()
            stripped = text.strip()
            tokens = tuple(self.tokenizer.encode(" " + stripped)[-self.prompt_tokens:]) if stripped else ()
            self._prompt_cache[text] = tokens
        return tokens

    def _prompts(self, texts: list[str]) -> list[list[int]]:
        tokens = [list(self._prompt_tokens(t)) for t in texts]
        if getattr(self.runtime, "ragged_prompts", False):
            return tokens  # the fixed-cache decoder (CUDA) takes every row's own prompt in one pass
        # Elsewhere rows with prompts of different lengths would need separate passes (and
        # encoder runs): cut them to a common length so that one batched pass serves most streams.
        lengths = [len(t) for t in tokens if t]
        if lengths:
            common = min(lengths)
            tokens = [t[-common:] if t else t for t in tokens]
        return tokens

    def window_frames(self, n_frames: int) -> int:
        """Mel frames a window of ``n_frames`` is padded to: the shortest enabled context that
        holds it and the margin, else the full 30 s."""
        need = min(int(n_frames), WINDOW_FRAMES) + self._margin_frames
        return next((width for width in self.context_frames if need <= width), WINDOW_FRAMES)

    def _input(self, requests, width: int = WINDOW_FRAMES):
        xp = self.xp
        batch = len(requests)
        windows = [r.log_mel for r in requests]
        if all(isinstance(w, RingWindow) for w in windows) and len({id(w.pool) for w in windows}) == 1:
            # Straight from the rings into the batch, padded and normalised (gpu/window_kernel.py),
            # into a buffer kept per width: the encoder has read it before the next step writes.
            pool = windows[0].pool
            out = self._ring_batches.get(width)
            if out is None or out.shape[0] != batch:
                out = self._ring_batches[width] = xp.empty((batch, self.n_mels, width), dtype=xp.float32)
            return pool.model_input([w.slot for w in windows], [w.first_frame for w in windows],
                                    [w.n_frames for w in windows], width, LOG_FLOOR, 8.0, 4.0, 0.25, out)
        windows = [w.read() if isinstance(w, RingWindow) else w for w in windows]
        padded = self._batches.get(width)
        if padded is None or padded.shape[0] != batch:
            padded = self._batches[width] = xp.empty((batch, self.n_mels, width), dtype=xp.float32)
        padded.fill(LOG_FLOOR)
        for b, window in enumerate(windows):
            n = min(int(window.shape[1]), width)
            padded[b, :, :n] = window[:, -n:] if n else 0
        # Whisper's normalisation, per window: clamp to its max - 8, then (x + 4) / 4.
        peak = padded.max(axis=(1, 2), keepdims=True)
        return (xp.maximum(padded, peak - 8.0) + 4.0) / 4.0

    @property
    def overlaps_host_work(self) -> bool:
        """Whether :meth:`decode`'s ``while_encoding`` work runs while the device computes (the
        encoder queued on CUDA), rather than simply before the model's work."""
        return self._synchronize is not None and getattr(self.runtime, "step_model", None) is not None \
            and str(self.provider).startswith("CUDA")

    def decode(self, requests, window_frames: int | None = None,
               while_encoding: Callable[[], None] | None = None) -> list[Hypothesis]:
        """A hypothesis per request. ``window_frames``: pad every window to this many mel
        frames (one of :attr:`context_frames`) instead of choosing per window; benchmarks and
        tests compare contexts with it. ``while_encoding``: host work (it must not touch the
        device) done once, while the device encodes the windows where it can
        (:attr:`overlaps_host_work`), else before; it has run when this returns."""
        return self.decode_pending(requests, window_frames, while_encoding).hypotheses()

    def decode_pending(self, requests, window_frames: int | None = None,
                       while_encoding: Callable[[], None] | None = None) -> PendingHypotheses:
        """:meth:`decode` with the host's reading of the decoded tokens (text, segments, the
        guards, words) put off until ``hypotheses()`` is called: the model's work is done when
        this returns. The engine reads a step's hypotheses while the device encodes its next
        step (``EngineConfig.overlap_updates``): at many streams that reading was a large share
        of the engine thread, about as much as the encoder's wait
        (benchmarks/results/capacity/HISTORY.md, "Hypotheses read while the next step encodes")."""
        overlap = Overlap(while_encoding, self._synchronize if self.overlaps_host_work else None) \
            if while_encoding is not None else None
        try:
            return PendingHypotheses(self._decode_widths(requests, window_frames, overlap))
        finally:
            if overlap is not None:
                overlap.run()  # no windows, or a model that never encoded: the work still happens

    def _decode_widths(self, requests, window_frames: int | None,
                       overlap: Overlap | None) -> list[tuple[list[int], Callable[[], list[Hypothesis]]]]:
        """``(rows, read)`` per group of windows decoded together: ``read()`` gives the rows'
        hypotheses."""
        if not requests:
            return []
        if window_frames is not None:
            if window_frames not in self.context_frames:
                raise ValueError(f"window_frames must be one of {self.context_frames}, not {window_frames}")
            return [(list(range(len(requests))), self._decode_group(requests, window_frames, overlap))]
        widths = [self.window_frames(r.log_mel.shape[1]) for r in requests]
        if self.merge_widths and len(set(widths)) > 1:
            widths = merged_widths(widths, DEVICE_DECODING_MIN_BATCH)
        if len(set(widths)) == 1:
            return [(list(range(len(requests))), self._decode_group(requests, widths[0], overlap))]
        # Windows of different contexts: one encoder run and one decoding pass per context.
        groups = []
        for width in sorted(set(widths)):
            rows = [b for b, w in enumerate(widths) if w == width]
            groups.append((rows, self._decode_group([requests[b] for b in rows], width, overlap)))
        return groups

    def warm_up(self, max_rows: int, prefix_tokens: int | None = None) -> int:
        """Meet once, now, every shape that batches of up to ``max_rows`` windows will meet, so
        that no stream waits for a first run later: on CUDA each batch bucket's decoder buffers
        and captured step graph, and its prompt prefill at each padded width, cost hundreds of
        times a warm run the first time (benchmarks/results/capacity/HISTORY.md, "Warm at start"), which
        a server with hundreds of streams otherwise pays in the middle of its first minutes, every
        stream of the batch waiting.

        Largest buckets first (ONNX Runtime's memory arena then grows once). Per bucket, five
        decodes of silent windows: no prompt (steps only), short prompts, full-length ones, and
        full-length ones with forced prefixes of half and all of ``prefix_tokens`` (the prefill
        widths: 32, 64, 96, 128 columns), rows alternating so that some finish before others (the
        compaction into smaller buckets), on both greedy paths for buckets that ``"auto"`` may
        decode either way (:attr:`decode_chooser`); then the encoder alone at each of its other
        row counts (``runtime.encoder_rows``). Returns the model calls made; 0 where nothing is
        captured or cached per shape (the CPU decoder)."""
        if not getattr(self.runtime, "ragged_prompts", False):
            return 0
        sizes = sorted({bucket_size(n) for n in range(1, max(1, int(max_rows)) + 1)}, reverse=True)
        xp = self.xp
        silence = xp.full((self.n_mels, WINDOW_FRAMES), LOG_FLOOR, dtype=xp.float32)
        full = " ".join(["and"] * self.prompt_tokens)  # one token each: the longest prompt
        word = self.tokenizer.encode(" and")
        ts = self.tokenizer.timestamp_begin
        prefix_tokens = PolicyConfig().prefix_tokens if prefix_tokens is None else int(prefix_tokens)
        half, whole = (tuple([ts] + word * (n - 1)) for n in (prefix_tokens // 2, prefix_tokens))
        prompt_sets = ((("", ()),), (("Thank you.", ()), ("", ())), ((full, ()), ("Thank you.", ())),
                       ((full, half), ("", ())), ((full, whole), ("Thank you.", half)))
        def warm(rows: int) -> int:
            for prompts in prompt_sets:
                self.decode([WindowRequest(f"warm-up {b}", silence, 0.0, prompts[b % len(prompts)][0], None,
                                           prefix=prompts[b % len(prompts)][1]) for b in range(rows)])
            return len(prompt_sets)

        calls = 0
        chooser = self.decode_chooser
        for rows in sizes:
            if chooser is None or rows >= chooser.min_device_rows:
                calls += warm(rows)
                continue
            # Under "auto" a small batch may take either greedy path, each with its own buffers
            # and captured graphs on CUDA: both are met, untimed (decode_choice.py).
            for path in (HOST, DEVICE):
                with chooser.warming(path):
                    calls += warm(rows)
        others = sorted({encoder_rows(n) for n in range(1, max(1, int(max_rows)) + 1)} - set(sizes), reverse=True)
        if others:
            mel = xp.zeros((others[0], self.n_mels, WINDOW_FRAMES), dtype=xp.float32)  # silence, normalised
            for rows in others:
                self.runtime.encode(mel[:rows])
                calls += 1
        return calls

    def _decode_group(self, requests, width: int, overlap: Overlap | None = None) -> Callable[[], list[Hypothesis]]:
        """Requests padded to ``width`` mel frames, decoded in one batch (``overlap``: host work
        for the device's encoding time, if not done yet); returns what reads their hypotheses."""
        mel = self._input(requests, width)
        if self._synchronize is not None:
            self._synchronize()
        spans_s = [min(int(r.log_mel.shape[1]), WINDOW_FRAMES) / 100.0 for r in requests]
        languages = [r.language for r in requests]
        if not self.is_multilingual:
            languages = [None] * len(requests)
        # A stream whose policy reads attention (AlignAtt) gets it recorded with its window.
        recorder = None
        if any(r.alignment for r in requests) and getattr(self.runtime, "has_alignment", False):
            recorder = AttentionRecorder(self.runtime)
        pending = RuntimeDecoder(recorder or self.runtime, self.tokenizer, self.xp, self.decode_chooser).decode_pending(
            mel, self.options, previous_tokens=self._prompts([r.prompt for r in requests]),
            languages=languages, window_s=spans_s, prefixes=[r.prefix for r in requests],
            overlap=overlap,
        )
        return lambda: self._hypotheses(requests, spans_s, pending.windows(), recorder)

    def _hypotheses(self, requests, spans_s: list[float], windows, recorder: AttentionRecorder | None) -> list[Hypothesis]:
        """Each decoded window read as the engine's hypothesis of its stream (host work only)."""
        hypotheses = []
        choices = _choices_per_pass(recorder, windows) if recorder is not None else {}
        for b, (r, span_s, w) in enumerate(zip(requests, spans_s, windows)):
            end_s = r.start_s + span_s
            if w.dropped in REJECT:
                hypotheses.append(Hypothesis((), r.start_s, end_s, (), rejected=True, reason=w.dropped,
                                             language=w.language))
                continue
            pieces = self._segments(w, span_s)
            segments = [(s.start_s, min(s.end_s, span_s), s.text) for s in pieces]
            timed = self._timed_words(recorder, windows[b], b, r, span_s, pieces, choices) \
                if recorder is not None and r.alignment else None
            words, ends = timed if timed is not None else words_from_segments(segments, r.start_s)
            # Only segments closed by a timestamp pair are safe places to cut the buffer.
            consumed = span_s if w.consumed_s is None else w.consumed_s
            safe_ends = tuple(e if e - r.start_s <= consumed + 1e-6 else float("inf") for e in ends)
            # Where a later window may be forced to begin with these words (LocalAgreement).
            token_ends = () if timed is not None else self._token_ends(w.tokens, pieces, words)
            hypotheses.append(Hypothesis(tuple(words), r.start_s, end_s, safe_ends, language=w.language,
                                         tokens=tuple(w.tokens) if token_ends else (), token_ends=token_ends))
        return hypotheses

    def _token_ends(self, tokens, pieces: list[TimedSegment], words) -> tuple[int, ...]:
        """Per word (of :func:`words_from_segments` over ``pieces``): how many of the window's
        ``tokens`` run to the word's end, or -1 where it ends inside a token; ``()`` when the
        segments' tokens do not follow each other in ``tokens`` (between timestamps). Byte
        offsets, as the tokenizer decodes (byte-level BPE: a token is its bytes). Once per
        hypothesis on the engine thread: plain loops, no array calls (tens of tokens)."""
        lengths = self.tokenizer.token_byte_lengths
        ts = self.tokenizer.timestamp_begin
        tokens = [int(t) for t in tokens]
        n = len(tokens)
        word_ends: list[list[int]] = []  # per segment, the window token count at each word end
        at = 0
        for piece in pieces:
            ids = piece.tokens
            while at < n and tokens[at] >= ts:
                at += 1
            if tuple(tokens[at:at + len(ids)]) != tuple(ids):
                return ()
            after: dict[int, int] = {}  # byte offset a token ends at -> window tokens up to it
            offset = 0
            for t in ids:
                offset += lengths[t]
                at += 1
                after[offset] = at
            text = piece.text
            if text.isascii():  # a character is a byte
                if offset != len(text):
                    word_ends.append([])
                    continue
                word_ends.append([after.get(m.end(), -1) for m in _WORD_PIECES.finditer(text)])
            else:
                encoded = text.encode("utf-8")
                if offset != len(encoded):  # bytes that do not decode as they are (a split character)
                    word_ends.append([])
                    continue
                word_ends.append([after.get(len(text[:m.end()].encode("utf-8")), -1) for m in _WORD_PIECES.finditer(text)])
        out: list[int] = []
        segment, k = -1, 0
        for w in words:  # a segment's words come in order, its k-th word is its k-th piece
            if w.segment != segment:
                segment, k = w.segment, 0
            ends = word_ends[segment] if segment < len(word_ends) else ()
            out.append(ends[k] if k < len(ends) else -1)
            k += 1
        return tuple(out)

    def _segments(self, w, span_s: float) -> list[TimedSegment]:
        """The window's segments, with the text after its last complete timestamp pair.

        Whisper's seek rule leaves that text for a next window starting at the last pair; a
        stream's next window starts at its policy's buffer instead, so the text would never be
        heard at all (a stream's last sentence, decoded every update as ``... fat<|5.28|>
        <|5.28|> mutton pieces ...`` and then end-of-text, lost its last nine words). It is kept
        as a segment ending at the window's end, which ``consumed_s`` marks as no place to cut."""
        pieces = list(w.segments)
        if w.consumed_s is None:
            return pieces
        ts = self.tokenizer.timestamp_begin
        tokens = [int(t) for t in w.tokens if int(t) != self.tokenizer.eot]
        pairs = [i for i in range(1, len(tokens)) if tokens[i] >= ts and tokens[i - 1] >= ts]
        if not pairs:
            return pieces
        rest = tokens[pairs[-1]:]
        text_ids = tuple(t for t in rest if t < self.tokenizer.eot)
        text = self.tokenizer.decode(list(text_ids))
        if text.strip():
            pieces.append(TimedSegment(min(self.tokenizer.timestamp_s(rest[0]), span_s), span_s, text_ids, text))
        return pieces

    def _timed_words(self, recorder: AttentionRecorder, w, b: int, r, span_s: float, segments,
                     choices: dict[int, int]):
        """Window ``b``'s (``w``) words with times and ``attend_s`` from the recorded attention,
        or ``None`` (the recording does not line up, e.g. a best-of fallback pass); ``choices``:
        :func:`_choices_per_pass`."""
        rows_pass = recorder.pass_of(b)
        if rows_pass is None:
            return None
        try:
            rows = recorder.token_rows(b, len(w.tokens), not w.hit_length_limit, choices[rows_pass])
        except ValueError:
            return None
        return words_with_times(w.tokens, rows, not w.hit_length_limit, segments, self.tokenizer.decode,
                                self.tokenizer.eot, span_s, r.start_s, logprobs=w.token_logprobs)


def _choices_per_pass(recorder: AttentionRecorder, windows) -> dict[int, int]:
    """Per recorded pass, how many tokens its longest row chose (its end token included): where
    that pass's choices begin in its runs (:meth:`AttentionRecorder.token_rows`). Once a step."""
    out: dict[int, int] = {}
    for b, w in enumerate(windows):
        number = recorder.pass_of(b)
        if number is not None:
            out[number] = max(out.get(number, 0), len(w.tokens) + (not w.hit_length_limit))
    return out


def load_whisper(model: str, backend, task: str = "transcribe", progress=None) -> WhisperRecognizer:
    """A Whisper model (a name such as ``tiny.en``, or a folder) as the recognizer on
    ``backend``'s device (the Whisper loader of :mod:`captioner.engine.families`)."""
    runtime = load_runtime(model, device=backend.name, progress=progress)
    tokenizer = WhisperTokenizer(runtime.files.tokenizer_path, runtime.files.config_path, n_vocab=runtime.n_vocab)
    return WhisperRecognizer(runtime, tokenizer, xp=backend.xp, task=task,
                             synchronize=backend.synchronize if backend.is_cuda else None)
