"""`captioner transcribe` files laid out as captions (captioner.layout: 42 characters a line, 2
lines a cue, 0.83-7 s a cue, broken at sentences, pauses and punctuation first), live and offline:
a live replay writes each cue to ``-o`` once no later word can change it, WebVTT cues carrying
each word's time; offline files hold the same cues in every format."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import pytest
import srt
import webvtt

from captioner.data import sample_speech_path

JFK = str(sample_speech_path())
PAUSE_S = 0.5  # EngineConfig().pause_s
_TAG = re.compile(r"<\d\d:\d\d:\d\d\.\d\d\d>")


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "captioner", "transcribe", *argv],
                          capture_output=True, text=True, timeout=600)


def _problems(cues) -> list[str]:
    """The layout rules a file's cues (``(lines, start_s, end_s)``) break."""
    from captioner import layout

    return layout.check([layout.Cue(start_s, end_s, tuple(lines)) for lines, start_s, end_s in cues])


@pytest.mark.slow
def test_live_replay_file_is_laid_out_as_captions_with_word_times(tmp_path):
    out = tmp_path / "live.vtt"
    done = _run(JFK, "--realtime", "--clock", "simulated", "--policy", "alignatt", "--device", "cpu", "-o", str(out))
    assert done.returncode == 0, done.stderr
    cues = list(webvtt.from_buffer(io.StringIO(out.read_text(encoding="utf-8"))))
    assert cues and _problems([(_TAG.sub("", c.raw_text).split("\n"), _seconds(c.start), _seconds(c.end))
                               for c in cues]) == []
    text = " ".join(_TAG.sub("", c.raw_text) for c in cues).lower()
    assert text.startswith("and so my fellow americans") and "country" in text
    assert any(_TAG.search(c.raw_text) for c in cues)  # word times, inside each cue
    for cue in cues:
        times = [_seconds(cue.start), *(_seconds(t) for t in _TAG.findall(cue.raw_text)), _seconds(cue.end)]
        assert times == sorted(times)


def _seconds(tag: str) -> float:
    h, m, s = tag.strip("<>").split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


@pytest.mark.slow
def test_offline_files_hold_the_same_cues_in_every_format(tmp_path):
    done = _run(JFK, "--device", "cpu", "-o", str(tmp_path / "jfk.srt"))
    assert done.returncode == 0, done.stderr
    subs = list(srt.parse((tmp_path / "jfk.srt").read_text(encoding="utf-8"), ignore_errors=False))
    done = _run(JFK, "--device", "cpu", "-f", "jsonl")
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["text"] for r in records] == [s.content for s in subs]

    assert _problems([(r["text"].split("\n"), r["start_s"], r["end_s"]) for r in records]) == []
