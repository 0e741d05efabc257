"""Whisper on ONNX Runtime: encode a 30 s window, prefill a prompt, step the decoder.

``load_runtime("tiny.en" | "base" | folder, device=None, progress=None)`` resolves the model,
picks the provider (CUDA when it really works, else the CPU — see :mod:`captioner.models.session`),
builds or reuses the cached ONNX graphs (fp16 on CUDA, fp32 on the CPU) and opens three sessions.

Data stays where it is produced: encoder states, cross K/V and the self-attention cache are
device-resident ``OrtValue`` handles on CUDA; only logits ([B, n_vocab] float32) come to the host,
and, when a caller asks (``attention=True``), the alignment heads' cross-attention of the newest
position ([B, A, 1500] float32, see :mod:`captioner.models.onnx_graphs`).
A runtime is driven by one thread at a time (the GPU worker or the CLI's main thread).

Shorter audio contexts (``load_runtime(..., encoder_windows_s=(10.0, 20.0))``, or
``CAPTIONER_ENCODER_WINDOWS_S=10,20``; off by default): beside the 30 s graphs, an encoder and
cross K/V graph per enabled context (mel [B, n_mels, 2n] -> [B, n, d]) and one decoder (step and
prefill on CUDA) that takes cross K/V of any length. :meth:`WhisperRuntime.encode` picks the
graphs by the mel's width; the encoder output carries its context, and everything decoded from
it (cross K/V, the decoder's slots, the attention [B, A, n]) follows. One ``encode`` is one
context: a caller with windows of several lengths groups them (see ``engine/whisper.py``).
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captioner.errors import UserError, one_line
from captioner.models import session as ort_session
from captioner.models.onnx_export import (
    FRAMES_DIM,
    FRAMES_VARIANT,
    OnnxFiles,
    ProgressFn,
    cache_folder,
    context_variant,
    ensure_onnx,
)
from captioner.models.registry import (
    N_AUDIO_FRAMES,
    ModelFiles,
    audio_contexts,
    resolve_model,
)

ENCODER_WINDOWS_ENV = "CAPTIONER_ENCODER_WINDOWS_S"
"""Shorter encoder windows in seconds, comma-separated ("10,20"); unset or empty: off."""

# Live decoder states of one batch size on CUDA, each with its own buffers and CUDA graph.
MAX_SLOTS_PER_BATCH = 4
# Batch sizes the fixed-cache decoder runs at (a batch is padded up to the next one; above the
# last, to a multiple of 64): a CUDA graph and a set of cache buffers per size, instead of one
# per distinct number of due streams. Steps are 2/3 full at worst from 32 rows on.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)


PREFILL_COLUMNS = 32
"""Prompt prefills are padded to a multiple of this many tokens. Every new input shape costs ONNX
Runtime's CUDA provider a slow first run (the attention kernels' set-up and memory), and a
batch's longest prompt took almost every length, while a warm prefill costs about the same at
any length (benchmarks/results/capacity/HISTORY.md, "After the profile"). Padding is masked and then
overwritten, as for the shorter rows of a ragged batch."""


def prefill_columns(n_tokens: int, limit: int) -> int:
    """The columns a prefill of ``n_tokens`` runs at: the next multiple of :data:`PREFILL_COLUMNS`,
    at most ``limit``."""
    return min(limit, -(-n_tokens // PREFILL_COLUMNS) * PREFILL_COLUMNS)


def _pad_columns(tokens: np.ndarray, limit: int) -> np.ndarray:
    """``tokens`` [B, T] right-padded (each row's last column repeated) to
    :func:`prefill_columns` columns."""
    width = prefill_columns(tokens.shape[1], limit)
    if width <= tokens.shape[1]:
        return tokens
    return np.concatenate([tokens, np.repeat(tokens[:, -1:], width - tokens.shape[1], axis=1)], axis=1)


ENCODER_ROW_STEP = 8
"""Above 8 windows the encoder runs on a multiple of this many rows (the last window repeated):
every new batch size was a new input shape, whose first run costs ONNX Runtime many times a
warm one (benchmarks/results/capacity/HISTORY.md, "Warm at start"), and a server meets nearly every size
from 1 to 256. 35 shapes up to 256 rows can all be met at start (``WhisperRecognizer.warm_up``), for at
most 7 spare rows a batch. Every bucket from 8 up is a multiple of 8, so the rows fit the
bucket's encoder buffer."""


def encoder_rows(batch: int) -> int:
    """The rows the encoder runs on for ``batch`` windows (fixed-cache decoder): the bucket up to
    8, then the next multiple of :data:`ENCODER_ROW_STEP`."""
    if batch <= ENCODER_ROW_STEP:
        return bucket_size(batch)
    return -(-batch // ENCODER_ROW_STEP) * ENCODER_ROW_STEP


def bucket_size(batch: int) -> int:
    """The batch size ``batch`` rows are decoded at by the fixed-cache decoder."""
    for size in BATCH_BUCKETS:
        if batch <= size:
            return size
    return -(-batch // 64) * 64


@dataclass
class _EncoderBuffer:
    """Encoder states of one bucket size, written by every ``encode`` of that size."""

    value: Any  # OrtValue [rows, n_ctx, d]
    generation: int = 0


@dataclass
class Overlap:
    """Host work to do while the device encodes a batch (:meth:`WhisperRuntime.encode`): on CUDA
    the encoder's run is queued without waiting, :attr:`work` runs on this thread meanwhile, and
    :attr:`synchronize` then waits for the device; elsewhere the work runs after the encoder.
    The work must not touch the device. It runs once, however many encodes follow (a
    temperature fallback encodes again)."""

    work: Callable[[], None]
    synchronize: Callable[[], None] | None = None
    """Waits for every queued device operation (the array back-end's); ``None``: the encoder
    runs synchronously."""
    done: bool = False

    def run(self) -> None:
        if not self.done:
            self.done = True
            self.work()


@dataclass
class EncoderOutput:
    """Encoder states of a batch of windows ([B, 1500, d], on the session's device). With the
    fixed-cache decoder ``value`` has ``rows`` >= ``batch`` rows (the batch's bucket; rows past
    ``batch`` are left over from earlier windows and only ever decoded as padding), and is valid
    until the next ``encode`` of the same bucket."""

    value: Any = field(repr=False)  # OrtValue
    batch: int
    rows: int = 0
    buffer: _EncoderBuffer | None = field(default=None, repr=False)
    generation: int = 0
    n_ctx: int = 1500
    """Encoder positions (the audio context: 1500 is 30 s); the graphs that decode it follow."""


@dataclass
class _AudioContext:
    """The graphs of one audio context of ``n_ctx`` encoder positions (1500: Whisper's 30 s).
    Short contexts share one decoder (its cross K/V length is symbolic)."""

    n_ctx: int
    encoder: Any  # OrtModel
    cross_kv: Any
    decoder: Any = None  # the concatenating decoder (CPU)
    step_model: Any = None  # the fixed-cache step and prefill (CUDA)
    prefill_model: Any = None


@dataclass
class DecoderState:
    """Self-attention cache and cross K/V of a batch being decoded. ``step`` grows it in place.

    On the CPU the cache grows by concatenation (``past``); on CUDA it lives in the fixed buffers
    of a ``slot`` (one CUDA graph each) that this state holds until it is dropped; several live
    states of the same batch size get separate slots, up to MAX_SLOTS_PER_BATCH, after which the
    oldest is taken over and its state raises instead of reading a cache it no longer owns."""

    cross: dict[str, Any] | None = field(repr=False)  # cross_k_i / cross_v_i -> OrtValue
    past: dict[str, Any] | None = field(repr=False)  # past_k_i / past_v_i -> OrtValue (or empty arrays)
    binding: Any = field(repr=False)  # session.Binding with cross K/V bound once
    batch: int
    length: int  # tokens in the cache = position of the next token (the longest row's, when ragged)
    slot: Any = field(default=None, repr=False)
    generation: int = 0
    positions: np.ndarray | None = field(default=None, repr=False)
    """Fixed cache: each slot row's next position (rows of different prompt lengths differ)."""
    probe_logits: Any = field(default=None, repr=False)
    """After a ``start(..., probe=...)``: the logits [B, n_vocab] float32 at each row's probe
    position (on ``xp``'s device, valid until the next start of as many rows)."""


class _Slot:
    """Fixed device buffers for one batch size, bound once to the step graph (and to the cross
    K/V graph's outputs), so the step can be captured as a CUDA graph and replayed."""

    def __init__(self, rt: WhisperRuntime, batch: int, graph_id: int, xp=None, context: _AudioContext | None = None):
        """``xp``: a device array module (CuPy) whose array receives the logits, so that decoding
        rules on them where they are; ``None``: an OrtValue, fetched to the host. ``context``:
        the audio context whose cross K/V the slot holds (default: the 30 s one)."""
        context = context or rt._contexts[rt.dims.n_audio_ctx]
        d, f = rt.dims, rt._float
        self.nbytes = 0
        """Device memory of this slot's own buffers (what :meth:`WhisperRuntime.buffer_bytes` sums)."""
        m = context.step_model

        def zeros(shape: tuple[int, ...], dtype):
            self.nbytes += int(np.prod(shape)) * np.dtype(dtype).itemsize
            return m.zeros(shape, dtype)

        self.n_ctx = context.n_ctx
        self.graph_id = graph_id
        self.generation = 0
        self.owner: weakref.ref | None = None  # the DecoderState using these buffers now
        self.last_used = 0
        self.batch = batch
        self.tokens = zeros((batch, 1), np.int64)
        self.offset = zeros((batch,), np.int64)  # each row's position
        self.position = np.zeros(batch, np.int64)  # host side of `offset`, reused every step
        self.logits = zeros((batch, d.n_vocab), np.float32)
        self.step = m.binding()
        self.cross_binding = context.cross_kv.binding()
        self.step.bind("tokens", self.tokens)
        self.step.bind("offset", self.offset)
        self.xp = xp
        self.device_logits = None
        if xp is not None:
            # A fixed address too, so the captured CUDA graph writes into it at every replay.
            self.device_logits = xp.zeros((batch, d.n_vocab), dtype=xp.float32)
            self.nbytes += int(self.device_logits.nbytes)
            self.step.bind_output_array("logits", self.device_logits)
        else:
            self.step.bind_output_value("logits", self.logits)
        # Bound always, so the captured graph is the same whether a caller reads it or not.
        self.attention = None
        if rt.has_alignment:
            self.attention = zeros((batch, len(rt.alignment_heads), 1, context.n_ctx), np.float32)
            self.step.bind_output_value("alignment_attn", self.attention)
        self.buffers: dict[str, Any] = {}
        # Buffer shapes follow the step graph's declared inputs (the key layout differs between
        # the MatMul and the fused-attention variants).
        shapes = _bound_shapes(m.input_shapes, batch, context.n_ctx)
        for i in range(d.n_text_layer):
            for kind in ("k", "v"):
                cache = zeros(shapes[f"cache_{kind}_{i}"], f)
                self.step.bind(f"cache_{kind}_{i}", cache)
                self.step.bind_output_value(f"new_cache_{kind}_{i}", cache)  # in place
                cross = zeros(shapes[f"cross_{kind}_{i}"], f)
                self.step.bind(f"cross_{kind}_{i}", cross)
                self.cross_binding.bind_output_value(f"cross_{kind}_{i}", cross)
                self.buffers[f"cache_{kind}_{i}"] = cache
                self.buffers[f"cross_{kind}_{i}"] = cross
        self.prefill = None
        if context.prefill_model is not None:
            # The prompt graph works on the very same buffers (not captured: its shapes vary).
            self.prefill = context.prefill_model.binding()
            for name, value in self.buffers.items():
                self.prefill.bind(name, value)
                if name.startswith("cache_"):
                    self.prefill.bind_output_value("new_" + name, value)
            if self.device_logits is not None:
                self.prefill.bind_output_array("logits", self.device_logits)
            else:
                self.prefill.bind_output_value("logits", self.logits)
            if self.attention is not None and "alignment_attn" in context.prefill_model.output_names:
                self.prefill.bind_output_value("alignment_attn", self.attention)

    def fetch_logits(self):
        """The logits of the last run: the device array itself (the next run overwrites it), or
        a host copy."""
        if self.device_logits is not None:
            return self.device_logits
        return ort_session.to_numpy(self.logits)


def _bound_shapes(declared: dict[str, list], batch: int, n_ctx: int) -> dict[str, tuple[int, ...]]:
    """A graph's declared input shapes with its symbolic dimensions filled in: the audio
    context's length for the short-context decoders' cross K/V, the batch for every other."""
    return {name: tuple((n_ctx if n == FRAMES_DIM else batch) if isinstance(n, str) else int(n) for n in dims)
            for name, dims in declared.items()}


class WhisperRuntime:
    def __init__(
        self, files: ModelFiles, choice: ort_session.ProviderChoice, onnx_files: OnnxFiles,
        intra_threads: int | None = None, fixed_cache: bool | None = None,
        short_contexts: dict[int, OnnxFiles] | None = None, frames_files: OnnxFiles | None = None,
    ):
        """``fixed_cache``: decode with the fixed-buffer step graph (default: on CUDA, where it is
        captured as a CUDA graph); the CPU uses the concatenating decoder. ``short_contexts``:
        encoder positions -> the folder of that context's encoder and cross K/V graphs, with
        ``frames_files`` the folder of the decoder graphs they share (see
        :func:`captioner.models.onnx_export.context_variant`)."""
        self.files = files
        self.onnx_files = onnx_files
        self.name = files.name
        self.precision = onnx_files.precision
        self.encoder = ort_session.OrtModel(onnx_files.path("encoder"), choice, intra_threads)
        self.cross_kv = ort_session.OrtModel(onnx_files.path("cross_kv"), choice, intra_threads)
        self.decoder = None
        self.step_model = None
        self.prefill_model = None
        self.cuda_graph = False
        if fixed_cache is None:
            fixed_cache = choice.is_cuda and onnx_files.path("decoder_step").is_file()
        if fixed_cache:
            self.step_model = _open_step_model(onnx_files.path("decoder_step"), choice)
            self.cuda_graph = self.step_model.cuda_graph
            if onnx_files.path("decoder_prefill").is_file():
                self.prefill_model = ort_session.OrtModel(onnx_files.path("decoder_prefill"), choice, intra_threads,
                                                          cudnn_attention=False)
            decoder_provider = self.step_model.provider
        else:
            self.decoder = ort_session.OrtModel(onnx_files.path("decoder"), choice, intra_threads)
            decoder_provider = self.decoder.provider
        # (batch, logits on a device array), and the audio context's positions after them for a
        # short context (the 30 s context's keys are as they were before short contexts existed).
        self._slots: dict[tuple, list[_Slot]] = {}
        self._probe_outputs: dict[tuple[int, bool], Any] = {}
        self._encoder_buffers: dict[tuple[int, int], _EncoderBuffer] = {}  # (rows, n_ctx)
        self._gather_rows: dict[int, ort_session.OrtModel] = {}  # row-compaction graphs by n_ctx, opened at first use
        self.compactions = 0  # how many times finished rows were dropped (compact), for tests and benchmarks
        self._gather_choice = choice
        self._n_graphs = 0
        self._starts = 0
        providers = {self.encoder.provider, self.cross_kv.provider, decoder_provider}
        self.provider = ort_session.CUDA if providers == {ort_session.CUDA} else ort_session.CPU
        self.device_name = choice.device_name if self.provider == ort_session.CUDA else "cpu"
        self.provider_note = choice.note
        d = files.dims
        self.dims = d
        self.alignment_heads = tuple(sorted(files.alignment_heads))
        decoder_model = self.step_model if self.step_model is not None else self.decoder
        # Graphs from an older cache (or a model without heads in its config) have no such output.
        self.has_alignment = bool(self.alignment_heads) and "alignment_attn" in decoder_model.output_names
        self.n_mels = d.n_mels
        self.n_vocab = d.n_vocab
        self.n_text_ctx = d.n_text_ctx
        self.is_multilingual = files.is_multilingual
        self.tokenizer_path = files.tokenizer_path
        self.special = files.special
        self.suppress_ids = files.suppress_ids
        self.suppress_ids_begin = files.suppress_ids_begin
        self._head_dim = d.n_text_state // d.n_text_head
        self._float = np.float16 if self.precision == "fp16" else np.float32
        self._contexts = {d.n_audio_ctx: _AudioContext(d.n_audio_ctx, self.encoder, self.cross_kv, self.decoder,
                                                       self.step_model, self.prefill_model)}
        if short_contexts:
            self._open_short_contexts(short_contexts, frames_files, choice, intra_threads)

    def _open_short_contexts(self, short_contexts: dict[int, OnnxFiles], frames: OnnxFiles | None,
                             choice: ort_session.ProviderChoice, intra_threads: int | None) -> None:
        if frames is None:
            raise ValueError("short audio contexts need the folder of their decoder graphs (frames_files)")
        shared: dict[str, Any] = {}
        if self.step_model is not None:
            shared["step_model"] = _open_step_model(frames.path("decoder_step"), choice)
            if self.prefill_model is not None and frames.path("decoder_prefill").is_file():
                shared["prefill_model"] = ort_session.OrtModel(frames.path("decoder_prefill"), choice, intra_threads,
                                                               cudnn_attention=False)
        else:
            shared["decoder"] = ort_session.OrtModel(frames.path("decoder"), choice, intra_threads)
        for n_ctx, folder in sorted(short_contexts.items()):
            if not 0 < n_ctx < self.dims.n_audio_ctx:
                raise ValueError(f"audio context of {n_ctx} positions: the model has {self.dims.n_audio_ctx}")
            self._contexts[n_ctx] = _AudioContext(
                n_ctx, ort_session.OrtModel(folder.path("encoder"), choice, intra_threads),
                ort_session.OrtModel(folder.path("cross_kv"), choice, intra_threads), **shared)

    @property
    def audio_contexts(self) -> tuple[int, ...]:
        """Encoder positions of every audio context this runtime encodes, shortest first (the
        model's own, 1500 = 30 s, last; alone unless shorter ones are enabled)."""
        return tuple(sorted(self._contexts))

    def __repr__(self) -> str:
        return f"WhisperRuntime({self.name!r}, provider={self.provider}, precision={self.precision})"

    # --- encoder -----------------------------------------------------------------------------

    def encode(self, mel, overlap: Overlap | None = None) -> EncoderOutput:
        """mel: [B, n_mels, 3000] (or [n_mels, 3000]) float32, NumPy or a device array (CuPy);
        device data is bound by pointer and never copied to the host. With shorter audio
        contexts enabled, [B, n_mels, 2n] for any of them (n in :attr:`audio_contexts`).
        ``overlap``: host work done while the device encodes (see :class:`Overlap`); the states
        are complete when this returns either way."""
        shape = tuple(mel.shape)
        if len(shape) == 2:
            mel = mel[None]
            shape = (1, *shape)
        context = self._contexts.get(shape[2] // 2) if len(shape) == 3 and shape[2] % 2 == 0 else None
        if len(shape) != 3 or shape[1] != self.n_mels or context is None:
            widths = " | ".join(str(2 * n) for n in self.audio_contexts) if len(self._contexts) > 1 else str(N_AUDIO_FRAMES)
            raise ValueError(f"mel must be [B, {self.n_mels}, {widths}], got {shape}")
        if np.dtype(mel.dtype) != np.float32:
            mel = mel.astype(np.float32)
        if not hasattr(mel, "__cuda_array_interface__"):
            mel = np.ascontiguousarray(mel)
        elif not mel.flags.c_contiguous:
            mel = mel.copy()
        n_ctx = context.n_ctx
        if self.step_model is None:
            out = context.encoder.run({"mel": mel})
            if overlap is not None:
                overlap.run()
            return EncoderOutput(out["encoder_out"], shape[0], rows=shape[0], n_ctx=n_ctx)
        # Fixed cache: the states go into the first rows of a buffer of the batch's bucket size,
        # which the cross K/V graph then reads whole; the encoder itself runs on the real rows
        # rounded up to a multiple of 8 (encoder_rows), so that it meets few shapes.
        rows = bucket_size(shape[0])
        buffer = self._encoder_buffers.get((rows, n_ctx))
        if buffer is None:
            d = self.dims
            buffer = self._encoder_buffers[(rows, n_ctx)] = _EncoderBuffer(context.encoder.zeros((rows, n_ctx, d.n_audio_state), self._float))
        buffer.generation += 1
        run_rows = encoder_rows(shape[0])
        if run_rows > shape[0]:
            # Spare rows repeat the last window: an indexed copy, the same on NumPy and device arrays.
            mel = mel[np.minimum(np.arange(run_rows), shape[0] - 1)]
        # The encoder is the largest single device run of a step: with host work to overlap, it
        # is queued and the work runs while it computes.
        queued = overlap is not None and not overlap.done and overlap.synchronize is not None
        context.encoder.run_into({"mel": mel}, "encoder_out", buffer.value, (run_rows, n_ctx, self.dims.n_audio_state),
                                 wait=not queued)
        if overlap is not None:
            try:
                overlap.run()
            finally:
                if queued:
                    overlap.synchronize()
        return EncoderOutput(buffer.value, shape[0], rows=rows, buffer=buffer, generation=buffer.generation, n_ctx=n_ctx)

    # --- decoder -----------------------------------------------------------------------------

    def start(self, enc: EncoderOutput, prompt_tokens, attention: bool = False, xp=None, probe=None):
        """Compute cross K/V once and prefill the cache with ``prompt_tokens`` [B, T] (same T for
        all items), or, where ``ragged_prompts`` (the fixed-cache decoder), B token lists of any
        lengths, each row then at its own position. Returns the logits [B, n_vocab] float32 after the last prompt token and the
        state: ``(logits, state)``, or with ``attention`` ``(logits, state, attention)``, the
        alignment heads' cross-attention of the last prompt token [B, A, 1500] float32.

        ``xp`` (NumPy, CuPy; ``None``: NumPy) is the array module this state's logits are wanted
        on, here and at every :meth:`step`. With CuPy on CUDA the step graph writes them into a
        device array that the next step overwrites (read them before stepping again), so they
        never cross to the host; otherwise they come to the host as before.

        ``probe`` (where ``ragged_prompts``): [B] positions in each row's prompt whose logits are
        wanted too, in ``state.probe_logits``: the ``<|startoftranscript|>`` of a row whose prompt
        goes on with forced tokens (the decoding reads the no-speech probability there)."""
        self._check_attention(attention)
        if self.step_model is not None:
            tokens, lengths = self._ragged(enc.batch, prompt_tokens)
            if probe is not None:
                probe = np.asarray(probe, dtype=np.int64).reshape(-1)
                if probe.shape != lengths.shape or (probe < 0).any() or (probe >= lengths).any():
                    raise ValueError("probe must hold one position inside each row's prompt")
            logits, state = self._start_fixed(enc, tokens, lengths, self._device_xp(xp), probe)
            logits = _on(xp, logits)
            if probe is not None:
                state.probe_logits = _on(xp, state.probe_logits)
            return (logits, state, self._slot_attention(state)) if attention else (logits, state)
        if probe is not None:
            raise ValueError("probe needs the fixed-cache decoder (ragged_prompts)")
        tokens = np.ascontiguousarray(np.asarray(prompt_tokens, dtype=np.int64))
        if tokens.ndim == 1:
            tokens = tokens[None]
        if tokens.ndim != 2 or tokens.shape[0] != enc.batch or tokens.shape[1] < 1:
            raise ValueError(f"prompt_tokens must be [{enc.batch}, T>=1] (rows of one length on this decoder), got {tokens.shape}")
        if tokens.shape[1] > self.n_text_ctx:
            raise ValueError(f"prompt of {tokens.shape[1]} tokens exceeds the text context of {self.n_text_ctx}")
        context = self._contexts[enc.n_ctx]
        cross = context.cross_kv.run({"encoder_out": enc.value})
        d = self.dims
        empty_k = np.zeros((enc.batch, d.n_text_head, self._head_dim, 0), self._float)
        empty_v = np.zeros((enc.batch, d.n_text_head, 0, self._head_dim), self._float)
        past = {}
        for i in range(d.n_text_layer):
            past[f"past_k_{i}"] = empty_k
            past[f"past_v_{i}"] = empty_v
        binding = context.decoder.binding()
        binding.bind_all(cross)
        state = DecoderState(cross=cross, past=past, binding=binding, batch=enc.batch, length=0)
        if attention:
            logits, attn = self._run_decoder(state, tokens, attention=True)
            return _on(xp, logits), state, attn
        return _on(xp, self._run_decoder(state, tokens)), state

    @property
    def ragged_prompts(self) -> bool:
        """Whether rows of one batch may have prompts of different lengths (fixed cache)."""
        return self.step_model is not None

    def _ragged(self, batch: int, prompt_tokens) -> tuple[np.ndarray, np.ndarray]:
        """Prompts (an array [B, T] or B lists) -> right-padded [B, T_max] and each row's length."""
        rows = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompt_tokens]
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        if len(rows) != batch or not len(rows) or lengths.min() < 1:
            raise ValueError(f"prompt_tokens must hold {batch} prompts of at least one token, got {len(rows)}")
        if lengths.max() > self.n_text_ctx:
            raise ValueError(f"prompt of {lengths.max()} tokens exceeds the text context of {self.n_text_ctx}")
        tokens = np.empty((batch, int(lengths.max())), dtype=np.int64)
        for b, row in enumerate(rows):
            tokens[b, :len(row)] = row
            tokens[b, len(row):] = row[-1]  # padding, never attended to: masked, then overwritten
        return tokens, lengths

    def _device_xp(self, xp):
        """``xp`` when the step graph can write logits straight into its arrays (a device array
        module on CUDA), else ``None`` (host logits)."""
        if xp is None or xp is np or self.provider != ort_session.CUDA:
            return None
        return xp

    def step(self, state: DecoderState, tokens: np.ndarray, attention: bool = False, xp=None):
        """Append one token per item ([B] int64) and return the next logits [B, n_vocab]; with
        ``attention``, ``(logits, attention)``: the alignment heads' cross-attention of this
        token over the encoder frames, [B, A, 1500] float32 (A = ``len(alignment_heads)``).
        Logits come on ``xp``, as for :meth:`start` (pass the same ``xp`` as the state's start)."""
        self._check_attention(attention)
        t = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if t.shape[0] != state.batch:
            raise ValueError(f"step needs {state.batch} tokens, got {t.shape[0]}")
        # Ragged rows: a row that finished early may run past the end (it then rewrites the last
        # column, read by no one); the context is full when every real row is.
        shortest = state.length if state.positions is None else int(state.positions[:state.batch].min())
        if shortest >= self.n_text_ctx:
            raise ValueError(f"decoder context of {self.n_text_ctx} tokens is full")
        if state.slot is not None:
            if state.generation != state.slot.generation:
                raise ValueError(
                    f"this DecoderState's cache was taken over by a newer start() (more than {MAX_SLOTS_PER_BATCH} "
                    f"live states of batch size {state.batch}); drop finished states"
                )
            slot = state.slot
            feed = np.full((slot.batch, 1), t[0], dtype=np.int64)  # padding rows repeat row 0
            feed[:state.batch, 0] = t
            logits = self._step_fixed(slot, feed, state.positions, fetch=True)[:state.batch]
            state.positions += 1
            state.length += 1
            logits = _on(xp, logits)
            return (logits, self._slot_attention(state)) if attention else logits
        out = self._run_decoder(state, np.ascontiguousarray(t[:, None]), attention=attention)
        return (_on(xp, out[0]), out[1]) if attention else _on(xp, out)

    def extend(self, state: DecoderState, tokens: np.ndarray, xp=None):
        """Append ``tokens`` [B, T] (the same T for every row) in one run of the concatenating
        decoder and return the logits after the last one, as :meth:`step` does for one token.
        The fixed-cache decoder takes such tokens in its prefill instead (``start``)."""
        t = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64))
        if t.ndim != 2 or t.shape[0] != state.batch or t.shape[1] < 1:
            raise ValueError(f"extend needs [{state.batch}, T>=1] tokens, got {t.shape}")
        if state.slot is not None:
            raise ValueError("the fixed-cache decoder takes forced tokens in start()'s prefill")
        if state.length + t.shape[1] > self.n_text_ctx:
            raise ValueError(f"decoder context of {self.n_text_ctx} tokens would overflow")
        return _on(xp, self._run_decoder(state, t))

    def _check_attention(self, attention: bool) -> None:
        if attention and not self.has_alignment:
            raise ValueError(f"{self.name}: its decoder graph has no alignment-head output "
                             "(no alignment_heads in config.json)")

    @staticmethod
    def _slot_attention(state: DecoderState) -> np.ndarray:
        # A copy: on the CPU the OrtValue's memory is the buffer the next step writes into.
        return np.array(ort_session.to_numpy(state.slot.attention)[:state.batch, :, 0])

    def _probe_output(self, rows: int, xp):
        """Where the prefill writes ``probe_logits`` for ``rows`` rows: a device array (with
        ``xp``) or an OrtValue, one per row count, read before the next start of as many rows."""
        key = (rows, xp is not None)
        out = self._probe_outputs.get(key)
        if out is None:
            shape = (rows, self.dims.n_vocab)
            out = xp.zeros(shape, dtype=xp.float32) if xp is not None else self.step_model.zeros(shape, np.float32)
            self._probe_outputs[key] = out
        return out

    def _start_fixed(self, enc: EncoderOutput, tokens: np.ndarray, lengths: np.ndarray, xp=None,
                     probe: np.ndarray | None = None) -> tuple[Any, DecoderState]:
        batch = tokens.shape[0]
        if enc.buffer is not None and enc.generation != enc.buffer.generation:
            raise ValueError("these encoder states were overwritten by a later encode() of as many windows; "
                             "start() each encoding before the next encode()")
        rows = max(enc.rows, batch)
        probes = lengths - 1 if probe is None else probe
        if rows > batch:  # padding rows of the bucket: row 0's prompt again (their output is dropped)
            tokens = np.concatenate([tokens, np.repeat(tokens[:1], rows - batch, axis=0)])
            lengths = np.concatenate([lengths, np.repeat(lengths[:1], rows - batch)])
            probes = np.concatenate([probes, np.repeat(probes[:1], rows - batch)])
        probe_logits = None
        slot = self._free_slot(rows, xp, enc.n_ctx)
        slot.generation += 1
        self._starts += 1
        slot.last_used = self._starts
        slot.cross_binding.bind("encoder_out", enc.value)
        slot.cross_binding.run_bound()
        state = DecoderState(cross=None, past=None, binding=slot.step, batch=batch, length=0, slot=slot, generation=slot.generation)
        n = tokens.shape[1]
        logits = None
        if n > 1 and slot.prefill is not None:
            try:
                slot.prefill.bind("tokens", _pad_columns(tokens, self.n_text_ctx))
                slot.prefill.bind("offset", np.zeros(1, np.int64))
                slot.prefill.bind("last", lengths - 1)  # each row's logits after its own last token
                slot.prefill.bind("probe", probes)
                out = self._probe_output(rows, xp)
                if xp is not None:
                    slot.prefill.bind_output_array("probe_logits", out)
                else:
                    slot.prefill.bind_output_value("probe_logits", out)
                slot.prefill.run_bound()
                logits = slot.fetch_logits()
                if probe is not None:
                    probe_logits = out if xp is not None else ort_session.to_numpy(out)
            except Exception as e:  # an ORT build whose fused attention rejects this shape, say
                warnings.warn(f"prompt prefill failed ({str(e).splitlines()[0]}); feeding prompts token by token", RuntimeWarning, stacklevel=2)
                for other in self._slots.values():
                    for each in other:
                        each.prefill = None
                self.prefill_model = None
                for context in self._contexts.values():
                    context.prefill_model = None
        if logits is None:  # one captured step per prompt token
            for t in range(n):
                # A row whose prompt has ended feeds its last token at its last position again
                # (the same key and value rewritten), so every row ends on its own last token.
                position = np.minimum(t, lengths - 1)
                probed = probe is not None and bool((probes == t).any())
                logits = self._step_fixed(slot, tokens[np.arange(rows), position][:, None], position,
                                          fetch=t == n - 1 or probed)
                if probed:
                    at = np.flatnonzero(probes == t)
                    if probe_logits is None:
                        probe_logits = xp.empty_like(logits) if xp is not None else np.empty_like(logits)
                    probe_logits[at] = logits[at]
        state.probe_logits = None if probe_logits is None else probe_logits[:batch]
        state.positions = lengths.copy()
        state.length = int(lengths[:batch].max())
        slot.owner = weakref.ref(state)
        return logits[:batch], state

    def graph_models(self) -> dict[str, set]:
        """Per graph (encoder, cross_kv, decoder, decoder_step, decoder_prefill, gather_rows),
        the :class:`~captioner.models.session.OrtModel` sessions that run it (one per audio
        context that has it)."""
        models: dict[str, set] = {}
        names = {"step_model": "decoder_step", "prefill_model": "decoder_prefill"}
        for context in self._contexts.values():
            for name in ("encoder", "cross_kv", "decoder", "step_model", "prefill_model"):
                model = getattr(context, name)
                if model is not None:
                    models.setdefault(names.get(name, name), set()).add(model)
        models["gather_rows"] = set(self._gather_rows.values())
        return models

    def graph_runs(self) -> dict[str, tuple[int, float]]:
        """Per graph (:meth:`graph_models`; every audio context's added up): how many times it
        ran and its wall time in seconds so far, the device's work included. Benchmarks take
        differences of two readings."""
        return {k: (sum(m.runs for m in v), sum(m.run_s for m in v)) for k, v in self.graph_models().items()}

    def can_compact(self, state: DecoderState, n_rows: int) -> bool:
        """Whether :meth:`compact` to ``n_rows`` rows would move the state to a smaller bucket."""
        return state.slot is not None and 0 < n_rows and bucket_size(n_rows) < state.slot.batch

    def compact(self, state: DecoderState, keep: np.ndarray) -> DecoderState:
        """A state of only the rows ``keep`` (indices into ``state``'s rows, in order), in the
        buffers of their smaller bucket: their caches and cross K/V are copied there on the
        device, and further steps run at that batch size. The old state must not be stepped again.
        Used between steps, when enough rows have finished that a smaller bucket holds the rest."""
        keep = np.asarray(keep, dtype=np.int64).reshape(-1)
        if not self.can_compact(state, len(keep)):
            raise ValueError(f"cannot compact {state.batch} rows to {len(keep)}")
        old = state.slot
        if state.generation != old.generation:
            raise ValueError("this DecoderState's cache was taken over by a newer start()")
        rows = bucket_size(len(keep))
        index = np.concatenate([keep, np.repeat(keep[:1], rows - len(keep))])  # padding rows: the first again
        new = self._free_slot(rows, old.xp, old.n_ctx)
        new.generation += 1
        new.last_used = self._starts
        self.compactions += 1
        binding = self._gather_model(old.n_ctx).binding()
        binding.bind("rows", index)
        for name, value in old.buffers.items():
            binding.bind(name, value)
            binding.bind_output_value(f"gathered_{name}", new.buffers[name])
        binding.run_bound()
        moved = DecoderState(cross=None, past=None, binding=new.step, batch=len(keep), length=state.length, slot=new,
                             generation=new.generation, positions=state.positions[index].copy())
        new.owner = weakref.ref(moved)
        old.owner = None  # free for the next start(); the old state raises if stepped again
        old.generation += 1
        return moved

    def _gather_model(self, n_ctx: int) -> ort_session.OrtModel:
        model = self._gather_rows.get(n_ctx)
        if model is None:
            from captioner.models.onnx_graphs import build_gather_rows  # noqa: PLC0415 - onnx is only needed here

            element = 10 if self._float == np.float16 else 1  # TensorProto.FLOAT16 / FLOAT
            shapes = _bound_shapes(self._contexts[n_ctx].step_model.input_shapes, 1, n_ctx)
            tensors = {name: (element, list(shapes[name][1:]))
                       for name in shapes if name.startswith(("cache_", "cross_"))}
            model = self._gather_rows[n_ctx] = ort_session.OrtModel(
                Path("gather_rows.onnx"), self._gather_choice, model_bytes=build_gather_rows(tensors).SerializeToString())
        return model

    def buffer_bytes(self) -> dict[str, float]:
        """The fixed-cache decoder's own device buffers: its slots (each batch bucket's caches,
        cross K/V and logits; up to MAX_SLOTS_PER_BATCH per bucket and greedy path) and the
        encoder's output buffers. ONNX Runtime's arena (the graphs' working memory) is not in it.
        A served engine's process holds much more GPU memory than these
        (benchmarks/results/serve/HISTORY.md, "Three engines on one GPU with MPS"): this says how much
        of it is these."""
        slots = [slot for pool in self._slots.values() for slot in pool]
        return {"decoder_slots": float(len(slots)),
                "decoder_slot_bytes": float(sum(slot.nbytes for slot in slots)),
                "encoder_buffer_bytes": float(sum(rows * n_ctx * self.dims.n_audio_state * np.dtype(self._float).itemsize
                                                  for rows, n_ctx in self._encoder_buffers))}

    def _free_slot(self, batch: int, xp=None, n_ctx: int | None = None) -> _Slot:
        """A slot whose last state is gone (dropped by the caller), a new one while the pool for
        this batch size (logits destination and audio context) is small, else the least
        recently started one."""
        n_ctx = self.dims.n_audio_ctx if n_ctx is None else n_ctx
        key = (batch, xp is not None) if n_ctx == self.dims.n_audio_ctx else (batch, xp is not None, n_ctx)
        pool = self._slots.setdefault(key, [])
        for slot in pool:
            if slot.owner is None or slot.owner() is None:
                return slot
        if len(pool) < MAX_SLOTS_PER_BATCH:
            slot = _Slot(self, batch, graph_id=self._n_graphs, xp=xp, context=self._contexts[n_ctx])
            self._n_graphs += 1
            pool.append(slot)
            return slot
        return min(pool, key=lambda s: s.last_used)

    def _step_fixed(self, slot: _Slot, tokens: np.ndarray, position, fetch: bool) -> np.ndarray | None:
        """One captured step; ``position``: each row's (or one for all), kept inside the context
        (rows already finished may be stepped past its end)."""
        ort_session.write(slot.tokens, np.ascontiguousarray(tokens, dtype=np.int64))
        np.minimum(position, self.n_text_ctx - 1, out=slot.position, casting="unsafe")
        ort_session.write(slot.offset, slot.position)
        slot.step.run_bound(slot.graph_id)
        return slot.fetch_logits() if fetch else None

    def _run_decoder(self, state: DecoderState, tokens: np.ndarray, attention: bool = False):
        binding = state.binding
        binding.bind("tokens", tokens)
        binding.bind_all(state.past)
        out = binding.run(host_outputs=("logits", "alignment_attn") if attention else ("logits",))
        for i in range(self.dims.n_text_layer):
            state.past[f"past_k_{i}"] = out[f"present_k_{i}"]
            state.past[f"past_v_{i}"] = out[f"present_v_{i}"]
        state.length += tokens.shape[1]
        if attention:
            return out["logits"], np.ascontiguousarray(out["alignment_attn"][:, :, -1])
        return out["logits"]


def _on(xp, logits):
    """Logits as an array of ``xp`` (no copy when they are one already, or ``xp`` is NumPy)."""
    if xp is None or xp is np or not isinstance(logits, np.ndarray):
        return logits
    return xp.asarray(logits)


def _open_step_model(path: Path, choice: ort_session.ProviderChoice) -> ort_session.OrtModel:
    """The step graph with CUDA graph capture, or without it when this ORT build refuses (or
    ``CAPTIONER_CUDA_GRAPH=0`` asks so)."""
    if os.environ.get("CAPTIONER_CUDA_GRAPH", "1") == "0":
        return ort_session.OrtModel(path, choice, cuda_graph=False)
    try:
        return ort_session.OrtModel(path, choice, cuda_graph=True)
    except UserError:
        return ort_session.OrtModel(path, choice, cuda_graph=False)


def encoder_windows_from_env() -> tuple[float, ...]:
    """The shorter encoder windows ``CAPTIONER_ENCODER_WINDOWS_S`` asks for ("10,20" -> (10.0,
    20.0)); unset, empty or "off": none. Raises UserError for anything else."""
    text = os.environ.get(ENCODER_WINDOWS_ENV, "").strip()
    if text.lower() in ("", "off", "0", "none"):
        return ()
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UserError(f"{ENCODER_WINDOWS_ENV}={text!r}: give encoder windows in seconds, e.g. 10,20") from None


def load_runtime(
    name_or_path: str | Path,
    device: str | None = None,
    progress: ProgressFn | None = None,
    intra_threads: int | None = None,
    encoder_windows_s=None,
) -> WhisperRuntime:
    """Resolve, convert (cached) and open a Whisper model. ``device``: None/"auto", "cpu",
    "cuda" or "cuda:N" (``CAPTIONER_DEVICE`` applies when None). ``encoder_windows_s``: shorter
    encoder windows to enable beside 30 s, e.g. ``(10.0, 20.0)`` (``None``: what
    ``CAPTIONER_ENCODER_WINDOWS_S`` says, by default none); their graphs are built on first use
    and cached like the others. Raises UserError on bad input."""
    files = resolve_model(str(name_or_path))
    choice = ort_session.choose_provider(device)
    precision = "fp16" if choice.is_cuda else "fp32"
    windows_s = encoder_windows_from_env() if encoder_windows_s is None else tuple(encoder_windows_s)
    contexts = audio_contexts(windows_s, files.dims)
    # CAPTIONER_FUSED_ATTENTION=0 builds the CUDA graphs with plain MatMul attention instead.
    fused = precision == "fp16" and os.environ.get("CAPTIONER_FUSED_ATTENTION", "1") != "0"

    def open_runtime(rebuild: bool) -> WhisperRuntime:
        onnx_files = ensure_onnx(files, precision, progress, fused_attention=fused, rebuild=rebuild)
        short = {n: ensure_onnx(files, precision, progress, fused_attention=fused, rebuild=rebuild, variant=context_variant(n))
                 for n in contexts}
        frames = ensure_onnx(files, precision, progress, fused_attention=fused, rebuild=rebuild,
                             variant=FRAMES_VARIANT) if contexts else None
        return WhisperRuntime(files, choice, onnx_files, intra_threads, short_contexts=short, frames_files=frames)

    try:
        return open_runtime(rebuild=False)
    except UserError:
        raise
    except Exception:  # graphs ONNX Runtime cannot open (damaged past what the manifest saw): rebuild once
        pass
    try:
        return open_runtime(rebuild=True)
    except UserError:
        raise
    except Exception as e:
        folder = cache_folder(files, precision, fused)
        raise UserError(f"cannot open the ONNX graphs in {folder} even after rebuilding them: "
                        f"{one_line(e)}") from None
