"""MicrophoneSource when its device goes away: health() names the fault (a source that left the
server, a stream PulseAudio moved to another source, a frozen server), reopen() finds the same
device once it is back, and PortAudio's own stderr lines never reach the terminal.

Each test breaks a private PulseAudio server of its own (tests/pulse.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from captioner.audio.microphone import STALL_S, MicrophoneSource, refresh_portaudio

FIRST_CHUNK_TIMEOUT_S = 20.0



def health_within(source, timeout_s: float) -> tuple[str, float]:
    """The first reason health() gives, and after how many seconds."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        why = source.health()
        if why is not None:
            return why, time.monotonic() - started
        time.sleep(0.05)
    pytest.fail(f"health() said nothing for {timeout_s:g} s")


def started(source, sinks):
    sink = sinks.Collector()
    source.start(sink)
    sink.wait(lambda c: len(c.chunks) >= 5, FIRST_CHUNK_TIMEOUT_S, "audio from the monitor")
    assert source.health() is None
    return sink


@pytest.mark.pulse
def test_a_source_that_leaves_is_gone_and_reopens_once_it_is_back(own_server, sinks):
    sink_0 = own_server.sinks[0]
    source = MicrophoneSource(sink_0.device, stream="Me")
    started(source, sinks)
    try:
        own_server.unload_sink(sink_0)
        why, after_s = health_within(source, 5)
        assert why == "PulseAudio source 'captioner_test.monitor' is gone"
        assert after_s < 1.5
        assert source.reopen() is None  # not back yet
    finally:
        source.stop()
    assert source.health() is None  # stopped: nothing to say

    own_server.load_sink(sink_0)
    fresh = source.reopen()
    assert fresh is not None and fresh is not source
    assert (fresh.stream, fresh.device.pulse_source, fresh.rate_hz) == ("Me", "captioner_test.monitor", 48_000)
    again = sinks.Collector()
    fresh.start(again)
    try:
        again.wait(lambda c: c.chunks, FIRST_CHUNK_TIMEOUT_S, "audio from the reopened source")
    finally:
        fresh.stop()
    assert again.chunks[0].first_sample == 0 and again.chunks[0].stream == "Me"


@pytest.mark.pulse
def test_a_stream_pulseaudio_moves_to_another_source_is_noticed(own_server, sinks):
    """The ALSA plug-in's streams follow the server's default source: with sink 0 gone, the
    default falls back to sink 1's monitor, and when sink 0 comes back PulseAudio moves the
    streams sitting on that fallback (ours, of sink 1) to it — someone else's audio."""
    sink_0, sink_1 = own_server.sinks
    source = MicrophoneSource(sink_1.device, stream="Meeting")
    started(source, sinks)
    try:
        own_server.unload_sink(sink_0)
        time.sleep(1.5)
        assert source.health() is None  # our source is still there; nothing moved yet
        own_server.load_sink(sink_0)
        why, after_s = health_within(source, 5)
    finally:
        source.stop()
    assert why == "PulseAudio moved it to 'captioner_test.monitor'"
    assert after_s < 2.0


@pytest.mark.pulse
def test_a_frozen_server_is_noticed_and_stop_elsewhere_does_not_hold_anyone(own_server, sinks):
    source = MicrophoneSource(own_server.sink.device, stream="Me")
    started(source, sinks)
    stopper = None
    try:
        own_server.freeze()  # no callback, no finished callback: PortAudio is not told
        why, after_s = health_within(source, 5)
        assert why == "no answer from the PulseAudio server"
        assert STALL_S <= after_s < STALL_S + 1.0
        assert source.reopen() is None  # the server does not answer: nothing is opened on it
        # The close waits on the frozen plug-in; the owner runs it on a thread of its own.
        stopper = threading.Thread(target=source.stop, daemon=True)
        stopper.start()
        stopper.join(1.0)
        assert stopper.is_alive()
    finally:
        own_server.thaw()
        if stopper is not None:
            stopper.join(90)
            assert not stopper.is_alive()
        source.stop()


@pytest.mark.pulse
def test_a_question_to_a_frozen_server_ends_at_its_deadline_and_leaves_no_thread(
        pulse_server, own_server, monkeypatch):
    """libpulse's poll is bounded by the question's timeout: at the deadline the connection is
    hung up, so nothing waits on a frozen server afterwards (a waiting thread once stayed for the
    rest of a process, and took a core when libpulse spun on it), and nothing is held."""
    from captioner.audio import pulse

    own_server.freeze()
    try:
        asked_s = time.monotonic()
        assert pulse.list_sources(0.5) == []
        assert time.monotonic() - asked_s < 0.5 + pulse.HANG_UP_GRACE_S
        assert not [t for t in threading.enumerate() if t.name == "captioner-pulse-query"]
        assert not pulse._stuck_exchanges  # noqa: SLF001
        asked_s = time.monotonic()
        assert pulse.list_sources(3.0) == [] and time.monotonic() - asked_s < 0.2, "held: no second timeout"
        cpu_start_s = time.process_time()
        time.sleep(0.5)
        assert time.process_time() - cpu_start_s < 0.1, "nothing spins on the frozen server"
        monkeypatch.setenv("PULSE_SERVER", pulse_server.server)  # another server: not held
        assert "captioner_test.monitor" in {s.name for s in pulse.list_sources(5.0)}
    finally:
        own_server.thaw()
    monkeypatch.setenv("PULSE_SERVER", own_server.server)
    monkeypatch.setattr(pulse, "UNANSWERED_HOLD_S", 0.2)
    time.sleep(0.3)
    assert "captioner_test.monitor" in {s.name for s in pulse.list_sources(5.0)}, "answered once back"


@pytest.mark.pulse
def test_an_exchange_that_never_returns_holds_the_others_for_a_while_only(pulse_server, monkeypatch):
    """An exchange still running past its deadline (libpulse not polling at all: here a question
    that does not return) makes the next questions give up at once, so no threads pile up; but
    only for ``UNANSWERED_HOLD_S``, and never past ``MAX_STUCK_EXCHANGES`` running."""
    from captioner.audio import pulse

    release = threading.Event()

    def wedged(client):
        release.wait(30)
        return client.server_info()

    try:
        assert pulse._ask_server(wedged, 0.2) is None  # noqa: SLF001
        stuck = [t for t in pulse._stuck_exchanges if t.is_alive()]  # noqa: SLF001
        assert len(stuck) == 1
        asked_s = time.monotonic()
        assert pulse.list_sources(3.0) == [] and time.monotonic() - asked_s < 0.5, "held: no second thread"
        monkeypatch.setattr(pulse, "UNANSWERED_HOLD_S", 0.2)
        time.sleep(0.3)
        names = {s.name for s in pulse.list_sources(5.0)}
        assert "captioner_test.monitor" in names, names
        monkeypatch.setattr(pulse, "MAX_STUCK_EXCHANGES", 1)
        assert pulse.list_sources(5.0) == [], "no more questions past the limit of running ones"
    finally:
        release.set()
        stuck_threads = list(pulse._stuck_exchanges)  # noqa: SLF001
        for thread in stuck_threads:
            thread.join(10)
    assert not any(t.is_alive() for t in stuck_threads), "past its deadline, the exchange ends once it polls"
    assert "captioner_test.monitor" in {s.name for s in pulse.list_sources(5.0)}


@pytest.mark.pulse
def test_a_rescan_between_resolving_and_opening_reopens_the_same_device(pulse_server, sinks):
    source = MicrophoneSource(pulse_server.sinks[1].device, stream="Meeting")
    assert refresh_portaudio()  # PortAudio's indices are renumbered: the choice is re-found by name
    sink = sinks.Collector()
    source.start(sink)
    try:
        sink.wait(lambda c: c.chunks, FIRST_CHUNK_TIMEOUT_S, "audio")
    finally:
        source.stop()
    assert source.device.pulse_source == "captioner_test_44k.monitor"


def test_portaudio_lines_on_c_stderr_are_dropped_and_ours_are_not():
    """What PortAudio and alsa-lib print goes through C stdio's stderr (a PortAudio thread's
    ``Expression '...' failed in 'src/hostapi/alsa/pa_linux_alsa.c'``): dropped while PortAudio
    works; Python's own sys.stderr writes fd 2 and still shows."""
    code = textwrap.dedent("""
        import ctypes, sys
        from captioner.audio.microphone import quiet_portaudio
        libc = ctypes.CDLL(None)
        with quiet_portaudio():
            with quiet_portaudio():  # nested (two open streams)
                libc.perror(b"C stderr while quiet")
            libc.perror(b"C stderr while still quiet")
            print("python stderr while quiet", file=sys.stderr, flush=True)
        libc.perror(b"C stderr afterwards")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "while quiet" not in done.stderr.replace("python stderr while quiet", "")
    assert "python stderr while quiet" in done.stderr
    assert "C stderr afterwards" in done.stderr
