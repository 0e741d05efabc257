"""A front-end frames its connections' audio (serve/gather.py) exactly as the engine's own ingest
would, whatever the message sizes, rates and the moments frames go to the hub."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile

from captioner.audio.ingest import StreamIngest
from captioner.events import FRAME_SAMPLES
from captioner.serve.gather import AudioGather

JFK = "src/captioner/data/jfk_inaugural_1961.flac"


def _speech_int16(rate_hz: int, seconds: float) -> np.ndarray:
    audio, native_hz = soundfile.read(JFK, dtype="float32", always_2d=False)
    audio = audio[: int(seconds * native_hz)]
    if rate_hz != native_hz:
        import soxr

        audio = soxr.resample(audio, native_hz, rate_hz)
    return np.round(np.clip(audio, -1, 1) * 32767).astype("<i2")


def _direct(pcm: np.ndarray, rate_hz: int) -> np.ndarray:
    """The engine's own ingest, given the whole recording as float32 at once, then flushed."""
    ingest = StreamIngest("direct")
    samples = pcm.astype(np.float32) / 32768.0
    blocks = [ingest.accept(rate_hz, samples, 0), ingest.flush(0)]
    return np.concatenate([b.samples for b in blocks if b is not None])


def _split(pcm: np.ndarray, sizes: list[int]):
    start, k = 0, 0
    while start < pcm.shape[0]:
        n = sizes[k % len(sizes)]
        yield pcm[start:start + n]
        start += n
        k += 1


@pytest.mark.parametrize("rate_hz", [16_000, 44_100, 8_000])
def test_two_connections_interleaved_come_out_as_their_own_ingest(rate_hz):
    pcm = {1: _speech_int16(rate_hz, 3.0), 2: _speech_int16(16_000, 2.3)[::-1].copy()}
    rates = {1: rate_hz, 2: 16_000}
    messages = {1: list(_split(pcm[1], [1234, 77, rate_hz // 10])), 2: list(_split(pcm[2], [1600, 999]))}
    gather = AudioGather()
    got: dict[int, list] = {1: [], 2: []}

    def take():
        index, data = gather.take()
        samples = np.frombuffer(data, dtype=np.float32)
        offset = 0
        for sid, first, n_samples, _capture_ns in index:
            assert n_samples > 0 and n_samples % FRAME_SAMPLES == 0  # whole frames only
            expected_first = sum(piece.shape[0] for _, piece in got[sid])
            assert first == expected_first  # one clock per connection, no gap, no overlap
            got[sid].append((first, samples[offset:offset + n_samples]))
            offset += n_samples
        assert offset == samples.shape[0]

    for k in range(max(len(m) for m in messages.values())):
        for sid in (1, 2):
            if k < len(messages[sid]):
                piece = messages[sid][k]
                gather.add(sid, rates[sid], piece.tobytes(), piece.shape[0], 1_000 + k)
        if k % 3 == 2:  # a frame to the hub every few messages, at any point of a 10 ms frame
            take()
    for sid in (1, 2):
        gather.end(sid, 10**9)
    take()
    assert gather.take() == ([], b"")  # ended connections are forgotten
    for sid in (1, 2):
        out = np.concatenate([piece for _, piece in got[sid]])
        np.testing.assert_array_equal(out, _direct(pcm[sid], rates[sid]))


def test_an_end_before_any_new_audio_sends_only_the_padded_tail():
    gather = AudioGather()
    piece = _speech_int16(16_000, 0.1)[:1000]  # 6 frames and 40 samples
    gather.add(7, 16_000, piece.tobytes(), 1000, 5)
    index, _ = gather.take()
    assert [(sid, first, n) for sid, first, n, _ in index] == [(7, 0, 960)]
    gather.end(7, 9)
    index, data = gather.take()
    assert [(sid, first, n, when) for sid, first, n, when in index] == [(7, 960, FRAME_SAMPLES, 9)]
    tail = np.frombuffer(data, dtype=np.float32)
    np.testing.assert_array_equal(tail[:40], piece[960:].astype(np.float32) / 32768.0)
    assert not tail[40:].any()
    gather.end(7, 10)  # twice, or for a connection that never sent audio: nothing
    gather.end(8, 10)
    assert gather.take() == ([], b"")
