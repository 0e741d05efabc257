"""libpulse's poll with a deadline (captioner.audio.pulse_deadline), on real fds."""

from __future__ import annotations

import os
import select
import socket
import time

import pytest

from captioner.audio.pulse_deadline import HANG_UP, DeadlinePoll

_pulsectl = pytest.importorskip("pulsectl._pulsectl")


def _pollfds(*fds_events):
    return [_pulsectl.POLLFD(fd, events, 0) for fd, events in fds_events]


@pytest.fixture
def pair():
    """A connected pair of real sockets: ``ours`` stands for libpulse's connection."""
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


def test_before_the_deadline_it_is_poll(pair):
    ours, theirs = pair
    poll = DeadlinePoll(time.monotonic() + 5.0)
    pollfds = _pollfds((ours.fileno(), select.POLLIN))
    waited_s = time.monotonic()
    assert poll(pollfds, 0.1) == 0 and pollfds[0].revents == 0
    assert 0.08 <= time.monotonic() - waited_s < 1.0, "libpulse's own timeout is kept"
    theirs.send(b"x")
    assert poll(pollfds, -0.001) == 1 and pollfds[0].revents == select.POLLIN


def test_no_timeout_waits_until_the_deadline_only(pair):
    ours, _ = pair
    poll = DeadlinePoll(time.monotonic() + 0.2)
    pollfds = _pollfds((ours.fileno(), select.POLLIN))
    waited_s = time.monotonic()
    poll(pollfds, -0.001)  # "no timeout" from libpulse
    assert 0.15 <= time.monotonic() - waited_s < 1.0


def test_past_the_deadline_the_sockets_are_hung_up_and_the_wakeup_pipe_is_not(pair):
    ours, _ = pair
    wake_r, wake_w = os.pipe()
    try:
        poll = DeadlinePoll(time.monotonic() - 0.01)
        pollfds = _pollfds((wake_r, select.POLLIN), (ours.fileno(), select.POLLIN | select.POLLOUT))
        assert not poll.hung_up
        assert poll(pollfds, -0.001) == 1
        assert pollfds[0].revents == 0
        assert pollfds[1].revents == HANG_UP
        assert poll.hung_up
    finally:
        for fd in (wake_r, wake_w):
            os.close(fd)


def test_an_fd_closed_under_libpulse_is_a_hang_up_not_a_spin():
    ours, theirs = socket.socketpair()
    closed_fd = ours.fileno()
    ours.close()
    try:
        poll = DeadlinePoll(time.monotonic() + 5.0)
        pollfds = _pollfds((closed_fd, select.POLLIN))
        assert poll(pollfds, 1.0) == 1
        assert pollfds[0].revents == HANG_UP  # libpulse ignores POLLNVAL; it fails on a hang-up
    finally:
        theirs.close()
