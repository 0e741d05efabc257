"""`captioner transcribe FILE --realtime --format jsonl`: a file replayed at real-time pace
through the live engine, every update as one JSON object."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from captioner.engine.policy import normalize_word

pytestmark = pytest.mark.slow

FIELDS = {"stream", "kind", "text", "start_s", "end_s", "emitted_audio_s", "emitted_wall_s"}


def test_realtime_jsonl(speech_clips, tmp_path):
    clip = speech_clips["en_ls_1089-134691-0001"]  # "for a full hour he had paced up and down ..."
    out = tmp_path / "live.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "captioner", "transcribe", str(clip.wav), "--realtime", "--format", "jsonl",
         "-o", str(out), "--device", "cpu"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert records and all(FIELDS <= set(r) for r in records)
    assert {r["stream"] for r in records} == {clip.wav.stem}
    assert {r["kind"] for r in records} <= {"partial", "final"}
    finals = [r for r in records if r["kind"] == "final"]
    words = {normalize_word(w) for r in finals for w in r["text"].split()}
    assert {"hour", "paced", "waiting", "longer"} <= words
    # Causality of a real-time replay: nothing is emitted before its audio was played, and
    # both clocks only move forward.
    for r in records:
        assert r["end_s"] <= r["emitted_audio_s"] + 0.05
        assert r["emitted_audio_s"] <= r["emitted_wall_s"] + 0.05
    walls = [r["emitted_wall_s"] for r in records]
    assert walls == sorted(walls)


def test_realtime_bad_file_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.wav"
    bad.write_bytes(b"not audio at all")
    done = subprocess.run([sys.executable, "-m", "captioner", "transcribe", str(bad), "--realtime"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "captioner: error:" in done.stderr
