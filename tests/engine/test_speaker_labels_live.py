"""Speaker labels through the live engine: real voices taking turns, a scripted listener for the
words (no Whisper), the real voice encoder on the engine's features."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from scripted import ScriptedRecognizer, ScriptWord, feed, finish_all

from captioner.audio.file_source import read_audio_16k
from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.simulate import SimClock
from captioner.errors import UserError

RATE = 16000
# Two readers, in three turns: LJ Speech's, LibriSpeech 1089's, LJ Speech's again.
TURNS = (("en_ljspeech_LJ001-0001", 0.0), ("en_ls_1089-134686-0000", 9.0), ("en_ljspeech_LJ001-0003", 18.0))
TURN_S = 8.0
# Words of letters alone, all different (the policy compares words as a reader would).
NAMES = ["".join(p) for p in itertools.product("bdfgklmnprst", "aeiou", "bdgkmnpt")]


@pytest.fixture(scope="module")
def conversation(speech_clips):
    try:
        from captioner.models.speaker.weights import checkpoint_path

        checkpoint_path()
    except UserError as exc:
        pytest.skip(str(exc))
    audio = np.zeros(int((TURNS[-1][1] + TURN_S + 1.0) * RATE), np.float32)
    words = []
    for clip_id, start_s in TURNS:
        voice = read_audio_16k(speech_clips[clip_id].wav)[: int(TURN_S * RATE)]
        audio[int(start_s * RATE):int(start_s * RATE) + voice.shape[0]] = voice
        for t in np.arange(0.2, TURN_S - 0.3, 0.5):  # a word every half second of the turn
            words.append(ScriptWord(NAMES[len(words)], round(start_s + t, 3), round(start_s + t + 0.3, 3)))
    return audio, words


def _turn(time_s: float) -> int:
    return max(i for i, (_, start_s) in enumerate(TURNS) if time_s >= start_s - 0.5)


def test_labels_follow_the_turns_and_a_microphone_stays_unlabelled(conversation):
    audio, words = conversation
    recognizer = ScriptedRecognizer({"meeting": words, "mic": words}, check_audio=False)
    clock = SimClock()
    # LocalAgreement: the scripted listener has no attention for AlignAtt to read.
    config = EngineConfig(policy=PolicyConfig(kind="localagreement"))
    live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock, speakers="auto", config=config)
    assert live.open_stream("meeting", source="meeting").speakers
    assert not live.open_stream("mic", source="microphone").speakers
    updates = feed(live, clock, {"meeting": audio, "mic": audio}, chunk_s=0.1) + finish_all(live, clock)
    meeting = [u for u in updates if u.stream == "meeting" and u.kind == "final"]
    assert meeting and all(u.speaker for u in meeting)
    assert all(u.speaker == "" for u in updates if u.stream == "mic")
    by_turn = [Counter(u.speaker for u in meeting if _turn((u.start_s + u.end_s) / 2) == i) for i in range(3)]
    majority = [c.most_common(1)[0][0] for c in by_turn]
    assert majority[0] == majority[2] == "Speaker 1" and majority[1] == "Speaker 2", by_turn
    # Nearly every line of a turn is its speaker's (a line at a turn's edge may hear the other).
    agree = sum(c[m] for c, m in zip(by_turn, majority)) / sum(sum(c.values()) for c in by_turn)
    assert agree >= 0.85, by_turn
    live.close()


def test_off_labels_nothing_and_a_bad_mode_or_source_is_one_line():
    with pytest.raises(ValueError, match="speakers must be one of auto, on, off"):
        LiveCaptioner(recognizer=ScriptedRecognizer({}), speakers="yes")
    live = LiveCaptioner(recognizer=ScriptedRecognizer({}), speakers="off")
    assert not live.open_stream("a", source="meeting").speakers
    assert live.engine.features.speaker_bands is False  # the kernel leaves the bands out
    with pytest.raises(ValueError, match="source is one of"):
        live.open_stream("b", source="radio")
    assert "b" not in live.streams
    live.close()


def test_an_encoder_that_cannot_load_leaves_auto_unlabelled_and_fails_on(monkeypatch):
    """Under ``auto`` labels are extra: a missing or broken voice encoder captions the meeting
    without them (and says why once); asked for with ``on``, it is the stream's error."""
    import captioner.models.speaker.encoder as encoder

    def missing(*args, **kwargs):
        raise UserError("speaker labels need the voice encoder of the resemblyzer package")

    monkeypatch.setattr(encoder, "SpeakerEncoder", missing)
    live = LiveCaptioner(recognizer=ScriptedRecognizer({}), speakers="auto")
    assert not live.open_stream("meeting", source="meeting").speakers
    assert not live.open_stream("file", source="file").speakers
    assert live.engine.speakers_unavailable == ("speaker labels are off: speaker labels need the voice encoder "
                                                "of the resemblyzer package")
    live.close()
    live = LiveCaptioner(recognizer=ScriptedRecognizer({}), speakers="on")
    with pytest.raises(UserError, match="resemblyzer"):
        live.open_stream("meeting", source="meeting")
    live.close()
