"""FileSource: files of any format, rate and channel count replayed at their native rate, mono."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from captioner.audio.file_source import FileSource, open_audio_file, read_audio_16k
from captioner.audio.replay import REPLAY_CHUNK_S
from captioner.audio.resample import resample_whole
from captioner.audio.source import AudioSource, SourceEnd
from captioner.events import FRAME_SAMPLES, NS_PER_S, SAMPLE_RATE_HZ

CLIP_ID = "en_ls_1089-134686-0001"




@pytest.fixture(scope="module")
def speech(speech_clips):
    x, rate_hz = sf.read(str(speech_clips[CLIP_ID].wav), dtype="float32")
    assert rate_hz == SAMPLE_RATE_HZ
    return x


def ncc(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize(
    "fmt, subtype, rate_hz, channels",
    [("WAV", "PCM_16", 16_000, 1), ("WAV", "FLOAT", 48_000, 2), ("FLAC", "PCM_24", 44_100, 2),
     ("WAV", "PCM_16", 8_000, 1), ("OGG", "VORBIS", 48_000, 1)],
)
def test_formats_rates_and_channels_replay_at_the_native_rate_in_mono(tmp_path, sinks, speech, fmt, subtype,
                                                                       rate_hz, channels):
    native = resample_whole(speech, SAMPLE_RATE_HZ, rate_hz)
    if channels == 2:
        native = np.stack([native, 0.5 * native], axis=1)
    path = tmp_path / f"clip.{fmt.lower()}"
    sf.write(str(path), native, rate_hz, format=fmt, subtype=subtype)

    source = FileSource(path)
    assert isinstance(source, AudioSource)
    assert source.stream == "clip" and source.rate_hz == rate_hz and not source.live
    assert source.info.rate_hz == rate_hz and source.info.channels == channels
    sink = sinks.run_to_end(source)
    assert sink.ends == [SourceEnd("clip")] and source.exhausted

    # Chunks: native rate, mono, 20 ms, gapless, exactly what the file holds, mixed down.
    chunks = sink.chunks
    assert {c.rate_hz for c in chunks} == {rate_hz}
    assert all(c.samples.ndim == 1 and c.samples.dtype == np.float32 for c in chunks)
    assert all(c.n_samples == round(rate_hz * REPLAY_CHUNK_S) for c in chunks[:-1])
    assert chunks[0].first_sample == 0
    assert all(a.end_sample == b.first_sample for a, b in zip(chunks, chunks[1:]))
    decoded = sf.read(str(path), dtype="float32", always_2d=True)[0]
    np.testing.assert_array_equal(sinks.joined(chunks), decoded.mean(axis=1, dtype=np.float32))
    assert source.stats().delivered_samples == source.info.frames

    # The engine's 16 kHz frames of them: the same speech, the same as the offline reader.
    blocks = sinks.frame(chunks)
    out = sinks.joined(blocks)
    assert all(b.n_samples % FRAME_SAMPLES == 0 for b in blocks)
    assert abs(len(out) - len(speech)) <= FRAME_SAMPLES
    n = min(len(out), len(speech))
    gain = 0.75 if channels == 2 else 1.0
    assert ncc(out[1600 : n - 1600], speech[1600 : n - 1600]) > (0.999 if fmt != "OGG" and rate_hz >= 16_000 else 0.95)
    assert np.std(out) == pytest.approx(gain * np.std(speech), rel=0.05)
    offline = read_audio_16k(path)
    np.testing.assert_allclose(out[: len(offline)], offline, atol=1e-5)
    if rate_hz == SAMPLE_RATE_HZ and subtype == "PCM_16":
        np.testing.assert_array_equal(out[: len(speech)], speech)
        assert np.all(out[len(speech):] == 0)  # the last partial frame is padded with zeros


def test_realtime_replay_is_paced_by_the_injected_clock(speech_clips, sinks, speech):
    clock = sinks.FakeClock()
    source = FileSource(speech_clips[CLIP_ID].wav, realtime=True, clock_ns=clock, sleep=clock.sleep)
    start_ns = clock.now_ns
    sink, arrivals = sinks.run_timed(source, clock)

    chunks = sink.chunks
    np.testing.assert_array_equal(sinks.joined(chunks), speech)
    for chunk, arrived_ns in zip(chunks, arrivals):  # never released before its time
        assert chunk.capture_ns == start_ns + -(-chunk.end_sample * NS_PER_S // SAMPLE_RATE_HZ)
        assert chunk.capture_ns <= arrived_ns < chunk.capture_ns + 1_000
    # The first chunk was due 20 ms after the start: the replay waited that long for it.
    assert clock.sleeps_s[0] == pytest.approx(REPLAY_CHUNK_S)
    # The replay took as long as the audio, in simulated time, and the end came right after.
    elapsed_s = (arrivals[-1] - start_ns) / NS_PER_S
    assert elapsed_s == pytest.approx(len(speech) / SAMPLE_RATE_HZ, abs=1e-6)
    assert isinstance(sink.items[-1], SourceEnd)


def test_restart_replays_from_the_beginning(speech_clips, sinks):
    source = FileSource(speech_clips[CLIP_ID].wav)
    first = sinks.run_to_end(source)
    again = sinks.run_to_end(source)
    assert again.chunks[0].first_sample == 0
    np.testing.assert_array_equal(sinks.joined(again.chunks), sinks.joined(first.chunks))
    source.stop()


def test_a_refusing_sink_ends_the_replay_and_the_file_is_closed(speech_clips, sinks):
    source = FileSource(speech_clips[CLIP_ID].wav)
    sink = sinks.Collector(limit=3)
    source.start(sink)
    sink.wait(lambda c: c.calls == 4, 10, "the refused chunk")
    source.stop()
    assert sink.calls == 4 and len(sink.chunks) == 3 and sink.ends == []
    assert source._file is None  # closed by the replay thread on its way out


def test_open_audio_file_reports_the_header(speech_clips):
    info = open_audio_file(speech_clips[CLIP_ID].wav)
    assert (info.rate_hz, info.channels, info.format) == (16_000, 1, "WAV")
    assert info.duration_s == pytest.approx(speech_clips[CLIP_ID].duration_s, abs=0.01)
