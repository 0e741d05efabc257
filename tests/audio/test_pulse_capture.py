"""Real capture through a real sound server: speech played into a PulseAudio null sink with
`paplay` is captured from the sink's monitor by MicrophoneSource (PortAudio -> ALSA `pulse`
device), turned into 16 kHz frames by StreamIngest, and must match what was played."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile as sf

from captioner.audio.microphone import MicrophoneSource
from captioner.events import FRAME_SAMPLES, SAMPLE_RATE_HZ

pytestmark = pytest.mark.pulse

CLIP_ID = "en_ls_1089-134686-0001"  # 3.3 s of read speech
FIRST_BLOCK_TIMEOUT_S = 20.0  # opening a stream through the ALSA plug-in can take a second or two
TAIL_S = 1.0  # keep capturing this long after paplay ends (server and plug-in latency)


def best_alignment(captured: np.ndarray, played: np.ndarray) -> tuple[int, float]:
    """Lag of ``played`` inside ``captured`` maximising their correlation, and the normalised
    cross-correlation at that lag (1.0 = identical up to gain)."""
    n = len(captured) + len(played)
    size = 1 << (n - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(captured, size) * np.conj(np.fft.rfft(played, size)), size)
    lag = int(np.argmax(corr[: len(captured) - len(played) + 1]))
    segment = captured[lag : lag + len(played)]
    ncc = float(np.dot(segment, played) / (np.linalg.norm(segment) * np.linalg.norm(played) + 1e-12))
    return lag, ncc


def active_span_s(x: np.ndarray, rel_threshold: float = 0.05) -> float:
    """Time from the first to the last sample louder than ``rel_threshold`` of the peak."""
    loud = np.flatnonzero(np.abs(x) > rel_threshold * np.abs(x).max())
    return (loud[-1] - loud[0]) / SAMPLE_RATE_HZ


def capture_while_playing(server, source: MicrophoneSource, wav, sink, sinks) -> tuple[np.ndarray, list, list]:
    """Captures from ``source`` while ``paplay`` plays ``wav`` into ``sink``, until a little
    after it ended: (the 16 kHz audio the engine makes of it, its blocks, the raw chunks).
    ``sinks`` is the fixture of tests/audio/conftest.py."""
    collector = sinks.Collector()
    source.start(collector)
    try:
        # The stream is live before anything is played.
        collector.wait(lambda c: c.chunks, FIRST_BLOCK_TIMEOUT_S, "audio from the monitor source")
        player = server.play(wav, sink)
        clip_s = sf.info(str(wav)).duration
        try:
            player.wait(timeout=clip_s + 15.0)
        except subprocess.TimeoutExpired:
            player.kill()
            pytest.fail("paplay did not finish in time")
        time.sleep(TAIL_S)
        assert player.returncode == 0, player.stderr.read().decode(errors="replace")
    finally:
        source.stop()
    assert collector.ends == [], "the device did not end by itself"
    chunks = collector.chunks
    blocks = sinks.frame(chunks)  # the engine's conversion (StreamIngest), flushed at the end
    return np.concatenate([b.samples for b in blocks]), blocks, chunks


@pytest.mark.parametrize("sink_index", [0, 1], ids=["48kHz", "44.1kHz"])
def test_monitor_capture_matches_played_speech(pulse_server, speech_clips, sinks, sink_index):
    sink = pulse_server.sinks[sink_index]
    clip = speech_clips[CLIP_ID]
    played, rate_hz = sf.read(str(clip.wav), dtype="float32")
    assert rate_hz == SAMPLE_RATE_HZ

    source = MicrophoneSource(sink.device, stream="Meeting")
    # Opened at the monitor's own rate: the 16 kHz conversion happens on our side.
    assert source.rate_hz == sink.rate_hz
    assert source.device.pulse_source == sink.monitor

    captured, blocks, chunks = capture_while_playing(pulse_server, source, clip.wav, sink, sinks)

    # What the device delivered: native-rate stereo copies, gapless on the native clock,
    # nothing refused, capture times in order.
    assert all(c.stream == "Meeting" and c.rate_hz == sink.rate_hz for c in chunks)
    assert all(c.samples.dtype == np.float32 and c.samples.shape == (source.block_frames, 2) for c in chunks)
    assert chunks[0].first_sample == 0
    assert all(a.end_sample == b.first_sample for a, b in zip(chunks, chunks[1:]))
    assert all(a.capture_ns <= b.capture_ns for a, b in zip(chunks, chunks[1:]))
    stats = source.stats()
    assert stats.dropped_blocks == 0
    assert stats.delivered_samples == sum(c.n_samples for c in chunks)
    # What the engine makes of it: whole 10 ms frames with a gapless running sample index.
    assert all(b.n_samples % FRAME_SAMPLES == 0 and b.stream == "Meeting" for b in blocks)
    assert blocks[0].first_sample == 0
    assert all(a.end_sample == b.first_sample for a, b in zip(blocks, blocks[1:]))
    expected_n = round(stats.delivered_samples * SAMPLE_RATE_HZ / sink.rate_hz)
    assert len(captured) == -(-expected_n // FRAME_SAMPLES) * FRAME_SAMPLES
    assert len(captured) > len(played)

    lag, ncc = best_alignment(captured, played)
    assert ncc >= 0.9, f"captured audio does not match what was played (NCC {ncc:.3f})"
    played_span_s = active_span_s(played)
    captured_span_s = active_span_s(captured[lag : lag + len(played)])
    assert abs(captured_span_s - played_span_s) <= 0.05 * played_span_s
    print(f"{sink.name}: NCC {ncc:.4f}, lag {lag / SAMPLE_RATE_HZ:.3f} s, span {captured_span_s:.3f}/{played_span_s:.3f} s")


def test_default_source_through_portaudio_device_name(pulse_server, speech_clips, sinks):
    """Opening PortAudio's ALSA `pulse` device by name captures the server's default source
    (the default sink's monitor), at PortAudio's default rate for that device."""
    clip = speech_clips[CLIP_ID]
    played, _ = sf.read(str(clip.wav), dtype="float32")
    source = MicrophoneSource("pulse", stream="Meeting")
    assert source.device.pulse_source is None and source.device.name == "pulse"
    captured, _, chunks = capture_while_playing(pulse_server, source, clip.wav, pulse_server.sink, sinks)
    assert chunks[0].rate_hz == source.rate_hz
    _, ncc = best_alignment(captured, played)
    assert ncc >= 0.9


def test_chosen_source_only(pulse_server, speech_clips, sinks):
    """Speech played into one sink is not heard on the other sink's monitor."""
    clip = speech_clips[CLIP_ID]
    quiet_sink = pulse_server.sinks[1]
    source = MicrophoneSource(quiet_sink.device, stream="Meeting")
    captured, _, chunks = capture_while_playing(pulse_server, source, clip.wav, pulse_server.sinks[0], sinks)
    assert sum(c.n_samples for c in chunks) > 3 * source.rate_hz  # it was capturing all along
    assert np.abs(captured).max() < 1e-4


def test_devices_command_lists_monitors(pulse_server):
    done = subprocess.run(
        [sys.executable, "-m", "captioner", "devices"], env=pulse_server.env,
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    monitor_lines = [line for line in lines if "captioner_test.monitor" in line]
    assert len(monitor_lines) == 1
    assert "[monitor]" in monitor_lines[0] and "[default]" in monitor_lines[0]
    assert "48000 Hz" in monitor_lines[0] and "--input pulse:captioner_test.monitor" in monitor_lines[0]
    assert any("captioner_test_44k.monitor" in line and "44100 Hz" in line for line in lines)
    assert any(line.split()[1:2] == ["pulse"] for line in lines if line.strip()[:1].isdigit())
    assert any(line.startswith("GPUs") for line in lines)
