"""Capacity: how many concurrent real-time streams one engine (one GPU, or the CPU) serves.

N streams of real speech (the English recordings of the speech set, each stream playing them
one after another from its own starting recording, after its own lead-in of room noise, so the
streams neither start nor speak in step) go through the public API (``LiveCaptioner``, one
thread) on a simulated clock that charges every model step, and all host work between steps,
its measured duration: audio keeps arriving while the engine works, as in a live session, and
idle waiting costs no wall time. N doubles from 1 up to ``--max-n`` while the time limit allows
and the engine keeps up.

Per N and configuration (model × decoding place):

- step time (p50/p99 of the batched model calls), and per stream-update: wall time, host CPU
  time (the process, every thread, during model calls), GPU time (NVML utilisation sampled
  during the run × the run's wall time, on CUDA only);
- engine host time outside the model per stream-second of audio (ingest, features, VAD,
  scheduling, policy: what bounds a host before the model does);
- update interval p50/p99 (clock time between consecutive updates of one segment of a stream);
- caption latency p50/p99 of each reference word, shown (partial) and committed, against its
  end in the audio (word times by forced alignment, ``benchmarks/word_times.py``; tiny.en's
  alignment serves every model: it is a property of the audio);
- committed WER of the streams against the references, beside the same model's offline WER on
  the same recordings (the offline path, ``captioner.engine.offline``);
- VRAM: the feature pool's bytes per stream, and the device's used memory growth per stream.

Host and device decoding side by side: ``--decode-on host,device`` runs both with one loaded
model each (``WhisperRecognizer(decode_on=...)``, where the checkout has it; otherwise only the
host path runs and the report says so).

Admission is relaxed for the measurement (every stream is opened whatever the time budget says;
the 15 % VRAM floor still holds and its refusals are reported); the engine's own estimate —
admitted load, predicted interval, fitted step costs — is recorded beside the measurement.

Run (here):  .venv/bin/python benchmarks/bench_capacity.py --device cpu --max-n 4 --audio-s 20 --out benchmarks/results/capacity/2026-12-01-cpu-capacity.json
Run (H200):  PYTHONPATH=src:/tmp/site:/tmp/stage/ortsite:/tmp/stage python3 benchmarks/bench_capacity.py \
                 --device cuda:0 --models tiny.en,base --decode-on host,device --max-n 4096 \
                 --time-limit-s 1500 --out $OUT/capacity-h200.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import inspect
import json
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from bench_first_runs import change_session_options, set_mem_pattern  # noqa: E402
from bench_latency import NORMALIZER_NAME, match, percentile, split_words, wer_counts  # noqa: E402
from captioner.errors import UserError  # noqa: E402
from captioner.models import gpu_memory  # noqa: E402
from captioner.serve.engine_link import SERVER_POLICY  # noqa: E402
from word_times import load_manifest, word_times  # noqa: E402

SR = 16_000
GAP_S = 0.8
"""Room noise between two recordings of a stream: a pause, which keeps the segment open (it
closes at the policy's long pause), so a caption may hold the end of one recording and the start
of the next."""
TAIL_S = 2.0
MAX_LEAD_S = 3.0
TICK_S = 0.1
"""Audio handed to every stream per loop: 100 ms blocks, as a WebSocket client sends them."""


# -- the streams' programmes ----------------------------------------------------------------------
@dataclass
class Clip:
    id: str
    audio: np.ndarray
    words: list[dict]
    reference: str
    offline: str = ""


@dataclass
class Programme:
    """What one stream plays: room noise, recordings with gaps, room noise; built lazily from
    the shared clips so thousands of streams cost no memory of their own."""

    pieces: list[tuple[int, object]] = field(default_factory=list)  # (first sample, Clip or n noise samples)
    n_samples: int = 0

    @property
    def clips(self) -> list[tuple[float, Clip]]:
        """(start s on the stream's clock, clip) of each recording played."""
        return [(start / SR, piece) for start, piece in self.pieces if isinstance(piece, Clip)]

    def add_noise(self, seconds: float) -> None:
        n = int(round(seconds * SR))
        self.pieces.append((self.n_samples, n))
        self.n_samples += n

    def add_clip(self, clip: Clip) -> None:
        self.pieces.append((self.n_samples, clip))
        self.n_samples += clip.audio.shape[0]

    def samples(self, first: int, stop: int, room: np.ndarray) -> np.ndarray:
        out = np.empty(stop - first, dtype=np.float32)
        for start, piece in self.pieces:
            length = piece if isinstance(piece, int) else piece.audio.shape[0]
            a, b = max(first, start), min(stop, start + length)
            if a >= b:
                continue
            if isinstance(piece, int):
                out[a - first:b - first] = room[np.arange(a, b) % room.shape[0]]
            else:
                out[a - first:b - first] = piece.audio[a - start:b - start]
        return out


def clip_latencies(updates, start_s: float, end_s: float, clip: Clip) -> tuple[list, list]:
    """Shown and committed latencies of the clip's words, from the updates whose text ends within
    the clip's span (a caption that runs on into the next recording counts there)."""
    mine = [u for u in updates if start_s <= u.end_s <= end_s + GAP_S]
    keys = [w for w, _ in clip.words]
    first_shown: dict[int, float] = {}
    committed_at: dict[int, float] = {}
    committed: list[str] = []
    for u in mine:
        partial: list[str] = []
        if u.kind == "final":
            committed += split_words(u.text)
            for j in match(keys, committed):
                committed_at.setdefault(j, u.emitted_wall_s)
        else:
            partial = split_words(u.text)
        for j in match(keys, committed + partial):
            first_shown.setdefault(j, u.emitted_wall_s)
    shown = [first_shown[j] - (start_s + e) for j, (_, e) in enumerate(clip.words) if j in first_shown]
    done = [committed_at[j] - (start_s + e) for j, (_, e) in enumerate(clip.words) if j in committed_at]
    return shown, done


def programmes(n: int, clips: list[Clip], audio_s: float) -> list[Programme]:
    out = []
    for i in range(n):
        p = Programme()
        p.add_noise(0.5 + (i * 0.618034 % 1.0) * (MAX_LEAD_S - 0.5))
        k = i % len(clips)
        while p.n_samples < audio_s * SR:
            p.add_clip(clips[k % len(clips)])
            p.add_noise(GAP_S)
            k += 1
        p.add_noise(TAIL_S)
        out.append(p)
    return out


def load_clips(model: str, device: str, max_clips: int | None, offline: bool = True) -> list[Clip]:
    import soundfile as sf

    from captioner.engine.offline import (
        TranscribeOptions,
        load_decoder,
        transcribe_file,
    )

    times = word_times("tiny.en")
    rows = [c for c in load_manifest() if c["language"] == "en" and c["id"] in times]
    rows = rows[:max_clips] if max_clips else rows
    decoder = load_decoder(model, device) if offline else None
    clips = []
    for c in rows:
        audio, rate = sf.read(c["path"], dtype="float32")
        assert rate == SR, c["id"]
        words = [(k, w["end_s"]) for w in times[c["id"]] for k in split_words(w["word"])[:1]]
        text = transcribe_file(c["path"], TranscribeOptions(model=model, device=device), decoder=decoder).text \
            if offline else ""
        clips.append(Clip(c["id"], audio, words, c["reference"], text))
    return clips


# -- the model ------------------------------------------------------------------------------------
def device_decoding_available() -> bool:
    from captioner.engine.whisper import WhisperRecognizer

    return "decode_on" in inspect.signature(WhisperRecognizer).parameters


def load_recognizer(model: str, device: str, decode_on: str):
    """(backend, recognizer) as ``captioner.engine.live.load_recognizer``, with the decoding
    place chosen where the checkout has the switch."""
    from captioner.engine.whisper import WhisperRecognizer
    from captioner.gpu.backend import get_backend
    from captioner.models.runtime import load_runtime
    from captioner.models.tokenizer import WhisperTokenizer

    backend = get_backend(device)
    backend.use()
    runtime = load_runtime(model, device=backend.name)
    tokenizer = WhisperTokenizer(runtime.files.tokenizer_path, runtime.files.config_path, n_vocab=runtime.n_vocab)
    extra = {"decode_on": decode_on} if device_decoding_available() else {}
    return backend, WhisperRecognizer(runtime, tokenizer, xp=backend.xp,
                                      synchronize=backend.synchronize if backend.is_cuda else None, **extra)


class NoModel:
    """``--engine-only``: a recognizer that hears nothing, at once, so a run measures the
    engine's own host path (ingest, features, VAD, scheduling, policy) at any N. Not a model:
    its WER and latency columns are empty."""

    name = "none (engine only)"
    provider = "none"
    device_name = "none"
    is_multilingual = False

    def __init__(self, n_mels: int = 80) -> None:
        self.n_mels = n_mels

    def decode(self, requests):
        from captioner.engine.policy.words import Hypothesis

        return [Hypothesis((), r.start_s, r.start_s + r.log_mel.shape[1] / 100.0) for r in requests]


class GpuSampler:
    """NVML utilisation and memory, sampled every 50 ms on a thread of the benchmark's own."""

    def __init__(self, gpu_index: int | None) -> None:
        self.samples: list[tuple[float, float | None, int | None]] = []
        self.process_bytes: list[int] = []  # this process's own GPU memory (NVML), each sample
        self._gpu_index = gpu_index
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-gpu-sampler", daemon=True)

    def __enter__(self):
        if self._gpu_index is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        from captioner.gpu.telemetry import NvmlReader

        reader = NvmlReader(self._gpu_index)  # made and read on this thread, as NvmlReader asks
        try:
            while reader.available and not self._stop.wait(0.05):
                gpu = reader.read_gpu()
                self.samples.append((time.perf_counter(), gpu.get("utilization_pct"), gpu.get("vram_used_bytes")))
                if gpu.get("vram_process_bytes") is not None:
                    self.process_bytes.append(int(gpu["vram_process_bytes"]))
        finally:
            reader.close()

    @property
    def utilization(self) -> float | None:
        values = [u for _, u, _ in self.samples if u is not None]
        return float(np.mean(values)) / 100.0 if values else None

    @property
    def peak_used_bytes(self) -> int | None:
        values = [m for _, _, m in self.samples if m is not None]
        return max(values) if values else None

    @property
    def peak_process_bytes(self) -> int | None:
        return max(self.process_bytes) if self.process_bytes else None


def process_gpu_bytes(gpu_index: int | None) -> int | None:
    """This process's GPU memory now, as NVML counts it (``None`` off a GPU or without NVML)."""
    if gpu_index is None:
        return None
    from captioner.gpu.telemetry import NvmlReader

    reader = NvmlReader(gpu_index)
    try:
        return reader.read_gpu().get("vram_process_bytes")
    finally:
        reader.close()


def memory_breakdown(backend, gpu_index: int | None) -> dict:
    """The process's GPU memory (NVML) and CuPy's pool, in bytes, at one moment."""
    pool = backend.xp.get_default_memory_pool() if backend.is_cuda else None
    return {"process_bytes": process_gpu_bytes(gpu_index),
            "cupy_pool_used_bytes": None if pool is None else int(pool.used_bytes()),
            "cupy_pool_total_bytes": None if pool is None else int(pool.total_bytes())}


CUT_VALUES = {"prefix": ("on", "off"), "rings": ("on", "off"), "riders": ("load", "on"), "fill": ("on", "off", "ROWS"),
              "closewait": ("0", "SECONDS"), "overlap": ("auto", "off"), "compact": ("on", "off"),
              "widths": ("auto", "split", "merge"), "speakers": ("off", "on"),
              "policy": ("auto", "localagreement", "alignatt", "alignatt-gpu")}
"""Each ``--cuts`` key, its values; the first is the default (``ROWS``, ``SECONDS``: a number)."""


def _seconds(text: str) -> bool:
    try:
        return 0 <= float(text) <= 2
    except ValueError:
        return False


def parse_cut(text: str) -> dict[str, str]:
    """One ``--cuts`` setting, e.g. ``prefix=off,rings=on`` (unnamed ones at their default)."""
    cut = {key: values[0] for key, values in CUT_VALUES.items()}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, _, value = part.partition("=")
        numeric = (key == "fill" and value.isdigit() and int(value) > 0) or (key == "closewait" and _seconds(value))
        if value not in CUT_VALUES.get(key, ()) and not numeric:
            raise ValueError(f"--cuts: {part!r} is not one of " +
                             ", ".join(f"{k}={'|'.join(v)}" for k, v in CUT_VALUES.items()))
        cut[key] = value
    return cut


# -- one run --------------------------------------------------------------------------------------
def graph_run_stats(before: dict, after: dict, steps: int, updates: int) -> dict:
    """Per graph, between two ``WhisperRuntime.graph_runs()`` readings: runs, runs per engine
    step, wall ms per run and per stream-update."""
    stats = {}
    for name, (runs, seconds) in after.items():
        runs -= before.get(name, (0, 0.0))[0]
        seconds -= before.get(name, (0, 0.0))[1]
        if runs:
            stats[name] = {"runs": runs, "runs_per_step": round(runs / max(1, steps), 2),
                           "ms_per_run": round(1e3 * seconds / runs, 3),
                           "ms_per_update": round(1e3 * seconds / max(1, updates), 4)}
    return stats


def set_ort_threads(setting: str) -> None:
    """``--ort-threads``: ONNX Runtime sessions opened from now on run their CPU work on one
    intra-op thread, or on the default pool with its threads not spin-waiting between runs
    (each session has its own pool; with several sessions per model their spinning threads
    compete with the engine's Python thread for the cores)."""
    if setting not in ("default", "one", "nospin"):
        raise ValueError(f"--ort-threads takes default, one or nospin, got {setting!r}")
    if setting == "one":
        change_session_options(lambda so: setattr(so, "intra_op_num_threads", 1))
    elif setting == "nospin":
        change_session_options(lambda so: so.add_session_config_entry("session.intra_op.allow_spinning", "0"))


def set_cudnn_attention(setting: str) -> None:
    """``--cudnn-attention``: ``package`` leaves the package's choice (cuDNN's fused attention off
    for the prompt prefill's sessions only); ``on``/``off`` set ONNX Runtime's switch in the
    environment, which then holds for every session (``session.CUDNN_ATTENTION_ENV``)."""
    if setting not in ("package", "on", "off"):
        raise ValueError(f"--cudnn-attention takes package, on or off, got {setting!r}")
    if setting != "package":
        from captioner.models.session import CUDNN_ATTENTION_ENV

        os.environ[CUDNN_ATTENTION_ENV] = "1" if setting == "on" else "0"


def profile_graph_sessions(graph: str) -> list:
    """``--ort-profile GRAPH``: sessions opened from now on for the ONNX file ``GRAPH.onnx``
    (``decoder_prefill``, ``encoder``, ...) record ONNX Runtime's own per-node profile. Returns the
    list those sessions are appended to (``node_profile`` reads them after the run)."""
    from captioner.models import session

    profiled: list = []
    init = session.OrtModel.__init__
    wanted = {"on": False}

    def with_profiling(so) -> None:
        if wanted["on"]:
            so.enable_profiling = True
            so.profile_file_prefix = f"ort-profile-{graph}"

    def opened(self, path, *args, **kwargs):
        wanted["on"] = Path(path).stem == graph
        try:
            init(self, path, *args, **kwargs)
        finally:
            wanted["on"] = False
        if Path(path).stem == graph:
            profiled.append(self)
    change_session_options(with_profiling)
    session.OrtModel.__init__ = opened
    return profiled


def node_profile(models: list, top: int = 15) -> list[dict]:
    """ONNX Runtime's profiles of ``models`` (ended here), summed per node: the ``top`` nodes by
    total time, with their operator, runs and mean microseconds a run."""
    per_node: dict[str, dict] = {}
    for model in models:
        trace = Path(model.session.end_profiling())
        for event in json.loads(trace.read_text(encoding="utf-8")):
            if event.get("cat") != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
                continue
            name = event["name"][:-len("_kernel_time")]
            entry = per_node.setdefault(name, {"node": name, "op": event.get("args", {}).get("op_name", ""), "us": []})
            entry["us"].append(float(event.get("dur", 0)))
        trace.unlink(missing_ok=True)
    # Ranked by the median run (the warm-up's first runs of each shape are in the profile too).
    ranked = sorted(per_node.values(), key=lambda e: -float(np.median(e["us"])))[:top]
    return [{"node": e["node"], "op": e["op"], "runs": len(e["us"]), "us_p50": round(float(np.median(e["us"])), 1),
             "us_mean": round(float(np.mean(e["us"])), 1), "total_ms": round(sum(e["us"]) / 1e3, 2)} for e in ranked]


class DeviceWaits:
    """``--sync-runs``: the device synchronised around every graph run of the engine, and the two
    waits timed per graph — before a run, for work still queued from earlier (another graph's
    kernels, the array code's), and after it, for its own work still running when ONNX Runtime
    returned. It tells a graph's own time from the time it spends waiting for others; the syncs
    cost time themselves, so read the run for attribution, not speed."""

    def __init__(self, runtime, synchronize) -> None:
        from captioner.models.runtime import bucket_size, prefill_columns

        self.seconds: dict[str, list[float]] = {}  # graph -> [waited before, waited after]
        # The prefill's own run times by (bucket rows, padded columns) of the start that ran it.
        self.prefill_ms: dict[tuple[int, int], list[float]] = {}
        self._shape = (0, 0)
        self._wrapped = []
        for name, models in runtime.graph_models().items():
            totals = self.seconds.setdefault(name, [0.0, 0.0])
            for model in models:
                model._run_io = self._timed(model._run_io, synchronize, totals, name == "decoder_prefill")
                self._wrapped.append(model)
        # The longest prompt (tokens, the forced prefix included) of each batch's prefill.
        self.prompt_tokens: list[int] = []
        self._runtime, start = runtime, runtime.start

        def counted_start(enc, prompt_tokens, *args, **kwargs):
            longest = max((len(p) for p in prompt_tokens), default=0)
            self.prompt_tokens.append(longest)
            self._shape = (bucket_size(len(prompt_tokens)), prefill_columns(longest, runtime.n_text_ctx))
            return start(enc, prompt_tokens, *args, **kwargs)
        runtime.start = counted_start

    def _timed(self, run_io, synchronize, totals, by_shape: bool):
        def run(io, options=None):
            t0 = time.perf_counter()
            synchronize()
            t1 = time.perf_counter()
            run_io(io, options)
            t2 = time.perf_counter()
            synchronize()
            totals[0] += t1 - t0
            totals[1] += time.perf_counter() - t2
            if by_shape:
                self.prefill_ms.setdefault(self._shape, []).append(1e3 * (t2 - t1))
        return run

    def close(self) -> None:
        for model in self._wrapped:
            del model._run_io  # the class's method again
        del self._runtime.start

    def add_to(self, stats: dict) -> None:
        """Each graph's waits, ms per run, into ``graph_run_stats``' entries."""
        for name, (before_s, after_s) in self.seconds.items():
            if name in stats:
                runs = stats[name]["runs"]
                stats[name]["waited_before_ms_per_run"] = round(1e3 * before_s / runs, 3)
                stats[name]["waited_after_ms_per_run"] = round(1e3 * after_s / runs, 3)
        if self.prompt_tokens and "decoder_prefill" in stats:
            stats["decoder_prefill"]["prompt_tokens_p50_p90_max"] = [
                int(np.percentile(self.prompt_tokens, q)) for q in (50, 90, 100)]
            # Per shape: runs, and the median and largest run (is the cost some shapes', or every run's?).
            stats["decoder_prefill"]["ms_by_rows_x_columns"] = {
                f"{rows}x{columns}": [len(ms), round(float(np.median(ms)), 2), round(max(ms), 2)]
                for (rows, columns), ms in sorted(self.prefill_ms.items())}


def run_once(backend, recognizer, clips: list[Clip], n: int, args, light=None) -> dict:
    from captioner.engine.admission import AdmissionConfig
    from captioner.engine.core import EngineConfig
    from captioner.engine.live import LiveCaptioner
    from captioner.engine.policy.config import PolicyConfig
    from captioner.engine.scheduler import SchedulerConfig
    from captioner.engine.simulate import ChargedRecognizer, SimClock
    from captioner.engine.speakers import SpeakerConfig
    from captioner.errors import StreamRefused
    from captioner.events import NS_PER_S

    cut = getattr(args, "cut", None) or parse_cut("")
    if hasattr(recognizer, "options"):  # finished rows moved to smaller buckets (the default), or not
        recognizer.options = replace(recognizer.options, drop_finished=cut["compact"] == "on")
    if hasattr(recognizer, "merge_widths") and cut["widths"] != "auto":  # auto: the recognizer's own
        recognizer.merge_widths = cut["widths"] == "merge"  # small context groups padded into wider ones, or not
    config = EngineConfig(
        scheduler=SchedulerConfig(base_interval_s=args.interval_s, max_batch=args.max_batch,
                                  merge_max_load=None if cut["riders"] == "on" else 0.5,
                                  fill_wait_s=0.0 if cut["fill"] == "off" else SchedulerConfig().fill_wait_s,
                                  fill_rows=int(cut["fill"]) if cut["fill"].isdigit() else None,
                                  fill_close_wait_s=float(cut["closewait"])),
        admission=AdmissionConfig(time_budget="on" if args.admission else "off",
                                  gpu_memory_bytes=getattr(args, "gpu_memory_bytes", None)),
        # auto: what `captioner serve` runs, so the capacity measured is the server's.
        policy=PolicyConfig(kind=SERVER_POLICY if cut["policy"] == "auto" else cut["policy"],
                            forced_prefix=cut["prefix"] == "on"),
        ring_kernels=cut["rings"] == "on",
        block_streams=getattr(args, "block_streams", 64),
        overlap_updates=cut["overlap"],
        speakers=SpeakerConfig(mode=cut["speakers"]),
    )
    gc.collect()
    if backend.is_cuda:
        backend.xp.get_default_memory_pool().free_all_blocks()
    memory_before = backend.vram_bytes()
    gpu_index = backend.device_index if backend.is_cuda else None
    process_before = memory_breakdown(backend, gpu_index)
    clock = SimClock()
    records = []
    charged = ChargedRecognizer(recognizer, clock, "measured", records)
    light_charged = ChargedRecognizer(light, clock, "measured", records) if light is not None else None
    live = LiveCaptioner(recognizer=charged, light_recognizer=light_charged, backend=backend, config=config, clock_ns=clock,
                         timer_ns=time.perf_counter_ns)
    # The breakdown of the host path in CPU time: on a shared machine real time counts the
    # waits for a core too.
    live.engine.host_timer = time.thread_time
    live.engine.interval_log = intervals = []
    progs = programmes(n, clips, args.audio_s)
    room = (np.random.default_rng(0).standard_normal(SR) * 10 ** (-70 / 20)).astype(np.float32)
    streams, refused = {}, []
    for i in range(n):
        try:
            streams[i] = live.open_stream(f"s{i}", language="en", priority="live")
        except StreamRefused as refusal:
            refused.append(str(refusal))
    fed = dict.fromkeys(streams, 0)
    updates = []
    start_ns = clock()
    loop_wall_s = 0.0
    # The engine thread's CPU time: the budget of the one Python thread that drives an engine,
    # whatever else runs on the machine (NumPy's BLAS helper threads are not in it; reading the
    # process's CPU time while they spin cost more than the work it timed).
    loop_cpu_s = 0.0
    statuses = []
    graph_runs = getattr(getattr(recognizer, "runtime", None), "graph_runs", None)
    runs_before = graph_runs() if graph_runs is not None else None
    waits = DeviceWaits(recognizer.runtime, backend.xp.cuda.runtime.deviceSynchronize) \
        if getattr(args, "sync_runs", False) and graph_runs is not None and backend.is_cuda else None
    wall0 = time.perf_counter()
    with GpuSampler(backend.device_index if backend.is_cuda else None) as gpu:
        while streams and any(not s.done for s in streams.values()):
            clock.advance(TICK_S)
            due = (clock() - start_ns) * SR // NS_PER_S
            # The audio that arrived (the clients' side: not charged to the engine).
            arrived = {}
            for i in streams:
                end = min(due, progs[i].n_samples)
                if end > fed[i]:
                    arrived[i] = (progs[i].samples(fed[i], end, room), end == progs[i].n_samples)
                    fed[i] = end
            t0 = time.perf_counter()
            c0 = time.thread_time()
            n_records = len(records)
            for i, (samples, last) in arrived.items():
                streams[i].accept_waveform(SR, samples, capture_ns=clock())
                if last:
                    streams[i].finish()
            updates += live.step()
            wall_s = time.perf_counter() - t0
            loop_wall_s += wall_s
            loop_cpu_s += time.thread_time() - c0
            model_s = sum(r.charged_s for r in records[n_records:])
            clock.advance(max(0.0, wall_s - model_s))  # host work outside the model takes time too
            if len(statuses) < (clock() - start_ns) / NS_PER_S / 2:
                statuses.append(live.status())  # every 2 s of audio: admission's view while streams run
            if time.perf_counter() - wall0 > args.run_limit_s:
                break
        statuses.append(live.status())
        process_end = memory_breakdown(backend, gpu_index)  # the streams' rings and the batches' slots still held
    run_wall_s = time.perf_counter() - wall0
    runs_after = graph_runs() if graph_runs is not None else None
    if waits is not None:
        waits.close()
    host_totals = dict(live.engine.host_s)
    finished = all(s.done for s in streams.values())
    live.close()
    audio_s = sum(p.n_samples for i, p in enumerate(progs) if i in streams) / SR

    # Update intervals as the engine's admission counts them (a kept pause is no interval: a
    # segment now spans the gaps between recordings), and caption latency per reference word.
    shown_lat, commit_lat = [], []
    err_s = err_o = n_ref = 0
    n_words = 0
    per_stream: dict[str, list] = {}
    for u in updates:
        per_stream.setdefault(u.stream, []).append(u)
    for i in streams:
        mine = per_stream.get(f"s{i}", [])
        for start_s, clip in progs[i].clips:
            end_s = start_s + clip.audio.shape[0] / SR
            shown, done = clip_latencies(mine, start_s, end_s, clip)
            shown_lat += shown
            commit_lat += done
            n_words += len(clip.words)
        # WER over the stream's whole text: a caption may span two recordings.
        clips_in = [clip for _, clip in progs[i].clips]
        reference = " ".join(c.reference for c in clips_in)
        e, r = wer_counts(reference, " ".join(u.text for u in mine if u.kind == "final"))
        eo, _ = wer_counts(reference, " ".join(c.offline for c in clips_in))
        err_s, err_o, n_ref = err_s + e, err_o + eo, n_ref + r

    batches = sum(r.batch for r in records)
    model_wall_s = sum(r.wall_s for r in records)
    model_cpu_s = sum(r.cpu_s for r in records)
    steps_ms = [1e3 * r.wall_s for r in records]
    # Admission's view at its busiest moment (the last status comes after the streams closed).
    busiest = max(statuses, key=lambda s: (len(s.streams), s.admitted_load or 0.0))
    extra = dict(busiest.extra)
    util = gpu.utilization
    peak = gpu.peak_used_bytes
    used_before = memory_before[1] - memory_before[0] if memory_before else None
    graph_stats = None if runs_before is None else graph_run_stats(runs_before, runs_after, len(records), batches)
    if waits is not None:
        waits.add_to(graph_stats)
    return {
        "streams": n, "admitted": len(streams), "refused": len(refused), "refusal": refused[0] if refused else "",
        "finished": finished, "run_wall_s": round(run_wall_s, 2), "audio_s_per_stream": round(audio_s / max(1, len(streams)), 1),
        "steps": len(records), "batch_mean": round(batches / max(1, len(records)), 1),
        # Model updates per stream-second of audio: 1.0 is one update a second while every
        # stream speaks; more where steps take streams before they are due (riders, closings).
        "updates_per_stream_s": round(batches / max(1e-9, audio_s), 3),
        "light_model_updates": None if light is None else sum(r.batch for r in records if r.model == light.name),
        # Steps during whose encoding the previous step's text work was done (overlap=auto).
        "overlapped_steps": live.engine.overlapped_steps,
        "step_ms_p50": percentile(steps_ms, 50), "step_ms_p99": percentile(steps_ms, 99),
        "wall_ms_per_update": round(1e3 * model_wall_s / max(1, batches), 3),
        "host_cpu_ms_per_update": round(1e3 * model_cpu_s / max(1, batches), 3),
        "gpu_ms_per_update": None if util is None else round(1e3 * util * run_wall_s / max(1, batches), 3),
        "gpu_utilization": None if util is None else round(util, 3),
        "engine_host_ms_per_stream_s": round(1e3 * (loop_wall_s - model_wall_s) / max(1e-9, audio_s), 3),
        # The same work in the engine thread's CPU time (the model calls' process CPU time taken off):
        # on a shared machine the wall time above also counts the waits for a core.
        "engine_host_cpu_ms_per_stream_s": round(1e3 * max(0.0, loop_cpu_s - model_cpu_s) / max(1e-9, audio_s), 3),
        # ...of which, in CPU time: handing audio over, feature pushes, the VAD, scheduling (the
        # rest: the policy, building windows, stepping the API).
        "host_breakdown_cpu_ms_per_stream_s": {
            part: round(1e3 * seconds / max(1e-9, audio_s), 3)
            for part, seconds in host_totals.items()},
        "compute_over_audio": round(loop_wall_s / max(1e-9, audio_s / max(1, len(streams))), 3),
        "update_interval_p50_s": percentile(intervals, 50), "update_interval_p99_s": percentile(intervals, 99),
        "partial_p50_s": percentile(shown_lat, 50), "partial_p99_s": percentile(shown_lat, 99),
        "commit_p50_s": percentile(commit_lat, 50), "commit_p99_s": percentile(commit_lat, 99),
        "words": n_words, "words_committed": len(commit_lat),
        "wer_committed_pct": round(100 * err_s / max(1, n_ref), 2), "wer_offline_pct": round(100 * err_o / max(1, n_ref), 2),
        "feature_pool_bytes_per_stream": round(extra.get("feature_pool_bytes", 0) / max(1, len(streams))),
        "feature_bytes_per_slot": round(extra.get("feature_pool_bytes", 0) / max(1, extra.get("stream_slots", 1))),
        # The decoder's slots and the encoder's buffers (runtime.buffer_bytes): how much of the
        # process's GPU memory is these rather than ONNX Runtime's arena.
        "decoder_slots": int(extra.get("decoder_slots", 0)),
        "decoder_slot_bytes": int(extra.get("decoder_slot_bytes", 0)),
        "encoder_buffer_bytes": int(extra.get("encoder_buffer_bytes", 0)),
        "vram_growth_bytes_per_stream": None if peak is None or used_before is None
        else round((peak - used_before) / max(1, len(streams))),
        # This process's own GPU memory (NVML), before the streams opened (the model loaded and
        # warmed, what earlier runs left), at its peak during the run and at the run's end; with
        # CuPy's pool (feature rings, device logits) at both ends.
        "process_gpu_bytes_before": process_before["process_bytes"],
        "process_gpu_bytes_peak": gpu.peak_process_bytes,
        "process_gpu_bytes_end": process_end["process_bytes"],
        "cupy_pool_bytes_before": process_before["cupy_pool_total_bytes"],
        "cupy_pool_bytes_end": process_end["cupy_pool_total_bytes"],
        "cupy_pool_used_bytes_end": process_end["cupy_pool_used_bytes"],
        "ort_arena": gpu_memory.arena_mode(),
        # How often each graph ran during the run and its wall time per run (the device's work
        # included): a graph run more often than once a step, or slower than on its own
        # (profile_graphs.py), shows here.
        "graph_runs": graph_stats,
        "graph_runs_synchronised": waits is not None,
        "admission_estimate": {
            "streams_held": len(busiest.streams),
            "admitted_load": None if busiest.admitted_load is None else round(busiest.admitted_load, 3),
            "predicted_interval_s": round(extra.get("predicted_interval_s", 0.0), 3),
            "step_fixed_ms": round(1e3 * extra.get("step_fixed_s", 0.0), 3),
            "step_per_update_ms": round(1e3 * extra.get("step_per_update_s", 0.0), 3),
        },
    }


def profiled(path: str | None, run, *run_args):
    """``run(*run_args)``, under cProfile when ``path`` is given (stats saved there, top 25 on stderr)."""
    if path is None:
        return run(*run_args)
    import cProfile
    import pstats

    profile = cProfile.Profile()
    try:
        return profile.runcall(run, *run_args)
    finally:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        profile.dump_stats(path)
        pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(25)


# -- the sweep ------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description="concurrent real-time streams one engine serves")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--models", default="tiny.en", help="comma separated (tiny.en, base, a folder)")
    parser.add_argument("--decode-on", default="host,device",
                        help="where greedy decoding runs, comma separated: host, device, auto (the engine's "
                             "default: the device from 16 rows of a group up; device and auto need the switch)")
    parser.add_argument("--max-n", type=int, default=4096, help="largest number of streams (N doubles from 1)")
    parser.add_argument("--min-n", type=int, default=1)
    parser.add_argument("--ns", default=None,
                        help="the numbers of streams to run, comma separated (e.g. 1024,1536,2048), instead of "
                             "doubling from --min-n to --max-n")
    parser.add_argument("--audio-s", type=float, default=30.0, help="speech per stream (whole recordings, at least this)")
    parser.add_argument("--interval-s", type=float, default=1.0, help="the scheduler's base update interval")
    parser.add_argument("--max-batch", type=int, default=64, help="most streams in one model step")
    parser.add_argument("--max-clips", type=int, default=None, help="use only the first K recordings")
    parser.add_argument("--time-limit-s", type=float, default=600.0, help="wall time for the whole sweep")
    parser.add_argument("--run-limit-s", type=float, default=300.0, help="wall time for one N (the run is cut)")
    parser.add_argument("--admission", action="store_true", help="keep the time budget's refusals on")
    parser.add_argument("--light-model", default=None,
                        help="a light model beside each model (e.g. tiny.en beside base): new segments of English "
                             "streams move to it under load; the runs count the updates it made")
    parser.add_argument("--keep-going", action="store_true",
                        help="double N even once the engine is saturated (update interval p99 over 4 x base)")
    parser.add_argument("--engine-only", action="store_true",
                        help="no model: measure the engine's host path alone (features, VAD, scheduling) up to --max-n")
    parser.add_argument("--mem-pattern", default="on",
                        help="on|off: ONNX Runtime's memory patterns for the sessions (bench_first_runs.set_mem_pattern)")
    parser.add_argument("--ort-threads", default="default",
                        help="default|one|nospin: ONNX Runtime's intra-op threads for the sessions (one thread, or "
                             "its default pool without spin-waiting) — whether the pools' threads slow the engine's")
    parser.add_argument("--cudnn-attention", default="package",
                        help="package|on|off: cuDNN's fused attention in the CUDA sessions: the package's choice "
                             "(off for the prompt prefill only, session.CUDNN_ATTENTION_ENV), or on or off for all")
    parser.add_argument("--block-streams", type=int, default=64,
                        help="feature-pool bank size (EngineConfig.block_streams): a push is one call per bank "
                             "(at 1,024 streams 16 banks of 64; the feature push was 7 %% of the engine thread)")
    parser.add_argument("--warm-up-passes", type=int, default=1,
                        help="times the warm-up meets every shape (a prefill shape's second run cost 40-80 ms "
                             "on the H200, its third 2-3 ms: bench_first_runs --prompt-tokens; docs/capacity.md)")
    parser.add_argument("--ort-profile", default=None, metavar="GRAPH",
                        help="ONNX Runtime's per-node profile of one graph (decoder_prefill, encoder, ...) over the "
                             "whole sweep, warm-up included: its top nodes go into the JSON as ort_profile")
    parser.add_argument("--sync-runs", action="store_true",
                        help="synchronise the device around every graph run and time the waits per graph "
                             "(which graph's time is another's work still on the device; slows the run)")
    parser.add_argument("--profile", default=None, metavar="PREFIX",
                        help="profile each N with cProfile: PREFIX-nN.prof, and its top costs on stderr "
                             "(profiling slows the run: read its shares, not its times)")
    parser.add_argument("--warm-up", default="on",
                        help="on, off, or off,on (side by side, each on its own freshly loaded model): "
                             "meet every batch shape before the sweep (WhisperRecognizer.warm_up), as a server does")
    parser.add_argument("--cuts", default="prefix=on,rings=on",
                        help="engine settings to run side by side on the same model, ';' between settings: "
                             "prefix=on|off (LocalAgreement feeds the committed words of a buffer to the decoder "
                             "as a forced prefix, PolicyConfig.forced_prefix) and rings=on|off (kernels read the "
                             "feature rings: the VAD's measures and the model's batch, EngineConfig.ring_kernels); "
                             "riders=load|on (streams not yet due ride along in a step only while the engine's "
                             "load is under SchedulerConfig.merge_max_load, or always), fill=on|off|ROWS (under load a step "
                             "that would be mostly fixed cost waits up to SchedulerConfig.fill_wait_s to be fuller: as "
                             "the cost fit says, never, or until ROWS are due, SchedulerConfig.fill_rows), "
                             "closewait=SECONDS (a closing segment may wait that long past its pause for a fuller "
                             "step, SchedulerConfig.fill_close_wait_s; 0: never), "
                             "overlap=auto|off (a step's hypotheses read and folded while the next step encodes, "
                             "EngineConfig.overlap_updates), compact=on|off (the greedy loop moves rows still "
                             "decoding to a smaller batch as others finish, DecodingOptions.drop_finished), "
                             "speakers=off|on (every stream labelled: the voice encoder and clustering in each "
                             "round, EngineConfig.speakers), policy=auto|localagreement|alignatt|alignatt-gpu (the "
                             "streaming policy, PolicyConfig.kind; auto: the server's, serve --policy auto); e.g. 'prefix=off,rings=off;prefix=on,rings=on'")
    parser.add_argument("--gpu-memory", default=None, metavar="GIB",
                        help="the engine's GPU memory budget, as serve --gpu-memory: the shared ONNX Runtime arena "
                             "capped there, and streams refused under 15 %% of it left")
    parser.add_argument("--out", default=None, help="JSON results here")
    args = parser.parse_args()
    try:
        args.gpu_memory_bytes = gpu_memory.use_budget(args.gpu_memory) if args.gpu_memory else None
        warms = [w.strip() for w in args.warm_up.split(",") if w.strip()]
        if not warms or any(w not in ("on", "off") for w in warms):
            raise ValueError(f"--warm-up takes on and/or off, got {args.warm_up!r}")
        set_mem_pattern(args.mem_pattern)
        set_ort_threads(args.ort_threads)
        set_cudnn_attention(args.cudnn_attention)
        node_profiled = profile_graph_sessions(args.ort_profile) if args.ort_profile else None
        cuts = [parse_cut(item) for item in args.cuts.split(";") if item.strip()]
        if not cuts:
            raise ValueError("--cuts needs at least one setting")
        modes = [m.strip() for m in args.decode_on.split(",") if m.strip()]
        if not modes or any(m not in ("host", "device", "auto") for m in modes):
            raise ValueError(f"--decode-on takes host, device and/or auto, got {args.decode_on!r}")
        if args.min_n < 1 or args.max_n < args.min_n:
            raise ValueError("--min-n must be >= 1 and at most --max-n")
        ns = sorted({int(v) for v in args.ns.split(",") if v.strip()}) if args.ns else None
        if ns is not None and (not ns or ns[0] < 1):
            raise ValueError(f"--ns takes positive numbers of streams, got {args.ns!r}")
        if args.block_streams < 1 or args.warm_up_passes < 1:
            raise ValueError("--block-streams and --warm-up-passes must be positive")
        if args.audio_s <= 0 or args.interval_s <= 0 or args.max_batch < 1:
            raise ValueError("--audio-s, --interval-s and --max-batch must be positive")
    except (ValueError, UserError) as error:
        print(f"bench_capacity: {error}", file=sys.stderr)
        return 2
    has_switch = device_decoding_available()
    if not has_switch and any(m != "host" for m in modes):
        print("bench_capacity: this checkout's WhisperRecognizer has no decode_on switch: host decoding only",
              file=sys.stderr)
        modes = [m for m in modes if m == "host"] or ["host"]
    report = {
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
        "machine": platform.processor() or platform.machine(), "python": platform.python_version(),
        "command": " ".join(sys.argv), "device": args.device, "interval_s": args.interval_s,
        "mem_pattern": args.mem_pattern, "ort_threads": args.ort_threads, "cudnn_attention": args.cudnn_attention,
        "max_batch": args.max_batch, "audio_s": args.audio_s, "normalizer": NORMALIZER_NAME,
        "decode_on_switch": has_switch, "ort_arena": gpu_memory.arena_mode(),
        "gpu_memory_budget_bytes": gpu_memory.budget_bytes(), "runs": [],
    }
    sweep0 = time.perf_counter()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.engine_only:
        models, modes = ["tiny.en"], ["none"]
    for model in models:
        clips = load_clips(model, args.device, args.max_clips, offline=not args.engine_only)
        for mode, warm in [(m, w) for m in modes for w in warms]:
            if args.engine_only:
                from captioner.gpu.backend import get_backend

                backend, recognizer = get_backend(args.device), NoModel()
                backend.use()
            else:
                backend, recognizer = load_recognizer(model, args.device, mode)
            light = None
            if args.light_model and not args.engine_only:
                light = load_recognizer(args.light_model, args.device, mode)[1]
            report.update(provider=recognizer.provider, device_name=recognizer.device_name)
            gpu_index = backend.device_index if backend.is_cuda else None
            memory_loaded = memory_breakdown(backend, gpu_index)
            warm_up_s = None
            if warm == "on" and not args.engine_only:
                t0 = time.perf_counter()
                for each in (recognizer, light):
                    if each is not None and hasattr(each, "warm_up"):
                        for _ in range(args.warm_up_passes):
                            each.warm_up(args.max_batch)
                warm_up_s = round(time.perf_counter() - t0, 2)
                print(f"  warmed up to {args.max_batch} rows in {warm_up_s} s", file=sys.stderr)
            memory_warmed = {**memory_breakdown(backend, gpu_index), **getattr(recognizer.runtime, "buffer_bytes", dict)()} \
                if not args.engine_only else None
            what = "engine only" if args.engine_only else \
                f"{model}, decoding on the {mode}: {recognizer.provider} ({recognizer.device_name})"
            print(f"{what}, {len(clips)} recordings" + (f", light model {light.name}" if light else ""), file=sys.stderr)
            for cut in cuts:  # warm-up: what each setting compiles or captures at its first use
                run_once(backend, recognizer, clips, 1, argparse.Namespace(**{**vars(args), "audio_s": 5.0, "cut": cut}),
                         light)
            for cut in cuts:  # the same loaded (and warmed) model for each
                args.cut = cut
                todo = list(ns) if ns else []
                n = todo.pop(0) if ns else args.min_n
                last_wall_s = 0.0
                while n is not None and n <= (ns[-1] if ns else args.max_n):
                    left_s = args.time_limit_s - (time.perf_counter() - sweep0)
                    if left_s < 2.2 * last_wall_s:
                        print(f"  stop before N={n}: {left_s:.0f} s of the time limit left", file=sys.stderr)
                        break
                    result = profiled(f"{args.profile}-n{n}.prof" if args.profile else None,
                                      run_once, backend, recognizer, clips, n, args, light)
                    result.update(model=recognizer.name, decode_on=mode, warm_up=warm, warm_up_s=warm_up_s,
                                  memory_loaded=memory_loaded, memory_warmed=memory_warmed,
                                  forced_prefix=cut["prefix"], ring_kernels=cut["rings"], riders=cut["riders"],
                                  fill=cut["fill"], closewait=cut["closewait"], overlap=cut["overlap"],
                                  compact=cut["compact"], widths=cut["widths"], speakers=cut["speakers"],
                                  policy=cut["policy"])
                    chooser = getattr(recognizer, "decode_chooser", None)
                    if chooser is not None:  # auto: which path small groups took, as timed so far
                        result["decode_choice"] = {str(k): v for k, v in chooser.table().items()}
                    if args.engine_only:  # nothing was heard: accuracy and caption latency do not apply
                        for key in ("partial_p50_s", "partial_p99_s", "commit_p50_s", "commit_p99_s",
                                    "wer_committed_pct", "wer_offline_pct", "words_committed"):
                            result[key] = None
                    report["runs"].append(result)
                    last_wall_s = result["run_wall_s"]
                    print(f"  N={n}: " + json.dumps({k: v for k, v in result.items() if k not in ("refusal",)}),
                          file=sys.stderr)
                    if args.out:  # keep what was measured if a later N runs out of time or memory
                        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
                    if not result["finished"] or result["refused"]:
                        print(f"  stop after N={n}: " + ("streams refused" if result["refused"] else "the run was cut"),
                              file=sys.stderr)
                        break
                    p99 = result["update_interval_p99_s"]
                    if p99 is not None and p99 > 4 * args.interval_s and not args.keep_going:
                        print(f"  stop after N={n}: update interval p99 {p99} s, the engine is saturated", file=sys.stderr)
                        break
                    n = (todo.pop(0) if todo else None) if ns else n * 2
    if node_profiled is not None:
        report["ort_profile"] = {"graph": args.ort_profile, "nodes": node_profile(node_profiled)}
        for node in report["ort_profile"]["nodes"]:
            print(f"  {node['op']:<20} {node['us_p50']:>9.1f} us p50  {node['runs']:>6} runs  {node['node']}", file=sys.stderr)
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print("\n| model | decoding | N | step p50 / p99 ms | wall / host / GPU ms per update | engine host ms per stream-s "
          "| interval p50 / p99 s | partial p50 / p99 s | committed p50 / p99 s | WER committed / offline | "
          "VRAM per stream (pool / device) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in report["runs"]:
        mib = lambda b: "–" if b is None else f"{b / 2**20:.1f} MiB"  # noqa: E731
        print(f"| {r['model']} | {r['decode_on']}{' (cold)' if r.get('warm_up') == 'off' else ''}{', speakers' if r.get('speakers') == 'on' else ''}"
              f"{' (no prefix)' if r.get('forced_prefix') == 'off' else ''}"
              f"{' (rings: array code)' if r.get('ring_kernels') == 'off' else ''} | {r['streams']}{'' if r['finished'] else ' (cut)'} | "
              f"{r['step_ms_p50']} / {r['step_ms_p99']} | {r['wall_ms_per_update']} / {r['host_cpu_ms_per_update']} / "
              f"{r['gpu_ms_per_update'] if r['gpu_ms_per_update'] is not None else '–'} | {r['engine_host_ms_per_stream_s']} | "
              f"{r['update_interval_p50_s']} / {r['update_interval_p99_s']} | {r['partial_p50_s']} / {r['partial_p99_s']} | "
              f"{r['commit_p50_s']} / {r['commit_p99_s']} | {r['wer_committed_pct']} % / {r['wer_offline_pct']} % | "
              f"{mib(r['feature_pool_bytes_per_stream'])} / {mib(r['vram_growth_bytes_per_stream'])} |")
    if args.out:
        print(f"results: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
