"""Capacity of several GPUs, one engine (one worker process) per GPU: ``bench_capacity.py`` run on
each device at once, then the streams they held added up.

Why separate processes: with several GPUs the engine runs one worker per GPU (``captioner serve
--device all`` gives each its own model process), so what two GPUs hold is what two independent
engines hold while they share the host's cores, memory bandwidth and PCIe. First the sweep runs on
the first device alone (the 1-GPU figure), then on every device at once, with the same arguments;
the report sets the two side by side: for each N per device, the update interval p99 and committed
WER of every device, and whether every device stayed within the interval limit.

Run (an H200 pair):
    PYTHONPATH=src python3 benchmarks/bench_capacity_gpus.py --devices cuda:0,cuda:1 --out OUT.json -- \\
        --models tiny.en --decode-on device --max-batch 256 --ns 512,1024 --audio-s 12 --time-limit-s 200
Everything after ``--`` goes to every ``bench_capacity.py`` run (``--device`` and ``--out`` are set here).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run_sweeps(devices: list[str], passthrough: list[str], folder: Path, tag: str) -> dict[str, dict]:
    """``bench_capacity.py`` on each of ``devices`` at the same time; their JSON reports by device."""
    procs = {}
    for i, device in enumerate(devices):
        name = device if devices.count(device) == 1 else f"{device}#{i}"  # "cpu,cpu" runs two engines too
        out = folder / f"{tag}-{i}.json"
        command = [sys.executable, str(HERE / "bench_capacity.py"), *passthrough, "--device", device, "--out", str(out)]
        log_path = folder / f"{tag}-{i}.log"
        log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 (closed once the run ends)
        procs[name] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT), out, log, log_path)
    reports = {}
    for name, (proc, out, log, log_path) in procs.items():
        code = proc.wait()
        log.close()
        if code != 0 or not out.exists():
            last = log_path.read_text(encoding="utf-8").strip().splitlines()[-1:]
            raise RuntimeError(f"bench_capacity on {name} exited {code}: {' '.join(last)}")
        reports[name] = json.loads(out.read_text(encoding="utf-8"))
    return reports


def by_n(reports: dict[str, dict], limit_s: float) -> list[dict]:
    """Per number of streams per device: what each device measured, and the total held within the limit."""
    rows = {}
    for device, report in reports.items():
        for run in report["runs"]:
            rows.setdefault(run["streams"], {})[device] = run
    table = []
    for n, runs in sorted(rows.items()):
        complete = len(runs) == len(reports)
        within = complete and all(r["finished"] and not r["refused"] and r["update_interval_p99_s"] is not None
                                  and r["update_interval_p99_s"] <= limit_s for r in runs.values())
        table.append({
            "streams_per_device": n, "devices": len(runs), "streams_total": n * len(runs), "within_limit": within,
            "update_interval_p99_s": {d: r["update_interval_p99_s"] for d, r in runs.items()},
            "wer_committed_pct": {d: r["wer_committed_pct"] for d, r in runs.items()},
            "gpu_ms_per_update": {d: r["gpu_ms_per_update"] for d, r in runs.items()},
            "wall_ms_per_update": {d: r["wall_ms_per_update"] for d, r in runs.items()},
        })
    return table


def held(table: list[dict]) -> int:
    """The most streams in total held within the limit (0: none)."""
    return max((row["streams_total"] for row in table if row["within_limit"]), default=0)


def main() -> int:
    parser = argparse.ArgumentParser(description="capacity of several GPUs, one engine per GPU")
    parser.add_argument("--devices", required=True, help="comma separated, e.g. cuda:0,cuda:1")
    parser.add_argument("--limit-s", type=float, default=1.5, help="update interval p99 a device must stay under")
    parser.add_argument("--no-solo", action="store_true", help="skip the first device's run alone")
    parser.add_argument("--out", default=None, help="JSON results here")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-- then bench_capacity.py's arguments")
    args = parser.parse_args()
    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    passthrough = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if len(devices) < 2:
        print("bench_capacity_gpus: --devices needs at least two devices", file=sys.stderr)
        return 2
    if any(a in ("--device", "--out") or a.startswith(("--device=", "--out=")) for a in passthrough):
        print("bench_capacity_gpus: --device and --out are set per run; leave them out after --", file=sys.stderr)
        return 2
    report = {"date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "command": " ".join(sys.argv),
              "devices": devices, "limit_s": args.limit_s}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            if not args.no_solo:
                solo = run_sweeps(devices[:1], passthrough, folder, "solo")
                report["solo"] = {"runs": solo, "by_n": by_n(solo, args.limit_s)}
            together = run_sweeps(devices, passthrough, folder, "together")
            report["together"] = {"runs": together, "by_n": by_n(together, args.limit_s)}
    except RuntimeError as error:
        print(f"bench_capacity_gpus: {error}", file=sys.stderr)
        return 1
    one = held(report["solo"]["by_n"]) if "solo" in report else None
    many = held(report["together"]["by_n"])
    report.update(streams_held_one=one, streams_held_all=many,
                  ratio=(round(many / one, 2) if one else None))
    print(f"| GPUs | streams per GPU | total | interval p99 s per GPU | WER committed % per GPU | within {args.limit_s} s |")
    print("|---|---|---|---|---|---|")
    for label, part in (("1", report.get("solo")), (str(len(devices)), report["together"])):
        for row in (part or {}).get("by_n", []):
            p99 = ", ".join(str(v) for v in row["update_interval_p99_s"].values())
            wer = ", ".join(str(v) for v in row["wer_committed_pct"].values())
            print(f"| {label} | {row['streams_per_device']} | {row['streams_total']} | {p99} | {wer} | "
                  f"{'yes' if row['within_limit'] else 'no'} |")
    print(f"held within the limit: one GPU {one}, {len(devices)} GPUs {many}" + (f" ({report['ratio']}x)" if one else ""))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
