"""Record a captioning run to a trace file, headless (no Qt): for GPU servers.

    python -m captioner.app.record_trace --file talk.wav [--file other.wav] \
        [--model tiny.en] [--device cuda:0] [--realtime] [--max-s 120] --out run.trace.jsonl

Every file is one stream, all captioned at once by one pipeline; the telemetry sampler runs
beside it. Open the result on a desktop with ``captioner gui --trace run.trace.jsonl`` (or
File > Load trace…).
"""

from __future__ import annotations

import argparse
import platform
import sys
import threading
import time
from pathlib import Path

from captioner.app.commands.device_option import add_device_argument, engine_device
from captioner.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m captioner.app.record_trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", action="append", required=True, metavar="PATH", help="audio file (repeatable)")
    parser.add_argument("--out", required=True, metavar="PATH", help="trace file to write (JSON Lines)")
    parser.add_argument("--model", default="tiny.en")
    add_device_argument(parser)
    parser.add_argument("--language")
    parser.add_argument("--realtime", action="store_true", help="replay at real-time pace (live-like latency)")
    parser.add_argument("--max-s", type=float, help="stop after this many seconds")
    parser.add_argument("--settle-s", type=float, default=2.0,
                        help="keep sampling telemetry this long after the run (cool-down on the plots)")
    return parser


def record(args: argparse.Namespace) -> int:
    from captioner.audio.file_source import FileSource
    from captioner.engine.pipeline import Pipeline, telemetry_gpu_index, unique_labels
    from captioner.gpu.telemetry import TelemetrySampler
    from captioner.trace import TraceRecorder, record_run

    for path in args.file:
        if not Path(path).is_file():
            raise UserError(f"no such audio file: {path}")
    device = engine_device(args.device)  # a GPU that is not there: refused before the trace file exists
    streams = unique_labels(Path(path).stem for path in args.file)
    sources = [FileSource(path, stream=stream, realtime=args.realtime) for path, stream in zip(args.file, streams)]
    sampler = TelemetrySampler(gpu_index=telemetry_gpu_index(device))
    sampler.start()
    meta = {
        "files": [Path(p).name for p in args.file],
        "model": args.model,
        "device_requested": args.device or "auto",
        "realtime": bool(args.realtime),
        "host": platform.node(),
        "device": sampler.gpu_name or "cpu",
        "recorded_by": "captioner.app.record_trace",
    }
    try:
        recorder = TraceRecorder(args.out, meta=meta)
    except OSError as error:  # the header did not fit (a full disk, /dev/full)
        sampler.stop()
        _remove_if_file(args.out)
        raise UserError(f"cannot write the trace {args.out}: {error.strerror or error}") from None
    except BaseException:
        sampler.stop()
        raise
    pipeline = Pipeline(sources, model=args.model, language=args.language, device=device,
                        progress=lambda message, fraction: print(f"  {message} ({100 * fraction:.0f}%)", file=sys.stderr))
    started_run = False
    try:
        started = time.monotonic()
        # Telemetry while the model loads is part of the story (VRAM growing, clocks rising).
        loading = _Sampling(recorder, sampler)
        pipeline.start()
        started_run = True
        loading.flush()
        record_run(recorder, pipeline, sampler, done=lambda: pipeline.wait_exhausted(0) or pipeline.error is not None,
                   poll_s=0.05, max_s=args.max_s)
        # Stopping commits what is still queued, which can take a while after a fast replay:
        # keep recording while it does.
        stopper = threading.Thread(target=pipeline.stop, name="captioner-record-stop", daemon=True)
        stopper.start()
        record_run(recorder, pipeline, sampler, done=lambda: not stopper.is_alive(), poll_s=0.05)
        stopper.join()
        record_run(recorder, pipeline, sampler, poll_s=0.1, max_s=args.settle_s)
        elapsed_s = time.monotonic() - started
    finally:
        pipeline.stop()
        sampler.stop()
        recorder.close()
        if not started_run:
            Path(args.out).unlink(missing_ok=True)  # the run never started: no trace of nothing
    if pipeline.failure is not None:
        raise UserError(f"the pipeline failed: {pipeline.failure}")
    try:
        print(f"recorded {recorder.events} events in {elapsed_s:.1f} s to {args.out}", flush=True)
    except BrokenPipeError:
        raise
    except OSError as error:  # `> /dev/full`
        raise UserError(f"cannot write standard output: {error.strerror or error}") from None
    return 0


def _remove_if_file(path: str) -> None:
    # Only a regular file we just made: never a device such as /dev/full.
    p = Path(path)
    if p.is_file() and p.stat().st_size == 0:
        p.unlink()


class _Sampling:
    """Records every telemetry sample taken while the main thread waits in ``pipeline.start``."""

    def __init__(self, recorder, sampler) -> None:
        self._recorder = recorder
        self._sampler = sampler
        history = sampler.history()
        # By sample time, not by position: the sampler's history is capped (10 minutes at 2 Hz),
        # so past the cap its length stops growing while new samples keep arriving.
        self._last_time_s = history[-1].time_s if history else float("-inf")

    def flush(self) -> None:
        for sample in self._sampler.history():
            if sample.time_s > self._last_time_s:
                self._recorder.record_if_new(sample)  # marks it recorded for record_run too
                self._last_time_s = sample.time_s


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return record(args)
    except UserError as error:
        print(f"record_trace: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130  # the trace keeps what was recorded until then
    except BrokenPipeError:  # the reader of stdout went away: quietly, as `captioner` does
        from captioner.app.cli import PIPE_CLOSED_EXIT, silence_stdout

        silence_stdout()
        return PIPE_CLOSED_EXIT
    except OSError as error:
        # Mid-run, the trace is the one file written (a disk that filled); an error on another
        # file names it.
        what = error.filename if error.filename else f"cannot write the trace {args.out}"
        print(f"record_trace: error: {what}: {error.strerror or error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
