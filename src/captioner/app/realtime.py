"""`captioner transcribe FILE --realtime`: a file replayed at real-time pace through the live
engine (the same pipeline as `captioner listen`, not the offline path).

With ``--format jsonl`` every update, partial and final, is written the moment it is made, one
JSON object per line: stream, kind, text, start_s, end_s, emitted_audio_s, emitted_wall_s (and
segment, language). Other formats get the committed captions when the replay ends.
"""

from __future__ import annotations

import sys

from captioner.errors import UserError


def run_realtime(args) -> int:
    from captioner.app.progress import TextProgress
    from captioner.audio.file_source import FileSource
    from captioner.engine.pipeline import Pipeline
    from captioner.formats import captions_from_updates, render

    fmt = args.format
    source = FileSource(args.file, realtime=True)  # a bad file fails here, before a model loads
    progress = TextProgress()
    pipeline = Pipeline([source], model=args.model, language=args.language, task=args.task,
                        device=args.compute, progress=progress)
    try:
        out = open(args.output, "w", encoding="utf-8", newline="") if args.output else sys.stdout
    except OSError as error:  # a folder, no permission: one line, as the offline path says it
        raise UserError(f"cannot write {args.output}: {error.strerror or error}") from None
    updates = []
    try:
        try:
            pipeline.start()
        finally:
            progress.close()
        try:
            while pipeline.running:
                batch = pipeline.drain_captions()
                updates += batch
                if fmt == "jsonl" and batch:
                    out.write(render(batch, "jsonl"))
                    out.flush()
                if pipeline.wait_exhausted(0.02):
                    break
        finally:
            pipeline.stop()
        batch = pipeline.drain_captions()
        updates += batch
        if pipeline.failure is not None:
            raise UserError(pipeline.failure)
        if fmt == "jsonl":
            if batch:
                out.write(render(batch, "jsonl"))
        else:
            out.write(render(captions_from_updates(updates), fmt))
        out.flush()
    finally:
        if out is not sys.stdout:
            out.close()
    return 0
