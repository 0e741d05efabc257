"""End to end through the real audio path: speech played into a PulseAudio null sink, its
monitor captured, captions from tiny.en on the CPU.

- the engine API with two streams at once ("Me" and "Meeting", two sinks' monitors);
- `captioner listen` as a subprocess: the expected words arrive as committed lines on stdout
  and in the transcript file; Ctrl-C (SIGINT) stops it cleanly;
- the transcript holds every committed line even when the process is killed (SIGKILL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from e2e_helpers import cue_text, saved_text, wait_for, words_of

pytestmark = [pytest.mark.pulse, pytest.mark.slow]

CLIP = "en_ls_1089-134686-0000"  # "he hoped there would be stew for dinner turnips and carrots ..."
OTHER = "en_jfk_inaugural_excerpt"  # "... ask not what your country can do for you ..."


def test_engine_captions_two_monitors_at_once(pulse_server, speech_clips, tmp_path):
    from captioner.app.transcript import TranscriptWriter
    from captioner.audio.microphone import MicrophoneSource
    from captioner.engine.pipeline import Pipeline

    me_sink, meeting_sink = pulse_server.sinks[0], pulse_server.sinks[1]
    sources = [MicrophoneSource(me_sink.device, stream="Me"), MicrophoneSource(meeting_sink.device, stream="Meeting")]
    transcript = TranscriptWriter(directory=tmp_path)
    pipeline = Pipeline(sources, model="tiny.en", device="cpu", transcript=transcript)
    pipeline.start()
    updates = []
    try:
        time.sleep(0.5)
        players = [pulse_server.play(speech_clips[CLIP].wav, me_sink),
                   pulse_server.play(speech_clips[OTHER].wav, meeting_sink)]
        wait_for(lambda: all(p.poll() is not None for p in players), 60, "paplay")
        # Let the engine reach the pause after the speech and commit.
        def done():
            updates.extend(pipeline.drain_captions())
            finals = {u.stream for u in updates if u.kind == "final"}
            status = pipeline.latest_status()
            return finals == {"Me", "Meeting"} and status is not None and status.lag_s < 30 and \
                not any(_shown_partials(updates).values())
        wait_for(done, 90, "committed captions of both streams")
        running = pipeline.latest_status()
    finally:
        pipeline.stop()
    updates += pipeline.drain_captions()
    me = " ".join(u.text for u in updates if u.kind == "final" and u.stream == "Me")
    meeting = " ".join(u.text for u in updates if u.kind == "final" and u.stream == "Meeting")
    assert {"stew", "dinner", "carrots", "potatoes"} <= words_of(me), me
    assert {"ask", "country", "americans"} <= words_of(meeting), meeting
    assert running.streams == ("Me", "Meeting") and running.provider == "CPUExecutionProvider"
    assert running.frame_latency_ms is not None and running.step_latency_ms is not None
    assert pipeline.latest_status().state == "stopped"
    lines = transcript.path.read_text(encoding="utf-8").splitlines()[1:]
    assert len(lines) == sum(1 for u in updates if u.kind == "final")
    assert any(line.split("] ", 1)[1].startswith("Meeting (Speaker ") for line in lines)


def _shown_partials(updates):
    """Each stream's partial text on screen after ``updates`` (a final or a clear takes it off)."""
    shown = {}
    for u in updates:
        shown[u.stream] = u.text if u.kind == "partial" else ""
    return shown


def _cue_text(lines: list[str]) -> str:
    """The words of printed cues of the monitor ("Meeting", its speakers labelled)."""
    return cue_text(lines, "Meeting")


class Listen:
    """`captioner listen` in a subprocess, its stdout lines collected by a thread."""

    def __init__(self, pulse_server, device: str, transcript: Path, *extra: str) -> None:
        env = dict(pulse_server.env, CAPTIONER_DEVICE="cpu", PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "captioner", "listen", "--input", device, "--transcript", str(transcript), *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
        )
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._read, args=(self.process.stderr, self.errors), daemon=True).start()

    def _read(self, stream, into):
        for line in stream:
            into.append(line.rstrip("\n"))
            if "listening to" in line:
                self._ready.set()

    def wait_ready(self, timeout_s=120):
        if not self._ready.wait(timeout_s):
            self.process.kill()
            pytest.fail("captioner listen did not start:\n" + "\n".join(self.errors))


def test_listen_command_captions_the_monitor(pulse_server, speech_clips, tmp_path):
    transcript = tmp_path / "t.txt"
    listen = Listen(pulse_server, pulse_server.sink.device, transcript)
    try:
        listen.wait_ready()
        player = pulse_server.play(speech_clips[CLIP].wav)
        wait_for(lambda: player.poll() is not None, 60, "paplay")
        wait_for(lambda: {"potatoes", "sauce"} & words_of(" ".join(listen.lines)) == {"potatoes", "sauce"}
                 or listen.process.poll() is not None, 60, "the last words as committed lines",
                 lambda: "\n".join(["", *listen.lines, *listen.errors[-20:]]))
        listen.process.send_signal(signal.SIGINT)  # Ctrl-C
        assert listen.process.wait(30) == 0, "\n".join(listen.errors)
    finally:
        if listen.process.poll() is None:
            listen.process.kill()
    time.sleep(0.2)
    printed = listen.lines
    # Plain committed cues (stdout is not a TTY): a cue's first line labelled, no ANSI codes.
    # A meeting's speakers are labelled (--speakers auto): its turn is headed by the speaker.
    assert printed and printed[0].startswith("[Meeting (Speaker ") and not any("\x1b" in line for line in printed)
    text = _cue_text(printed)
    assert {"stew", "dinner", "carrots", "potatoes"} <= words_of(text), text
    saved = transcript.read_text(encoding="utf-8").splitlines()[1:]
    # The transcript has a line per commit: the same words as the cues.
    assert " ".join(saved_text(line, "Meeting") for line in saved).split() == text.split()
    assert any("transcript saved" in line for line in listen.errors)


def test_transcript_survives_kill(pulse_server, speech_clips, tmp_path):
    transcript = tmp_path / "killed.txt"
    listen = Listen(pulse_server, pulse_server.sink.device, transcript)
    try:
        listen.wait_ready()
        pulse_server.play(speech_clips[OTHER].wav)
        wait_for(lambda: len(listen.lines) >= 2, 90, "two committed lines")
        printed = list(listen.lines)
        os.kill(listen.process.pid, signal.SIGKILL)
        listen.process.wait(10)
    finally:
        if listen.process.poll() is None:
            listen.process.kill()
    saved = [saved_text(line, "Meeting") for line in transcript.read_text(encoding="utf-8").splitlines()[1:]]
    # Every word shown before the kill is on disk (a commit is written before it is shown).
    shown = _cue_text(printed).split()
    assert " ".join(saved).split()[: len(shown)] == shown
