"""Does the prompt prefill slow down when its shape changes from one run to the next?

Inside the engine on the H200 the prefill took 19 ms a run at 768 streams (docs/capacity.md,
"graph runs"), against 4-7 ms when profile_graphs.py repeats one shape. The engine's prefills
change bucket (rows) and width (columns) from step to step. This runs the model's own prefill
graph (built from the weights as the converter builds it, and opened as the engine opens it,
``captioner.models.session.OrtModel``), at a list of shapes:
first each shape repeated on its own, then all of them in rotation, side by side in one run, and
reports the wall time per run of each shape both ways (the device's work included: a run returns
when it is done).

Run (H200):
    PYTHONPATH=src:/tmp/site:/tmp/stage/ortsite:/tmp/stage python3 benchmarks/bench_prefill_shapes.py \\
        --device cuda:0 --shapes 96x64,128x96,128x128,192x64,256x128 --runs 20 --out $OUT/2026-12-02-h200-prefill-shapes.json
Run (here): .venv/bin/python benchmarks/bench_prefill_shapes.py --device cpu --shapes 2x32,4x64 --runs 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from profile_graphs import TYPES, graph_dims, input_array, prefill_forms


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"96x64,128x128"`` -> [(96, 64), (128, 128)] (rows x prompt columns); ValueError otherwise."""
    shapes = []
    for part in text.split(","):
        rows, _, columns = part.strip().partition("x")
        shape = (int(rows), int(columns))
        if min(shape) < 1:
            raise ValueError(f"shape {part!r}: rows and columns must be positive")
        shapes.append(shape)
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def binding_for(model, rows: int, columns: int, rng):
    """A binding of the prefill at ``rows`` x ``columns``: inputs and outputs on the session's
    device (profile_graphs' inputs), caches bound as input and output (in place, as the engine
    binds them). The arrays come back beside it: they must live as long as it is run."""
    import onnxruntime as ort

    sizes = {"batch": rows, "new": columns}
    binding = model.binding()
    values = {}
    for arg in model.session.get_inputs():
        values[arg.name] = ort.OrtValue.ortvalue_from_numpy(input_array(arg, sizes, rng), *model._device)
        binding.io.bind_ortvalue_input(arg.name, values[arg.name])
    for out in model.session.get_outputs():
        source = out.name.replace("new_", "", 1)
        if out.name.startswith("new_") and source in values:
            binding.io.bind_ortvalue_output(out.name, values[source])  # the cache, in place
        else:
            values[out.name] = ort.OrtValue.ortvalue_from_shape_and_type(graph_dims(out.shape, sizes), TYPES[out.type],
                                                                         *model._device)
            binding.io.bind_ortvalue_output(out.name, values[out.name])
    return binding, values


def timed_run(binding) -> float:
    t0 = time.perf_counter()
    binding.run_bound()
    return (time.perf_counter() - t0) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description="the prefill at changing shapes against one shape repeated")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--shapes", default="96x64,128x96,128x128,192x64,256x128", help="rows x columns, comma separated")
    parser.add_argument("--runs", type=int, default=20, help="runs of each shape, each way")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    try:
        shapes = parse_shapes(args.shapes)
        if args.runs < 1:
            raise ValueError("--runs must be positive")
    except ValueError as error:
        print(f"bench_prefill_shapes: {error}", file=sys.stderr)
        return 2

    from captioner.models import session

    cuda = args.device.startswith("cuda")
    # The engine's prefill (converter version 11's form), built from the weights as the converter builds it.
    path = prefill_forms(args.model, cuda, Path(tempfile.mkdtemp()))["v11_last_query"]
    model = session.OrtModel(path, session.choose_provider(args.device))
    rng = np.random.default_rng(0)
    bound = {shape: binding_for(model, *shape, rng) for shape in shapes}
    bindings = {shape: binding for shape, (binding, _) in bound.items()}
    for binding in bindings.values():  # first runs: allocations, kernel choices
        for _ in range(3):
            binding.run_bound()
    alone = {shape: [timed_run(bindings[shape]) for _ in range(args.runs)] for shape in shapes}
    rotated = {shape: [] for shape in shapes}
    for _ in range(args.runs):
        for shape in shapes:
            rotated[shape].append(timed_run(bindings[shape]))
    rows = []
    print("| rows x columns | repeated ms (p50) | in rotation ms (p50) | ratio |")
    print("|---|---|---|---|")
    for shape in shapes:
        a, r = float(np.median(alone[shape])), float(np.median(rotated[shape]))
        rows.append({"rows": shape[0], "columns": shape[1], "repeated_ms_p50": round(a, 3),
                     "rotated_ms_p50": round(r, 3), "ratio": round(r / a, 2) if a > 0 else None})
        print(f"| {shape[0]} x {shape[1]} | {a:.2f} | {r:.2f} | {r / a:.2f} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({
            "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "command": " ".join(sys.argv),
            "model": args.model, "device": args.device, "provider": model.provider, "runs": args.runs, "shapes": rows,
        }, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
