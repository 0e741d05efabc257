"""`captioner devices`: the audio inputs to caption (monitors marked) and the GPUs to run on."""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument(
        "--no-pulse", action="store_true", help="do not ask a PulseAudio/PipeWire server for its sources"
    )


def _format_bytes(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"


def format_input_devices(devices) -> list[str]:
    if not devices:
        return ["  (none found: is a microphone connected, or a PulseAudio/PipeWire server running?)"]
    lines = []
    for d in devices:
        marks = "".join((" [monitor]" if d.is_monitor else "", " [default]" if d.is_default else ""))
        where = f"{d.index:>3}" if d.index is not None else "  -"
        lines.append(
            f"  {where}  {d.name}  ({d.host_api}, {d.channels} ch, {d.default_rate_hz} Hz){marks}"
            f"   --input {d.open_as}"
        )
    return lines


def format_gpus(gpus) -> list[str]:
    if not gpus:
        return ["  No usable CUDA GPU: captioning will run on the CPU."]
    return [
        f"  cuda:{g.index}  {g.name}  ({_format_bytes(g.total_vram_bytes)} VRAM, driver {g.driver_version})"
        for g in gpus
    ]


def run(args) -> int:
    from captioner.audio.devices import list_input_devices  # noqa: PLC0415 - keeps --help light
    from captioner.gpu.backend import describe_gpus  # noqa: PLC0415

    devices = list_input_devices(include_pulse=not args.no_pulse)
    lines = [
        "Audio input devices (caption one with `captioner listen --input INDEX`, a part of its name, "
        "or pulse:SOURCE):",
        *format_input_devices(devices),
        "",
        "GPUs (run on one with --device cuda:N):",
        *format_gpus(describe_gpus()),
    ]
    try:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        raise  # the reader went away (`| head -n 1`): the CLI ends quietly
    except OSError as error:  # `> /dev/full`, a full disk
        from captioner.app.live_view import stdout_failure  # noqa: PLC0415

        raise stdout_failure(error) from None
    return 0
