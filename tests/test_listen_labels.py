"""`captioner listen` names its streams as the desktop app does."""

import pytest

from captioner.app.commands.listen import _labels
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
