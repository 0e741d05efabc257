"""`captioner transcribe FILE`: a whole audio file to text, as fast as the model runs.

Offline by default (:mod:`captioner.engine.offline`: 30 s windows, segment by segment).
``--realtime`` replays the file at real-time pace through the live engine instead; that path
belongs to the engine (:func:`captioner.app.realtime.run_realtime`) and is imported only then.
"""

from __future__ import annotations

import sys
from pathlib import Path

from captioner.errors import UserError
from captioner.formats import FORMATS, write_captions

FORMAT_NAMES = tuple(FORMATS)


def add_arguments(parser) -> None:
    parser.add_argument("file", metavar="FILE", help="audio file (WAV, FLAC, OGG, MP3, ...)")
    parser.add_argument("--model", "-m", default="tiny.en", metavar="tiny.en|base|PATH",
                        help="tiny.en (English), base (99 languages), or a CTranslate2 Whisper folder")
    parser.add_argument("--language", "-l", default="auto", metavar="auto|en|de|zh|...",
                        help="spoken language code, or auto to detect it (default: auto)")
    parser.add_argument("--task", choices=("transcribe", "translate"), default="transcribe",
                        help="transcribe, or translate into English (multilingual models)")
    parser.add_argument("--format", "-f", choices=FORMAT_NAMES, default=None,
                        help="output format (default: from the -o suffix, else txt)")
    parser.add_argument("--output", "-o", default=None, metavar="OUT", help="output file (default: stdout)")
    # Named --device as in the issue; stored as "compute" like `listen`, where --device is audio.
    parser.add_argument("--device", dest="compute", default=None, metavar="cpu|cuda:N",
                        help="where the model runs (default: a CUDA GPU when usable, else the CPU)")
    parser.add_argument("--realtime", action="store_true",
                        help="replay the file in real time through the live engine (partial and final updates)")


def _output_format(args) -> str:
    if args.format:
        return args.format
    if args.output:
        suffix = Path(args.output).suffix.lower().lstrip(".")
        if suffix in FORMAT_NAMES:
            return suffix
    return "txt"


def run(args) -> int:
    fmt = _output_format(args)
    args.format = fmt
    if args.realtime:
        # The live engine's replay path (ENGINE's module); imported only when asked for.
        from captioner.app.realtime import run_realtime

        return run_realtime(args)
    return _run_offline(args, fmt)


def _run_offline(args, fmt: str) -> int:
    from captioner.app.progress import TextProgress
    from captioner.audio.file_source import open_audio_file
    from captioner.engine.offline import (
        TranscribeOptions,
        load_decoder,
        transcribe_file,
    )

    if args.output and Path(args.output).is_dir():
        raise UserError(f"-o {args.output} is a folder; give a file name")
    open_audio_file(args.file)  # a bad file fails before any model is loaded or converted
    options = TranscribeOptions(model=args.model, language=args.language or "auto", task=args.task, device=args.compute)
    bar = TextProgress()
    try:
        decoder = load_decoder(options.model, options.device, progress=bar, language=options.language, task=options.task)
    finally:
        bar.close()
    audio_bar = TextProgress() if bar.tty else None
    try:
        result = transcribe_file(
            args.file, options, decoder=decoder,
            progress=(lambda done_s, total_s: audio_bar("transcribing", done_s / total_s if total_s else 1.0))
            if audio_bar else None,
        )
    finally:
        if audio_bar:
            audio_bar.close()
    stream = Path(args.file).stem
    captions = result.captions(stream)
    if args.output:
        try:
            write_captions(captions, args.output, fmt, label_streams=False)
        except OSError as error:
            raise UserError(f"cannot write {args.output}: {error.strerror or error}") from None
    else:
        write_captions(captions, sys.stdout, fmt, label_streams=False)
        sys.stdout.flush()
    return 0
