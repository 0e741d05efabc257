"""`captioner transcribe FILE --realtime --clock simulated [--policy ...]` (issue 14): the live
engine on a simulated clock charged with each step's measured compute, with either commit
policy; bad combinations are one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from captioner.data import sample_speech_path
from captioner.engine.policy.words import normalize_word

JFK = str(sample_speech_path())


def _run(*argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "captioner", "transcribe", *argv],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["alignatt", "localagreement"])
def test_simulated_clock_replay_with_each_policy(tmp_path, policy):
    out = tmp_path / "live.jsonl"
    done = _run(JFK, "--realtime", "--clock", "simulated", "--policy", policy, "--device", "cpu",
                "-f", "jsonl", "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"policy {policy}" in done.stderr and "simulated clock: 11.0 s of audio" in done.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    finals = [r for r in records if r["kind"] == "final"]
    words = [normalize_word(w) for r in finals for w in r["text"].split()]
    assert {"fellow", "americans", "country"} <= set(words)
    for r in records:  # causal on the simulated clock: nothing before its audio was heard
        assert r["end_s"] <= r["emitted_audio_s"] + 0.05 <= r["emitted_wall_s"] + 0.1
    walls = [r["emitted_wall_s"] for r in records]
    assert walls == sorted(walls)


def test_simulated_clock_needs_realtime():
    done = _run(JFK, "--clock", "simulated", timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--realtime" in done.stderr


def test_unknown_policy_is_refused_by_the_parser():
    done = _run(JFK, "--realtime", "--policy", "waitk", timeout=60)
    assert done.returncode == 2 and "--policy" in done.stderr
