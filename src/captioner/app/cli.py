"""The `captioner` command.

Each subcommand lives in its own module under ``captioner.app.commands`` with two functions,
``add_arguments(parser)`` and ``run(args) -> int``. Command modules import only light things at
module level, so ``captioner --help`` works on a machine with no GPU, PortAudio or display.
``--device`` is the compute device in every command (``commands.device_option``); a device that
cannot be used is refused here for the desktop app, before Qt starts, and by each terminal
command itself, before it loads a model or opens a file.

What reaches the person is one line, never a traceback: a :class:`~captioner.errors.UserError`
prints ``captioner: error: ...`` and exits 2. Two more cases are the shell's, not errors:

- the reader of stdout went away (``captioner listen | head -n 2``): the command stops quietly,
  nothing on stderr, exit status 141 (128 + SIGPIPE, what a shell shows for a program that
  SIGPIPE ended), so ``set -o pipefail`` scripts still see it;
- stdout closed (``>&-``): a command whose results go there refuses at once, one line, exit 2;
  ``transcribe -o FILE`` and the desktop app do not need it and run.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings

from captioner import __version__
from captioner.errors import UserError

# name -> (module under captioner.app.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "gui": ("gui", "open the desktop app (the default when no command is given)"),
    "devices": ("devices", "list audio input devices (monitors marked) and GPUs"),
    "transcribe": ("transcribe", "transcribe an audio file (offline, or --realtime through the live engine)"),
    "listen": ("listen", "caption live audio from one or more inputs, or files at real-time pace, in the terminal"),
    "serve": ("serve", "caption clients' audio over WebSockets on this machine's GPU(s) (docs/serve.md)"),
    "install-desktop": ("install_desktop", "add Captioner to the desktop's application menu (--uninstall removes it)"),
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


PIPE_CLOSED_EXIT = 141
"""Exit status when the reader of stdout went away: 128 + SIGPIPE, as a shell reports a program
that SIGPIPE ended (Python ignores SIGPIPE, so it arrives as ``BrokenPipeError`` instead)."""


def _hold_closed_std_fds() -> None:
    """Point a closed fd 0, 1 or 2 (``>&-``) at /dev/null. Left closed, the next file opened
    would take its number, and anything printed (by a C library too) would land in that file:
    a transcript, an ``-o`` output."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null_fd = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd`` itself
            if null_fd != fd:
                os.dup2(null_fd, fd)
                os.close(null_fd)
    if sys.stderr is None:  # print(file=None) would write an error message to stdout
        sys.stderr = open(os.devnull, "w", encoding="utf-8")


def _needs_stdout(args) -> bool:
    """Whether the command's results go to stdout (so with stdout closed they would be lost)."""
    if args.command in ("gui", "serve"):
        return False
    if args.command == "transcribe":
        return args.output is None
    return True


def silence_stdout() -> None:
    """After stdout failed: point it at /dev/null, so the interpreter's flush at exit finds
    somewhere to put what is still buffered and says nothing (as the Python docs advise for
    ``BrokenPipeError``)."""
    try:
        null_fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null_fd, sys.stdout.fileno())
        os.close(null_fd)
    except (OSError, AttributeError, ValueError):  # no stdout at all, or not a real file
        pass


def _silence_stdout_if_broken() -> None:
    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except OSError:  # what it still holds would fail again, and loudly, at exit
        silence_stdout()


def _flush_stdout() -> None:
    """The last of the output reaches stdout here, where a failure can still be said on one
    line, rather than in the interpreter's flush at exit."""
    if sys.stdout is None:
        return
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as error:
        raise UserError(f"cannot write standard output: {error.strerror or error}") from None


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:  # stderr is gone too (`2>&1 | head`): the exit status says it
        pass


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    # Warnings reach people here, not developers: one line, no source location.
    print(f"captioner: warning: {message}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    warnings.showwarning = _one_line_warning
    stdout_closed = sys.stdout is None  # Python's sign that fd 1 was closed before it started
    _hold_closed_std_fds()
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        # `captioner` alone, or with the app's own options (`captioner --overlay`), opens the app.
        argv = ["gui", *argv]
    args = parser.parse_args(argv)
    try:
        if stdout_closed and _needs_stdout(args):
            # Said before any work: hours of transcription thrown away would be worse.
            hint = " or give -o FILE" if args.command == "transcribe" else ""
            raise UserError(f"standard output is closed; redirect it (> FILE, > /dev/null){hint}")
        if args.command == "gui":
            from captioner.app.commands.device_option import check_device

            check_device(args.device)  # one line and exit 2, not a warning box in a window
        code = int(args._run(args) or 0)
        _flush_stdout()
        return code
    except BrokenPipeError:
        silence_stdout()
        return PIPE_CLOSED_EXIT
    except UserError as error:
        _silence_stdout_if_broken()
        _say(f"captioner: error: {error}")
        return error.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
