"""Ctrl-C and SIGTERM as a flag while a command waits (app/interrupts.py): a real signal sent to
this process sets it, no exception is thrown into the waiting code, and the handlers before
come back afterwards."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from captioner.app.interrupts import stop_requests


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_waiting_sets_the_flag_and_the_old_handler_comes_back(sig):
    before = signal.getsignal(sig)
    lock = threading.Condition()
    with stop_requests() as stop:
        os.kill(os.getpid(), sig)
        with lock:  # a wait inside a lock, where a raised interrupt did harm: it runs to its end
            lock.wait(0.05)
        assert stop.wait(2.0)
    assert signal.getsignal(sig) is before


def test_off_the_main_thread_nothing_is_installed():
    seen = {}

    def run():
        with stop_requests() as stop:
            seen["handler"] = signal.getsignal(signal.SIGINT)
            seen["set"] = stop.is_set()

    before = signal.getsignal(signal.SIGINT)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == {"handler": before, "set": False}
