import numpy as np
import pytest
import soundfile as sf

from captioner.engine.simulate import SimClock
from captioner.audio.file_source import FileSource, open_audio_file, read_audio_16k
from captioner.audio.resample import resample_whole
from captioner.audio.source import AudioSource
from captioner.events import FRAME_SAMPLES, SAMPLE_RATE_HZ

CLIP_ID = "en_ls_1089-134686-0001"


class FakeClock(SimClock):
    """The app's simulated clock (``sleep`` advances ``now_ns``), recording every sleep."""

    def __init__(self, start_ns: int = 5_000_000_000):
        super().__init__(start_ns)
        self.sleeps_s: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps_s.append(seconds)
        super().sleep(seconds)


def drain(source, timeout_s=0.0, limit=100_000):
    blocks = []
    for _ in range(limit):
        if source.exhausted:
            return blocks
        blocks += source.read(timeout_s)
    raise AssertionError("source never finished")


@pytest.fixture(scope="module")
def speech(speech_clips):
    x, rate_hz = sf.read(str(speech_clips[CLIP_ID].wav), dtype="float32")
    assert rate_hz == SAMPLE_RATE_HZ
    return x


@pytest.mark.parametrize(
    "fmt, subtype, rate_hz, channels",
    [("WAV", "PCM_16", 16_000, 1), ("WAV", "FLOAT", 48_000, 2), ("FLAC", "PCM_24", 44_100, 2),
     ("WAV", "PCM_16", 8_000, 1), ("OGG", "VORBIS", 48_000, 1)],
)
def test_formats_rates_and_channels_replay_as_16k_frames(tmp_path, speech, fmt, subtype, rate_hz, channels):
    native = resample_whole(speech, SAMPLE_RATE_HZ, rate_hz)
    if channels == 2:
        native = np.stack([native, native], axis=1)
    path = tmp_path / f"clip.{fmt.lower()}"
    sf.write(str(path), native, rate_hz, format=fmt, subtype=subtype)

    source = FileSource(path)
    assert isinstance(source, AudioSource)
    assert source.stream == "clip" and source.info.rate_hz == rate_hz and source.info.channels == channels
    source.start()
    blocks = drain(source)
    source.stop()
    out = np.concatenate([b.samples for b in blocks])
    assert out.dtype == np.float32
    assert all(b.n_samples % FRAME_SAMPLES == 0 for b in blocks)
    assert all(a.end_sample == b.first_sample for a, b in zip(blocks, blocks[1:]))
    assert blocks[0].first_sample == 0
    expected_len = -(-round(len(speech)) // FRAME_SAMPLES) * FRAME_SAMPLES
    assert abs(len(out) - expected_len) <= FRAME_SAMPLES
    assert source.stats().delivered_frames == len(out) // FRAME_SAMPLES

    # Same speech back: exact for 16 kHz PCM, close for resampled/lossy ones.
    n = min(len(out), len(speech))
    a, b = out[1600 : n - 1600], speech[1600 : n - 1600]
    ncc = float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
    assert ncc > (0.999 if fmt != "OGG" and rate_hz >= 16_000 else 0.95)
    if rate_hz == SAMPLE_RATE_HZ and subtype == "PCM_16":
        np.testing.assert_array_equal(out[: len(speech)], speech)
        assert np.all(out[len(speech):] == 0)  # the last partial frame is padded with zeros

    np.testing.assert_array_equal(read_audio_16k(path), out[: len(read_audio_16k(path))])


def test_fast_mode_reads_in_bounded_chunks_and_never_drops(speech_clips, speech):
    source = FileSource(speech_clips[CLIP_ID].wav, stream="Replay", max_read_frames=7)
    source.start()
    blocks = drain(source)
    assert all(b.n_samples <= 7 * FRAME_SAMPLES for b in blocks)
    assert {b.stream for b in blocks} == {"Replay"}
    out = np.concatenate([b.samples for b in blocks])
    np.testing.assert_array_equal(out[: len(speech)], speech)
    assert source.read(1.0) == []  # exhausted: returns at once
    assert source.stats().dropped_blocks == 0


def test_realtime_replay_is_paced_by_the_injected_clock(speech_clips, speech):
    clock = FakeClock()
    source = FileSource(speech_clips[CLIP_ID].wav, realtime=True, clock_ns=clock, sleep=clock.sleep)
    source.start()
    start_ns = clock.now_ns

    assert source.read(0.0) == []  # nothing is due at the very start, and no waiting was asked
    assert clock.sleeps_s == []

    clock.now_ns += 25_000_000  # 25 ms later: two whole frames are due
    (block,) = source.read(0.0)
    assert block.first_sample == 0 and block.n_samples == 2 * FRAME_SAMPLES
    assert block.capture_ns == start_ns + 20_000_000  # released when its last sample was due

    (block,) = source.read(timeout_s=1.0)  # waits (simulated) until the next frame is due
    assert clock.sleeps_s == [pytest.approx(0.005)]
    assert block.first_sample == 2 * FRAME_SAMPLES and block.n_samples == FRAME_SAMPLES
    assert clock.now_ns == start_ns + 30_000_000

    blocks = [block]
    while not source.exhausted:
        got = source.read(timeout_s=0.1)
        for b in got:  # never released before its time
            assert b.capture_ns <= clock.now_ns
            assert b.capture_ns == start_ns + b.end_sample * 1_000_000_000 // SAMPLE_RATE_HZ
        blocks += got
    out = np.concatenate([b.samples for b in blocks])
    np.testing.assert_array_equal(out[: len(speech) - 2 * FRAME_SAMPLES], speech[2 * FRAME_SAMPLES:])
    # The replay took as long as the audio, in simulated time.
    elapsed_s = (clock.now_ns - start_ns) / 1e9
    assert elapsed_s == pytest.approx(len(speech) / SAMPLE_RATE_HZ, abs=0.2)


def test_realtime_read_without_timeout_never_sleeps(speech_clips):
    clock = FakeClock()
    source = FileSource(speech_clips[CLIP_ID].wav, realtime=True, clock_ns=clock, sleep=clock.sleep)
    source.start()
    for _ in range(10):
        assert source.read() == []
    assert clock.sleeps_s == []


def test_restart_replays_from_the_beginning(speech_clips):
    source = FileSource(speech_clips[CLIP_ID].wav)
    source.start()
    first = source.read()[0]
    source.stop()
    assert source.read() == []  # stopped
    source.start()
    again = source.read()[0]
    assert again.first_sample == 0
    np.testing.assert_array_equal(again.samples, first.samples)
    source.stop()
    source.stop()


def test_open_audio_file_reports_the_header(speech_clips):
    info = open_audio_file(speech_clips[CLIP_ID].wav)
    assert (info.rate_hz, info.channels, info.format) == (16_000, 1, "WAV")
    assert info.duration_s == pytest.approx(speech_clips[CLIP_ID].duration_s, abs=0.01)
