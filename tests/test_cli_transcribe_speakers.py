"""`captioner transcribe --speakers`: two real voices taking turns come out labelled; under
``auto`` one voice is not."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile

from captioner.app.cli import main
from captioner.audio.file_source import read_audio_16k
from captioner.errors import UserError

pytestmark = pytest.mark.slow


@pytest.fixture()
def cli(onnx_cache_dir, monkeypatch, capsys):
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(onnx_cache_dir))
    monkeypatch.setenv("CAPTIONER_DEVICE", "cpu")
    try:
        from captioner.models.speaker.weights import checkpoint_path

        checkpoint_path()
    except UserError as exc:
        pytest.skip(str(exc))

    def run(*argv):
        code = main(["transcribe", *map(str, argv)])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_two_voices_are_labelled_in_text_and_json_lines(cli, speech_clips, tmp_path):
    pause = np.zeros(12000, np.float32)
    # LibriSpeech 1089 (10.4 s), then LJ Speech's reader (9.7 s).
    turns = [read_audio_16k(speech_clips[c].wav) for c in ("en_ls_1089-134686-0000", "en_ljspeech_LJ001-0001")]
    path = tmp_path / "two.wav"
    soundfile.write(path, np.concatenate([turns[0], pause, turns[1], pause]), 16000)
    code, out, err = cli(path, "-o", tmp_path / "two.jsonl")
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "two.jsonl").read_text().splitlines()]
    first = [r["speaker"] for r in records if r["end_s"] < 10.5]
    second = [r["speaker"] for r in records if r["start_s"] > 11.0]
    assert first and second and set(first) == {"Speaker 1"} and set(second) == {"Speaker 2"}, records


def test_one_voice_is_not_labelled_by_auto(cli, speech_clips):
    code, out, _ = cli(speech_clips["en_timit_LDC93S1"].wav)
    assert code == 0 and out.strip() and "Speaker" not in out  # one voice: nothing to tell apart
