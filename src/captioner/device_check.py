"""Whether the device asked for can run the engine, and why not: one check for every caller.

The CLI's ``--device`` (``app.commands.device_option``) and the public API's ``device=``
(``LiveCaptioner``) both call :func:`check_device`, so a GPU that cannot be used is refused with
the same one line, for the same reason, whoever asked. The reason is the first thing missing in
the order a GPU run needs them: the NVIDIA driver and a device (:mod:`captioner.cuda_driver`),
then ONNX Runtime's CUDA provider (where the model runs), then CuPy (where the live engine
computes its features). What a name means and what is refused is
:func:`captioner.compute.resolve_device`; this module only asks both sides of the engine, and
(:func:`engine_device`) keeps "auto" from splitting them.
"""

from __future__ import annotations

from captioner.compute import DEVICE_ENV, parse_device, requested_device
from captioner.errors import UserError


def check_device(device: str | None, *, features: bool = True) -> None:
    """Raise ``UserError`` (one line) when ``device`` (else ``CAPTIONER_DEVICE``) names a device
    that does not exist or cannot be used. ``features=False`` for a run that needs only the
    model's side (offline transcription computes its features with NumPy)."""
    wanted = requested_device(device)
    if wanted == "auto":
        return
    try:
        kind, _ = parse_device(wanted)
        if kind == "cpu":
            return
        # Imported here: each side imports its library (onnxruntime, CuPy) only when asked.
        from captioner.models.session import choose_provider

        choose_provider(wanted)  # the driver, then ONNX Runtime's CUDA provider, where the model runs
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
    check_device(device, features=features)
    if not features or requested_device(device) != "auto":
        return device
    from captioner.gpu.backend import cuda_usable

    if not cuda_usable():
        return device  # no GPU for the features: the engine asks the model for the CPU too
    from captioner.models.session import choose_provider

    return device if choose_provider(None).is_cuda else "cpu"
