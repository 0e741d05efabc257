"""`captioner listen` names its streams as the desktop app does: microphones "Me", a monitor
"Meeting", a file by its name; ``--label`` in the order the inputs and files were given."""

from pathlib import Path

import pytest

from captioner.app.cli import build_parser
from captioner.app.listen_inputs import ListenInput, listen_inputs
from captioner.app.listen_inputs import stream_labels as _labels
from captioner.audio.file_source import AudioFileInfo
from captioner.audio.microphone import DeviceChoice
from captioner.errors import UserError

MIC = DeviceChoice(0, "USB microphone", 48_000, 1)
HEADSET = DeviceChoice(1, "Headset", 16_000, 1)
MEETING = DeviceChoice(-1, "pulse", 48_000, 2, pulse_source="alsa_output.pci.analog-stereo.monitor")


def test_microphones_and_a_monitor_get_me_me_2_and_meeting():
    assert _labels([MIC, HEADSET, MEETING], None) == ["Me", "Me 2", "Meeting"]
    assert _labels([MEETING, MIC], None) == ["Meeting", "Me"]


def test_user_labels_are_kept_and_must_be_one_per_device_and_distinct():
    assert _labels([MIC, MEETING], ["Anna", "Call"]) == ["Anna", "Call"]
    with pytest.raises(UserError, match="one per --input"):
        _labels([MIC, MEETING], ["Anna"])
    with pytest.raises(UserError, match="must differ"):
        _labels([MIC, HEADSET], ["Anna", "Anna"])


def _file(path: str) -> AudioFileInfo:
    return AudioFileInfo(Path(path), "WAV", "PCM_16", 16_000, 1, 16_000)


def test_files_are_named_after_themselves_and_a_repeat_is_numbered():
    assert _labels([_file("/a/talk.wav"), MIC, _file("/b/talk.flac")], None) == ["talk", "Me", "talk 2"]
    assert _labels([_file("/a/talk.wav"), MEETING], ["Recording", "Call"]) == ["Recording", "Call"]
    with pytest.raises(UserError, match="one per --input or --file"):
        _labels([_file("/a/talk.wav"), MIC], ["Anna"])


def test_inputs_and_files_keep_the_order_of_the_command_line():
    args = build_parser().parse_args(["listen", "--file", "a.wav", "-i", "monitor", "--file", "b.flac"])
    assert listen_inputs(args) == [ListenInput("file", "a.wav"), ListenInput("input", "monitor"),
                                   ListenInput("file", "b.flac")]
    assert args.input == ["monitor"] and args.file == ["a.wav", "b.flac"]
    assert listen_inputs(build_parser().parse_args(["listen"])) == [ListenInput("input", None)]
