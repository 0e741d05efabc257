"""Helpers of the end-to-end tests that drive real processes and audio (PulseAudio, listen,
serve): waiting on a condition with a deadline, and the words of captions as a set. Called
from the test's own thread."""

from __future__ import annotations

import time

import pytest

from captioner.engine.policy import normalize_word


def words_of(text: str) -> set[str]:
    """The normalised words of ``text`` (hyphenated words split), to test what a caption holds
    whatever its case and punctuation."""
    return {normalize_word(w) for w in text.replace("-", " ").split()}


def wait_for(predicate, timeout_s: float, what: str, detail=lambda: "") -> float:
    """Seconds until ``predicate()`` held; fails the test after ``timeout_s`` (with ``detail()``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what} {detail()}".rstrip())
