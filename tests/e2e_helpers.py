"""Helpers of the end-to-end tests that drive real processes, audio and devices (PulseAudio,
listen, serve, CUDA): waiting on a condition with a deadline, the words of captions as a set,
a jiwer-free word error rate. Called from the test's own thread."""

from __future__ import annotations

import re
import time

import pytest

from captioner.engine.policy.words import normalize_word


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


def plain_wer(references: list[str], hypotheses: list[str]) -> float:
    """Pooled word error rate with a plain normaliser (case, punctuation), for machines without
    jiwer (the GPU box): the same measure on both sides of a comparison."""
    errors = total = 0
    for ref, hyp in zip(references, hypotheses):
        r = re.sub(r"[^\w' ]+", " ", ref.lower()).split()
        h = re.sub(r"[^\w' ]+", " ", hyp.lower()).split()
        row = list(range(len(h) + 1))
        for i, word in enumerate(r, 1):
            prev, row = row, [i] + [0] * len(h)
            for j in range(1, len(h) + 1):
                row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (word != h[j - 1]))
        errors += row[-1]
        total += len(r)
    return errors / max(total, 1)


def cue_text(lines: list[str], stream: str) -> str:
    """The words of ``captioner listen``'s printed cues of ``stream``: each cue's first line
    labelled ``[Meeting] ``, or, where its speakers are labelled, each turn headed by a line
    ``[Meeting (Speaker 2)]`` of its own."""
    heading = re.compile(rf"\[{re.escape(stream)} \([^)]*\)\]")
    return " ".join(line.removeprefix(f"[{stream}] ") for line in lines if not heading.fullmatch(line))


def saved_text(line: str, stream: str) -> str:
    """The words of a transcript line of ``stream``: ``[t --> t] Meeting: words`` or, with a
    speaker, ``[t --> t] Meeting (Speaker 2): words``."""
    found = re.match(rf"\[[^]]*\] {re.escape(stream)}(?: \([^)]*\))?: (.*)", line)
    assert found, f"not a transcript line of {stream}: {line!r}"
    return found.group(1)
