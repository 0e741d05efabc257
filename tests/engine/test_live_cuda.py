"""The public API on a GPU: live captions of real recordings, several streams batched, on the
CUDA provider, as accurate as the offline path on the same device (marked `gpu`)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from live_feed import caption_live


def _words(text: str) -> list[str]:
    return re.sub(r"[^\w' ]+", " ", text.lower()).split()


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Word-level edit distance over the reference length, pooled (a plain normaliser: case and
    punctuation; the CPU tests use Whisper's English normaliser through jiwer)."""
    errors = total = 0
    for ref, hyp in zip(references, hypotheses):
        r, h = _words(ref), _words(hyp)
        row = np.arange(len(h) + 1)
        for i, word in enumerate(r, 1):
            prev, row = row, np.empty_like(row)
            row[0] = i
            for j in range(1, len(h) + 1):
                row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (word != h[j - 1]))
        errors += int(row[-1])
        total += len(r)
    return errors / max(total, 1)


@pytest.mark.gpu
@pytest.mark.slow
def test_live_streams_on_cuda_match_offline(speech_clips):
    import captioner

    clips = sorted((c for c in speech_clips.values() if c.language == "en" and c.duration_s <= 35),
                   key=lambda c: c.id)[:8]
    live_text = caption_live(clips, device="cuda:0", streams_at_once=8)
    references = [c.reference for c in clips]
    live_wer = word_error_rate(references, [live_text[c.id] for c in clips])
    offline = [captioner.transcribe(c.wav, model="tiny.en", language="en", device="cuda:0").text for c in clips]
    offline_wer = word_error_rate(references, offline)
    print(f"{len(clips)} clips on CUDA: live WER {live_wer:.3f}, offline {offline_wer:.3f}")
    assert live_wer <= offline_wer + 0.02


def test_word_error_rate_counts_edits():
    assert word_error_rate(["the cat sat"], ["the cat sat"]) == 0.0
    assert word_error_rate(["the cat sat"], ["the bat sat down"]) == pytest.approx(2 / 3)
