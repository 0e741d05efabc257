"""Speaker labels from scripted embeddings: a new speaker, the return of an old one, a short
line, a change of voice inside a line; no model."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.engine.speaker_clusters import OnlineClusters, speaker_label
from captioner.engine.speakers import Partial, SpeakerConfig, SpeakerTrack, wanted
from captioner.events import CaptionUpdate


def _voice(seed: int) -> np.ndarray:
    v = np.abs(np.random.default_rng(seed).standard_normal(256))
    return v / np.linalg.norm(v)


def _near(voice: np.ndarray, seed: int, spread: float = 0.25) -> np.ndarray:
    v = voice + spread * np.abs(np.random.default_rng(1000 + seed).standard_normal(256)) / 16
    return v / np.linalg.norm(v)


A, B, C = _voice(1), _voice(2), _voice(3)


def test_a_new_voice_is_a_new_speaker_and_an_old_one_comes_back():
    clusters = OnlineClusters(threshold=0.9, new_min_frames=100)
    assert clusters.assign(_near(A, 1), 300).index == 0
    assert clusters.assign(_near(A, 2), 300).index == 0
    made = clusters.assign(_near(B, 3), 300)
    assert made.index == 1 and made.new
    assert clusters.assign(_near(A, 4), 300).index == 0  # back to the first
    assert clusters.assign(_near(C, 5), 300).index == 2
    assert [speaker_label(i) for i in range(3)] == ["Speaker 1", "Speaker 2", "Speaker 3"]


def test_a_short_line_that_matches_no_one_is_the_speaker_before_it():
    clusters = OnlineClusters(threshold=0.9, new_min_frames=100)
    clusters.assign(_near(A, 1), 300)
    clusters.assign(_near(B, 2), 300)
    short = clusters.assign(_near(C, 3), 40)  # 0.4 s of an unknown voice: too little to tell
    assert short.index == 1 and not short.new and len(clusters) == 2
    assert clusters.assign(_near(C, 4), 150).new  # enough of it: a new speaker


def test_threshold_is_a_cosine_similarity():
    with pytest.raises(ValueError):
        OnlineClusters(threshold=1.5)


def _track(config: SpeakerConfig | None = None) -> SpeakerTrack:
    # Voice A for 0-6 s, B for 6-12 s, A again for 12-18 s: finished partials of 1.6 s every 0.8 s.
    track = SpeakerTrack("meeting", 0, config or SpeakerConfig(mode="on", threshold=0.85))
    for n, first in enumerate(range(0, 1800 - 159, 80)):
        last = first + 159
        voice = A if last < 600 or first >= 1200 else B if 600 <= first and last < 1200 else None
        if voice is None:  # across a change: a mix of both voices
            mixed = A + B
            track.partials.append(Partial(first, last, 160, mixed / np.linalg.norm(mixed)))
        else:
            track.partials.append(Partial(first, last, 160, _near(voice, n)))
    return track


def _final(text: str, start_s: float, end_s: float, timed: bool = False) -> CaptionUpdate:
    words = text.split()
    step = (end_s - start_s) / len(words)
    times = tuple((w, round(start_s + i * step, 3), round(start_s + (i + 0.8) * step, 3)) for i, w in enumerate(words)) \
        if timed else ()
    return CaptionUpdate("meeting", "final", text, start_s, end_s, end_s, end_s, words=times)


def test_each_committed_line_gets_its_speaker_once():
    track = _track()
    first = track.label(_final("hello there", 0.5, 5.0))
    second = track.label(_final("good morning to you", 6.8, 11.0))
    third = track.label(_final("and back to me", 12.6, 17.0))
    assert [u[0].speaker for u in (first, second, third)] == ["Speaker 1", "Speaker 2", "Speaker 1"]
    partial = CaptionUpdate("meeting", "partial", "so", 17.0, 17.2, 17.2, 17.2)
    assert track.label(partial)[0].speaker == "Speaker 1"  # provisional text: the last speaker


def test_a_change_of_voice_inside_a_line_splits_it():
    track = _track()
    track.label(_final("hello there", 0.5, 5.0))  # the first voice is known
    text = "one two three four five six seven eight nine ten eleven twelve"
    parts = track.label(_final(text, 2.0, 10.0, timed=True))  # A until 6 s, then B
    assert [p.speaker for p in parts] == ["Speaker 1", "Speaker 2"]
    assert " ".join(p.text for p in parts) == text
    assert parts[0].start_s == 2.0 and parts[1].end_s == 10.0
    assert parts[0].end_s <= parts[1].start_s
    assert 5.0 <= parts[1].start_s <= 7.0  # cut near the change, to a partial's resolution
    assert all(p.words and p.text.split() == [w for w, _, _ in p.words] for p in parts)
    untimed = track.label(_final(text, 2.0, 10.0))  # no word times: not split
    assert len(untimed) == 1


def test_a_line_is_split_between_words_never_inside_one():
    """A phone number read out across the change ("715-139-0787", its pieces timed apart) and a
    hyphenated word stay whole: the cut moves to the next space."""
    track = _track()
    track.label(_final("hello there", 0.5, 5.0))
    pieces = [("It's", 2.0, 2.6), ("715-", 3.0, 4.4), ("139-", 4.6, 6.4), ("0787.", 6.6, 7.4), ("Thanks", 7.8, 8.6),
              ("so", 8.8, 9.2), ("much", 9.3, 10.0)]
    text = "It's 715-139-0787. Thanks so much"
    parts = track.label(CaptionUpdate("meeting", "final", text, 2.0, 10.0, 10.0, 10.0, words=tuple(pieces)))
    assert [p.text for p in parts] == ["It's 715-139-0787.", "Thanks so much"]
    assert [p.speaker for p in parts] == ["Speaker 1", "Speaker 2"]


def test_auto_labels_meetings_files_and_server_streams_not_a_microphone():
    assert [wanted("auto", s) for s in ("meeting", "file", "remote", "microphone", None)] == [True, True, True, False, False]
    assert wanted("on", "microphone") and not wanted("off", "meeting")
    with pytest.raises(ValueError, match="speakers"):
        wanted("sometimes", None)
    with pytest.raises(ValueError, match="source"):
        wanted("auto", "telephone")
