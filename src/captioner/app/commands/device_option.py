"""``--device``, the compute device, the same in every command: where features and the model run.

Not a command itself: the option and its check, shared by ``gui``, ``transcribe``, ``listen``
and ``record_trace``. The audio input is never ``--device`` (``listen`` calls it ``--input``).

A device named on the command line or in ``CAPTIONER_DEVICE`` is checked before anything is
loaded or written, so a GPU that is not there costs one line and exit status 2, not a model
load, a run on the CPU or a half-written output file. "auto" (or nothing) is never refused: the
engine takes the GPU when it is usable, else the CPU. What a name means and what is refused is
:func:`captioner.compute.resolve_device`; this module only asks both sides of the engine, and
(:func:`engine_device`) keeps "auto" from splitting them.
"""

from __future__ import annotations

import argparse

from captioner.errors import UserError

DEVICE_METAVAR = "cpu|cuda|cuda:N"
DEVICE_HELP = ("where features and the model run: cpu, cuda or cuda:N (default: $CAPTIONER_DEVICE, "
               "else the GPU when usable, else the CPU)")


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, metavar=DEVICE_METAVAR, help=DEVICE_HELP)


def check_device(device: str | None, *, features: bool = True) -> None:
    """Raise ``UserError`` (one line) when ``device`` (else ``CAPTIONER_DEVICE``) names a device
    that does not exist or cannot be used. ``features=False`` for a run that needs only the
    model's side (offline transcription computes its features with NumPy)."""
    from captioner.compute import DEVICE_ENV, parse_device, requested_device

    wanted = requested_device(device)
    if wanted == "auto":
        return
    try:
        kind, _ = parse_device(wanted)
        if kind == "cpu":
            return
        from captioner.models.session import choose_provider

        choose_provider(wanted)  # ONNX Runtime's CUDA provider, where the model runs
        if features:
            from captioner.gpu.backend import get_backend

            get_backend(wanted)  # CuPy, where the live engine computes its features
    except UserError as error:
        if device in (None, ""):
            raise UserError(f"{DEVICE_ENV}={wanted}: {error}") from None
        raise


def engine_device(device: str | None, *, features: bool = True) -> str | None:
    """:func:`check_device`, then the device to hand the engine: ``device`` itself, except that
    "auto" on a machine where CuPy runs but ONNX Runtime's CUDA provider does not becomes "cpu".
    The live engine takes the GPU for its features when CuPy can, and then asks for that GPU by
    name for the model, which would refuse it; a GPU that only one side can use is not usable."""
    from captioner.compute import requested_device

    check_device(device, features=features)
    if not features or requested_device(device) != "auto":
        return device
    from captioner.gpu.backend import cuda_usable

    if not cuda_usable():
        return device  # no GPU for the features: the engine asks the model for the CPU too
    from captioner.models.session import choose_provider

    return device if choose_provider(None).is_cuda else "cpu"
