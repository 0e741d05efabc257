"""A lost input through the real path: speech played into PulseAudio null sinks, their monitors
captured by PortAudio, tiny.en on the CPU; the faults are real ones of a private server.

- a sink unloaded mid-session (a device unplugged) and loaded again: the loss is reported
  within 2 s, the other stream goes on captioning, the lost one comes back and captions speech
  played after its return, in time order, and the transcript keeps every line committed before;
- `captioner listen` with the server killed (kill -9) and started again: one line when lost,
  one when back, speech after the return captioned, no PortAudio lines, Ctrl-C exits cleanly;
- `captioner listen` with the server frozen (SIGSTOP): reported, and Ctrl-C still exits at once.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from e2e_helpers import cue_text, saved_text, wait_for, words_of

pytestmark = [pytest.mark.pulse, pytest.mark.slow]

BEFORE = "en_ls_1089-134691-0001"  # "for a full hour he had paced up and down waiting but ..."
DURING = "en_ls_7902-96591-0000"  # "i am from the cutter lying off the coast"
AFTER = "en_ls_1089-134686-0001"  # "stuff it into you his belly counselled him"
LOSS_REPORTED_S = 2.0
START_S = 120.0  # loading the model on a busy machine


def play_to_end(server, clip, sink) -> None:
    player = server.play(clip.wav, sink)
    try:
        player.wait(timeout=clip.duration_s + 20)
    except subprocess.TimeoutExpired:
        player.kill()
        pytest.fail("paplay did not finish")



class Captions:
    """Drains a pipeline's captions into a list on the test's thread, and notes each change of
    its lost inputs (with the time since it was made) for the failure messages."""

    def __init__(self, pipeline) -> None:
        self.pipeline = pipeline
        self.updates: list = []
        self.started = time.monotonic()
        self.changes: list[tuple[float, dict]] = []

    def lost(self) -> dict[str, str]:
        self.updates += self.pipeline.drain_captions()
        lost = self.pipeline.lost_inputs
        if not self.changes or self.changes[-1][1] != lost:
            self.changes.append((round(time.monotonic() - self.started, 2), lost))
        return lost

    def text(self, stream: str) -> str:
        self.lost()
        return " ".join(u.text for u in self.updates if u.kind == "final" and u.stream == stream)

    def detail(self) -> str:
        texts = {u.stream: "" for u in self.updates}
        return f"(lost inputs: {self.changes}; captions: {[(k, self.text(k)) for k in texts]})"

    def heard(self, stream: str, expected: set[str]) -> bool:
        return expected <= words_of(self.text(stream))


def test_an_unplugged_input_is_reported_the_other_goes_on_and_it_comes_back(own_server, speech_clips, tmp_path):
    from captioner.app.transcript import TranscriptWriter
    from captioner.audio.microphone import MicrophoneSource
    from captioner.engine.pipeline import Pipeline

    me_sink, meeting_sink = own_server.sinks
    sources = [MicrophoneSource(me_sink.device, stream="Me"), MicrophoneSource(meeting_sink.device, stream="Meeting")]
    transcript = TranscriptWriter(directory=tmp_path)
    pipeline = Pipeline(sources, model="tiny.en", device="cpu", transcript=transcript)
    pipeline.start(timeout_s=START_S)
    captions = Captions(pipeline)
    try:
        time.sleep(2.0)  # the streams deliver (the plug-in's first block takes 1.5 s)
        play_to_end(own_server, speech_clips[BEFORE], me_sink)
        wait_for(lambda: captions.heard("Me", {"hour", "paced", "longer"}), 60, "Me's words before the loss")
        before = [u for u in captions.updates if u.kind == "final" and u.stream == "Me"]

        own_server.unload_sink(me_sink)  # the device is unplugged
        reported_s = wait_for(lambda: "Me" in captions.lost(), 10, "the loss of Me")
        assert "gone" in pipeline.lost_inputs["Me"]
        wait_for(lambda: (pipeline.latest_status().lost_inputs == ("Me",)), 5, "the status to say Me is lost")
        status = pipeline.latest_status()
        assert status.streams == ("Me", "Meeting")  # its stream stays open
        assert "input 'Me' lost (PulseAudio source 'captioner_test.monitor' is gone); waiting for it to come back" \
            in status.message

        # The other stream goes on captioning while Me is away.
        play_to_end(own_server, speech_clips[DURING], meeting_sink)
        wait_for(lambda: captions.heard("Meeting", {"cutter", "coast"}), 60, "Meeting's words during the loss")
        assert "Me" in pipeline.lost_inputs

        own_server.load_sink(me_sink)  # plugged back
        back_s = wait_for(lambda: not captions.lost(), 30, "Me (and Meeting) back", captions.detail)
        # Loading the sink makes it the server's default again, and PulseAudio moves the
        # plug-in's streams that sat on the default meanwhile (Meeting's) to it: that stream was
        # reopened on its own source too. Both deliver again.
        time.sleep(2.0)
        play_to_end(own_server, speech_clips[AFTER], me_sink)
        wait_for(lambda: captions.heard("Me", {"into", "belly"}), 60, "Me's words after its return", captions.detail)
        losses = pipeline.input_losses
    finally:
        pipeline.stop()
    captions.updates += pipeline.drain_captions()
    print(f"loss reported after {reported_s:.2f} s; back {back_s:.2f} s after the sink was loaded again")
    assert reported_s <= LOSS_REPORTED_S

    me = [u for u in captions.updates if u.kind == "final" and u.stream == "Me"]
    assert me[: len(before)] == before
    # Time order on Me's clock across the loss: the speech after the return lies after all
    # that came before, about as far after as the time Me was away.
    assert all(a.start_s <= b.start_s for a, b in zip(me, me[1:])), [(u.start_s, u.end_s, u.text) for u in me]
    after = [u for u in me if {"into", "belly"} & words_of(u.text)]
    assert after[0].start_s > before[-1].end_s + losses["Me"].lost_s
    assert losses["Me"].count == 1 and losses["Me"].lost_s > 1.0
    # The transcript holds every committed line, those before the loss first and in order.
    lines = transcript.path.read_text(encoding="utf-8").splitlines()[1:]
    me_lines = [saved_text(line, "Me") for line in lines if re.match(r"\[[^]]*\] Me[ :]", line)]
    assert me_lines == [u.text for u in me]
    assert len(lines) == sum(1 for u in captions.updates if u.kind == "final")


class Listen:
    """`captioner listen` in a subprocess; stdout and stderr lines collected with their time."""

    def __init__(self, server, transcript: Path, *inputs: str) -> None:
        env = dict(server.env, CAPTIONER_DEVICE="cpu", PYTHONUNBUFFERED="1")
        argv = [sys.executable, "-m", "captioner", "listen", "--transcript", str(transcript), "--status"]
        for device in inputs:
            argv += ["--input", device]
        self.process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        stdin=subprocess.DEVNULL)
        self.lines: list[str] = []
        self.errors: list[tuple[float, str]] = []
        threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._read_timed, args=(self.process.stderr,), daemon=True).start()

    @staticmethod
    def _read(stream, into) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    def _read_timed(self, stream) -> None:
        for line in stream:
            self.errors.append((time.monotonic(), line.rstrip("\n")))

    def said(self, part: str) -> float | None:
        """When stderr first had a line containing ``part``."""
        return next((at for at, line in self.errors if part in line), None)

    def text(self) -> str:
        return " ".join(line.split("] ", 1)[-1] for line in self.lines)

    def stderr(self) -> str:
        return "\n".join(line for _, line in self.errors)

    def interrupt(self, timeout_s: float) -> tuple[int, float]:
        """Ctrl-C; the exit status and how long the exit took."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout_s)
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def assert_no_portaudio_lines(text: str) -> None:
    for raw in ("Expression '", "pa_linux_alsa.c", "ALSA lib", "PaAlsa", "double free"):
        assert raw not in text, text


def test_listen_says_when_the_server_is_killed_and_back_and_captions_after(pulse_helper, speech_clips, tmp_path):
    server = pulse_helper.start_pulse_server()
    listen = Listen(server, tmp_path / "t.txt", server.sink.device)
    try:
        wait_for(lambda: listen.said("listening to"), START_S, "listen to start")
        time.sleep(2.0)
        play_to_end(server, speech_clips[BEFORE], server.sink)
        wait_for(lambda: {"hour", "longer"} <= words_of(listen.text()), 60, "the words before the kill")
        before = list(listen.lines)

        killed = time.monotonic()
        server.kill()  # kill -9
        wait_for(lambda: listen.said("lost ("), 10, "the loss line")
        reported_s = listen.said("lost (") - killed

        server.restart()  # same socket, same sinks
        restarted = time.monotonic()
        wait_for(lambda: listen.said("is back"), 30, "the line saying the input is back")
        back_s = listen.said("is back") - restarted
        time.sleep(2.0)
        play_to_end(server, speech_clips[AFTER], server.sink)
        wait_for(lambda: {"into", "belly"} <= words_of(listen.text()), 60, "the words after the return",
                 lambda: f"(stdout: {listen.lines}; stderr: {listen.stderr()})")
        code, exit_s = listen.interrupt(30)
    finally:
        listen.kill()
        server.stop()
    print(f"kill -9: reported after {reported_s:.2f} s; back {back_s:.2f} s after the restart; Ctrl-C exit {exit_s:.2f} s")
    errors = listen.stderr()
    assert code == 0, errors
    assert reported_s <= LOSS_REPORTED_S
    lost_lines = [line for _, line in listen.errors if " lost (" in line]
    assert lost_lines == ["captioner: input 'Meeting' lost (no answer from the PulseAudio server); "
                          "waiting for it to come back"], errors
    assert [line for _, line in listen.errors if "is back" in line] == ["captioner: input 'Meeting' is back"]
    assert "captioner: input 'Meeting' was lost 1 time (" in errors
    assert "drops 0, inputs lost 1 (" in errors
    assert_no_portaudio_lines(errors)
    saved = [saved_text(line, "Meeting") for line in (tmp_path / "t.txt").read_text(encoding="utf-8").splitlines()[1:]]
    # A line per commit in the transcript, cues on stdout: the same words, none lost at the kill.
    saved_words = " ".join(saved).split()
    shown_before = cue_text(before, "Meeting").split()
    assert saved_words[: len(shown_before)] == shown_before
    assert saved_words == cue_text(listen.lines, "Meeting").split()


def test_listen_on_a_frozen_server_reports_it_and_stops_at_once(pulse_helper, tmp_path):
    server = pulse_helper.start_pulse_server()
    listen = Listen(server, tmp_path / "t.txt", server.sinks[0].device, server.sinks[1].device)
    try:
        wait_for(lambda: listen.said("listening to"), START_S, "listen to start")
        time.sleep(2.5)  # both streams deliver (the plug-in's first block takes 1.5 s)
        frozen = time.monotonic()
        server.freeze()  # SIGSTOP: connected, answering nothing; PortAudio is not told
        wait_for(lambda: len([1 for _, line in listen.errors if " lost (" in line]) == 2, 10, "both losses")
        reported_s = max(at for at, line in listen.errors if " lost (" in line) - frozen
        code, exit_s = listen.interrupt(30)  # while the server is still frozen
    finally:
        listen.kill()
        server.thaw()
        server.stop()
    print(f"SIGSTOP: reported after {reported_s:.2f} s; Ctrl-C exit {exit_s:.2f} s")
    errors = listen.stderr()
    assert code == 0, errors
    assert reported_s <= LOSS_REPORTED_S
    assert exit_s < 10.0
    assert_no_portaudio_lines(errors)
    assert "transcript saved" in errors
