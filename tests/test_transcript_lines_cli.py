"""`captioner transcribe` files in sentence-shaped lines (issue 14): a live replay writes each
caption to ``-o`` as it is committed and, at the end, the same words regrouped into lines that
end at a sentence end or a pause, WebVTT cues carrying each word's time; offline files the same
lines in every format."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from typing import NamedTuple

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


class _Line(NamedTuple):
    text: str
    start_s: float
    end_s: float


def _ends_lines_well(cues: list[_Line]) -> bool:
    """Each cue but the last ends a sentence or is followed by a pause."""
    return all(re.search(r"[.?!][\"')\]]*$", a.text.strip()) or b.start_s - a.end_s >= PAUSE_S - 0.001
               for a, b in zip(cues, cues[1:]))


@pytest.mark.slow
def test_live_replay_file_ends_in_sentence_lines_with_word_times(tmp_path):
    out = tmp_path / "live.vtt"
    done = _run(JFK, "--realtime", "--clock", "simulated", "--policy", "alignatt", "--device", "cpu", "-o", str(out))
    assert done.returncode == 0, done.stderr
    cues = list(webvtt.from_buffer(io.StringIO(out.read_text(encoding="utf-8"))))
    assert cues and _ends_lines_well([_Line(_TAG.sub("", c.raw_text), _seconds(c.start), _seconds(c.end))
                                      for c in cues])
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
def test_offline_files_hold_the_same_sentence_lines_in_every_format(tmp_path):
    done = _run(JFK, "--device", "cpu", "-o", str(tmp_path / "jfk.srt"))
    assert done.returncode == 0, done.stderr
    subs = list(srt.parse((tmp_path / "jfk.srt").read_text(encoding="utf-8"), ignore_errors=False))
    done = _run(JFK, "--device", "cpu", "-f", "jsonl")
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["text"] for r in records] == [s.content for s in subs]

    assert _ends_lines_well([_Line(r["text"], r["start_s"], r["end_s"]) for r in records])
