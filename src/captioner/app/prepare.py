"""``python -m captioner.app.prepare``: build the default model's ONNX graphs now, not at the
first launch. scripts/setup.sh runs it once, at the end of a first set-up.

A model is converted to ONNX graphs on its first use (cached per user afterwards), seconds of
CPU for ``tiny.en`` and as much again for ``base``, which the live language check loads beside an
English-only model. Done at the first launch, it kept a new user's window without captions
(docs/ui.md, "First run"); done here, while a set-up is expected to take a while and shows its
progress, the first window captions within seconds.

Runs on the main thread of its own process. Builds what the app will load: ``tiny.en`` on the
device the app picks by default (``--device`` / ``CAPTIONER_DEVICE``, else the GPU when usable),
and the language check's ``base`` on the CPU. Nothing is transcribed. With shorter encoder
windows turned on (``CAPTIONER_ENCODER_WINDOWS_S``, docs/encoder-windows.md) their graphs are
built here too, as every ``load_runtime`` builds what it will use.
"""

from __future__ import annotations

import argparse
import sys
import time

from captioner.errors import UserError


def prepare(model: str, device: str | None, with_language_check: bool, progress) -> list[str]:
    """Builds (or finds cached) the graphs of ``model`` on ``device`` and, when asked, of the
    language check's model on the CPU; returns a line per model for the user."""
    from captioner.app.commands.device_option import engine_device
    from captioner.engine.language_check import DETECTOR_MODEL, DETECTOR_THREADS
    from captioner.models.registry import resolve_model
    from captioner.models.runtime import load_runtime

    done = []
    start_s = time.monotonic()
    runtime = load_runtime(model, device=engine_device(device), progress=progress)
    done.append(f"{model} ready on {runtime.device_name} ({time.monotonic() - start_s:.1f} s)")
    if with_language_check and not runtime.is_multilingual:
        try:
            resolve_model(DETECTOR_MODEL)
        except UserError:
            return done  # not installed: the check is skipped at run time too
        start_s = time.monotonic()
        # As the check loads it (engine/language_check.load_detector): the CPU, fp32 graphs.
        load_runtime(DETECTOR_MODEL, device="cpu", intra_threads=DETECTOR_THREADS, progress=progress)
        done.append(f"{DETECTOR_MODEL} (language check) ready on cpu ({time.monotonic() - start_s:.1f} s)")
    return done


def main(argv: list[str] | None = None) -> int:
    from captioner.app.commands.device_option import add_device_argument
    from captioner.app.progress import TextProgress

    parser = argparse.ArgumentParser(prog="python -m captioner.app.prepare",
                                     description="build a model's ONNX graphs now (scripts/setup.sh runs this)")
    parser.add_argument("--model", default="tiny.en", help="tiny.en (default), base, or a CTranslate2 Whisper folder")
    add_device_argument(parser)
    parser.add_argument("--no-language-check", action="store_true",
                        help="skip the graphs of the model the language check loads (base)")
    args = parser.parse_args(argv)
    progress = TextProgress()
    try:
        lines = prepare(args.model, args.device, not args.no_language_check, progress)
    except UserError as error:
        progress.close()
        print(f"captioner: error: {error}", file=sys.stderr)
        return 2
    progress.close()
    for line in lines:
        print(f"captioner: {line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
