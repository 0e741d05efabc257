"""`captioner transcribe FILE --realtime`: a file replayed at real-time pace through the live
engine (the same pipeline as `captioner listen`, not the offline path).

Output streams as the captions are made, never only at the end:

- on a terminal, with no ``-o`` and the default text format, the file is shown as ``listen``
  shows a microphone (:class:`~captioner.app.live_view.TerminalView`): the partial line
  rewritten in place, committed lines scrolling up;
- otherwise each committed caption is written the moment it is committed, in the chosen
  format (:class:`~captioner.formats.CaptionStreamWriter`): a txt line, an SRT/WebVTT cue (the
  WebVTT header first), and with ``-f jsonl`` every update, partial and final, one JSON object
  per line (stream, kind, text, start_s, end_s, emitted_audio_s, emitted_wall_s, segment,
  language).

Every piece is flushed as it is written, so Ctrl-C (or SIGTERM) keeps everything committed
until then; the text still open is committed on the way out, and the exit status is 130.
"""

from __future__ import annotations

import signal
import sys
import threading

from captioner.errors import UserError

INTERRUPTED_EXIT = 130
"""Exit status after Ctrl-C: what was committed is kept, but the file was not replayed to its end."""

_POLL_S = 0.02


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt


class _TerminalOutput:
    """Live view on a terminal: partials in place, committed lines scrolling."""

    def __init__(self) -> None:
        from captioner.app.live_view import TerminalView

        self.view = TerminalView(sys.stdout, tty=True, label_streams=False)

    def show(self, updates) -> None:
        self.view.show(updates)

    def note(self, text: str) -> None:
        self.view.note(text)

    def close(self) -> None:
        self.view.close()


class _FormatOutput:
    """Committed captions in a caption format, to stdout or a file, each flushed when written."""

    def __init__(self, out, fmt: str) -> None:
        from captioner.formats import CaptionStreamWriter

        self.out = out
        self.writer = CaptionStreamWriter(out, fmt, label_streams=False)

    def show(self, updates) -> None:
        self.writer.write(updates)

    def note(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.out is not sys.stdout:
            self.out.close()


def _open_output(args):
    if args.output is None:
        if args.format == "txt" and sys.stdout.isatty():
            return _TerminalOutput()
        return _FormatOutput(sys.stdout, args.format)
    try:
        out = open(args.output, "w", encoding="utf-8", newline="")
    except OSError as error:  # no permission, a missing folder: one line, as the offline path says it
        raise UserError(f"cannot write {args.output}: {error.strerror or error}") from None
    return _FormatOutput(out, args.format)


def run_realtime(args) -> int:
    from captioner.app.commands.device_option import engine_device
    from captioner.app.commands.languages import LanguageReport, notice_line
    from captioner.app.progress import TextProgress
    from captioner.audio.file_source import FileSource
    from captioner.engine.pipeline import Pipeline

    source = FileSource(args.file, realtime=True)  # a bad file fails here, before a model loads
    progress = TextProgress()
    pipeline = Pipeline([source], model=args.model, language=args.language, task=args.task,
                        device=engine_device(args.device), progress=progress)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        pipeline.start()
    finally:
        progress.close()
    # The output is opened only once the model runs: a run that cannot start leaves no file.
    try:
        output = _open_output(args)
    except BaseException:
        pipeline.stop()
        raise
    recognizer = pipeline.captioner.recognizer if pipeline.captioner is not None else None
    languages = LanguageReport(args.language, getattr(recognizer, "is_multilingual", False))
    interrupted = False

    def emit(updates) -> None:
        for line in languages.lines(updates):
            output.note(line)
        for notice in pipeline.notices():  # an English-only model hearing another language
            output.note(notice_line(notice))
        output.show(updates)

    try:
        try:
            while pipeline.running:
                emit(pipeline.drain_captions())
                if pipeline.wait_exhausted(_POLL_S):
                    break
        except KeyboardInterrupt:
            interrupted = True  # Ctrl-C: keep what was committed, commit what is still open
        finally:
            try:
                pipeline.stop()
            except KeyboardInterrupt:  # a second Ctrl-C while stopping: stop anyway
                interrupted = True
                pipeline.stop()
        emit(pipeline.drain_captions())
    finally:
        output.close()
    if pipeline.failure is not None:
        raise UserError(pipeline.failure)
    return INTERRUPTED_EXIT if interrupted else 0
