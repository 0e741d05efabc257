"""`captioner gui` (and plain `captioner`): the desktop app.

Options apply to the run they are given for; the app saves only what the user chose in it
(:class:`captioner.ui.settings.ChosenSettings`).

Qt is imported inside :func:`run`, so `captioner --help` works without a display.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from captioner.app.commands.device_option import add_device_argument
from captioner.app.commands.policy_option import (
    POLICY_CHOICES,
    POLICY_HELP,
    SPEAKERS_CHOICES,
)
from captioner.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="tiny.en (default), base, or a CTranslate2 Whisper folder")
    add_device_argument(parser)  # the compute device, worded as in every command
    parser.add_argument("--file", metavar="PATH", action="append",
                        help="caption this audio file (played at real-time pace) instead of the microphone; "
                        "repeat for several streams at once")
    parser.add_argument("--language", help="spoken language code, or auto (multilingual models)")
    parser.add_argument("--policy", choices=POLICY_CHOICES, help=POLICY_HELP.replace("; default", "") + " (this run)")
    parser.add_argument("--speakers", choices=SPEAKERS_CHOICES,
                        help="who said what: label the speakers of a meeting's audio and files (auto), of every "
                        "source (on), or of none (off); this run (docs/speakers.md)")
    parser.add_argument("--trace", metavar="PATH", help="open a recorded run (captioner trace) in the dashboard")
    parser.add_argument("--compare", metavar="PATH", help="draw a second recorded run over --trace, dashed")
    parser.add_argument("--no-start", action="store_true", help="open the window without starting to caption")
    parser.add_argument("--metrics-port", type=int, metavar="N",
                        help="serve Prometheus metrics on 127.0.0.1:N (0 picks a free port)")
    parser.add_argument("--overlay", action="store_true", help="show the caption overlay at start")
    parser.add_argument("--theme", choices=("dark", "light"), help="colour theme (this run)")
    parser.add_argument("--settings", metavar="INI", help=argparse.SUPPRESS)  # tests: a private settings file
    parser.add_argument("--screenshot", metavar="PNG", help="save screenshots (window, dashboard, overlay) "
                        "just before --quit-after ends the app")
    parser.add_argument("--quit-after", type=float, metavar="S", help="quit after S seconds (smoke runs)")
    parser.add_argument("--save-trace", metavar="PATH", help="save this run's trace when the app quits")
    parser.add_argument("--server", metavar="ws://HOST:PORT",
                        help="caption on a `captioner serve` server (this run; docs/serve.md)")
    parser.add_argument("--token-file", metavar="PATH", help="the server's bearer token (never stored)")
    parser.add_argument("--reset-settings", action="store_true",
                        help="forget every setting saved by the app (then open it on the defaults)")


def run(args: argparse.Namespace) -> int:
    for path in args.file or ():
        if not Path(path).exists():
            raise UserError(f"no such audio file: {path}")
        from captioner.audio.file_source import open_audio_file

        open_audio_file(path)  # its header: a FIFO, a folder or a text file is one line now, not a hang or a banner
    if args.trace is not None and not Path(args.trace).is_file():
        raise UserError(f"no such trace file: {args.trace}")
    if args.compare is not None and (args.trace is None or not Path(args.compare).is_file()):
        raise UserError("--compare needs --trace and an existing trace file")
    if args.quit_after is not None and args.quit_after <= 0:
        raise UserError("--quit-after must be a positive number of seconds")
    args.token = None
    if args.server is not None or args.token_file is not None:
        from captioner.app.remote_listen import check_server_arguments

        check_server_arguments(args, local_device_allowed=True)  # one line now, not a dialog later
    if args.model is not None:
        from captioner.models.registry import resolve_model

        resolve_model(args.model)  # exit 2 on one line, as every command does, not a banner later
    if args.screenshot is not None and args.quit_after is None:
        raise UserError("--screenshot needs --quit-after S (the screenshot is taken just before quitting)")
    if not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY") and not os.environ.get("QT_QPA_PLATFORM") \
            and os.name == "posix" and not Path("/System").exists():
        raise UserError("no display: run it in a desktop session, under xvfb-run, or with QT_QPA_PLATFORM=offscreen")

    if args.reset_settings:
        from captioner.ui.settings import open_settings, reset_settings

        print(f"captioner: settings reset ({reset_settings(open_settings(args.settings))})", flush=True)
    from captioner.app.gui_main import run_app

    return run_app(args)
