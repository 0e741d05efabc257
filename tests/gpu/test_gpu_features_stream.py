"""StreamingFeatures: streaming == whole utterance, batched == alone, rings, under NumPy and CuPy."""

from __future__ import annotations

import numpy as np
import pytest
from whisper_oracle import kept, whisper_log_mel_f64

from captioner.gpu import features_ref as ref
from captioner.gpu.features import LOOKAHEAD_MS, StreamingFeatures

CLIPS = ["en_ls_1089-134691-0000", "en_timit_LDC93S1", "zh_BAC009S0724W0121", "en_ami_ES2011a_hs0_40-46s"]


def frames_of(audio: np.ndarray, seconds: float | None = None) -> np.ndarray:
    n = audio.shape[0] if seconds is None else min(audio.shape[0], int(seconds * 16000))
    return audio[: n // 160 * 160]


def assert_matches_spec(got: np.ndarray, audio: np.ndarray, n_mels: int, first: int = 0) -> None:
    """Raw log-mel frames ``first ..`` against the NumPy spec and the float64 oracle."""
    spec = ref.log_mel_spectrogram(audio, n_mels)[:, first : first + got.shape[1]]
    oracle = whisper_log_mel_f64(audio, n_mels)
    keep = kept(oracle)[:, first : first + got.shape[1]]
    oracle = oracle[:, first : first + got.shape[1]]
    assert got.shape == spec.shape
    assert np.abs(got - spec)[keep].max() < 1e-4
    assert np.abs(got - oracle)[keep].max() < 1e-4
    # Deep below Whisper's clamp, only float32 FFT rounding separates them.
    assert np.abs(got - spec).max() < 5e-3


@pytest.mark.parametrize("n_mels", [80, 128])
def test_frame_by_frame_equals_whole_utterance(xb, speech_audio, n_mels):
    audio = frames_of(speech_audio[CLIPS[0]])
    sf = StreamingFeatures(xb, n_mels=n_mels, max_streams=2, ring_frames=400)
    if xb.is_cuda:
        assert sf.path.startswith("cuda-"), sf.kernel_error
    blocks = audio.reshape(-1, 160)
    assert sf.frames_ready(1) == 0
    sf.push(1, blocks[0])
    assert sf.frames_ready(1) == 0  # frame 0 needs 12.5 ms past its centre: block 1
    for b in blocks[1:]:
        sf.push(1, b)
    n = sf.frames_ready(1)
    assert n == blocks.shape[0] - 1  # all but the last frame, which needs the right edge
    got = xb.asnumpy(sf.log_mel_window(1, 0, n))
    assert_matches_spec(got, audio, n_mels)
    # The window a model gets, normalised, is Whisper's within 1e-4.
    spec_norm = ref.whisper_normalize(ref.log_mel_spectrogram(audio, n_mels)[:, :n])
    assert np.abs(ref.whisper_normalize(got) - spec_norm).max() < 1e-4
    assert LOOKAHEAD_MS == 12.5


def test_any_push_size_gives_the_same_frames(xb, speech_audio):
    audio = frames_of(speech_audio[CLIPS[1]], 3.0)
    results = []
    for sizes in ([1], [3], [2, 7, 1], [250]):  # 250 > max_push_frames: split inside
        sf = StreamingFeatures(xb, max_streams=1, ring_frames=400, max_push_frames=64)
        pos, i = 0, 0
        while pos < audio.shape[0]:
            n = sizes[i % len(sizes)] * 160
            sf.push(0, audio[pos : pos + n])
            pos, i = pos + n, i + 1
        results.append(xb.asnumpy(sf.log_mel_window(0, 0, sf.frames_ready(0))))
    for r in results[1:]:
        assert r.shape == results[0].shape
        assert np.abs(r - results[0]).max() < 1e-5
    assert_matches_spec(results[0], audio, 80)


def test_many_streams_batched_equal_each_alone(xb, speech_audio):
    # Streams of different lengths that join at different times, pushed 10 ms at a time.
    audios = [frames_of(speech_audio[c], 2.0 + 0.37 * i) for i, c in enumerate(CLIPS)]
    starts = [0, 5, 17, 40]  # block at which each stream joins
    batched = StreamingFeatures(xb, max_streams=6, ring_frames=512)
    slot_of = [4, 0, 5, 2]
    total_blocks = max(s + a.shape[0] // 160 for s, a in zip(starts, audios))
    for t in range(total_blocks):
        rows = [(i, t - starts[i]) for i in range(len(audios)) if 0 <= t - starts[i] < audios[i].shape[0] // 160]
        slots = [slot_of[i] for i, _ in rows]
        block = np.stack([audios[i][b * 160 : (b + 1) * 160] for i, b in rows])
        batched.push_batch(slots, block)
    for i, audio in enumerate(audios):
        alone = StreamingFeatures(xb, max_streams=1, ring_frames=512)
        for b in audio.reshape(-1, 160):
            alone.push(0, b)
        n = alone.frames_ready(0)
        assert batched.frames_ready(slot_of[i]) == n
        got = xb.asnumpy(batched.log_mel_window(slot_of[i], 0, n))
        want = xb.asnumpy(alone.log_mel_window(0, 0, n))
        assert np.abs(got - want).max() < 1e-5
        assert_matches_spec(got, audio, 80)


@pytest.mark.parametrize("packing", ["default", "dense"])
def test_many_rows_with_uneven_pushes_equal_the_specification(xb, speech_audio, packing):
    # 37 streams (different audio in every row) join over the first pushes and are pushed
    # batched in sizes that leave every remainder of 32 frames, under and over 32, while some
    # rows are new (their first frames reflect) and others are not: on CUDA this is every way
    # the fused kernels split a push (full blocks of 32 frames, packed blocks of one or several
    # rows). "dense" tells the packing policy the GPU has one multiprocessor, so that rows
    # share packed blocks as densely as they can; on a big GPU 37 rows would not share.
    if packing == "dense" and not xb.is_cuda:
        pytest.skip("packing is a CUDA kernel matter")
    sizes = [1, 2, 45, 7, 33, 64, 100, 31, 3]
    n_streams = 37
    joins = [i % 5 for i in range(n_streams)]
    total = [sum(sizes[j:]) for j in joins]
    speech = np.concatenate([speech_audio[c] for c in CLIPS]).astype(np.float32)  # 15 s
    starts = [(i * 27_113) % (speech.shape[0] - total[i] * 160) for i in range(n_streams)]
    audios = [speech[a : a + n * 160] for a, n in zip(starts, total)]
    sf = StreamingFeatures(xb, speaker_bands=True, max_streams=40, ring_frames=512, max_push_frames=100)
    if xb.is_cuda:
        assert sf.path.startswith("cuda-"), sf.kernel_error
        if packing == "dense":
            sf._cuda.n_sms = 1
    pos = [0] * n_streams
    for p, size in enumerate(sizes):
        rows = [i for i in range(n_streams) if joins[i] <= p]
        block = np.stack([audios[i][pos[i] : pos[i] + size * 160] for i in rows])
        sf.push_batch([(7 * i) % 40 for i in rows], xb.asarray(block) if p % 2 else block)
        for i in rows:
            pos[i] += size * 160
    for i, audio in enumerate(audios):
        slot = (7 * i) % 40  # rows in another order than slots
        n = sf.frames_ready(slot)
        assert n == total[i] - 1
        got = xb.asnumpy(sf.log_mel_window(slot, 0, n))
        assert_matches_spec(got, audio, 80)
        assert_speaker_bands_match(xb.asnumpy(sf.speaker_window(slot, 0, n)), audio)


def test_batched_multi_frame_push_from_device_arrays(xb, speech_audio):
    audios = np.stack([frames_of(speech_audio[c], 1.5) for c in CLIPS])  # [4, 24000]
    sf = StreamingFeatures(xb, max_streams=4, ring_frames=256, max_push_frames=50)
    for start in range(0, audios.shape[1], 50 * 160):
        sf.push_batch([0, 1, 2, 3], xb.asarray(audios[:, start : start + 50 * 160]))
    for slot, audio in enumerate(audios):
        got = xb.asnumpy(sf.log_mel_window(slot, 0, sf.frames_ready(slot)))
        assert_matches_spec(got, audio, 80)


def test_ring_wraps_and_forgets_old_frames(xb, speech_audio):
    audio = frames_of(speech_audio[CLIPS[3]], 3.0)  # 300 blocks -> 299 frames
    sf = StreamingFeatures(xb, max_streams=1, ring_frames=64, max_push_frames=16)
    for start in range(0, audio.shape[0], 7 * 160):
        sf.push(0, audio[start : start + 7 * 160])
    ready = sf.frames_ready(0)
    assert ready == 299 and sf.oldest_frame(0) == ready - 64
    spec = ref.log_mel_spectrogram(audio, 80)
    first = ready - 64
    assert first % 64 != 0  # the window below crosses the ring's end
    got = xb.asnumpy(sf.log_mel_window(0, first, 64))
    assert_matches_spec(got, audio, 80, first=first)
    out = xb.xp.zeros((80, 10), dtype=xb.xp.float32)
    assert sf.log_mel_window(0, ready - 10, 10, out=out) is out
    assert np.abs(xb.asnumpy(out) - spec[:, ready - 10 : ready]).max() < 5e-3
    with pytest.raises(ValueError):
        sf.log_mel_window(0, first - 1, 4)  # overwritten
    with pytest.raises(ValueError):
        sf.log_mel_window(0, ready - 2, 3)  # not computed yet


def test_reset_starts_a_new_stream(xb, speech_audio):
    a, b = frames_of(speech_audio[CLIPS[0]], 1.0), frames_of(speech_audio[CLIPS[2]], 1.0)
    sf = StreamingFeatures(xb, max_streams=1, ring_frames=128)
    sf.push(0, a)
    sf.reset(0)
    assert sf.frames_ready(0) == 0
    for blk in b.reshape(-1, 160):
        sf.push(0, blk)
    assert_matches_spec(xb.asnumpy(sf.log_mel_window(0, 0, sf.frames_ready(0))), b, 80)


def assert_speaker_bands_match(got: np.ndarray, audio: np.ndarray, first: int = 0) -> None:
    """The speaker encoder's 40 bands against the NumPy spec and the float64 oracle. The encoder
    takes their linear power, so they are compared as power, relative to each frame's loudest band
    (log10 of a band ten decades down is only float32 FFT rounding, and weighs nothing there)."""
    n = got.shape[1]
    spec = ref.speaker_log_mel(audio)[:, first:first + n]
    oracle = whisper_log_mel_f64(audio, ref.SPEAKER_BANDS)[:, first:first + n]
    assert got.shape == spec.shape == (ref.SPEAKER_BANDS, n)
    for want in (spec, oracle):
        peak = 10.0 ** want.max(axis=0, keepdims=True)
        assert (np.abs(10.0 ** got.astype(np.float64) - 10.0 ** want) / peak).max() < 1e-4


@pytest.mark.parametrize("n_mels", [80, 128])
def test_streaming_speaker_bands(xb, speech_audio, n_mels):
    # Beside either Whisper mel count, from 10 ms pushes; one gather of several slots' frames.
    audio = frames_of(speech_audio[CLIPS[0]], 2.0)
    sf = StreamingFeatures(xb, n_mels=n_mels, speaker_bands=True, max_streams=2, ring_frames=256)
    if xb.is_cuda:
        assert sf.path.startswith("cuda-"), sf.kernel_error
    for blk in audio.reshape(-1, 160):
        sf.push_batch([0, 1], np.stack([blk, blk[::-1].copy()]))
    n = sf.frames_ready(0)
    assert_speaker_bands_match(xb.asnumpy(sf.speaker_window(0, 0, n)), audio)
    assert_matches_spec(xb.asnumpy(sf.log_mel_window(0, 0, n)), audio, n_mels)  # Whisper's bands unchanged
    frames = xb.asnumpy(sf.speaker_frames([1, 0], [5, 100], [20, 7]))
    assert frames.shape == (27, ref.SPEAKER_BANDS)
    np.testing.assert_array_equal(frames[20:], xb.asnumpy(sf.speaker_window(0, 100, 7)).T)
    np.testing.assert_array_equal(frames[:20], xb.asnumpy(sf.speaker_window(1, 5, 20)).T)
    with pytest.raises(ValueError, match="no speaker bands"):
        StreamingFeatures(xb, max_streams=1, ring_frames=16).speaker_window(0, 0, 0)
