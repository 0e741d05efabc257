import numpy as np
import pytest
import soundfile as sf

from captioner.audio.resample import (
    MIN_RATE_HZ,
    Resampler,
    check_rate,
    mixdown,
    resample_whole,
)
from captioner.errors import UserError
from captioner.events import SAMPLE_RATE_HZ

EDGE = 1_600  # 0.1 s at 16 kHz kept away from both ends


def fft_resample(x: np.ndarray, n_out: int) -> np.ndarray:
    """Reference: ideal band-limited resampling of a periodic signal, float64, via the DFT."""
    spectrum = np.fft.rfft(x)
    out = np.zeros(n_out // 2 + 1, dtype=complex)
    k = min(len(spectrum), len(out))
    out[:k] = spectrum[:k]
    return np.fft.irfft(out, n_out) * n_out / len(x)


def lowpass(x: np.ndarray, cut_hz: float, rate_hz: int = SAMPLE_RATE_HZ) -> np.ndarray:
    spectrum = np.fft.rfft(x)
    spectrum[np.fft.rfftfreq(len(x), 1 / rate_hz) > cut_hz] = 0
    return np.fft.irfft(spectrum, len(x))


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    return 10 * np.log10(np.sum(reference**2) / np.sum((test - reference) ** 2))


def stream_through(resampler: Resampler, x: np.ndarray, rng) -> np.ndarray:
    out, i = [], 0
    while i < len(x):
        n = int(rng.integers(1, 3_000))
        out.append(resampler.process(x[i : i + n]))
        i += n
    out.append(resampler.flush())
    return np.concatenate(out)


@pytest.fixture(scope="module")
def speech_16k(speech_clips):
    x, rate_hz = sf.read(str(speech_clips["en_ls_1089-134686-0001"].wav), dtype="float64")
    assert rate_hz == SAMPLE_RATE_HZ
    return x[: len(x) // 160 * 160]  # a multiple of 160 converts to 44.1/48 kHz in whole samples


@pytest.mark.parametrize("native_rate_hz", [44_100, 48_000])
def test_streaming_resampling_of_real_speech_matches_the_reference(speech_16k, native_rate_hz):
    native = fft_resample(speech_16k, len(speech_16k) * native_rate_hz // SAMPLE_RATE_HZ).astype(np.float32)
    out = stream_through(Resampler(native_rate_hz), native, np.random.default_rng(native_rate_hz))
    assert out.dtype == np.float32
    assert len(out) == len(speech_16k)
    x, y = speech_16k[EDGE:-EDGE], out[EDGE:-EDGE].astype(np.float64)
    # Full band the only loss is soxr's anti-alias roll-off just under 8 kHz ...
    assert snr_db(x, y) >= 30
    # ... below 7 kHz the conversion is transparent.
    assert snr_db(lowpass(speech_16k, 7_000)[EDGE:-EDGE], lowpass(out.astype(np.float64), 7_000)[EDGE:-EDGE]) >= 80


@pytest.mark.parametrize("native_rate_hz", [44_100, 48_000, 22_050, 8_000])
def test_streaming_equals_whole_signal_away_from_the_edges(speech_16k, native_rate_hz):
    native = fft_resample(speech_16k, len(speech_16k) * native_rate_hz // SAMPLE_RATE_HZ).astype(np.float32)
    streamed = stream_through(Resampler(native_rate_hz), native, np.random.default_rng(1))
    whole = resample_whole(native, native_rate_hz)
    n = min(len(streamed), len(whole))
    assert abs(len(streamed) - len(whole)) <= 1
    np.testing.assert_allclose(streamed[EDGE : n - EDGE], whole[EDGE : n - EDGE], atol=1e-6)


def test_stereo_is_mixed_down_before_resampling():
    t = np.arange(48_000) / 48_000
    left = np.sin(2 * np.pi * 300 * t).astype(np.float32)
    stereo = np.stack([left, 0.5 * left], axis=1)
    np.testing.assert_allclose(mixdown(stereo), 0.75 * left, atol=1e-7)
    mono_out = resample_whole(0.75 * left, 48_000)
    stereo_out = stream_through(Resampler(48_000), stereo, np.random.default_rng(2))
    np.testing.assert_allclose(stereo_out[EDGE:-EDGE], mono_out[EDGE:-EDGE], atol=1e-6)


def test_16khz_passes_through_untouched():
    resampler = Resampler(SAMPLE_RATE_HZ)
    assert resampler.passthrough
    x = np.random.default_rng(3).standard_normal((500, 2)).astype(np.float32)
    np.testing.assert_array_equal(resampler.process(x), x.mean(axis=1, dtype=np.float32))


def test_reset_forgets_history():
    resampler = Resampler(48_000)
    loud = np.ones(4_800, np.float32)
    resampler.process(loud)
    resampler.reset()
    quiet = resampler.process(np.zeros(48_000, np.float32))
    assert np.abs(quiet).max() == 0


@pytest.mark.parametrize("rate_hz", [0, 4_000, MIN_RATE_HZ - 1])
def test_rates_under_8khz_are_refused(rate_hz):
    with pytest.raises(UserError, match="at least 8000 Hz"):
        check_rate(rate_hz, "x")
    with pytest.raises(UserError):
        Resampler(rate_hz)
