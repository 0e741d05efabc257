"""StreamIngest: any rate, dtype and channel count in; 16 kHz whole frames on an exact clock out."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.audio.ingest import StreamIngest
from captioner.audio.synthetic import noise, tone
from captioner.events import FRAME_SAMPLES, NS_PER_S, SAMPLE_RATE_HZ


def feed(ingest: StreamIngest, rate_hz: int, signal: np.ndarray, chunk_samples: int, first_sample: int = 0,
         with_index: bool = True) -> list:
    """Feeds ``signal`` in chunks, each stamped with its last sample's time on the native clock."""
    blocks = []
    for start in range(0, len(signal), chunk_samples):
        piece = signal[start : start + chunk_samples]
        end = first_sample + start + len(piece)
        capture_ns = end * NS_PER_S // rate_hz
        block = ingest.accept(rate_hz, piece, capture_ns, first_sample + start if with_index else None)
        if block is not None:
            blocks.append(block)
    return blocks


def run(rate_hz: int, signal: np.ndarray, chunk_samples: int) -> tuple[list, np.ndarray]:
    ingest = StreamIngest("s")
    blocks = feed(ingest, rate_hz, signal, chunk_samples)
    tail = ingest.flush(len(signal) * NS_PER_S // rate_hz)
    blocks += [tail] if tail is not None else []
    return blocks, np.concatenate([b.samples for b in blocks])


def peak_hz(x: np.ndarray, rate_hz: int = SAMPLE_RATE_HZ) -> float:
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / rate_hz)[np.argmax(spectrum)])


def assert_gapless_frames(blocks, stream: str = "s", first: int = 0) -> None:
    assert blocks[0].first_sample == first
    assert all(b.stream == stream and b.n_samples % FRAME_SAMPLES == 0 and b.n_samples > 0 for b in blocks)
    assert all(a.end_sample == b.first_sample for a, b in zip(blocks, blocks[1:]))
    assert all(b.samples.dtype == np.float32 for b in blocks)


@pytest.mark.parametrize("rate_hz", [8_000, 16_000, 44_100, 48_000])
def test_a_1khz_tone_at_any_rate_comes_out_at_1khz_with_the_right_length(rate_hz):
    duration_s = 1.0037  # not a whole number of frames: the end is padded
    signal = tone(1_000.0, duration_s, rate_hz, amplitude=0.5)
    blocks, out = run(rate_hz, signal, chunk_samples=rate_hz // 50)  # 20 ms chunks, like a device
    assert_gapless_frames(blocks)

    expected_n = round(len(signal) * SAMPLE_RATE_HZ / rate_hz)
    assert len(out) == -(-expected_n // FRAME_SAMPLES) * FRAME_SAMPLES  # the last frame padded
    loud = np.flatnonzero(np.abs(out) > 0.05)
    assert abs((loud[-1] + 1) - expected_n) <= 3, "the tone ends where the input ends, within a few samples"
    assert np.all(out[expected_n + 3 :] == 0)
    assert peak_hz(out[:expected_n]) == pytest.approx(1_000.0, abs=1.0)
    # Not only the right pitch: the right waveform, in phase, at every 16 kHz sample.
    reference = tone(1_000.0, duration_s, SAMPLE_RATE_HZ, amplitude=0.5)
    edge = 400
    np.testing.assert_allclose(out[edge : expected_n - edge], reference[edge : expected_n - edge], atol=2e-3)


def test_int16_is_scaled_to_full_scale_floats():
    ints = (np.arange(-32768, 32768, 7, dtype=np.int32)).astype(np.int16)
    _, out_int = run(SAMPLE_RATE_HZ, ints, 1_000)
    _, out_float = run(SAMPLE_RATE_HZ, ints.astype(np.float32) / 32768, 1_000)
    np.testing.assert_array_equal(out_int, out_float)
    assert out_int.min() == -1.0 and out_int.max() < 1.0


def test_float64_and_float32_give_the_same_frames():
    signal = noise(0.3, rate_hz=44_100, seed=4).astype(np.float64)
    _, from_64 = run(44_100, signal, 882)
    _, from_32 = run(44_100, signal.astype(np.float32), 882)
    np.testing.assert_array_equal(from_64, from_32)


def test_channels_are_mixed_down():
    left = tone(300.0, 0.5, 48_000)
    right = tone(700.0, 0.5, 48_000, amplitude=0.25)
    _, stereo_out = run(48_000, np.stack([left, right], axis=1), 960)
    _, mono_out = run(48_000, (left + right) / 2, 960)
    np.testing.assert_allclose(stereo_out, mono_out, atol=1e-6)
    _, one_column = run(48_000, left[:, None], 960)
    _, flat = run(48_000, left, 960)
    np.testing.assert_array_equal(one_column, flat)


@pytest.mark.parametrize("chunk_samples", [1, 97, 441, 5_000])
def test_how_the_audio_is_cut_does_not_change_the_frames(chunk_samples):
    signal = noise(0.5, rate_hz=44_100, seed=3)
    reference_blocks, reference = run(44_100, signal, 882)
    blocks, out = run(44_100, signal, chunk_samples)
    assert_gapless_frames(blocks)
    assert len(out) == len(reference)
    np.testing.assert_allclose(out, reference, atol=1e-6)


@pytest.mark.parametrize(
    "rate_hz, samples, message",
    [
        (7_999, np.zeros(10, np.float32), "outside 8000"),
        (0, np.zeros(10, np.float32), "outside 8000"),
        (400_000, np.zeros(10, np.float32), "outside 8000"),
        (44_100.5, np.zeros(10, np.float32), "whole number"),
        ("16000", np.zeros(10, np.float32), "whole number"),
        (True, np.zeros(10, np.float32), "whole number"),
        (None, np.zeros(10, np.float32), "whole number"),
        (16_000, np.zeros((4, 2, 2), np.float32), r"\[n\] or \[n, channels\]"),
        (16_000, np.float32(0.5), r"\[n\] or \[n, channels\]"),
        (16_000, np.zeros((4, 0), np.float32), "no channels"),
        (16_000, np.array([0.0, np.nan], np.float32), "NaN or infinite"),
        (16_000, np.array([[0.0, 0.0], [np.inf, 0.0]]), "NaN or infinite"),
        (16_000, np.array([0.0, -np.inf]), "NaN or infinite"),
        (16_000, np.array([1e39, 0.0]), "NaN or infinite"),  # a float64 beyond float32's range
        (16_000, np.zeros(10, np.int32), "float32, float64 or int16"),
        (16_000, np.zeros(10, np.uint8), "float32, float64 or int16"),
        (16_000, np.zeros(10, np.complex64), "float32, float64 or int16"),
        (16_000, ["a", "b"], "float32, float64 or int16"),
    ],
)
def test_bad_input_is_a_one_line_value_error_and_changes_nothing(rate_hz, samples, message):
    ingest = StreamIngest("s")
    good = tone(440.0, 0.1)
    first = ingest.accept(SAMPLE_RATE_HZ, good[:800], 0)
    with pytest.raises(ValueError, match=message) as caught:
        ingest.accept(rate_hz, samples, 1)
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200
    # The stream goes on as if the bad chunk had never come.
    second = ingest.accept(SAMPLE_RATE_HZ, good[800:], 2)
    assert second.first_sample == first.end_sample
    np.testing.assert_array_equal(np.concatenate([first.samples, second.samples]), good)


def test_first_sample_may_not_go_backwards_or_below_zero():
    ingest = StreamIngest("s")
    ingest.accept(SAMPLE_RATE_HZ, np.zeros(320, np.float32), 0, first_sample=0)
    with pytest.raises(ValueError, match="goes back"):
        ingest.accept(SAMPLE_RATE_HZ, np.zeros(320, np.float32), 0, first_sample=100)
    with pytest.raises(ValueError, match=">= 0"):
        ingest.accept(SAMPLE_RATE_HZ, np.zeros(320, np.float32), 0, first_sample=-1)
    assert ingest.accept(SAMPLE_RATE_HZ, np.zeros(320, np.float32), 0, first_sample=320).first_sample == 320


def test_empty_input_gives_nothing_and_moves_nothing():
    ingest = StreamIngest("s")
    assert ingest.accept(48_000, np.zeros(0, np.float32), 0) is None
    assert ingest.accept(48_000, np.zeros((0, 2), np.int16), 0) is None
    assert ingest.accept(48_000, [], 0) is None
    assert ingest.next_sample == 0
    assert ingest.flush(0) is None


def test_a_gap_on_the_native_clock_moves_the_16k_clock_sample_exactly():
    # 16 kHz passes through the resampler untouched, so every sample can be checked exactly.
    signal = noise(1.0, seed=5)
    chunk = 320
    kept = [(i, signal[i : i + chunk]) for i in range(0, len(signal), chunk) if not 2 * chunk <= i < 7 * chunk]
    lost_from, lost_to = 2 * chunk, 7 * chunk  # chunks 2..6 never arrived
    ingest = StreamIngest("s")
    blocks = [b for i, piece in kept if (b := ingest.accept(SAMPLE_RATE_HZ, piece, i, first_sample=i)) is not None]
    jumps = [(a, b) for a, b in zip(blocks, blocks[1:]) if a.end_sample != b.first_sample]
    assert len(jumps) == 1
    before, after = jumps[0]
    assert before.end_sample == lost_from and after.first_sample == lost_to
    by_index = {b.first_sample + k: v for b in blocks for k, v in enumerate(b.samples)}
    assert all(by_index[k] == signal[k] for k in range(0, lost_from))
    assert all(by_index[k] == signal[k] for k in range(lost_to, len(signal)))


def test_a_gap_off_the_frame_grid_lands_the_audio_on_its_exact_index():
    signal = noise(0.5, seed=6)
    ingest = StreamIngest("s")
    first = ingest.accept(SAMPLE_RATE_HZ, signal[:1_000], 0, first_sample=0)  # 40 samples left over
    resume = 2_345  # not on the 160-sample grid
    after = ingest.accept(SAMPLE_RATE_HZ, signal[resume:], 0, first_sample=resume)
    assert first.end_sample == 960
    # The framer can only jump to a frame boundary: it jumps to the one before the true place
    # and zeros fill up to it, so the audio lands where it belongs.
    assert after.first_sample == resume - resume % FRAME_SAMPLES
    lead = resume % FRAME_SAMPLES
    assert np.all(after.samples[:lead] == 0)
    np.testing.assert_array_equal(after.samples[lead:], signal[resume : resume + after.n_samples - lead])


def test_no_history_leaks_across_a_gap_and_the_resampled_audio_stays_in_place():
    rate_hz, chunk = 48_000, 960
    ingest = StreamIngest("s")
    level = np.full(chunk, 0.25, np.float32)
    blocks = [ingest.accept(rate_hz, level, 0, first_sample=i * chunk) for i in range(10)]
    # Chunks 10..12 were lost; the level changes after the gap.
    resumed_at = 13 * chunk
    level = np.full(chunk, 0.5, np.float32)
    blocks += [ingest.accept(rate_hz, level, 0, first_sample=resumed_at + i * chunk) for i in range(10)]
    blocks = [b for b in blocks if b is not None]
    jumps = [b for a, b in zip(blocks, blocks[1:]) if a.end_sample != b.first_sample]
    assert len(jumps) == 1
    after_gap = jumps[0]
    target = resumed_at * SAMPLE_RATE_HZ // rate_hz  # 4160, on the grid here
    assert after_gap.first_sample == target
    # A fresh resampler: the old level does not bleed into the new audio.
    assert np.all(np.abs(after_gap.samples[FRAME_SAMPLES:] - 0.5) < 0.02)
    assert all(np.all(np.abs(b.samples[FRAME_SAMPLES:] - 0.25) < 0.02) for b in blocks if b.end_sample <= 10 * 320)

    # A tone across a gap stays in phase with where it was captured.
    signal = tone(1_000.0, 1.0, rate_hz)
    lost_from, lost_to = 20 * chunk, 23 * chunk + 17  # resumes off the 16 kHz grid
    pieces = [(i, signal[i : i + chunk]) for i in range(0, lost_from, chunk)]
    pieces += [(i, signal[i : i + chunk]) for i in range(lost_to, len(signal), chunk)]
    ingest = StreamIngest("s")
    blocks = [b for i, piece in pieces if (b := ingest.accept(rate_hz, piece, 0, first_sample=i)) is not None]
    resumed = lost_to * SAMPLE_RATE_HZ // rate_hz
    # The first native sample after the gap lands on the 16 kHz index at or before its true
    # time: 22097 / 3 = 7365.67 -> 7365, so from there on the audio runs 2/3 of a sample early.
    late_by = lost_to * SAMPLE_RATE_HZ / rate_hz - resumed
    checked = 0
    for b in blocks:
        index = np.arange(b.first_sample, b.end_sample, dtype=np.float64)
        # Away from where a resampler starts afresh (the very start, and right after the gap).
        if FRAME_SAMPLES <= b.first_sample < b.end_sample <= lost_from // 3 - FRAME_SAMPLES:
            expected = 0.5 * np.sin(2 * np.pi * 1_000.0 * index / SAMPLE_RATE_HZ)
        elif b.first_sample >= resumed + 2 * FRAME_SAMPLES:
            expected = 0.5 * np.sin(2 * np.pi * 1_000.0 * (index + late_by) / SAMPLE_RATE_HZ)
        else:
            continue
        np.testing.assert_allclose(b.samples, expected, atol=5e-3)
        checked += b.n_samples
    assert checked > 0.8 * (SAMPLE_RATE_HZ - (lost_to - lost_from) // 3)


def test_the_first_chunk_may_already_come_after_lost_audio():
    ingest = StreamIngest("s")
    block = ingest.accept(SAMPLE_RATE_HZ, np.ones(500, np.float32), 0, first_sample=1_000)
    assert block.first_sample == 960
    assert np.all(block.samples[:40] == 0) and np.all(block.samples[40:] == 1)


def test_a_change_of_rate_continues_the_clock_where_the_audio_ended():
    # A continuous 1 kHz tone, the first half captured at 48 kHz and the second at 16 kHz.
    reference = tone(1_000.0, 1.0)
    native = tone(1_000.0, 1.0, 48_000)
    ingest = StreamIngest("s")
    blocks = feed(ingest, 48_000, native[:24_000], 960)
    assert ingest.rate_hz == 48_000
    second_half = reference[8_000:]
    blocks += feed(ingest, SAMPLE_RATE_HZ, second_half, 320, first_sample=123_456)  # a new native clock
    assert ingest.rate_hz == SAMPLE_RATE_HZ
    blocks = [b for b in blocks if b is not None]
    assert_gapless_frames(blocks)
    out = np.concatenate([b.samples for b in blocks])
    # The old resampler's tail was flushed, not lost: the second half starts at exactly 8000.
    assert len(out) == SAMPLE_RATE_HZ
    np.testing.assert_array_equal(out[8_000:], second_half)
    np.testing.assert_allclose(out[400:7_900], reference[400:7_900], atol=2e-3)

    # A jump is measured on the new native clock: 1000 samples lost after 123456 + 8000.
    block = ingest.accept(SAMPLE_RATE_HZ, np.ones(320, np.float32), 0, first_sample=123_456 + 8_000 + 1_000)
    assert block.first_sample == 16_960  # 17000, floored to the frame grid, zeros up to it
    assert np.all(block.samples[:40] == 0) and np.all(block.samples[40:] == 1)


def test_flush_pads_the_last_frame_and_later_audio_continues_after_it():
    ingest = StreamIngest("s")
    first = ingest.accept(48_000, tone(500.0, 0.0101, 48_000), 10)  # 484.8 samples at 48 kHz
    tail = ingest.flush(capture_ns=99)
    assert first is None or first.n_samples % FRAME_SAMPLES == 0
    assert tail.capture_ns == 99 and tail.n_samples % FRAME_SAMPLES == 0
    produced = (first.n_samples if first is not None else 0) + tail.n_samples
    assert produced == 2 * FRAME_SAMPLES  # 162 samples -> two frames, the second mostly padding
    assert np.all(tail.samples[162 - (first.n_samples if first else 0) :] == 0)
    assert ingest.flush(100) is None  # nothing left
    assert ingest.next_sample == 2 * FRAME_SAMPLES
    again = ingest.accept(SAMPLE_RATE_HZ, np.ones(FRAME_SAMPLES, np.float32), 200)
    assert again.first_sample == 2 * FRAME_SAMPLES


def test_capture_time_is_that_of_the_blocks_last_sample():
    rate_hz, chunk = 48_000, 960
    start_ns = 7 * NS_PER_S
    ingest = StreamIngest("s")
    blocks = []
    for i in range(50):
        capture_ns = start_ns + (i + 1) * chunk * NS_PER_S // rate_hz  # when the chunk's last sample came
        block = ingest.accept(rate_hz, noise(0.02, rate_hz, seed=i), capture_ns, first_sample=i * chunk)
        if block is not None:
            blocks.append((block, capture_ns))
    for block, chunk_capture_ns in blocks:
        # The resampler holds a few samples back: the block ends a little before the chunk did,
        # and its capture time says when its own last sample was captured.
        assert block.capture_ns <= chunk_capture_ns
        true_ns = start_ns + block.end_sample * NS_PER_S // SAMPLE_RATE_HZ
        assert abs(block.capture_ns - true_ns) <= NS_PER_S // SAMPLE_RATE_HZ
    assert all(a.capture_ns <= b.capture_ns for (a, _), (b, _) in zip(blocks, blocks[1:]))


def test_next_sample_is_where_the_next_block_starts():
    ingest = StreamIngest("s")
    assert ingest.next_sample == 0
    block = ingest.accept(SAMPLE_RATE_HZ, np.zeros(500, np.float32), 0)
    assert block.end_sample == ingest.next_sample == 480
    assert ingest.accept(SAMPLE_RATE_HZ, np.zeros(300, np.float32), 0).first_sample == 480
