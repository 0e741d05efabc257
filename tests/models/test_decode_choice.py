"""The greedy path of small batches under ``decode_on="auto"``, chosen by measurement
(``models/decode_choice.py``): the chooser's rule on given times, and tiny.en on the CPU
(whose "device" path is the vectorised rules on NumPy; the chooser asked for, as a CUDA runtime
has it by default) trying both paths and keeping its words."""

from __future__ import annotations

import numpy as np
import pytest
from mel_helper import load_audio_16k

from captioner.engine.live import LiveCaptioner
from captioner.engine.recognizer import WindowRequest
from captioner.engine.whisper import WhisperRecognizer
from captioner.gpu.features_ref import log_mel_spectrogram
from captioner.models.decode_choice import (
    DEVICE,
    HOST,
    RETRY_EVERY,
    TRIALS,
    DecodeChooser,
    size_class,
)
from captioner.models.decoding import DEVICE_DECODING_MIN_BATCH


def _timed(chooser: DecodeChooser, rows: int, ms_per_step: dict[str, float], decodes: int) -> list[str]:
    """``decodes`` decodes of ``rows`` rows, each path's step taking the given milliseconds:
    the paths taken, in order."""
    taken = []
    for _ in range(decodes):
        path = chooser.path(rows)
        chooser.record(rows, path, 40 * ms_per_step[path] / 1e3, 40)
        taken.append(path)
    return taken


def test_size_classes_are_named_by_their_upper_bound():
    assert [size_class(r) for r in (1, 2, 3, 4, 5, 8, 9, 15)] == [1, 2, 4, 4, 8, 8, 16, 16]


def test_both_paths_are_tried_then_the_faster_kept_and_the_other_tried_now_and_then():
    chooser = DecodeChooser(16)
    taken = _timed(chooser, 3, {HOST: 0.9, DEVICE: 0.3}, 2 * TRIALS)
    assert taken[0] == HOST, "a first decode takes the host's path, as before"
    assert taken.count(HOST) == taken.count(DEVICE) == TRIALS
    later = _timed(chooser, 4, {HOST: 0.9, DEVICE: 0.3}, 2 * RETRY_EVERY)  # 4 rows: the same class as 3
    assert later.count(HOST) == 2 and later.count(DEVICE) == 2 * RETRY_EVERY - 2
    assert later[RETRY_EVERY - 1] == HOST
    row = chooser.table()[4]
    assert row["kept"] == DEVICE and row["host_runs"] == TRIALS + 2
    assert row["device_ms_per_step"] == pytest.approx(0.3) and row["host_ms_per_step"] == pytest.approx(0.9)


def test_the_choice_follows_when_the_times_change():
    chooser = DecodeChooser(16)
    _timed(chooser, 1, {HOST: 0.2, DEVICE: 0.5}, 2 * TRIALS)
    assert chooser.path(1) == HOST
    # The device gets faster (a warmer GPU, a lighter step): its next tries move its mean over.
    taken = _timed(chooser, 1, {HOST: 0.2, DEVICE: 0.05}, 6 * RETRY_EVERY)
    assert chooser.table()[1]["kept"] == DEVICE
    assert taken[-RETRY_EVERY:].count(HOST) == 1, "the host now only tried now and then"


def test_large_batches_decode_on_the_device_untimed_and_classes_apart_are_apart():
    chooser = DecodeChooser(16)
    assert all(chooser.path(rows) == DEVICE for rows in (16, 17, 64, 256))
    chooser.record(64, DEVICE, 1.0, 10)  # not a class the chooser keeps
    assert chooser.table() == {}
    _timed(chooser, 8, {HOST: 0.9, DEVICE: 0.3}, 2 * TRIALS)
    assert set(chooser.table()) == {8} and chooser.path(2) == HOST, "2 rows are still tried on their own"


def test_device_from_rows_counts_only_classes_kept_on_the_device_from_the_top():
    chooser = DecodeChooser(16)
    assert chooser.device_from_rows() == 16
    _timed(chooser, 5, {HOST: 0.9, DEVICE: 0.3}, 2 * TRIALS)  # 5-8 rows: the device
    assert chooser.device_from_rows() == 16, "9-15 rows not measured yet"
    _timed(chooser, 12, {HOST: 0.9, DEVICE: 0.3}, 2 * TRIALS)
    assert chooser.device_from_rows() == 5
    _timed(chooser, 3, {HOST: 0.1, DEVICE: 0.3}, 2 * TRIALS)  # 3-4 rows: the host
    _timed(chooser, 1, {HOST: 0.9, DEVICE: 0.3}, 2 * TRIALS)
    assert chooser.device_from_rows() == 5


CLIPS = ("en_ls_1089-134686-0001", "en_ami_ES2011a_hs0_40-46s")


@pytest.mark.slow
def test_tiny_en_tries_both_paths_and_its_words_do_not_change(tiny_en_cpu, speech_clips):
    """A fresh recognizer on the CPU model: two recordings decoded together, 2 x TRIALS times;
    both paths run TRIALS times each (the chooser times real decoder steps), and every decode
    gives the same words, whichever path took it."""
    backend, shared = tiny_en_cpu
    # On the CPU the chooser is asked for (by default only a CUDA runtime has one).
    assert shared.decode_chooser is None
    recognizer = WhisperRecognizer(shared.runtime, shared.tokenizer, xp=np, choose_paths=True)
    assert recognizer.decode_chooser is not None and recognizer.options.decode_on == "auto"
    requests = [WindowRequest(f"s{i}", np.ascontiguousarray(log_mel_spectrogram(load_audio_16k(speech_clips[c].wav)),
                                                            dtype=np.float32), 0.0, "", None)
                for i, c in enumerate(CLIPS)]
    texts = {tuple(h.text for h in recognizer.decode(requests)) for _ in range(2 * TRIALS)}
    row = recognizer.decode_chooser.table()[2]
    assert row["host_runs"] == TRIALS and row["device_runs"] == TRIALS and row["kept"] in (HOST, DEVICE)
    assert row["host_ms_per_step"] > 0 and row["device_ms_per_step"] > 0
    assert len(texts) == 1, texts
    (words,) = texts
    assert all(len(text.split()) > 5 for text in words)
    # The engine's status says from how many rows the device decodes now: 3-15 rows untimed,
    # so from 16 whatever 2 rows keep.
    live = LiveCaptioner(recognizer=recognizer, backend=backend)
    extra = dict(live.status().extra)
    assert extra["device_decoding_from_rows"] == DEVICE_DECODING_MIN_BATCH
    # ...and what its runtime's own buffers hold (tests/models/test_ragged_batch.py counts them).
    assert extra["decoder_slot_bytes"] == shared.runtime.buffer_bytes()["decoder_slot_bytes"]
    # Asked for one path, a recognizer keeps no chooser: nothing is timed, nothing changes.
    assert WhisperRecognizer(shared.runtime, shared.tokenizer, xp=np, decode_on="host", choose_paths=True).decode_chooser is None
    assert DEVICE_DECODING_MIN_BATCH == recognizer.decode_chooser.min_device_rows


@pytest.mark.gpu
@pytest.mark.slow
def test_on_cuda_both_paths_are_timed_and_give_the_same_words(speech_clips):
    """The same on the GPU, where the device path is the rules kernel on CuPy logits: 1, 4
    and 8 rows, each class timed on both paths, the words the same every time."""
    from captioner.engine.live import load_recognizer

    backend, recognizer = load_recognizer("tiny.en", "cuda:0")
    assert recognizer.decode_chooser is not None, "a CUDA runtime times both paths by default"
    clips = ("en_ls_1089-134686-0001", "en_ami_ES2011a_hs0_40-46s", "en_ljspeech_LJ001-0001",
             "en_ls_7902-96591-0000")
    mels = [backend.xp.asarray(log_mel_spectrogram(load_audio_16k(speech_clips[c].wav)), dtype=backend.xp.float32)
            for c in clips]
    for rows in (1, 4, 8):
        requests = [WindowRequest(f"s{i}", mels[i % len(mels)], 0.0, "", None) for i in range(rows)]
        texts = {tuple(h.text for h in recognizer.decode(requests)) for _ in range(2 * TRIALS)}
        assert len(texts) == 1, (rows, texts)
        row = recognizer.decode_chooser.table()[size_class(rows)]
        assert row["host_runs"] == TRIALS and row["device_runs"] == TRIALS, (rows, row)
    print(recognizer.decode_chooser.table())


def test_one_slow_decode_moves_no_choice_and_warming_is_untimed():
    chooser = DecodeChooser(16)
    _timed(chooser, 2, {HOST: 0.9, DEVICE: 0.3}, 2 * TRIALS)
    chooser.record(2, DEVICE, 40 * 25e-3, 40)  # a graph captured at first use: 25 ms a step once
    assert chooser.path(2) == DEVICE and chooser.table()[2]["device_ms_per_step"] == pytest.approx(0.3)
    with chooser.warming(HOST):
        assert chooser.path(2) == HOST and chooser.path(64) == DEVICE
        chooser.record(2, HOST, 1e-3, 40)
    assert chooser.table()[2]["host_runs"] == TRIALS
    with pytest.raises(ValueError):
        with chooser.warming("gpu"):
            pass
