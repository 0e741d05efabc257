"""MicrophoneSource: device resolution, the callback's contract, drops on a stalled consumer."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from captioner.audio.microphone import MicrophoneSource
from captioner.errors import UserError
from captioner.events import FRAME_SAMPLES, SAMPLE_RATE_HZ


@pytest.mark.parametrize("device", ["no such microphone 12345", 4242, "4242", "pulse:no_such_source.monitor"])
def test_a_device_that_does_not_exist_is_a_one_line_error(device):
    with pytest.raises(UserError) as caught:
        MicrophoneSource(device)
    message = str(caught.value)
    assert "\n" not in message
    assert "captioner devices" in message


def test_empty_pulse_source_name_is_refused():
    with pytest.raises(UserError, match="needs a source name"):
        MicrophoneSource("pulse:")


def test_audio_modules_import_without_touching_hardware_libraries():
    code = (
        "import sys\n"
        "import captioner.audio.microphone, captioner.audio.devices, captioner.audio.file_source\n"
        "import captioner.audio.synthetic, captioner.app.commands.devices\n"
        "bad = {'sounddevice', 'soundfile', 'soxr', 'cupy', 'PySide6', 'pynvml'} & set(sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class Flags:
    """What PortAudio hands the callback as ``status``: truthy when the driver flagged trouble."""

    def __init__(self, overflow: bool):
        self.input_overflow = overflow

    def __bool__(self) -> bool:
        return self.input_overflow


@pytest.mark.pulse
def test_callback_counts_overflows_and_drops_and_the_clock_jumps_over_the_gap(pulse_server):
    sink = pulse_server.sinks[0]  # 48 kHz
    source = MicrophoneSource(sink.device, stream="Meeting", block_ms=20.0, queue_s=0.1)
    assert source.rate_hz == 48_000 and source.channels == 2 and source.block_frames == 960
    capacity = source._queue.maxsize
    block = np.full((960, 2), 0.25, np.float32)

    # The callback runs without the stream here: it is plain code, fed as PortAudio feeds it.
    for i in range(capacity + 3):
        source._callback(block, 960, None, Flags(overflow=(i == 1)))
    stats = source.stats()
    assert (stats.dropped_blocks, stats.overflows, stats.queue_depth) == (3, 1, capacity)

    blocks = source.read()  # the consumer catches up ...
    assert source.stats().queue_depth == 0
    block[:] = 0.5
    for _ in range(5):  # ... and these blocks arrive after the 3 dropped ones
        source._callback(block, 960, None, Flags(False))
    blocks += source.read()
    jumps = [(b.first_sample - a.end_sample, b) for a, b in zip(blocks, blocks[1:]) if b.first_sample != a.end_sample]
    assert len(jumps) == 1, "exactly one gap, where the blocks were dropped"
    gap, after_gap = jumps[0]
    # The first block after the gap starts on the frame grid at (or just after, < 1 frame)
    # where the dropped audio ended: capacity + 3 blocks of 20 ms.
    expected = (capacity + 3) * 960 * SAMPLE_RATE_HZ // 48_000
    assert after_gap.first_sample % FRAME_SAMPLES == 0
    assert expected <= after_gap.first_sample < expected + FRAME_SAMPLES
    assert gap >= 3 * 320 - FRAME_SAMPLES
    # Resampler history was not carried across the gap: the new level shows at once.
    assert np.all(np.abs(after_gap.samples[FRAME_SAMPLES:] - 0.5) < 0.02)
    assert all(np.all(np.abs(b.samples[FRAME_SAMPLES:-FRAME_SAMPLES] - 0.25) < 0.02)
               for b in blocks if b.end_sample <= expected - 320)
    assert source.stats().queue_depth == 0
    # Capture times come from the callback, in order.
    assert all(a.capture_ns <= b.capture_ns for a, b in zip(blocks, blocks[1:]))


@pytest.mark.pulse
def test_a_stalled_consumer_loses_counted_blocks_not_the_stream(pulse_server):
    source = MicrophoneSource(pulse_server.sinks[1].device, stream="Meeting", queue_s=0.1)
    source.start()
    try:
        deadline = time.monotonic() + 20
        blocks = []
        while not blocks:
            assert time.monotonic() < deadline, "no audio arrived"
            blocks += source.read(timeout_s=0.2)
        time.sleep(1.0)  # the consumer stalls: the 0.1 s queue overflows
        stalled_until = time.monotonic() + 1.0
        while time.monotonic() < stalled_until:
            blocks += source.read(timeout_s=0.05)
    finally:
        source.stop()
    stats = source.stats()
    assert stats.dropped_blocks > 10
    jumps = [b.first_sample - a.end_sample for a, b in zip(blocks, blocks[1:])]
    assert all(j >= 0 and j % FRAME_SAMPLES == 0 for j in jumps)
    assert sum(jumps) > 0
    lost_s = sum(jumps) / SAMPLE_RATE_HZ
    dropped_s = stats.dropped_blocks * source.block_frames / source.rate_hz
    assert lost_s == pytest.approx(dropped_s, abs=0.05)
    assert source.exhausted or source.stats().queue_depth > 0
    source.stop()  # twice is fine


@pytest.mark.pulse
def test_names_resolve_to_pulse_sources(pulse_server):
    # "monitor" alone: what the machine plays, i.e. the default sink's monitor.
    assert MicrophoneSource("monitor").device.pulse_source == "captioner_test.monitor"
    pulse_server.pactl("set-default-sink", "captioner_test_44k")
    try:
        chosen = MicrophoneSource("monitor").device
        assert (chosen.pulse_source, chosen.rate_hz) == ("captioner_test_44k.monitor", 44_100)
    finally:
        pulse_server.pactl("set-default-sink", "captioner_test")
    # Any unique part of a source name works; an ambiguous one is refused, naming the candidates.
    assert MicrophoneSource("TEST_44k").device.pulse_source == "captioner_test_44k.monitor"
    with pytest.raises(UserError, match="ambiguous.*captioner_test.monitor.*captioner_test_44k.monitor"):
        MicrophoneSource("captioner_test")
    # PortAudio devices first: "default" is PortAudio's ALSA default device (the server's default source).
    chosen = MicrophoneSource("default").device
    assert chosen.pulse_source is None and chosen.name == "default"


@pytest.mark.pulse
def test_a_vanishing_server_ends_the_stream_without_hanging(pulse_helper, monkeypatch):
    own = pulse_helper.start_pulse_server()  # a server of its own, to kill mid-stream
    try:
        monkeypatch.setenv("PULSE_SERVER", own.server)
        source = MicrophoneSource(own.sink.device)
        source.start()
        deadline = time.monotonic() + 20
        while not source.read(timeout_s=0.2):
            assert time.monotonic() < deadline, "no audio arrived"
        own.process.kill()
        own.process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not source.exhausted:
            assert time.monotonic() < deadline, "the dead stream was not noticed"
            source.read(timeout_s=0.1)
        source.stop()
    finally:
        own.stop()
