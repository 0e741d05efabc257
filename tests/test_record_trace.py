"""Headless recording of a real captioning run (no Qt), as on the GPU server."""

from __future__ import annotations

from pathlib import Path

import pytest

from captioner.app import record_trace
from captioner.trace import load_trace


@pytest.mark.slow
def test_records_a_real_run(tmp_path, speech_clips, monkeypatch):
    monkeypatch.setenv("CAPTIONER_TRANSCRIPT_DIR", str(tmp_path / "transcripts"))
    a, b = speech_clips["en_ls_1089-134686-0001"], speech_clips["en_ls_1089-134691-0000"]
    out = tmp_path / "run.trace.jsonl"
    assert record_trace.main(["--file", str(a.wav), "--file", str(b.wav), "--device", "cpu", "--out", str(out),
                              "--settle-s", "0.5"]) == 0
    trace = load_trace(out)
    assert trace.meta["files"] == [a.wav.name, b.wav.name] and trace.meta["model"] == "tiny.en"
    # A stream's caption may commit as several lines (where it breaks depends on CPU load): join them.
    finals: dict[str, str] = {}
    for c in trace.final_captions():
        finals[c.stream] = (finals.get(c.stream, "") + " " + c.text.lower()).strip()
    assert "wait no longer" in finals[b.wav.stem]
    assert "belly" in finals[a.wav.stem]
    # Both streams were captioned side by side (a file's stream leaves once its audio is committed).
    assert any(set(status.streams) == {a.wav.stem, b.wav.stem} for status in trace.statuses)
    assert len(trace.telemetry) >= 4
    times = [s.time_s for s in trace.telemetry]
    assert times == sorted(times) and len(set(times)) == len(times)  # each sample once


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    assert record_trace.main(["--file", str(tmp_path / "nope.wav"), "--out", str(tmp_path / "t.jsonl")]) == 2
    assert "no such audio file" in capsys.readouterr().err


def test_a_run_that_cannot_start_leaves_no_trace_file(tmp_path, speech_clips, capsys):
    out = tmp_path / "t.jsonl"
    wav = str(speech_clips["en_ls_7902-96591-0000"].wav)
    # A model folder without a model: the pipeline fails to start after the trace was opened.
    assert record_trace.main(["--file", wav, "--model", str(tmp_path), "--device", "cpu", "--out", str(out)]) == 2
    assert "lacks model.bin" in capsys.readouterr().err
    assert not out.exists()
    # A GPU that is not there is refused before the trace is opened at all.
    assert record_trace.main(["--file", wav, "--device", "cuda:63", "--out", str(out)]) == 2
    assert "cuda:63" in capsys.readouterr().err and not out.exists()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_trace_on_a_full_disk_is_one_line(tmp_path, speech_clips, capsys):
    wav = str(speech_clips["en_ls_7902-96591-0000"].wav)
    assert record_trace.main(["--file", wav, "--device", "cpu", "--out", "/dev/full"]) == 2
    err = capsys.readouterr().err
    assert err == "record_trace: error: cannot write the trace /dev/full: No space left on device\n"
    assert Path("/dev/full").is_char_device()
