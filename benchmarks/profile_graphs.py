"""Where a model step's time goes inside ONNX Runtime: each graph of a Whisper model (encoder,
cross K/V, prompt prefill, decoder step) run on its own at one batch size, with every input and
output bound to device memory (no host copies), timed per run and profiled per node.

The wall time of a run against the sum of its nodes' times says which side bounds it: ONNX
Runtime's CUDA provider times a node on the host (its kernel launches), so a run whose nodes add
up to its wall time is bound by the host, and one whose wall time is far above them waited for the
GPU. The prefill is also run at several prompt lengths, so its GPU cost per token shows.

Run (H200):
    PYTHONPATH=src:/tmp/site:/tmp/stage/ortsite:/tmp/stage python3 benchmarks/profile_graphs.py \\
        --device cuda:0 --batch 64 --out $OUT/2026-12-01-h200-profile-graphs.json
Run (here, the CPU provider): .venv/bin/python benchmarks/profile_graphs.py --device cpu --batch 2 --runs 2

``--prefill-forms`` profiles only the prompt prefill, in the two forms of its alignment weights
side by side (converter version 10: every prompt column weighed against the audio, the last one
kept; 11: each row's last query alone), built from the model's weights into a temporary folder.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

GRAPHS = ("encoder", "cross_kv", "decoder_prefill", "decoder_step")


def graph_files(model: str, cuda: bool) -> dict[str, Path]:
    """The model's cached graphs (built if missing) for the CUDA (fp16, fused attention) or CPU set."""
    from captioner.models.onnx_export import ensure_onnx
    from captioner.models.registry import resolve_model

    files = ensure_onnx(resolve_model(model), "fp16" if cuda else "fp32", None, fused_attention=cuda)
    return {name: files.path(name) for name in GRAPHS}


def prefill_forms(model: str, cuda: bool, folder: Path) -> dict[str, Path]:
    """The prefill graph in both forms of its alignment weights (see the module's docstring)."""
    import onnx

    from captioner.models import onnx_graphs
    from captioner.models.registry import resolve_model

    files = resolve_model(model)
    weights = files.open_weights()
    paths = {}
    try:
        for label, last in (("v10_all_columns", False), ("v11_last_query", True)):
            graph = onnx_graphs.build_decoder_prefill(weights, files.dims, np.float16 if cuda else np.float32,
                                                      fused_attention=True, alignment_heads=files.alignment_heads,
                                                      align_last_query=last)
            paths[label] = folder / f"decoder_prefill_{label}.onnx"
            onnx.save_model(graph, str(paths[label]))
    finally:
        weights.close()
    return paths


TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


def graph_dims(shape, sizes: dict[str, int]) -> list[int]:
    return [d if isinstance(d, int) and d > 0 else sizes[d] for d in shape]


def input_array(arg, sizes: dict[str, int], rng) -> np.ndarray:
    """A host array for graph input ``arg`` (an ONNX Runtime ``NodeArg``) at ``sizes``: random
    tokens, each row's last prompt column at ``new - 1``, other integers zero, small floats."""
    shape = graph_dims(arg.shape, sizes)
    dtype = TYPES[arg.type]
    if arg.name == "tokens":
        return rng.integers(0, 50000, size=shape).astype(np.int64)
    if arg.name == "last":
        return np.full(shape, sizes["new"] - 1, np.int64)
    if dtype == np.int64:
        return np.zeros(shape, np.int64)
    return (0.1 * rng.standard_normal(shape)).astype(dtype)


def profile(path: Path, sizes: dict[str, int], cuda: bool, device_id: int, runs: int, folder: Path) -> dict:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.enable_profiling = True
    so.profile_file_prefix = str(folder / path.stem)
    so.log_severity_level = 3
    providers = ([("CUDAExecutionProvider", {"device_id": device_id, "cudnn_conv_algo_search": "HEURISTIC"})]
                 if cuda else []) + ["CPUExecutionProvider"]
    sess = ort.InferenceSession(str(path), so, providers=providers)
    place = ("cuda", device_id) if cuda else ("cpu", 0)
    binding = sess.io_binding()
    rng = np.random.default_rng(0)
    for arg in sess.get_inputs():
        binding.bind_ortvalue_input(arg.name, ort.OrtValue.ortvalue_from_numpy(input_array(arg, sizes, rng), *place))
    for out in sess.get_outputs():
        shape = graph_dims(out.shape, sizes)
        binding.bind_ortvalue_output(out.name, ort.OrtValue.ortvalue_from_shape_and_type(shape, TYPES[out.type], *place))
    for _ in range(3):  # warm-up: allocations, algorithm choices
        sess.run_with_iobinding(binding)
    walls_ms = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run_with_iobinding(binding)  # synchronous: returns when the device is done
        walls_ms.append((time.perf_counter() - t0) * 1e3)
    trace = json.loads(Path(sess.end_profiling()).read_text(encoding="utf-8"))
    nodes = [e for e in trace if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")]
    by_op = collections.Counter()
    for e in nodes:
        by_op[e.get("args", {}).get("op_name", "?")] += e["dur"] / 1e3
    runs_total = runs + 3
    node_ms = sum(by_op.values()) / runs_total
    return {"graph": path.stem, "sizes": {k: v for k, v in sizes.items()}, "runs": runs,
            "wall_ms_p50": round(float(np.median(walls_ms)), 3), "wall_ms_min": round(min(walls_ms), 3),
            "node_ms_per_run": round(node_ms, 3), "nodes_per_run": round(len(nodes) / runs_total, 1),
            "by_op_ms_per_run": {k: round(v / runs_total, 3) for k, v in by_op.most_common(12)}}


def main() -> int:
    parser = argparse.ArgumentParser(description="per-graph, per-node times of a Whisper model in ONNX Runtime")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompts", default="1,8,16,32,48", help="prompt lengths (tokens) for the prefill")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--prefill-forms", action="store_true",
                        help="only the prefill, its two forms of the alignment weights side by side")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    device_id = int(args.device.split(":")[1]) if ":" in args.device else 0
    try:
        prompts = [int(v) for v in args.prompts.split(",") if v.strip()]
        if args.batch < 1 or args.runs < 1 or not prompts or min(prompts) < 1:
            raise ValueError("--batch, --runs and every prompt length must be positive")
    except ValueError as error:
        print(f"profile_graphs: {error}", file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        files = prefill_forms(args.model, cuda, Path(tmp)) if args.prefill_forms else graph_files(args.model, cuda)
        base = {"batch": args.batch, "frames": 3000, "new": 1, "past": 0}
        for name in files:
            lengths = prompts if "prefill" in files[name].stem else [1]
            for new in lengths:
                sizes = {**base, "new": new}
                try:
                    result = profile(files[name], sizes, cuda, device_id, args.runs, Path(tmp))
                except Exception as error:  # a graph with inputs this script does not know: say so, go on
                    result = {"graph": files[name].stem, "sizes": sizes, "error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
                results.append(result)
                if "error" in result:
                    print(f"{name:16s} T={new:3d}: {result['error']}", file=sys.stderr)
                else:
                    print(f"{name:16s} B={args.batch} T={new:3d}: wall {result['wall_ms_p50']:8.3f} ms, nodes on the host "
                          f"{result['node_ms_per_run']:8.3f} ms ({result['nodes_per_run']:.0f} nodes); "
                          + ", ".join(f"{k} {v}" for k, v in list(result["by_op_ms_per_run"].items())[:5]))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"model": args.model, "device": args.device, "results": results}, indent=1) + "\n",
                                  encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
