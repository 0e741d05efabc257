"""SyntheticSource, and through it the replay thread every finite source shares."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

from captioner.audio.replay import REPLAY_CHUNK_S
from captioner.audio.source import AudioSource, RawChunk, SourceEnd
from captioner.audio.synthetic import SyntheticSource, noise, silence, tone
from captioner.errors import UserError
from captioner.events import FRAME_SAMPLES, NS_PER_S, SAMPLE_RATE_HZ


def peak_hz(x, rate_hz=SAMPLE_RATE_HZ):
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return np.fft.rfftfreq(len(x), 1 / rate_hz)[np.argmax(spectrum)]


@pytest.mark.parametrize("rate_hz", [16_000, 44_100, 48_000])
def test_a_tone_is_delivered_at_its_own_rate_in_20ms_chunks(sinks, rate_hz):
    source = SyntheticSource.tone(1_000.0, 1.0, rate_hz=rate_hz, amplitude=0.5, stream="Beep")
    assert isinstance(source, AudioSource)
    assert (source.rate_hz, source.live) == (rate_hz, False)
    sink = sinks.run_to_end(source)

    assert sink.ends == [SourceEnd("Beep")] and isinstance(sink.items[-1], SourceEnd)
    assert source.exhausted
    chunks = sink.chunks
    assert {c.stream for c in chunks} == {"Beep"} and {c.rate_hz for c in chunks} == {rate_hz}
    chunk_samples = round(rate_hz * REPLAY_CHUNK_S)
    assert all(c.samples.shape == (chunk_samples,) and c.samples.dtype == np.float32 for c in chunks)
    assert chunks[0].first_sample == 0
    assert all(a.end_sample == b.first_sample for a, b in zip(chunks, chunks[1:]))
    np.testing.assert_array_equal(sinks.joined(chunks), tone(1_000.0, 1.0, rate_hz, 0.5))
    assert source.stats().delivered_samples == rate_hz
    assert sink.threads == {"captioner-replay-Beep"}

    # The engine's conversion of those chunks: the same tone at 16 kHz.
    blocks = sinks.frame(chunks)
    out = sinks.joined(blocks)
    assert len(out) == SAMPLE_RATE_HZ
    assert all(b.n_samples % FRAME_SAMPLES == 0 for b in blocks)
    assert peak_hz(out) == pytest.approx(1_000.0, abs=2.0)
    np.testing.assert_allclose(out[800:-800], tone(1_000.0, 1.0, SAMPLE_RATE_HZ, 0.5)[800:-800], atol=2e-3)


def test_noise_is_reproducible_and_has_the_asked_level(sinks):
    a, b, c = noise(2.0, seed=7), noise(2.0, seed=7), noise(2.0, seed=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.std(a) == pytest.approx(0.1, rel=0.02)
    sink = sinks.run_to_end(SyntheticSource.noise(2.0, amplitude=0.1, seed=7))
    np.testing.assert_array_equal(sinks.joined(sink.chunks), a)


def test_the_last_chunk_is_short_and_the_engine_pads_its_frame(sinks):
    sink = sinks.run_to_end(SyntheticSource(silence(0.0123)))  # 197 samples
    assert [c.n_samples for c in sink.chunks] == [197]
    out = sinks.joined(sinks.frame(sink.chunks))
    assert len(out) == 2 * FRAME_SAMPLES and not out.any()  # the second frame padded


def test_stereo_signal_is_delivered_mixed_down(sinks):
    left = tone(300.0, 0.5)
    sink = sinks.run_to_end(SyntheticSource(np.stack([left, np.zeros_like(left)], axis=1)))
    assert all(c.samples.ndim == 1 for c in sink.chunks)
    np.testing.assert_allclose(sinks.joined(sink.chunks), 0.5 * left, atol=1e-7)


def test_realtime_releases_each_chunk_when_its_last_sample_is_due(sinks):
    clock = sinks.FakeClock()
    source = SyntheticSource.tone(500.0, 0.5, rate_hz=44_100, realtime=True, clock_ns=clock, sleep=clock.sleep)
    start_ns = clock.now_ns
    sink, arrivals = sinks.run_timed(source, clock)
    chunks = sink.chunks
    assert sum(c.n_samples for c in chunks) == 22_050
    for chunk, arrived_ns in zip(chunks, arrivals):
        due_ns = start_ns + -(-chunk.end_sample * NS_PER_S // 44_100)
        assert chunk.capture_ns == due_ns
        assert due_ns <= arrived_ns < due_ns + 1_000  # never early; late only by the clock's rounding
    # It slept from one chunk to the next (a fake clock moves only then), never spun.
    assert len(clock.sleeps_s) >= len(chunks)
    assert sum(clock.sleeps_s) == pytest.approx(0.5, abs=1e-3)
    assert max(clock.sleeps_s) == pytest.approx(REPLAY_CHUNK_S, abs=1e-3)


def test_realtime_on_the_real_clock_takes_as_long_as_the_audio_and_sleeps_meanwhile(sinks):
    source = SyntheticSource.tone(500.0, 1.0, realtime=True)
    wall_start, cpu_start = time.monotonic(), time.process_time()
    sink = sinks.run_to_end(source, timeout_s=30)
    wall_s, cpu_s = time.monotonic() - wall_start, time.process_time() - cpu_start
    assert 0.95 <= wall_s < 3.0
    assert cpu_s < 0.5 * wall_s, "the replay thread must sleep, not spin, until a chunk is due"
    received_ns = time.monotonic_ns()
    assert all(c.capture_ns <= received_ns for c in sink.chunks)
    assert sum(c.n_samples for c in sink.chunks) == SAMPLE_RATE_HZ


def test_loop_keeps_going_until_the_sink_refuses(sinks):
    clock = sinks.FakeClock()
    signal = tone(500.0, 0.05)  # 800 samples: chunks of 320 straddle the loop points
    source = SyntheticSource(signal, loop=True, realtime=True, clock_ns=clock, sleep=clock.sleep)
    sink = sinks.Collector(limit=150)  # 3 s of chunks, then "the consumer is shutting down"
    source.start(sink)
    sink.wait(lambda c: c.calls > 150, 30, "the refused chunk")
    source.stop()
    assert sink.calls == 151 and sink.ends == []  # a refusal ends the delivery, no SourceEnd
    assert not source.exhausted
    out = sinks.joined(sink.chunks)
    assert len(out) == 3 * SAMPLE_RATE_HZ
    np.testing.assert_array_equal(out, np.tile(signal, 60))
    assert all(a.end_sample == b.first_sample for a, b in zip(sink.chunks, sink.chunks[1:]))
    assert source.stats().delivered_samples == 3 * SAMPLE_RATE_HZ


def test_a_blocking_sink_slows_the_replay_down_and_nothing_is_dropped(sinks):
    source = SyntheticSource.noise(2.0, seed=1)  # as fast as the sink takes it
    inbox: queue.Queue = queue.Queue(maxsize=2)
    source.start(lambda item: inbox.put(item) or True)  # blocks while the consumer is behind
    received = []
    while not received or not isinstance(received[-1], SourceEnd):
        time.sleep(0.001)  # a slow consumer
        received.append(inbox.get(timeout=10))
    source.stop()
    np.testing.assert_array_equal(sinks.joined(received[:-1]), noise(2.0, seed=1))


def test_stop_wakes_a_waiting_replay_and_nothing_comes_after_it(sinks):
    source = SyntheticSource.silence(60.0, realtime=True, stream="Long")
    sink = sinks.Collector()
    source.start(sink)
    sink.wait(lambda c: c.chunks, 10, "the first chunk")
    assert any(t.name == "captioner-replay-Long" for t in threading.enumerate())
    started = time.monotonic()
    source.stop()
    assert time.monotonic() - started < 0.5  # woken from its wait, not at the next due time
    assert not any(t.name == "captioner-replay-Long" for t in threading.enumerate())
    calls = sink.calls
    time.sleep(0.1)
    assert sink.calls == calls and sink.ends == [] and not source.exhausted
    source.stop()  # twice is fine


def test_a_sink_may_stop_its_source_from_inside_and_it_can_start_again(sinks):
    source = SyntheticSource.noise(1.0, seed=9)
    got = []
    stopped = threading.Event()

    def stopping_sink(item):
        got.append(item)
        source.stop()  # on the replay thread: must not deadlock joining itself
        stopped.set()
        time.sleep(0.05)  # still inside the sink when the restart below comes
        return True

    source.start(stopping_sink)
    assert stopped.wait(10)
    again = sinks.Collector()
    source.start(again)  # waits for the stopped thread to finish, then replays afresh
    again.wait_end(10)
    source.stop()
    assert len(got) == 1 and isinstance(got[0], RawChunk)
    assert not any(t.name == "captioner-replay-Synthetic" for t in threading.enumerate())
    np.testing.assert_array_equal(sinks.joined(again.chunks), noise(1.0, seed=9))


def test_restart_replays_from_the_beginning_and_twice_running_is_refused(sinks):
    source = SyntheticSource.noise(0.2, seed=2)
    first = sinks.run_to_end(source)
    again = sinks.run_to_end(source)
    assert again.chunks[0].first_sample == 0
    np.testing.assert_array_equal(sinks.joined(again.chunks), sinks.joined(first.chunks))
    blocker = threading.Event()
    source.start(lambda item: blocker.wait(10) and False)
    try:
        with pytest.raises(RuntimeError, match="already started"):
            source.start(sinks.Collector())
    finally:
        blocker.set()
        source.stop()


def test_stop_before_start_is_fine():
    SyntheticSource.silence(0.1).stop()


def test_empty_signal_and_low_rates_are_refused():
    with pytest.raises(ValueError):
        SyntheticSource(np.zeros(0))
    with pytest.raises(UserError, match="at least 8000 Hz"):
        SyntheticSource(np.zeros(100), rate_hz=4_000)
