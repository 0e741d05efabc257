"""`captioner listen --server URL`: the inputs captured here, captioned by `captioner serve`.

The terminal side of `listen` stays as it is: a :class:`~captioner.serve.client.RemotePipeline`
has the shape of the local pipeline (captions, status, lost inputs — here a connection being
retried — and the transcript written as lines are committed), so the same loop drives either.
Each input tells the server what its audio is (``source=``: ``microphone``, ``meeting`` for a
monitor of an output, ``file`` for ``--file``), so the server's ``--speakers auto`` labels the
speakers of a meeting or a file and leaves a microphone unlabelled; the captions' ``speaker``
reaches the view and the transcript as a local pipeline's does. ``--speakers off`` drops the
labels here; ``--speakers on`` does not tell the server that a microphone is one, so it labels
that too (what a server started with ``--speakers off`` does not do: the server decides).
"""

from __future__ import annotations

from captioner.errors import UserError


def check_server_arguments(args, local_device_allowed: bool = False) -> None:
    """The server URL and the token file, refused on one line before any device is opened
    (the desktop app keeps ``--device`` for when its Server field is emptied)."""
    if args.server is None:
        raise UserError("--token-file needs --server")
    from captioner.app.commands.serve import read_token
    from captioner.serve.client import stream_url

    stream_url(args.server, "Me", None)
    args.token = read_token(args.token_file) if args.token_file else None
    if args.device is not None and not local_device_allowed:
        raise UserError("--device picks where a local model runs; with --server the server's device is used")


def remote_pipeline(sources, args, transcript):
    from captioner.serve.client import RemotePipeline

    return RemotePipeline(sources, server=args.server, token=getattr(args, "token", None),
                          language=args.language, transcript=transcript,
                          speakers=getattr(args, "speakers", None) or "auto")
