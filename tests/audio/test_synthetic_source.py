import numpy as np
import pytest

from captioner.audio.source import AudioSource
from captioner.audio.synthetic import SyntheticSource, noise, silence, tone
from captioner.events import FRAME_SAMPLES, SAMPLE_RATE_HZ


def collect(source):
    source.start()
    blocks = []
    for _ in range(100_000):
        if source.exhausted:
            break
        blocks += source.read()
    source.stop()
    return blocks, np.concatenate([b.samples for b in blocks])


def peak_hz(x, rate_hz=SAMPLE_RATE_HZ):
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return np.fft.rfftfreq(len(x), 1 / rate_hz)[np.argmax(spectrum)]


@pytest.mark.parametrize("rate_hz", [16_000, 44_100, 48_000])
def test_tone_at_any_rate_arrives_as_the_same_tone_at_16k(rate_hz):
    source = SyntheticSource.tone(1_000.0, 1.0, rate_hz=rate_hz, amplitude=0.5, stream="Beep")
    assert isinstance(source, AudioSource)
    blocks, out = collect(source)
    assert len(out) == SAMPLE_RATE_HZ
    assert all(b.stream == "Beep" and b.n_samples % FRAME_SAMPLES == 0 for b in blocks)
    assert all(a.end_sample == b.first_sample for a, b in zip(blocks, blocks[1:]))
    assert peak_hz(out) == pytest.approx(1_000.0, abs=2.0)
    reference = tone(1_000.0, 1.0, SAMPLE_RATE_HZ, 0.5)
    np.testing.assert_allclose(out[800:-800], reference[800:-800], atol=2e-3)


def test_noise_is_reproducible_and_has_the_asked_level():
    a, b, c = noise(2.0, seed=7), noise(2.0, seed=7), noise(2.0, seed=8)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.std(a) == pytest.approx(0.1, rel=0.02)
    _, out = collect(SyntheticSource.noise(2.0, amplitude=0.1, seed=7))
    np.testing.assert_array_equal(out, a)


def test_silence_and_a_partial_last_frame():
    _, out = collect(SyntheticSource(silence(0.0123)))
    assert len(out) == 2 * FRAME_SAMPLES  # 197 samples -> two frames, the second padded
    assert not out.any()


def test_stereo_signal_is_mixed_down():
    left = tone(300.0, 0.5)
    _, out = collect(SyntheticSource(np.stack([left, np.zeros_like(left)], axis=1)))
    np.testing.assert_allclose(out, 0.5 * left, atol=1e-7)


@pytest.mark.parametrize("chunk_samples", [1, 97, 160, 5_000])
def test_chunking_does_not_change_the_output(chunk_samples):
    signal = noise(0.5, rate_hz=44_100, seed=3)
    _, reference = collect(SyntheticSource(signal, rate_hz=44_100))
    _, out = collect(SyntheticSource(signal, rate_hz=44_100, chunk_samples=chunk_samples, max_read_frames=3))
    np.testing.assert_allclose(out, reference, atol=1e-6)


def test_loop_keeps_going_in_real_time():
    now = [0]
    source = SyntheticSource(tone(500.0, 0.05), loop=True, realtime=True,
                             clock_ns=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + int(s * 1e9)))
    source.start()
    blocks = []
    for _ in range(30):
        now[0] += 100_000_000  # 100 ms of simulated time per read
        blocks += source.read()
    assert not source.exhausted
    total = sum(b.n_samples for b in blocks)
    assert total == 3 * SAMPLE_RATE_HZ  # 3 s of looped 50 ms tone, nothing skipped
    assert source.stats().delivered_frames == total // FRAME_SAMPLES


def test_empty_signal_is_refused():
    with pytest.raises(ValueError):
        SyntheticSource(np.zeros(0))
