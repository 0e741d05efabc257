"""Streaming, batched Whisper log-mel (and the speaker encoder's bands) over many streams, on
NumPy or CuPy.

Audio arrives as whole 10 ms frames (160 samples at 16 kHz) per stream. Each stream owns a
slot: a history of its last 360 raw samples, a ring of log-mel frames and, with
``speaker_bands``, a ring of the voice encoder's 40 mel bands of the same frames (the same power
spectrum through :func:`~captioner.gpu.features_ref.speaker_filters`, ``log10`` too), all in
the back-end's memory and allocated once, when the object is made.

Streaming alignment (the same frames as :func:`captioner.gpu.features_ref.log_mel_spectrogram`
over the whole utterance):

* Frame ``t`` is centred on sample ``160 t`` and spans samples ``160 t - 200 .. 160 t + 199``;
  frames 0 and 1 reach before the start and use Whisper's reflect padding, built exactly from
  the stream's first 201 samples.
* Frame ``t`` is therefore ready once sample ``160 t + 199`` is in: a look-ahead of 200
  samples, 12.5 ms past the frame's centre. With 10 ms pushes, the push of block ``b``
  (samples ``160 b .. 160 b + 159``) completes frame ``b - 1``: after ``k`` blocks,
  ``frames_ready == k - 1``, and every frame equals the whole-utterance frame. Only the
  utterance's last frame (which Whisper computes with right-edge reflection) is never
  produced: a live stream has no right edge.

CuPy path (used when the kernels pass a self-check against the NumPy specification at
construction): one push of ``F`` frames for ``B`` streams is one launch of the fused kernel of
:mod:`captioner.gpu.logmel_kernel` (two when 32 does not divide ``F``: the last ``F % 32``
frames of several streams share blocks). It reads each stream's history and new samples once into
shared memory and writes finished log-mel (and speaker band) frames into the rings: windowing,
a 400-point real FFT, power, mel filters and ``log10(max(., 1e-10))`` never touch global
memory in between; each stream's first block also rolls its history on.
``fft_precision`` ``"mixed"`` runs the FFT's DFT-25 stage in float64 and keeps every kept cell
within 1e-4 of the specification; ``"float32"`` is faster, within 1e-4 at 80 mels but not
always at 128; ``"auto"`` (default) picks between them by mel count (see
docs/gpu-validation.md). Host input goes through pinned buffers; with ``use_graphs`` (default
on CUDA) a whole push of host frames is one CUDA graph replay, so per-frame latency costs one
launch. NumPy path: the same arithmetic with NumPy (or CuPy) array operations; it is also the
fall-back when the CUDA self-check fails (``path`` says which one runs, ``kernel_error`` why).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from captioner.gpu import features_ref as ref
from captioner.gpu import logmel_kernel, logmel_launch, speech_kernel, window_kernel
from captioner.gpu.backend import Backend

HOP = ref.HOP
N_FFT = ref.N_FFT
N_BINS = ref.N_BINS
HALF = N_FFT // 2  # reflect padding: 200 samples
HISTORY = logmel_launch.HISTORY  # raw samples kept per stream: the oldest the next frame can need
LOOKAHEAD_SAMPLES = HALF  # samples past a frame's centre that it needs (12.5 ms)
LOOKAHEAD_MS = 1000.0 * LOOKAHEAD_SAMPLES / ref.SAMPLE_RATE_HZ

FFT_PRECISIONS = ("auto", "float32", "mixed")


class StreamingFeatures:
    """Per-stream streaming log-mel (and speaker bands) for up to ``max_streams`` streams at once.

    ``ring_frames``: frames kept per stream (3200 = 32 s, a Whisper window and some).
    ``max_push_frames``: frames per stream in one batched step (longer pushes are split).
    ``use_kernels`` / ``use_graphs``: CUDA only; ``None`` = use them if they pass a self-check.
    ``fft_precision``: CUDA only; the fused kernel's FFT arithmetic. ``"mixed"`` runs its first
    stage (the DFT-25s, where float32 rounding was largest) in float64; ``"float32"`` runs all
    of it in float32; ``"auto"`` (default) takes float32 at 80 mels and mixed at 128, the
    fastest that kept every kept cell within 1e-4 (docs/gpu-validation.md).

    All methods are called from one thread: the worker that owns the back-end's GPU.
    """

    def __init__(
        self,
        backend: Backend,
        n_mels: int = 80,
        speaker_bands: bool = False,
        max_streams: int = 8,
        ring_frames: int = 3200,
        max_push_frames: int | None = None,
        use_kernels: bool | None = None,
        use_graphs: bool | None = None,
        fft_precision: str = "auto",
    ) -> None:
        if max_push_frames is None:  # up to 1 s per push by default
            max_push_frames = min(100, ring_frames)
        if max_streams < 1 or ring_frames < 1 or max_push_frames < 1:
            raise ValueError("max_streams, ring_frames and max_push_frames must be >= 1")
        if fft_precision not in FFT_PRECISIONS:
            raise ValueError(f"fft_precision must be one of {FFT_PRECISIONS}, got {fft_precision!r}")
        if fft_precision == "auto":
            fft_precision = logmel_kernel.auto_precision(n_mels)
        if max_push_frames > ring_frames:
            raise ValueError("max_push_frames must not exceed ring_frames")
        if max_push_frames > logmel_launch.MAX_PUSH_FRAMES:
            raise ValueError(f"max_push_frames must not exceed {logmel_launch.MAX_PUSH_FRAMES}")
        self.backend = backend
        self.xp = xp = backend.xp
        self.n_mels = n_mels
        self.n_speaker = ref.SPEAKER_BANDS if speaker_bands else 0
        self.max_streams = max_streams
        self.ring_frames = ring_frames
        self.max_push_frames = max_push_frames
        filters = ref.mel_filters(n_mels)
        self._blocks = np.zeros(max_streams, dtype=np.int64)  # 10 ms blocks pushed per slot
        with backend.activate():
            self._filters_t = xp.asarray(np.ascontiguousarray(filters.T))  # [201, n_mels]
            self._speaker_t = xp.asarray(np.ascontiguousarray(ref.speaker_filters().T)) if self.n_speaker else None
            self._hann = xp.asarray(ref.hann_window())
            self._history = xp.zeros((max_streams, HISTORY), dtype=xp.float32)
            self._mel_ring = xp.zeros((max_streams, ring_frames, n_mels), dtype=xp.float32)
            # Without speaker bands a one-frame stand-in: the kernel takes a pointer either way.
            self._speaker_ring = (xp.zeros((max_streams, ring_frames, self.n_speaker), dtype=xp.float32)
                                  if self.n_speaker else xp.zeros((1, 1, 1), dtype=xp.float32))
        self.graph_error: str | None = None
        self.kernel_error: str | None = None
        self._cuda: _CudaPath | None = None
        if backend.is_cuda and use_kernels is not False:
            try:
                self._cuda = _CudaPath(self, filters, use_graphs=use_graphs is not False, fft_precision=fft_precision)
                self._verify_cuda()
            except Exception as exc:  # self-check failed: the generic path stays correct
                self._cuda = None
                self.kernel_error = f"{type(exc).__name__}: {exc}"
                if use_kernels:
                    raise

    @property
    def path(self) -> str:
        """Which implementation runs: ``generic`` (array ops) or ``cuda-kernels[+graphs]``."""
        if self._cuda is None:
            return "generic"
        return f"cuda-fused-{self._cuda.fft_precision}" + ("+graphs" if self._cuda.use_graphs else "")

    def _verify_cuda(self) -> None:
        """Push a little noise through the kernels and compare with the NumPy specification."""
        rng = np.random.default_rng(11)
        audio = (0.1 * rng.standard_normal(6 * HOP)).astype(np.float32)
        use_graphs = self._cuda.use_graphs
        self._cuda.use_graphs = False
        try:
            self.push(0, audio)
            n = self.frames_ready(0)
            got = self.backend.asnumpy(self.log_mel_window(0, 0, n))
            got_speaker = self.backend.asnumpy(self.speaker_window(0, 0, n)) if self.n_speaker else None
        finally:
            self._cuda.use_graphs = use_graphs
            self.reset(0)
        want = ref.log_mel_spectrogram(audio, self.n_mels)[:, :n]
        err = float(np.abs(got - want).max())
        if self.n_speaker:
            err = max(err, float(np.abs(got_speaker - ref.speaker_log_mel(audio)[:, :n]).max()))
        if not err < 1e-3:
            raise RuntimeError(f"CUDA kernels disagree with the NumPy specification (max error {err:.2e})")

    # ----------------------------------------------------------------------------------
    def frames_ready(self, stream_slot: int) -> int:
        """Absolute count of log-mel frames this slot has produced since its last reset."""
        return max(0, int(self._blocks[stream_slot]) - 1)

    def oldest_frame(self, stream_slot: int) -> int:
        """The oldest frame still in the slot's ring."""
        return max(0, self.frames_ready(stream_slot) - self.ring_frames)

    def reset(self, stream_slot: int) -> None:
        """Forget the slot's audio: the next push starts a new stream (frame 0 again)."""
        self._check_slot(stream_slot)
        self._blocks[stream_slot] = 0
        with self._context():
            self._history[stream_slot] = 0

    def push(self, stream_slot: int, samples) -> None:
        """Append whole 10 ms frames (``len % 160 == 0``) to one stream."""
        self.push_batch([stream_slot], samples.reshape(1, -1))

    def push_batch(self, stream_slots, samples) -> None:
        """Append ``samples[i]`` (same number of whole 10 ms frames per row) to stream
        ``stream_slots[i]``. ``samples`` is ``[B, 160 F]`` float32, on the host or the device."""
        slots = np.asarray(stream_slots, dtype=np.int64).reshape(-1)
        if samples.ndim != 2 or samples.shape[0] != slots.shape[0]:
            raise ValueError(f"samples must be [len(stream_slots), n], got {samples.shape}")
        if slots.size == 0:
            return
        if slots.size > self.max_streams or len(set(slots.tolist())) != slots.size:
            raise ValueError("stream_slots must be distinct and at most max_streams")
        if slots.min() < 0 or slots.max() >= self.max_streams:
            raise ValueError(f"stream slots must be in 0..{self.max_streams - 1}")
        n = samples.shape[1]
        if n % HOP:
            raise ValueError(f"push whole 10 ms frames: {n} samples is not a multiple of {HOP}")
        total_frames = n // HOP
        for start in range(0, total_frames, self.max_push_frames):
            frames = min(self.max_push_frames, total_frames - start)
            chunk = samples[:, start * HOP : (start + frames) * HOP]
            b0 = self._blocks[slots].copy()
            if self._cuda is not None:
                self._cuda.push(slots, b0, chunk, frames)
            else:
                self._push_generic(slots, b0, chunk, frames)
            self._blocks[slots] += frames

    def log_mel_window(self, stream_slot: int, first_frame: int, n_frames: int, out=None):
        """Raw log-mel frames ``first_frame .. first_frame + n_frames - 1`` of a stream as a
        back-end array ``[n_mels, n_frames]`` (into ``out`` when given, e.g. a row of a model's
        batch buffer). Ordered after all pushes on the caller's current CUDA stream."""
        return self._window(self._mel_ring, self.n_mels, stream_slot, first_frame, n_frames, out)

    def log_mel_frames(self, stream_slots, first_frames, n_frames: int):
        """``n_frames`` raw log-mel frames of several streams at once, each from its own first
        frame, as one back-end array ``[len(stream_slots), n_mels, n_frames]`` (one gather:
        the VAD of every stream that was pushed costs one read of the rings, not one each)."""
        slots = np.asarray(stream_slots, dtype=np.int64).reshape(-1)
        firsts = np.asarray(first_frames, dtype=np.int64).reshape(-1)
        if slots.shape != firsts.shape or n_frames < 0:
            raise ValueError("stream_slots and first_frames must match, n_frames be >= 0")
        self._check_reads(slots, firsts, np.full(slots.shape, n_frames, dtype=np.int64))
        xp = self.xp
        cols = (firsts[:, None] + np.arange(n_frames)[None, :]) % self.ring_frames
        with self._context():
            gathered = self._mel_ring[xp.asarray(slots)[:, None], xp.asarray(cols)]  # [B, n, n_mels]
            # Bands on axis 1, frames contiguous: the layout log_mel_window gives one stream.
            out = xp.ascontiguousarray(gathered.transpose(0, 2, 1))
        if self._cuda is not None:
            self._cuda.order_after_pushes()
        return out

    def log_mel_windows(self, stream_slots, first_frames, n_frames) -> list:
        """Raw log-mel windows of several streams, each ``n_frames[i]`` frames from its own
        first frame, read from the rings in ONE gather: a list of back-end arrays
        ``[n_mels, n_frames[i]]``, views of one ``[n_mels, sum(n_frames)]`` array (frames
        contiguous within a band, as :meth:`log_mel_window` gives them; not C-contiguous as a
        whole). A model step's windows cost one gather and one transposing copy, not a few
        copies and an event per stream."""
        index, ends = self._flat_index(stream_slots, first_frames, n_frames)
        starts = np.concatenate(([0], ends[:-1]))
        xp = self.xp
        with self._context():
            # One take along the first axis: NumPy's fancy indexing with two index arrays was
            # slower than the copies per stream it replaces.
            gathered = xp.take(self._mel_ring.reshape(-1, self.n_mels), xp.asarray(index), axis=0)
            flat = xp.ascontiguousarray(gathered.T)  # [n_mels, total]
        if self._cuda is not None:
            self._cuda.order_after_pushes()
        return [flat[:, a:b] for a, b in zip(starts.tolist(), ends.tolist())]

    def speaker_window(self, stream_slot: int, first_frame: int, n_frames: int, out=None):
        """The speaker encoder's bands ``[40, n_frames]`` (``log10`` mel power), like
        :meth:`log_mel_window`."""
        if not self.n_speaker:
            raise ValueError("this StreamingFeatures computes no speaker bands (speaker_bands=False)")
        return self._window(self._speaker_ring, self.n_speaker, stream_slot, first_frame, n_frames, out)

    def speaker_frames(self, stream_slots, first_frames, n_frames):
        """The speaker bands of several streams, ``n_frames[i]`` frames of slot ``stream_slots[i]``
        from ``first_frames[i]``, in one gather: a back-end array ``[sum(n_frames), 40]``, row
        ``i``'s frames at ``[sum(n_frames[:i]), sum(n_frames[:i + 1]))`` (frames on the first
        axis, as the encoder takes them)."""
        if not self.n_speaker:
            raise ValueError("this StreamingFeatures computes no speaker bands (speaker_bands=False)")
        index, _ = self._flat_index(stream_slots, first_frames, n_frames)
        xp = self.xp
        with self._context():
            out = xp.take(self._speaker_ring.reshape(-1, self.n_speaker), xp.asarray(index), axis=0)
        if self._cuda is not None:
            self._cuda.order_after_pushes()
        return out

    def synchronize(self) -> None:
        """Wait until every queued push has finished (for timing, or before a foreign library
        reads the rings from another CUDA stream)."""
        if self._cuda is not None:
            self._cuda.stream.synchronize()
        self.backend.synchronize()

    # ----------------------------------------------------------------------------------
    def _flat_index(self, stream_slots, first_frames, n_frames) -> tuple[np.ndarray, np.ndarray]:
        """Where each frame of a one-gather read of several streams' windows lives in a ring
        seen as ``[slots * ring_frames, bands]``, and each window's end in the gather
        (row ``i`` is ``n_frames[i]`` frames of slot ``stream_slots[i]`` from ``first_frames[i]``)."""
        slots = np.asarray(stream_slots, dtype=np.int64).reshape(-1)
        firsts = np.asarray(first_frames, dtype=np.int64).reshape(-1)
        counts = np.asarray(n_frames, dtype=np.int64).reshape(-1)
        if not slots.shape == firsts.shape == counts.shape or (counts.size and counts.min() < 0):
            raise ValueError("stream_slots, first_frames and n_frames must match, n_frames be >= 0")
        self._check_reads(slots, firsts, counts)
        ends = np.cumsum(counts)
        # Frame j of the flat gather belongs to row r(j), at offset j - starts[r] in its window.
        row_of = np.repeat(np.arange(slots.size), counts)
        total = int(ends[-1]) if ends.size else 0
        cols = (firsts[row_of] + np.arange(total) - (ends - counts)[row_of]) % self.ring_frames
        return slots[row_of] * self.ring_frames + cols, ends

    def _check_slot(self, stream_slot: int) -> None:
        if not 0 <= stream_slot < self.max_streams:
            raise ValueError(f"stream slot must be in 0..{self.max_streams - 1}, got {stream_slot}")

    def _check_reads(self, slots: np.ndarray, firsts: np.ndarray, counts: np.ndarray) -> None:
        """Refuse a gather of ``counts[i]`` frames from ``firsts[i]`` of slot ``slots[i]`` that
        names a slot out of range or frames its ring no longer (or does not yet) hold: the
        checks every several-stream read shares, all in arrays."""
        if slots.size and (slots.min() < 0 or slots.max() >= self.max_streams):
            raise ValueError(f"stream slots must be in 0..{self.max_streams - 1}")
        ready = np.maximum(0, self._blocks[slots] - 1)
        oldest = np.maximum(0, ready - self.ring_frames)
        bad = (firsts < oldest) | (firsts + counts > ready)
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"frames {firsts[k]}..{firsts[k] + counts[k] - 1} of slot {slots[k]} are not in "
                             f"the ring (it holds {oldest[k]}..{ready[k] - 1})")

    def _context(self):
        return self._cuda.stream if self._cuda is not None else self.backend.activate()

    def _window(self, ring, width, stream_slot, first_frame, n_frames, out):
        self._check_slot(stream_slot)
        ready = self.frames_ready(stream_slot)
        oldest = self.oldest_frame(stream_slot)
        if n_frames < 0 or first_frame < oldest or first_frame + n_frames > ready:
            raise ValueError(
                f"frames {first_frame}..{first_frame + n_frames - 1} of slot {stream_slot} are not in "
                f"the ring (it holds {oldest}..{ready - 1})"
            )
        xp = self.xp
        with self._context():
            if out is None:
                out = xp.empty((width, n_frames), dtype=xp.float32)
            elif out.shape != (width, n_frames):
                raise ValueError(f"out must be {(width, n_frames)}, got {out.shape}")
            col = first_frame % self.ring_frames
            first_part = min(n_frames, self.ring_frames - col)
            out[:, :first_part] = ring[stream_slot, col : col + first_part, :width].T
            if first_part < n_frames:
                out[:, first_part:] = ring[stream_slot, : n_frames - first_part, :width].T
        if self._cuda is not None:
            self._cuda.order_after_pushes()
        return out

    def _push_generic(self, slots: np.ndarray, b0: np.ndarray, samples, frames: int) -> None:
        """Array-op twin of the CUDA kernels (NumPy, or CuPy when the kernels are unusable)."""
        xp = self.xp
        with self.backend.activate():
            samples = xp.asarray(samples, dtype=xp.float32)
            n_new = frames * HOP
            slots_x = xp.asarray(slots)
            ext = xp.concatenate([self._history[slots_x], samples], axis=1)  # x[160 b0 - 360 ..)
            # Each row's reflect-padded signal from its first new frame's window on. Past a
            # stream's third block no frame reaches the reflection: it is `ext` itself.
            if b0.min() >= 3:
                padded = ext[:, : n_new + N_FFT - HOP]
            else:
                k = np.arange(n_new + N_FFT - HOP, dtype=np.int64)
                q = (HOP * (b0 - 1))[:, None] + k[None, :]
                e = np.abs(q - HALF) - (HOP * b0 - HISTORY)[:, None]
                e = np.clip(e, 0, HISTORY + n_new - 1)  # out of range only for frames not emitted
                padded = xp.take_along_axis(ext, xp.asarray(e), axis=1)
            if xp is np:
                windows = np.lib.stride_tricks.sliding_window_view(padded, N_FFT, axis=1)[:, ::HOP] * self._hann
            else:
                window_idx = (np.arange(frames) * HOP)[:, None] + np.arange(N_FFT)[None, :]
                windows = padded[:, xp.asarray(window_idx)] * self._hann  # [B, F, 400]
            spectrum = xp.fft.rfft(windows, axis=-1)
            power = (spectrum.real * spectrum.real + spectrum.imag * spectrum.imag).astype(xp.float32)
            # One 2-D product: a stacked [B, F, 201] @ [201, n_mels] is many times slower in NumPy.
            mel = (power.reshape(-1, N_BINS) @ self._filters_t).reshape(power.shape[0], frames, -1)
            log_mel = xp.log10(xp.maximum(mel, xp.float32(ref.LOG_FLOOR)))
            t = (b0 - 1)[:, None] + np.arange(frames)[None, :]  # [B, F]
            valid = t >= 0
            rows, cols = np.nonzero(valid)
            ring_slots = xp.asarray(slots[rows])
            ring_cols = xp.asarray(t[rows, cols] % self.ring_frames)
            rows_x, cols_x = xp.asarray(rows), xp.asarray(cols)
            emitted = log_mel[rows_x, cols_x]  # [V, n_mels]
            self._mel_ring[ring_slots, ring_cols] = emitted
            if self.n_speaker:
                # The same power spectrum through the speaker encoder's 40 bands.
                speaker = (power.reshape(-1, N_BINS) @ self._speaker_t).reshape(power.shape[0], frames, -1)
                speaker = xp.log10(xp.maximum(speaker, xp.float32(ref.LOG_FLOOR)))
                self._speaker_ring[ring_slots, ring_cols] = speaker[rows_x, cols_x]
            self._history[slots_x] = ext[:, -HISTORY:]


_MODULES: dict[tuple[int, str], object] = {}


def _compiled_module(cp, source: str):
    """The kernels compiled once per device and source: every bank of stream slots an engine adds
    builds a ``_CudaPath``, and an NVRTC compile each time stalled every stream
    (benchmarks/results/capacity/HISTORY.md, "Where a full step's time goes").
    Called with the device active, on the thread that owns it."""
    key = (cp.cuda.Device().id, source)
    module = _MODULES.get(key)
    if module is None:
        module = _MODULES[key] = cp.RawModule(code=source, options=("-std=c++17",))
    return module


class _CudaPath:
    """Buffers, the fused kernel and CUDA graphs of the CuPy fast path."""

    def __init__(self, owner: StreamingFeatures, filters: np.ndarray, use_graphs: bool, fft_precision: str) -> None:
        backend = owner.backend
        cp = backend.xp
        self.owner = owner
        self.cp = cp
        self.fft_precision = fft_precision
        with backend.activate():
            self.runtime = cp.cuda.runtime
            self.n_sms = cp.cuda.Device().attributes["MultiProcessorCount"]
            self.stream = cp.cuda.Stream(non_blocking=True)
            speaker = ref.speaker_filters() if owner.n_speaker else None
            module = _compiled_module(cp, logmel_kernel.kernel_source(filters, fft_precision, speaker))
            self.k_fused = module.get_function("captioner_logmel_fused")  # full blocks of 32 frames
            self.k_packed = module.get_function("captioner_logmel_packed")  # the remainders
            self.shared_bytes = logmel_launch.shared_bytes(fft_precision)
            for kernel in (self.k_fused, self.k_packed):
                kernel.max_dynamic_shared_size_bytes = self.shared_bytes
            s, f = owner.max_streams, owner.max_push_frames
            self.samples_dev = cp.zeros(s * f * HOP, dtype=cp.float32)
            self.params_dev = cp.zeros(3 * s, dtype=cp.int64)
            # Two sets of pinned staging buffers, used in turn, so that the host fills one while
            # the previous push's copies may still be reading the other.
            self.samples_host = [backend.empty_pinned((s * f * HOP,), np.float32) for _ in range(2)]
            self.params_host = [backend.empty_pinned((3 * s,), np.int64) for _ in range(2)]
            self.copies_done = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
            for event in self.copies_done:
                event.record(self.stream)
            self.turn = 0
        self.graphs: dict[tuple[int, int, int], object] = {}
        self.use_graphs = use_graphs

    def _launch(self, samples, n_rows: int, frames: int) -> None:
        """Queue the fused kernels on the current stream (also while capturing a graph).

        ``params_dev`` holds the rows' slots, their block counts, then the ring column of each
        row's frame ``b0 - 1`` (worked out on the host: a 64-bit modulo per thread was a tenth of
        the kernel's instructions).
        """
        owner = self.owner
        i32 = np.int32
        slots = self.params_dev[:n_rows]
        b0s = self.params_dev[n_rows : 2 * n_rows]
        cols = self.params_dev[2 * n_rows : 3 * n_rows]
        args = (
            samples, slots, b0s, cols, owner._history, owner._mel_ring, owner._speaker_ring,
            i32(n_rows), i32(frames), i32(owner.ring_frames),
        )
        logmel_launch.launch((self.k_fused, self.k_packed), args, n_rows, frames, self.n_sms, self.shared_bytes)

    def _copy_params(self, n_rows: int, turn: int) -> None:
        self.runtime.memcpyAsync(
            self.params_dev.data.ptr, self.params_host[turn].ctypes.data, 3 * n_rows * 8,
            self.runtime.memcpyHostToDevice, self.stream.ptr,
        )

    def _copy_samples(self, n_rows: int, frames: int, turn: int) -> None:
        self.runtime.memcpyAsync(
            self.samples_dev.data.ptr, self.samples_host[turn].ctypes.data, n_rows * frames * HOP * 4,
            self.runtime.memcpyHostToDevice, self.stream.ptr,
        )

    def push(self, slots: np.ndarray, b0: np.ndarray, samples, frames: int) -> None:
        cp = self.cp
        n_rows = slots.size
        turn = self.turn = 1 - self.turn
        # This turn's pinned buffers are read by the copies of the push before last until those
        # have run (the event follows that whole push: a wait only when the GPU is 2 pushes behind).
        self.copies_done[turn].synchronize()
        params_host = self.params_host[turn]
        params_host[:n_rows] = slots
        params_host[n_rows : 2 * n_rows] = b0
        params_host[2 * n_rows : 3 * n_rows] = (b0 - 1) % self.owner.ring_frames
        with self.owner.backend.activate():
            if isinstance(samples, cp.ndarray):  # made on the caller's stream: wait for it
                self.stream.wait_event(cp.cuda.get_current_stream().record())
        with self.owner.backend.activate(), self.stream:
            if isinstance(samples, cp.ndarray):
                source = cp.ascontiguousarray(samples, dtype=cp.float32).reshape(-1)
                if source.data.ptr % 16:  # the kernel reads new samples as float4
                    source = source.copy()
                self._copy_params(n_rows, turn)
                self.copies_done[turn].record(self.stream)
                self._launch(source, n_rows, frames)
                return
            n_samples = n_rows * frames * HOP
            staging = self.samples_host[turn][:n_samples].reshape(n_rows, frames * HOP)
            np.copyto(staging, samples, casting="same_kind")
            graph = self._graph(n_rows, frames, turn) if self.use_graphs else None
            if graph is not None:
                graph.launch(self.stream)
            else:
                self._copy_params(n_rows, turn)
                self._copy_samples(n_rows, frames, turn)
                self._launch(self.samples_dev, n_rows, frames)
            self.copies_done[turn].record(self.stream)

    def _graph(self, n_rows: int, frames: int, turn: int):
        """The whole push (copies from this turn's pinned buffers + kernels) as one CUDA graph."""
        key = (n_rows, frames, turn)
        if key in self.graphs:
            return self.graphs[key]
        self.stream.synchronize()
        graph = None
        try:
            self.stream.begin_capture()
            try:
                self._copy_params(n_rows, turn)
                self._copy_samples(n_rows, frames, turn)
                self._launch(self.samples_dev, n_rows, frames)
            finally:
                graph = self.stream.end_capture()
        except Exception as exc:  # graphs are an optimisation: fall back to plain launches
            self.owner.graph_error = f"{type(exc).__name__}: {exc}"
            self.use_graphs = False
            graph = None
        if graph is not None:
            try:  # uploading now keeps the one-time set-up out of the first replay
                graph.upload(self.stream)
            except Exception:  # older CuPy: the first launch uploads it
                pass
        self.graphs[key] = graph
        return graph

    def order_after_pushes(self) -> None:
        """Make the caller's current stream wait for the pushes queued on ours."""
        self.cp.cuda.get_current_stream().wait_event(self.stream.record())


def bank_bytes(n_streams: int, n_mels: int, n_speaker: int, ring_frames: int, max_push_frames: int) -> int:
    """Memory one :class:`StreamingFeatures` of ``n_streams`` slots holds on its back-end
    (histories, log-mel and speaker band rings, the CUDA path's device staging buffers), worked
    out from the shapes alone, so that a caller can count a bank's cost before allocating it.
    ``n_speaker``: speaker bands per frame (0 or 40)."""
    per_stream = HISTORY + ring_frames * n_mels + ring_frames * n_speaker
    staging = max_push_frames * HOP + 3 * 2  # samples (float32) and params (int64, as 2 floats)
    return 4 * n_streams * (per_stream + staging)


class RingWindow(NamedTuple):
    """A stream's window in a pool's rings, not yet read: ``n_frames`` log-mel frames of slot
    ``slot`` from ``first_frame``. The engine hands these to a recognizer that builds its batch
    from the rings itself (``reads_rings``, :meth:`FeaturePool.model_input`); :meth:`read`
    gives the frames as an array ``[n_mels, n_frames]``."""

    pool: FeaturePool
    slot: int
    first_frame: int
    n_frames: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.pool.n_mels, self.n_frames)

    def read(self):
        return self.pool.log_mel_window(self.slot, self.first_frame, self.n_frames)


class FeaturePool:
    """Feature rings for any number of streams, in banks of ``block_streams`` slots.

    A bank is a :class:`StreamingFeatures` allocated whole when the pool grows (on the GPU and
    the CPU alike), so a stream opened later never allocates inside a step; banks are kept once
    made (a stream that closes frees its slot for the next one). Slot ``s`` lives in bank
    ``s // block_streams``; a batched push is one call per bank it touches.

    Called only by the thread that owns the back-end (the engine's).
    """

    def __init__(self, backend: Backend, n_mels: int = 80, speaker_bands: bool = True, ring_frames: int = 3200,
                 block_streams: int = 64, **bank_options) -> None:
        if block_streams < 1:
            raise ValueError(f"block_streams must be >= 1, got {block_streams}")
        self.backend = backend
        self.n_mels = n_mels
        self.speaker_bands = bool(speaker_bands)
        self.ring_frames = ring_frames
        self.block_streams = block_streams
        self._options = bank_options
        self._max_push_frames = bank_options.get("max_push_frames") or min(100, ring_frames)
        self.banks: list[StreamingFeatures] = []
        self._free: list[int] = []  # free slots, kept sorted: the lowest is handed out first

    # -- slots -------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Slots allocated (in use or free)."""
        return len(self.banks) * self.block_streams

    @property
    def bytes_allocated(self) -> int:
        return len(self.banks) * self.block_bytes

    @property
    def block_bytes(self) -> int:
        """What one more bank costs on the back-end (see :func:`bank_bytes`)."""
        n_speaker = ref.SPEAKER_BANDS if self.speaker_bands else 0
        return bank_bytes(self.block_streams, self.n_mels, n_speaker, self.ring_frames, self._max_push_frames)

    @property
    def needs_block(self) -> bool:
        """Whether the next :meth:`acquire` allocates a new bank."""
        return not self._free

    @property
    def path(self) -> str:
        return self.banks[0].path if self.banks else "none"

    def grow(self) -> None:
        """Allocate one more bank of ``block_streams`` slots."""
        first = self.capacity
        self.banks.append(StreamingFeatures(self.backend, n_mels=self.n_mels, speaker_bands=self.speaker_bands,
                                            max_streams=self.block_streams, ring_frames=self.ring_frames,
                                            **self._options))
        self._free = sorted(self._free + list(range(first, first + self.block_streams)))

    def acquire(self) -> int:
        """A free slot, reset (the pool grows by a bank when none is free)."""
        if not self._free:
            self.grow()
        slot = self._free.pop(0)
        self.reset(slot)
        return slot

    def release(self, slot: int) -> None:
        bank, _ = self._where(slot)
        if slot in self._free:
            raise ValueError(f"slot {slot} is already free")
        self._free.append(slot)
        self._free.sort()

    # -- the StreamingFeatures interface, per slot -------------------------------------------
    def _where(self, slot: int) -> tuple[StreamingFeatures, int]:
        if not 0 <= slot < self.capacity:
            raise ValueError(f"stream slot must be in 0..{self.capacity - 1}, got {slot}")
        return self.banks[slot // self.block_streams], slot % self.block_streams

    def frames_ready(self, slot: int) -> int:
        # Asked for every stream on every tick: the plain look-up, without _where's checks.
        if slot < 0:
            raise ValueError(f"stream slot must be >= 0, got {slot}")
        try:
            blocks = self.banks[slot // self.block_streams]._blocks[slot % self.block_streams]
        except IndexError:
            raise ValueError(f"stream slot must be in 0..{self.capacity - 1}, got {slot}") from None
        return max(0, int(blocks) - 1)

    def oldest_frame(self, slot: int) -> int:
        bank, local = self._where(slot)
        return bank.oldest_frame(local)

    def frames_ready_many(self, slots) -> np.ndarray:
        """:meth:`frames_ready` of many slots at once (int64 array; their oldest frames in the
        ring are ``max(0, ready - ring_frames)``)."""
        slots = np.asarray(slots, dtype=np.int64)
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"stream slots must be in 0..{self.capacity - 1}")
        blocks = np.concatenate([bank._blocks for bank in self.banks]) if self.banks else np.zeros(0, np.int64)
        return np.maximum(0, blocks[slots] - 1)

    def reset(self, slot: int) -> None:
        bank, local = self._where(slot)
        bank.reset(local)

    def log_mel_window(self, slot: int, first_frame: int, n_frames: int, out=None):
        bank, local = self._where(slot)
        return bank.log_mel_window(local, first_frame, n_frames, out)

    def log_mel_frames(self, slots, first_frames, n_frames: int):
        """As :meth:`StreamingFeatures.log_mel_frames`, across banks (one gather per bank),
        rows in the order of ``slots``."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        firsts = np.asarray(first_frames, dtype=np.int64).reshape(-1)
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"stream slots must be in 0..{self.capacity - 1}")
        banks = slots // self.block_streams
        order = np.argsort(banks, kind="stable")
        parts = []
        for b in np.unique(banks):
            rows = order[banks[order] == b]
            parts.append(self.banks[int(b)].log_mel_frames(slots[rows] % self.block_streams, firsts[rows], n_frames))
        xp = self.backend.xp
        if not parts:
            return xp.zeros((0, self.n_mels, n_frames), dtype=xp.float32)
        with self.backend.activate():
            joined = parts[0] if len(parts) == 1 else xp.concatenate(parts)
            if len(parts) == 1 or np.array_equal(order, np.arange(order.size)):
                return joined
            inverse = np.empty_like(order)
            inverse[order] = np.arange(order.size)
            return joined[xp.asarray(inverse)]

    def log_mel_windows(self, slots, first_frames, n_frames) -> list:
        """As :meth:`StreamingFeatures.log_mel_windows`, across banks (one gather per bank),
        windows in the order of ``slots``."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        firsts = np.asarray(first_frames, dtype=np.int64).reshape(-1)
        counts = np.asarray(n_frames, dtype=np.int64).reshape(-1)
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"stream slots must be in 0..{self.capacity - 1}")
        banks = slots // self.block_streams
        out: list = [None] * slots.size
        for b in np.unique(banks).tolist():
            rows = np.nonzero(banks == b)[0]
            windows = self.banks[b].log_mel_windows(slots[rows] % self.block_streams, firsts[rows], counts[rows])
            for row, window in zip(rows.tolist(), windows):
                out[row] = window
        return out

    def speaker_frames(self, slots, first_frames, counts):
        """As :meth:`StreamingFeatures.speaker_frames`, across banks (one gather per bank):
        ``[sum(counts), 40]``, the frames of the rows in the order of ``slots``."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        firsts = np.asarray(first_frames, dtype=np.int64).reshape(-1)
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"stream slots must be in 0..{self.capacity - 1}")
        xp = self.backend.xp
        banks = slots // self.block_streams
        touched = np.unique(banks).tolist()
        if len(touched) == 1:
            return self.banks[touched[0]].speaker_frames(slots % self.block_streams, firsts, counts)
        pieces: list = [None] * slots.size
        for b in touched:
            rows = np.nonzero(banks == b)[0]
            gathered = self.banks[b].speaker_frames(slots[rows] % self.block_streams, firsts[rows], counts[rows])
            ends = np.cumsum(counts[rows])
            for row, end, n in zip(rows.tolist(), ends.tolist(), counts[rows].tolist()):
                pieces[row] = gathered[end - n:end]
        with self.backend.activate():
            return xp.concatenate(pieces) if pieces else xp.zeros((0, ref.SPEAKER_BANDS), dtype=xp.float32)

    @property
    def measures_on_device(self) -> bool:
        """Whether :meth:`speech_measures` can run (every bank on the CUDA kernels' path)."""
        return bool(self.banks) and all(bank._cuda is not None for bank in self.banks)

    def speech_measures(self, slots, first_frames, counts, backs, band: tuple[int, int], lag: int,
                        range_db: float, full_scale_db: float) -> tuple[np.ndarray, np.ndarray]:
        """The VAD's band energy and spectral change of ``counts[i]`` frames of slot ``slots[i]``
        from frame ``first_frames[i]`` on, each compared with the frame ``lag`` earlier (of which
        ``backs[i]`` <= ``lag`` may be read; earlier ones stand in as the first readable),
        computed from the rings by one kernel launch (:mod:`captioner.gpu.speech_kernel`) for
        all rows of all banks. Returns two float32 host arrays of ``sum(counts)`` values, row
        ``i``'s frames at ``[sum(counts[:i]), sum(counts[:i + 1]))``. CUDA only
        (:attr:`measures_on_device`); the NumPy path gathers with :meth:`log_mel_frames`."""
        if not self.measures_on_device:
            raise RuntimeError("speech_measures needs every bank on the CUDA kernels' path")
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        firsts = np.asarray(first_frames, dtype=np.int64).reshape(-1)
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        backs = np.asarray(backs, dtype=np.int64).reshape(-1)
        if not slots.shape == firsts.shape == counts.shape == backs.shape:
            raise ValueError("slots, first_frames, counts and backs must match")
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"stream slots must be in 0..{self.capacity - 1}")
        if counts.size and (counts.min() < 1 or backs.min() < 0 or backs.max() > lag):
            raise ValueError("every row needs at least one frame, and 0..lag frames back")
        addresses, touched = self._ring_reads(slots, firsts - backs, counts + backs)
        cp = self.backend.xp
        table, total = speech_kernel.row_table(addresses, firsts % self.ring_frames, counts, backs)
        with self.backend.activate():
            for b in touched:
                self.banks[b]._cuda.order_after_pushes()  # each bank pushes on a stream of its own
            table_dev = cp.asarray(table)
            out = cp.empty(2 * max(total, 1), dtype=cp.float32)
            speech_kernel.launch(speech_kernel.compiled(cp), table_dev, slots.size, total, self.ring_frames, self.n_mels,
                                 band, lag, range_db, full_scale_db, out[:total], out[total:2 * total])
            host = out[:2 * total].get()  # one copy back
        return host[:total], host[total:]

    def compile_ring_kernels(self) -> None:
        """Compile the kernels that read the rings now (NVRTC, once per process and device) rather
        than at their first launch; nothing on the NumPy path."""
        if self.measures_on_device:
            with self.backend.activate():
                speech_kernel.compiled(self.backend.xp)
                window_kernel.compiled(self.backend.xp)

    def _ring_reads(self, slots: np.ndarray, firsts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """Check reads of ``counts[i]`` frames from ``firsts[i]`` of each slot (every bank's
        rings must hold them) and give each slot's ring address (its first ring frame, on the
        device) and the banks read, for the kernels that read rings directly."""
        banks = slots // self.block_streams
        local = slots % self.block_streams
        touched = np.unique(banks).tolist()
        for b in touched:
            rows = banks == b
            self.banks[b]._check_reads(local[rows], firsts[rows], counts[rows])
        bases = np.array([bank._mel_ring.data.ptr for bank in self.banks], dtype=np.int64)
        return bases[banks] + local * (self.ring_frames * self.n_mels * 4), touched

    def model_input(self, slots, first_frames, counts, width: int, floor_value: float, clamp: float, offset: float,
                    scale: float, out):
        """A model step's batch from the rings (:mod:`captioner.gpu.window_kernel`): row ``i`` of
        ``out`` ([B, n_mels, width] float32 on the device, C order) becomes the last
        ``min(counts[i], width)`` of the ``counts[i]`` frames of slot ``slots[i]`` from frame
        ``first_frames[i]``, then ``floor_value`` up to ``width``, each value clamped to at most
        ``clamp`` below the row's peak, plus ``offset``, times ``scale``: Whisper's padded,
        normalised window. Two kernel launches for all rows of all banks. CUDA only
        (:attr:`measures_on_device`); returns ``out``."""
        if not self.measures_on_device:
            raise RuntimeError("model_input needs every bank on the CUDA kernels' path")
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        firsts = np.asarray(first_frames, dtype=np.int64).reshape(-1)
        counts = np.asarray(counts, dtype=np.int64).reshape(-1)
        if not slots.shape == firsts.shape == counts.shape or (counts.size and counts.min() < 0):
            raise ValueError("slots, first_frames and counts must match, counts be >= 0")
        if slots.size and (slots.min() < 0 or slots.max() >= self.capacity):
            raise ValueError(f"stream slots must be in 0..{self.capacity - 1}")
        if tuple(out.shape) != (slots.size, self.n_mels, width):
            raise ValueError(f"out must be {(slots.size, self.n_mels, width)}, not {tuple(out.shape)}")
        used = np.minimum(counts, width)
        start = firsts + counts - used  # a window longer than the width: its last frames
        addresses, touched = self._ring_reads(slots, start, used)
        cp = self.backend.xp
        table = window_kernel.row_table(addresses, start % self.ring_frames, used)
        with self.backend.activate():
            for b in touched:
                self.banks[b]._cuda.order_after_pushes()
            peaks = cp.empty(max(slots.size, 1), dtype=cp.float32)
            window_kernel.launch(window_kernel.compiled(cp), cp.asarray(table), slots.size, self.ring_frames, self.n_mels,
                                 width, floor_value, clamp, offset, scale, peaks, out)
        return out

    def push_batch(self, slots, samples) -> None:
        """``samples[i]`` to slot ``slots[i]`` (as :meth:`StreamingFeatures.push_batch`): one
        batched push per bank."""
        slots = np.asarray(slots, dtype=np.int64).reshape(-1)
        if samples.shape[0] != slots.shape[0]:
            raise ValueError(f"samples must be [len(slots), n], got {samples.shape}")
        banks = slots // self.block_streams
        for b in np.unique(banks):
            rows = np.nonzero(banks == b)[0]
            if int(b) >= len(self.banks) or slots.min() < 0:
                raise ValueError(f"stream slots must be in 0..{self.capacity - 1}")
            if rows.size == slots.size:
                chunk = samples
            elif rows[-1] - rows[0] + 1 == rows.size:  # one run of rows (slots come in order): a view
                chunk = samples[int(rows[0]):int(rows[-1]) + 1]
            else:
                chunk = samples[rows]
            self.banks[int(b)].push_batch(slots[rows] % self.block_streams, chunk)

    def synchronize(self) -> None:
        for bank in self.banks:
            bank.synchronize()
