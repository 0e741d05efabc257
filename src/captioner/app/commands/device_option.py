"""``--device``, the compute device, the same in every command: where features and the model run.

Not a command itself: the option and its check, shared by ``gui``, ``transcribe``, ``listen``
and ``record_trace``. The audio input is never ``--device`` (``listen`` calls it ``--input``).

A device named on the command line or in ``CAPTIONER_DEVICE`` is checked before anything is
loaded or written, so a GPU that is not there costs one line and exit status 2, not a model
load, a run on the CPU or a half-written output file. "auto" (or nothing) is never refused: the
engine takes the GPU when it is usable, else the CPU. What a name means and what is refused is
:func:`captioner.compute.resolve_device`; the check itself (:func:`check_device`,
:func:`engine_device`) is :mod:`captioner.device_check`, the one the public API makes too, so
both say the same about a GPU that cannot be used. This module adds the option.
"""

from __future__ import annotations

import argparse

from captioner.device_check import check_device, engine_device

__all__ = ["DEVICE_HELP", "DEVICE_METAVAR", "add_device_argument", "check_device", "engine_device"]

DEVICE_METAVAR = "cpu|cuda|cuda:N"
DEVICE_HELP = ("where features and the model run: cpu, cuda or cuda:N (default: $CAPTIONER_DEVICE, "
               "else the GPU when usable, else the CPU)")


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, metavar=DEVICE_METAVAR, help=DEVICE_HELP)
