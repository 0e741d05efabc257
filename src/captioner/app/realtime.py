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

``--clock simulated`` replays the file on a simulated clock instead (:func:`_run_simulated`):
one thread, audio arriving as the clock advances, each model step charged to the clock with its
measured duration. The captions are those a live session on this machine would make, with
their latencies, but the idle waiting is skipped, so a minute of audio takes as long as its
model steps do.

Every piece is flushed as it is written, so Ctrl-C (or SIGTERM) keeps everything committed
until then; the text still open is committed on the way out, and the exit status is 130. The
``-o`` file is therefore written in place, not renamed into place at the end as the offline path
does; a write it refuses (a full disk) is cut back to the last whole caption and ends the run
with one line, exit status 2 (:class:`_FileOutput`).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys

from captioner.app.interrupts import sigterm_as_interrupt, stop_requests
from captioner.errors import UserError

INTERRUPTED_EXIT = 130
"""Exit status after Ctrl-C: what was committed is kept, but the file was not replayed to its end."""

_POLL_S = 0.02


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
    """Committed captions in a caption format to stdout, each flushed when written."""

    def __init__(self, fmt: str) -> None:
        from captioner.formats import CaptionStreamWriter

        self.writer = _stdout_guard(lambda: CaptionStreamWriter(sys.stdout, fmt, label_streams=False))

    def show(self, updates) -> None:
        _stdout_guard(lambda: self.writer.write(updates))

    def note(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        _stdout_guard(self.writer.finish)  # the last cue


def _stdout_guard(write):
    """``write()``, a failure of stdout said on one line (a closed pipe passes through: the CLI
    ends quietly)."""
    from captioner.app.live_view import stdout_failure

    try:
        return write()
    except BrokenPipeError:
        raise
    except OSError as error:
        raise stdout_failure(error) from None


class _CueFile:
    """The ``-o`` file of a live replay, written in place as captions are committed (a file
    renamed into place at the end would hold nothing after a kill). Each flush appends its
    text whole or not at all: a write the disk refuses is cut back, so the file never ends in
    a torn cue. Quacks as the text file :class:`~captioner.formats.CaptionStreamWriter` wants."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        # A device or a FIFO (/dev/full, /dev/stdout) cannot be cut back, nor removed.
        self.regular = stat.S_ISREG(os.fstat(self._fd).st_mode)
        self._pending: list[str] = []
        self.bytes_written = 0

    def write(self, text: str) -> None:
        self._pending.append(text)

    def flush(self) -> None:
        data = "".join(self._pending).encode("utf-8")
        self._pending.clear()
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
            if self.regular:
                os.fsync(self._fd)  # a network or quota file system may say "full" only here
        except OSError:
            if self.regular:
                try:
                    os.ftruncate(self._fd, self.bytes_written)
                    os.lseek(self._fd, self.bytes_written, os.SEEK_SET)
                except OSError:
                    pass  # the error being raised says the file is incomplete
            raise
        self.bytes_written += len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _FileOutput:
    """Committed captions in a caption format to ``-o``, each cue on disk the moment no later
    word can change it (at most a cue behind the captions shown). A write that fails (a full disk, ``/dev/full``) ends the run with one line; the
    file keeps the whole captions written before it, and is removed when it holds none."""

    def __init__(self, path: str, fmt: str) -> None:
        from captioner.formats import CaptionStreamWriter

        self.path = path
        self.fmt = fmt
        self._failure: OSError | None = None
        try:
            self.file = _CueFile(path)
        except OSError as error:  # no permission, a missing folder: as the offline path says it
            raise UserError(f"cannot write {path}: {error.strerror or error}") from None
        try:
            self.writer = CaptionStreamWriter(self.file, fmt, label_streams=False)  # WebVTT's header
        except OSError as error:
            raise self._failed(error) from None

    @property
    def captions_kept(self) -> int:
        """Cues (JSON Lines: updates) on disk so far."""
        return self.writer.cues

    def show(self, updates) -> None:
        try:
            self.writer.write(updates)
        except OSError as error:
            raise self._failed(error) from None

    def note(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def _failed(self, error: OSError) -> UserError:
        self._failure = error
        self.file.close()
        reason = error.strerror or str(error)
        if not self.file.regular:
            return UserError(f"cannot write {self.path}: {reason}")
        if self.captions_kept == 0:
            with contextlib.suppress(OSError):  # nothing worth keeping: no empty or header-only file
                os.unlink(self.path)
            return UserError(f"cannot write {self.path}: {reason}")
        return UserError(f"cannot write {self.path}: {reason}; it keeps the {self.captions_kept} "
                         f"caption(s) written before")

    def close(self) -> None:
        """The last cue (still open when the run ended), then the file is closed; nothing more
        after a write failed (the file is closed, and its error was said)."""
        if self._failure is not None:
            return
        try:
            self.writer.finish()
        except OSError as error:
            raise self._failed(error) from None
        finally:
            self.file.close()


def _open_output(args):
    if args.output is None:
        if args.format == "txt" and sys.stdout.isatty():
            return _TerminalOutput()
        return _FormatOutput(args.format)
    return _FileOutput(args.output, args.format)


def _with_speakers(config, args):
    """The engine's configuration with ``--speakers``. A live replay cannot wait to see whether a
    second voice comes, as the offline path does, so ``auto`` is ``off`` here: one speaker's
    recording labelled from its first line reads as noise, and the live labels split one voice
    in two often enough (JFK's 11 s as two speakers) that they wait to be asked for (``on``)."""
    from dataclasses import replace

    mode = "on" if getattr(args, "speakers", "auto") == "on" else "off"
    return replace(config, speakers=replace(config.speakers, mode=mode))


def run_realtime(args) -> int:
    if getattr(args, "clock", "real") == "simulated":
        return _run_simulated(args)
    from captioner.app.commands.device_option import engine_device
    from captioner.app.commands.languages import LanguageReport, notice_line
    from captioner.app.commands.policy_option import engine_config
    from captioner.app.progress import TextProgress
    from captioner.audio.file_source import FileSource
    from captioner.engine.pipeline import Pipeline
    from captioner.engine.recognizer import capabilities_of

    source = FileSource(args.file, realtime=True)  # a bad file fails here, before a model loads
    progress = TextProgress()
    pipeline = Pipeline([source], model=args.model, language=args.language, task=args.task,
                        device=engine_device(args.device), progress=progress, config=_with_speakers(engine_config(args), args))
    sigterm_as_interrupt()
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
    if isinstance(output, _TerminalOutput):
        # The replay has begun: said at once, as nothing else shows until the first words are
        # recognised a few seconds in (the audio itself is not played aloud).
        output.note(f"captioner: playing {source.info.path.name} ({source.duration_s:.0f} s) at its real pace; "
                    "the captions follow as it is heard (Ctrl-C stops)")
    recognizer = pipeline.captioner.recognizer if pipeline.captioner is not None else None
    languages = LanguageReport(args.language, capabilities_of(recognizer).is_multilingual)
    interrupted = False

    def emit(updates) -> None:
        for line in languages.lines(updates):
            output.note(line)
        for notice in pipeline.notices():  # an English-only model hearing another language
            output.note(notice_line(notice))
        output.show(updates)

    try:
        try:
            with stop_requests() as stop:
                while pipeline.running and not stop.is_set():
                    emit(pipeline.drain_captions())
                    if pipeline.wait_exhausted(_POLL_S):
                        break
                interrupted = stop.is_set()  # Ctrl-C: keep what was committed, commit what is still open
        except KeyboardInterrupt:
            interrupted = True  # one that came just before or after the wait
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


def _run_simulated(args) -> int:
    """The file through the live engine on a simulated clock charged with measured compute; the
    output as in a real-time replay, a summary of the run on stderr."""
    from pathlib import Path

    from captioner.app.commands.device_option import engine_device
    from captioner.app.commands.languages import LanguageReport
    from captioner.app.commands.policy_option import engine_config
    from captioner.app.progress import TextProgress
    from captioner.audio.file_source import read_audio_16k
    from captioner.engine.live import LiveCaptioner
    from captioner.engine.recognizer import capabilities_of
    from captioner.engine.simulate import replay

    samples = read_audio_16k(args.file)  # a bad file fails here, before a model loads
    device = engine_device(args.device)
    config = _with_speakers(engine_config(args), args)
    opened: dict = {}

    def make_captioner(clock, timer_ns):
        progress = TextProgress()
        try:
            live = LiveCaptioner(args.model, device, language=args.language, task=args.task, config=config,
                                 progress=progress, clock_ns=clock, timer_ns=timer_ns)
        finally:
            progress.close()
        # The output is opened only once the model runs: a run that cannot start leaves no file.
        opened["output"] = _open_output(args)
        opened["languages"] = LanguageReport(args.language, capabilities_of(live.engine.recognizer).is_multilingual)
        return live

    def show(updates) -> None:
        output = opened["output"]
        for line in opened["languages"].lines(updates):
            output.note(line)
        output.show(updates)

    interrupted = False
    result = None
    sigterm_as_interrupt()
    try:
        result = replay(make_captioner, {Path(args.file).stem: samples}, compute="measured", on_updates=show)
    except KeyboardInterrupt:
        interrupted = True  # what was committed is written already
    finally:
        if "output" in opened:
            opened["output"].close()
    if result is not None:
        busy_s = sum(result.step_s)
        print(f"captioner: simulated clock: {result.audio_s:.1f} s of audio, {result.steps} model steps, "
              f"{busy_s:.1f} s of compute ({busy_s / max(result.audio_s, 1e-9):.2f} of real time), "
              f"policy {config.policy.kind}", file=sys.stderr, flush=True)
    return INTERRUPTED_EXIT if interrupted else 0
