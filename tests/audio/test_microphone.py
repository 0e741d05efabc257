"""MicrophoneSource: device resolution, the callback's contract, drops when the sink refuses,
the end of a device that goes away."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from captioner.audio.microphone import MicrophoneSource
from captioner.audio.source import AudioSource, RawChunk, SourceEnd
from captioner.errors import UserError
from captioner.events import FRAME_SAMPLES, SAMPLE_RATE_HZ

FIRST_CHUNK_TIMEOUT_S = 20.0  # opening a stream through the ALSA plug-in can take a second or two


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
        "import captioner.audio.synthetic, captioner.audio.ingest, captioner.app.commands.devices\n"
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
def test_the_callback_hands_over_copies_and_counts_refusals_and_overflows(pulse_server, sinks):
    source = MicrophoneSource(pulse_server.sinks[0].device, stream="Meeting", block_ms=20.0)  # 48 kHz
    assert isinstance(source, AudioSource) and source.live
    assert source.rate_hz == 48_000 and source.channels == 2 and source.block_frames == 960
    sink = sinks.Collector()
    # The callback runs without the stream here: plain code, fed as PortAudio feeds it.
    source._sink = sink
    block = np.full((960, 2), 0.25, np.float32)
    before_ns = time.monotonic_ns()
    for i in range(10):
        source._callback(block, 960, None, Flags(overflow=(i == 1)))
    sink.take = False  # the consumer falls behind: three blocks are refused ...
    for _ in range(3):
        source._callback(block, 960, None, Flags(False))
    sink.take = True
    block[:] = 0.5  # ... and the driver's buffer is reused for what comes next
    for _ in range(10):
        source._callback(block, 960, None, Flags(False))

    chunks = sink.chunks
    assert len(chunks) == 20 and sink.calls == 23
    stats = source.stats()
    assert (stats.dropped_blocks, stats.overflows, stats.delivered_samples, stats.queue_depth) == (3, 1, 20 * 960, 0)
    assert all(c.stream == "Meeting" and c.rate_hz == 48_000 and c.samples.shape == (960, 2) for c in chunks)
    assert all(np.all(c.samples == 0.25) for c in chunks[:10]), "chunks are copies, not the driver's buffer"
    assert all(np.all(c.samples == 0.5) for c in chunks[10:])
    assert before_ns <= chunks[0].capture_ns and all(a.capture_ns <= b.capture_ns for a, b in zip(chunks, chunks[1:]))
    # The native clock went on under the refused blocks: the consumer sees the gap, exactly.
    assert [c.first_sample for c in chunks] == [i * 960 for i in range(10)] + [i * 960 for i in range(13, 23)]

    # ... and the engine's conversion moves its 16 kHz clock over it.
    blocks = sinks.frame(chunks, flush=False)
    jumps = [(a, b) for a, b in zip(blocks, blocks[1:]) if a.end_sample != b.first_sample]
    assert len(jumps) == 1
    after_gap = jumps[0][1]
    assert after_gap.first_sample == 13 * 960 * SAMPLE_RATE_HZ // 48_000
    assert np.all(np.abs(after_gap.samples[FRAME_SAMPLES:] - 0.5) < 0.02)  # no history across the gap
    assert source.exhausted is False


def wait_for_chunks(sink, n: int = 1) -> None:
    sink.wait(lambda c: len(c.chunks) >= n, FIRST_CHUNK_TIMEOUT_S, f"{n} chunk(s) from the device")


@pytest.mark.pulse
def test_a_refusing_sink_loses_counted_blocks_not_the_stream(pulse_server, sinks):
    source = MicrophoneSource(pulse_server.sinks[1].device, stream="Meeting")  # 44.1 kHz
    sink = sinks.Collector()
    source.start(sink)
    try:
        wait_for_chunks(sink, 10)
        sink.take = False  # a full inbox, for a second
        time.sleep(1.0)
        sink.take = True
        seen = len(sink.chunks)
        wait_for_chunks(sink, seen + 20)
    finally:
        source.stop()
    stats = source.stats()
    chunks = sink.chunks
    assert stats.dropped_blocks > 10
    assert stats.delivered_samples == sum(c.n_samples for c in chunks)
    jumps = [b.first_sample - a.end_sample for a, b in zip(chunks, chunks[1:])]
    assert all(j >= 0 for j in jumps)
    # Sample-exact on the native clock: the gaps add up to the refused blocks.
    assert sum(jumps) == stats.dropped_blocks * source.block_frames
    assert sum(jumps) / source.rate_hz == pytest.approx(1.0, abs=0.3)
    blocks = sinks.frame(chunks, flush=False)
    assert blocks[0].first_sample == 0
    lost_s = sum(b.first_sample - a.end_sample for a, b in zip(blocks, blocks[1:])) / SAMPLE_RATE_HZ
    # The 16 kHz gap is the lost audio plus what was still inside the resampler and the last
    # partial frame before it (dropped with it), and ends where the audio resumed.
    assert sum(jumps) / source.rate_hz <= lost_s < sum(jumps) / source.rate_hz + 0.05
    assert sink.ends == [] and not source.exhausted  # our own stop is no SourceEnd


@pytest.mark.pulse
def test_nothing_is_delivered_after_stop_and_a_restart_starts_a_new_clock(pulse_server, sinks):
    source = MicrophoneSource(pulse_server.sink.device)
    sink = sinks.Collector()
    source.start(sink)
    try:
        wait_for_chunks(sink, 3)
        with pytest.raises(RuntimeError, match="already started"):
            source.start(sinks.Collector())
    finally:
        source.stop()
    calls = sink.calls
    time.sleep(0.2)
    assert sink.calls == calls and sink.ends == []
    source.stop()  # twice is fine

    again = sinks.Collector()
    source.start(again)
    try:
        wait_for_chunks(again)
    finally:
        source.stop()
    assert again.chunks[0].first_sample == 0
    assert all(isinstance(item, RawChunk) for item in again.items)


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
def test_a_vanishing_server_ends_the_stream_with_a_source_end(pulse_helper, sinks, monkeypatch):
    own = pulse_helper.start_pulse_server()  # a server of its own, to kill mid-stream
    try:
        monkeypatch.setenv("PULSE_SERVER", own.server)
        source = MicrophoneSource(own.sink.device, stream="Gone")
        sink = sinks.Collector()
        source.start(sink)
        try:
            wait_for_chunks(sink)
            own.process.kill()
            own.process.wait(timeout=10)
            end = sink.wait_end(timeout_s=10)
            assert end == SourceEnd("Gone", error="input device stopped")
            assert source.exhausted
        finally:
            started = time.monotonic()
            source.stop()
            assert time.monotonic() - started < 5.0  # no hang on a dead device
        assert len(sink.ends) == 1  # our stop after the loss adds no second end
    finally:
        own.stop()


@pytest.mark.pulse
def test_a_sink_that_raises_ends_the_stream_saying_so(pulse_server, sinks):
    source = MicrophoneSource(pulse_server.sink.device, stream="Me")
    ends = []

    def broken_sink(item):
        if isinstance(item, SourceEnd):
            ends.append(item)
            return True
        raise KeyError("no such stream")

    source.start(broken_sink)
    try:
        deadline = time.monotonic() + FIRST_CHUNK_TIMEOUT_S
        while not ends:
            assert time.monotonic() < deadline, "the stream did not end"
            time.sleep(0.05)
    finally:
        source.stop()
    assert ends == [SourceEnd("Me", error="the consumer failed: 'no such stream'")]
    assert source.exhausted
