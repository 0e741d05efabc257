"""`captioner listen`: live captions from audio inputs and files, in the terminal.

Each ``--input`` is one stream, and so is each ``--file``. A monitor (the audio a meeting plays)
is labelled "Meeting", anything else "Me" (numbered when there are several), a file by its name;
``--label`` overrides, in the order the inputs and files were given. Every committed line also
goes to a transcript file in the user data dir, written as it is committed. Ctrl-C stops
cleanly: pending text is committed and the transcript is closed. ``--device`` is the compute
device, as in every command; ``--server`` captions on a `captioner serve` server instead.

The transcript's first line is written before any model is loaded, so a full disk is one line,
exit 2. A disk that fills during the session is said on one line the moment a line cannot be
saved (the lines are held in memory and written when there is room), and again once they are; a
session that ends with lines still unsaved says how many, exit 2, whatever ended it.

A file plays at real-time pace, as if it were being said now (no microphone or sound server is
needed for one). With files alone, the session ends by itself once every file has played: the
last words are committed, the transcript closed, and the exit status is 0. With live inputs too,
it runs until Ctrl-C or ``--duration``, as always.

An input whose device goes away (unplugged, its sound server killed) is said on one line the
moment it is noticed, and again when it is back; the other inputs go on captioning, and the
session waits for the lost one (it ends only with Ctrl-C or ``--duration``). How often each
input was lost, and for how long, is said at the end.
"""

from __future__ import annotations

import argparse
import sys
import time

from captioner.app.commands.device_option import add_device_argument, engine_device
from captioner.app.commands.policy_option import (
    add_policy_argument,
    add_speakers_argument,
)
from captioner.app.interrupts import sigterm_as_interrupt, stop_requests
from captioner.app.listen_inputs import InOrder, listen_inputs, open_inputs
from captioner.errors import UserError, one_line


class _DeprecatedCompute(argparse.Action):
    """``--compute``: listen's old name for the compute device, before ``--device`` meant the
    compute device in every command. Still accepted; says so once."""

    def __call__(self, parser, namespace, values, option_string=None):
        if not getattr(namespace, "_compute_said", False):
            namespace._compute_said = True
            print("captioner: warning: --compute is deprecated; use --device (the compute device in every "
                  "command); the audio input is --input", file=sys.stderr, flush=True)
        namespace.device = values


def add_arguments(parser) -> None:
    parser.set_defaults(inputs_in_order=None)
    parser.add_argument("--input", "-i", action=InOrder, metavar="NAME|INDEX", default=None,
                        help="audio input to caption (repeat for several streams; default: the default "
                             "input, unless --file is given). A PulseAudio monitor captures what the "
                             "machine plays; `captioner devices` lists them.")
    parser.add_argument("--file", action=InOrder, metavar="PATH", default=None,
                        help="audio file to caption, played at real-time pace as if it were said now "
                             "(repeat for several; each is one stream, named after the file; mixes "
                             "with --input). With files alone the session ends when every file has played.")
    parser.add_argument("--label", action="append", metavar="NAME", default=None,
                        help="stream label for each --input and --file, in the order given "
                             "(default: Me / Meeting, a file's name)")
    parser.add_argument("--model", "-m", default="tiny.en", help="tiny.en, base, or a CTranslate2 Whisper folder")
    parser.add_argument("--language", "-l", default=None,
                        help="language code, or auto (multilingual models; what they detect is said on stderr)")
    parser.add_argument("--task", choices=("transcribe", "translate"), default="transcribe")
    add_policy_argument(parser)
    add_speakers_argument(parser)
    add_device_argument(parser)
    parser.add_argument("--compute", action=_DeprecatedCompute, metavar="DEVICE", help=argparse.SUPPRESS)
    parser.add_argument("--transcript", default=None, metavar="PATH",
                        help="transcript file (default: a new file in the user data dir)")
    parser.add_argument("--no-transcript", action="store_true", help="do not write a transcript file")
    parser.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                        help="stop after this many seconds (default: until Ctrl-C)")
    parser.add_argument("--status", action="store_true",
                        help="print the pipeline status (latency, lag, real-time factor) to stderr on exit")
    parser.add_argument("--server", metavar="ws://HOST:PORT", default=None,
                        help="caption on a `captioner serve` server instead of here (docs/serve.md)")
    parser.add_argument("--token-file", metavar="PATH", default=None, help="with --server: the server's bearer token")


def _check_arguments(args) -> None:
    """What can be refused before any device is opened or any model loaded."""
    if args.duration is not None and not args.duration > 0:  # also NaN
        raise UserError(f"--duration must be a positive number of seconds, not {args.duration:g}")
    if args.server is not None or args.token_file is not None:
        from captioner.app.remote_listen import check_server_arguments

        check_server_arguments(args)  # the URL and the token, before any device is opened
        return
    try:
        args.device = engine_device(args.device)
    except UserError as error:
        if args.device and str(error).startswith("unknown device"):
            # `listen --device monitor` meant the audio input before --device meant compute.
            raise UserError(f"{error} (the audio input is --input: --input {args.device})") from None
        raise


def run(args) -> int:
    _check_arguments(args)
    from captioner.app.commands.languages import LanguageReport, notice_line
    from captioner.app.live_view import TerminalView
    from captioner.app.transcript import TranscriptWriter
    from captioner.engine.pipeline import Pipeline
    from captioner.engine.recognizer import capabilities_of

    inputs = listen_inputs(args)
    sources, labels = open_inputs(inputs, args.label)  # a bad file or device: one line, before any model
    files_only = all(item.kind == "file" for item in inputs)
    transcript = progress = None
    if not args.no_transcript:
        from pathlib import Path

        transcript = TranscriptWriter(Path(args.transcript) if args.transcript else None,
                                      title=", ".join(labels))
    view = TerminalView(sys.stdout)
    if args.server is not None:
        from captioner.app.remote_listen import remote_pipeline

        pipeline = remote_pipeline(sources, args, transcript)
    else:
        from captioner.app.commands.policy_option import engine_config
        from captioner.app.progress import TextProgress

        # A first use builds the model's graphs, a damaged cache rebuilds them: both say so.
        progress = TextProgress()
        pipeline = Pipeline(sources, model=args.model, language=args.language, task=args.task,
                            device=args.device, transcript=transcript, config=engine_config(args),
                            progress=progress)
    sigterm_as_interrupt()
    print(f"captioner: connecting to {args.server} …" if args.server else f"captioner: loading {args.model} …",
          file=sys.stderr, flush=True)
    try:
        pipeline.start()
    except BaseException:
        if transcript is not None:
            transcript.close()
            if transcript.lines_written == 0:
                transcript.path.unlink(missing_ok=True)  # no session happened: leave no empty file
        raise
    finally:
        if progress is not None:
            progress.close()
    where = pipeline.provider if args.server else f"{args.model} on {pipeline.provider}"
    print(f"captioner: listening to {', '.join(labels)} ({where}); Ctrl-C stops"
          + (f"; transcript: {transcript.path}" if transcript else ""), file=sys.stderr, flush=True)
    recognizer = pipeline.captioner.recognizer if pipeline.captioner is not None else None
    languages = LanguageReport(args.language, capabilities_of(recognizer).is_multilingual,
                               name_streams=len(labels) > 1)

    def show(updates) -> None:
        for line in languages.lines(updates):
            view.note(line)
        for notice in pipeline.notices():  # an English-only model hearing another language
            view.note(notice_line(notice, name_stream=len(labels) > 1))
        view.show(updates)

    deadline = None if args.duration is None else time.monotonic() + args.duration
    inputs_report = _InputsReport(view)
    saving = _TranscriptReport(view, transcript, pipeline)
    played = _FilesPlayed(view, sources, say=not files_only)
    finished = False
    try:
        with stop_requests() as stop:  # Ctrl-C is how a session ends
            while pipeline.running and not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                show(pipeline.drain_captions())
                inputs_report.update(pipeline.lost_inputs, pipeline.source_errors)
                saving.update()
                played.update()
                for line in getattr(pipeline, "worker_notices", list)():  # a model worker restarted; the CPU fall-back
                    view.note(f"captioner: {line}")
                if len(pipeline.source_errors) == len(labels):
                    break  # every input has ended for good: nothing more can be captioned
                if files_only and pipeline.wait_exhausted(0):
                    finished = True  # every file has played and its last words are committed
                    break
                stop.wait(0.05)
        # A server's streams end with their finals: the loop may see the links gone first.
        finished = finished or (files_only and not stop.is_set() and pipeline.wait_exhausted(0))
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a session ends
    finally:
        try:
            pipeline.stop()
        except KeyboardInterrupt:  # a second Ctrl-C while stopping: stop anyway
            pipeline.stop()
        show(pipeline.drain_captions())
        view.close()
        if transcript is not None:
            transcript.close()  # the last try for held lines (a pipeline that closed it already: no-op)
    error = pipeline.error
    unsaved = saving.loss()
    if error is not None:
        raise UserError("; ".join(part for part in (one_line(error), unsaved) if part))
    if unsaved:
        raise UserError(unsaved)  # shown but not saved: never "transcript saved", never exit 0
    status = pipeline.latest_status()
    losses = pipeline.input_losses
    for line in _loss_lines(losses):
        print(line, file=sys.stderr)
    if finished and not pipeline.source_errors:
        print("captioner: finished: every file has played", file=sys.stderr)
    if args.status and status is not None:
        print(_status_line(status, losses), file=sys.stderr)
    if transcript is not None:
        print(f"captioner: transcript saved to {transcript.path} ({transcript.lines_written} lines)", file=sys.stderr)
    return 0  # Ctrl-C is the normal way to stop: a clean stop, not a failure


class _InputsReport:
    """Says, once each, when an input is lost, when it is back, and when one ended for good
    (main thread, from the pipeline's state as it is polled)."""

    def __init__(self, view) -> None:
        self._view = view
        self._lost: set[str] = set()
        self._ended: set[str] = set()

    def update(self, lost: dict[str, str], ended: dict[str, str]) -> None:
        for label, why in lost.items():
            if label not in self._lost:
                self._lost.add(label)
                self._view.note(f"captioner: input {label!r} lost ({why}); waiting for it to come back")
        for label in sorted(self._lost - lost.keys()):
            self._lost.discard(label)
            if label not in ended:
                self._view.note(f"captioner: input {label!r} is back")
        for label, why in ended.items():
            if label not in self._ended:
                self._ended.add(label)
                self._view.note(f"captioner: input {label!r} lost ({why})")


class _TranscriptReport:
    """Says, once each time, that committed lines can no longer be saved to the transcript (and
    why), and that they are saved again (main thread, polling the writer)."""

    def __init__(self, view, transcript, pipeline) -> None:
        self._view = view
        self._transcript = transcript
        self._pipeline = pipeline
        self._said_paused = False
        self._said_failed = False

    def update(self) -> None:
        if self._transcript is None:
            return
        path = self._transcript.path
        why = self._transcript.paused
        if why and not self._said_paused:
            self._said_paused = True
            self._view.note(f"captioner: captions are no longer being saved to {path} ({why}); they are kept "
                            "in memory and written when there is room")
        elif not why and self._said_paused:
            self._said_paused = False
            self._view.note(f"captioner: captions are being saved to {path} again (the lines kept meanwhile "
                            "are written)")
        failed = self._failure()
        if failed and not self._said_failed:
            self._said_failed = True
            self._view.note(f"captioner: captions are no longer being saved to {path} ({failed})")

    def _failure(self) -> str:
        """Why the pipeline stopped writing the transcript altogether, if it did."""
        error = getattr(self._pipeline, "transcript_error", None)
        return one_line(error) if error is not None else ""

    def loss(self) -> str | None:
        """After the session: one line for what was shown but never saved, else ``None``."""
        if self._transcript is None:
            return None
        failed = self._failure()
        if failed:
            return (f"cannot write the transcript {self._transcript.path}: {failed}; the committed lines after "
                    f"the first {self._transcript.lines_written} were not saved")
        return self._transcript.loss()


class _FilesPlayed:
    """Says, once each, that a file has played to its end, while live inputs go on (with files
    alone the session's own end says it)."""

    def __init__(self, view, sources, say: bool) -> None:
        self._view = view
        self._files = [source for source in sources if say and not getattr(source, "live", True)]

    def update(self) -> None:
        for source in [source for source in self._files if source.exhausted]:
            self._files.remove(source)
            self._view.note(f"captioner: {source.stream!r} has played to its end")


def _loss_lines(losses) -> list[str]:
    """One line per input that was lost during the session: how often, how long in all."""
    return [
        f"captioner: input {label!r} was lost {loss.count} time{'s' if loss.count != 1 else ''} "
        f"({loss.lost_s:.1f} s without audio)"
        for label, loss in losses.items() if loss.count
    ]


def _status_line(status, losses=None) -> str:
    def f(value, fmt):
        return "n/a" if value is None else format(value, fmt)

    lost = sum(loss.count for loss in (losses or {}).values())
    lost_s = sum(loss.lost_s for loss in (losses or {}).values())
    return (f"captioner: {status.model} on {status.provider} ({status.device_name}); "
            f"frame latency {f(status.frame_latency_ms, '.1f')} ms, step {f(status.step_latency_ms, '.0f')} ms, "
            f"lag {status.lag_s:.2f} s, real-time factor {f(status.real_time_factor, '.2f')}, "
            f"drops {status.dropped_frames}, inputs lost {lost}" + (f" ({lost_s:.1f} s)" if lost else ""))
