"""`captioner transcribe FILE`: a whole audio file to text, as fast as the model runs.

Offline by default (:mod:`captioner.engine.offline`: 30 s windows, segment by segment).
``--realtime`` replays the file at real-time pace through the live engine instead; that path
belongs to the engine (:func:`captioner.app.realtime.run_realtime`) and is imported only then.
Both paths check the same things first (the device, the output path, the file), so bad input
is the same one-line error either way, before any model is loaded.
"""

from __future__ import annotations

import sys
from pathlib import Path

from captioner.app.commands.device_option import add_device_argument, check_device
from captioner.app.commands.languages import (
    detected_language_line,
    is_auto,
    notice_line,
)
from captioner.app.commands.policy_option import add_policy_argument
from captioner.app.file_lines import file_lines
from captioner.errors import UserError
from captioner.formats import FORMATS, write_captions

FORMAT_NAMES = tuple(FORMATS)


def add_arguments(parser) -> None:
    parser.add_argument("file", metavar="FILE", help="audio file (WAV, FLAC, OGG, MP3, ...)")
    parser.add_argument("--model", "-m", default="tiny.en", metavar="tiny.en|base|PATH",
                        help="tiny.en (English), base (99 languages), or a CTranslate2 Whisper folder")
    parser.add_argument("--language", "-l", default="auto", metavar="auto|en|de|zh|...",
                        help="spoken language code, or auto to detect it (default: auto; "
                             "a multilingual model says on stderr what it detected)")
    parser.add_argument("--task", choices=("transcribe", "translate"), default="transcribe",
                        help="transcribe, or translate into English (multilingual models)")
    parser.add_argument("--format", "-f", choices=FORMAT_NAMES, default=None,
                        help="output format (default: from the -o suffix, else txt)")
    parser.add_argument("--output", "-o", default=None, metavar="OUT", help="output file (default: stdout)")
    add_device_argument(parser)
    parser.add_argument("--realtime", action="store_true",
                        help="replay the file in real time through the live engine, each line printed "
                             "as it is committed (-f jsonl: every partial and final update)")
    parser.add_argument("--clock", choices=("real", "simulated"), default="real",
                        help="with --realtime: real (wait for each second of audio) or simulated (a clock "
                             "charged with each model step's measured time: the captions and latencies of "
                             "a live session on this machine, without the idle waiting)")
    add_policy_argument(parser)
    parser.add_argument("--speakers", choices=("auto", "on", "off"), default="auto",
                        help="label who speaks (Speaker 1, Speaker 2, ...): on, off, or auto (default): "
                             "offline, the labels are written only when more than one voice was heard; "
                             "with --realtime, only with on")


def _output_format(args) -> str:
    if args.format:
        return args.format
    if args.output:
        suffix = Path(args.output).suffix.lower().lstrip(".")
        if suffix in FORMAT_NAMES:
            return suffix
    return "txt"


def check_long_enough(info) -> None:
    """A file too short to make even one frame of features is refused the same way by both
    paths (offline would fail in the features, a live replay would say nothing at all)."""
    from captioner.events import SAMPLE_RATE_HZ
    from captioner.gpu.features_ref import N_FFT

    samples_16k = round(info.frames * SAMPLE_RATE_HZ / info.rate_hz)
    needed = N_FFT // 2 + 1  # the features' reflect padding needs more samples than its width
    if samples_16k < needed:
        raise UserError(f"{info.path} is too short to transcribe: {samples_16k} samples at 16 kHz, "
                        f"at least {needed} ({1000 * needed / SAMPLE_RATE_HZ:.1f} ms) are needed")


def _check_writable(path: Path) -> None:
    """Refuse an output that cannot be written before the work starts, not after it is done:
    a folder, a missing folder, no permission, and (by writing a byte to a file made beside it
    and removed) a read-only or full disk or a folder such as /proc that takes no files."""
    import os

    from captioner.formats import check_writable

    if path.is_dir():
        raise UserError(f"-o {path} is a folder; give a file name")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UserError(f"cannot write {path}: the folder {folder} does not exist")
    # os.access first for its plain message; it says yes to everything for root, so the byte
    # written beside the file is the check that counts.
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"cannot write {path}: permission denied")
    try:
        check_writable(path)
    except OSError as error:
        raise UserError(f"cannot write {path}: {error.strerror or error}") from None


def run(args) -> int:
    from captioner.audio.file_source import open_audio_file

    fmt = _output_format(args)
    args.format = fmt
    if getattr(args, "clock", "real") == "simulated" and not args.realtime:
        raise UserError("--clock simulated replays through the live engine: add --realtime")
    if args.output:
        _check_writable(Path(args.output))
    check_long_enough(open_audio_file(args.file))  # a bad file fails before any model is loaded
    # Offline features are NumPy's: only the model's side of the device matters there (the
    # live replay checks both sides when it starts the engine).
    check_device(args.device, features=args.realtime)
    if args.realtime:
        # The live engine's replay path (ENGINE's module); imported only when asked for.
        from captioner.app.realtime import run_realtime

        return run_realtime(args)
    return _run_offline(args, fmt)


def _run_offline(args, fmt: str) -> int:
    from captioner.app.progress import TextProgress
    from captioner.engine.offline import (
        TranscribeOptions,
        load_decoder,
        transcribe_file,
    )

    options = TranscribeOptions(model=args.model, language=args.language or "auto", task=args.task, device=args.device)
    bar = TextProgress()
    try:
        decoder = load_decoder(options.model, options.device, progress=bar, language=options.language, task=options.task)
    finally:
        bar.close()
    # On a terminal only, and gone once done: the transcript follows it on the same screen.
    audio_bar = TextProgress(leave=False) if bar.tty else None
    try:
        result = transcribe_file(
            args.file, options, decoder=decoder,
            progress=(lambda done_s, total_s: audio_bar("transcribing", done_s / total_s if total_s else 1.0))
            if audio_bar else None,
        )
    finally:
        if audio_bar:
            audio_bar.close()
    if is_auto(options.language) and decoder.is_multilingual and result.info.language:
        print(detected_language_line(result.info.language), file=sys.stderr, flush=True)
    if result.info.language_notice is not None:  # an English-only model heard another language
        print(notice_line(result.info.language_notice), file=sys.stderr, flush=True)
    stream = Path(args.file).stem
    captions = result.captions(stream)
    if getattr(args, "speakers", "off") != "off":
        captions = _with_speakers(args.file, captions, args.speakers)
    captions = file_lines(captions, fmt)  # sentence-shaped lines
    if args.output:
        try:  # a new file renamed into place: a failure leaves no 0-byte or half-written file
            write_captions(captions, args.output, fmt, label_streams=False)
        except OSError as error:
            raise UserError(f"cannot write {args.output}: {error.strerror or error}") from None
    else:
        try:
            write_captions(captions, sys.stdout, fmt, label_streams=False)
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as error:
            from captioner.app.live_view import stdout_failure

            raise stdout_failure(error) from None
    return 0


def _with_speakers(path: str, captions, mode: str):
    """The offline captions labelled with their speakers (the file is read again, as the live
    engine hears a stream); under ``auto``, labels only where more than one voice was heard."""
    from dataclasses import replace

    from captioner.audio.file_source import audio_16k_blocks
    from captioner.engine.offline_speakers import label_captions

    _, blocks = audio_16k_blocks(Path(path))
    labelled = label_captions(blocks, captions)
    if mode == "auto" and len({c.speaker for c in labelled}) < 2:
        return [replace(c, speaker="") for c in labelled]
    return labelled
