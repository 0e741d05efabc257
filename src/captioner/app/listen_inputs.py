"""The inputs of `captioner listen`: audio devices (``--input``) and audio files (``--file``),
in the order they were given, each one stream with its label, opened as sources.

A file plays at real-time pace through the desktop app's file source
(:class:`~captioner.audio.file_source.FileSource`), so its captions come as they would from a
person speaking now, on this machine or on a `captioner serve` server alike.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class ListenInput:
    """One ``--input`` (``name``: a device's name or index, ``None`` for the default input) or
    one ``--file`` (``name``: its path)."""

    kind: str  # "input" or "file"
    name: str | None


class InOrder(argparse.Action):
    """``--input`` and ``--file``: each value goes to its own list and to ``args.inputs_in_order``,
    so ``--label`` follows the order of the command line whichever kind each input is."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), values])
        kind = "file" if self.dest == "file" else "input"
        namespace.inputs_in_order = [*(getattr(namespace, "inputs_in_order", None) or []), ListenInput(kind, values)]


def listen_inputs(args) -> list[ListenInput]:
    """What to caption: the inputs and files given, else the default input."""
    return list(getattr(args, "inputs_in_order", None) or [ListenInput("input", None)])


def stream_labels(choices: list, labels: list[str] | None) -> list[str]:
    """Stream labels for resolved inputs: a device (``DeviceChoice``) or a file
    (``AudioFileInfo``). The user's ``--label``s, else "Meeting" for a monitor of an output,
    "Me" for a microphone and the file's name without its suffix for a file, a repeat numbered
    as in the desktop app ("Me", "Me 2")."""
    from captioner.engine.pipeline import unique_labels
    from captioner.errors import UserError

    if labels:
        if len(labels) != len(choices):
            raise UserError(f"--label given {len(labels)} times for {len(choices)} input(s): "
                            "give one per --input or --file")
        out = list(labels)
    else:
        out = unique_labels(_default_label(choice) for choice in choices)
    if len(set(out)) != len(out):
        raise UserError(f"stream labels must differ: {out}")
    return out


def _default_label(choice) -> str:
    from captioner.audio.file_source import AudioFileInfo

    if isinstance(choice, AudioFileInfo):
        return choice.path.stem
    from captioner.audio.devices import is_loopback_name

    return "Meeting" if is_loopback_name(choice.pulse_source or choice.name) else "Me"


def _resolve_device(name: str | None):
    """Each device is resolved once (a PortAudio scan, libpulse for PulseAudio names): its label
    is read from the resolution and its source opens what was found."""
    from captioner.audio.microphone import resolve_device

    return resolve_device(name)


def open_inputs(inputs: list[ListenInput], labels: list[str] | None) -> tuple[list, list[str]]:
    """The sources (made, not started) and their labels. Every file is checked first, so a
    missing or unreadable one is a one-line ``UserError`` before any device is looked for;
    devices are resolved only when there are any (a run with files alone needs no audio
    system)."""
    from captioner.audio.file_source import AudioFileInfo, FileSource, open_audio_file

    files = {i: open_audio_file(item.name) for i, item in enumerate(inputs) if item.kind == "file"}
    choices = [files[i] if i in files else _resolve_device(item.name) for i, item in enumerate(inputs)]
    names = stream_labels(choices, labels)
    sources = []
    for choice, label in zip(choices, names):
        if isinstance(choice, AudioFileInfo):  # real-time pace, as the desktop app plays a file
            sources.append(FileSource(choice.path, stream=label, realtime=True))
        else:
            from captioner.audio.microphone import MicrophoneSource

            sources.append(MicrophoneSource(choice, stream=label))
    return sources, names
