"""The `captioner` command.

Each subcommand lives in its own module under ``captioner.app.commands`` with two functions,
``add_arguments(parser)`` and ``run(args) -> int``. Command modules import only light things at
module level, so ``captioner --help`` works on a machine with no GPU, PortAudio or display.
``--device`` is the compute device in every command (``commands.device_option``); a device that
cannot be used is refused here for the desktop app, before Qt starts, and by each terminal
command itself, before it loads a model or opens a file.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from captioner import __version__
from captioner.errors import UserError

# name -> (module under captioner.app.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "gui": ("gui", "open the desktop app (the default when no command is given)"),
    "devices": ("devices", "list audio input devices (monitors marked) and GPUs"),
    "transcribe": ("transcribe", "transcribe an audio file (offline, or --realtime through the live engine)"),
    "listen": ("listen", "caption live audio from one or more inputs in the terminal"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="captioner",
        description="Live captions for speech, with the heavy work on an NVIDIA GPU (or the CPU).",
    )
    parser.add_argument("--version", action="version", version=f"captioner {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(f"captioner.app.commands.{module_name}")
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command_parser)
        command_parser.set_defaults(_run=module.run)
    return parser


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    # Warnings reach people here, not developers: one line, no source location.
    print(f"captioner: warning: {message}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _one_line_warning
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        # `captioner` alone, or with the app's own options (`captioner --overlay`), opens the app.
        argv = ["gui", *argv]
    args = parser.parse_args(argv)
    try:
        if args.command == "gui":
            from captioner.app.commands.device_option import check_device

            check_device(args.device)  # one line and exit 2, not a warning box in a window
        return int(args._run(args) or 0)
    except UserError as error:
        print(f"captioner: error: {error}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
