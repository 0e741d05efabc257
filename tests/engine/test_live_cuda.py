"""The public API on a GPU: live captions of real recordings, several streams batched, on the
CUDA provider, as accurate as the offline path on the same device (marked `gpu`)."""

from __future__ import annotations

import pytest
from live_feed import caption_live

from e2e_helpers import plain_wer


@pytest.mark.gpu
@pytest.mark.slow
def test_live_streams_on_cuda_match_offline(speech_clips):
    import captioner

    clips = sorted((c for c in speech_clips.values() if c.language == "en" and c.duration_s <= 35),
                   key=lambda c: c.id)[:8]
    live_text = caption_live(clips, device="cuda:0", streams_at_once=8)
    references = [c.reference for c in clips]
    live_wer = plain_wer(references, [live_text[c.id] for c in clips])
    offline = [captioner.transcribe(c.wav, model="tiny.en", language="en", device="cuda:0").text for c in clips]
    offline_wer = plain_wer(references, offline)
    print(f"{len(clips)} clips on CUDA: live WER {live_wer:.3f}, offline {offline_wer:.3f}")
    assert live_wer <= offline_wer + 0.02


def test_word_error_rate_counts_edits():
    assert plain_wer(["the cat sat"], ["the cat sat"]) == 0.0
    assert plain_wer(["the cat sat"], ["the bat sat down"]) == pytest.approx(2 / 3)
