"""The engine's voice embeddings against resemblyzer's on real recordings.

Ours: the features kernel's NumPy twin (the speaker bands beside Whisper's log-mel), the
encoder's ONNX graph in ONNX Runtime with its state carried from push to push, partials as the
live engine makes them (:mod:`captioner.engine.speakers`), the level raised as the stream goes.
Theirs: resemblyzer's front end and utterance embedding written out independently in float64
(``resemblyzer_reference``) through the NumPy network. Every frame is heard as speech on both
sides (resemblyzer's silence trimming needs webrtcvad; these recordings hardly pause)."""

from __future__ import annotations

import pytest
from resemblyzer_reference import embed_utterance

from captioner.audio.file_source import read_audio_16k
from captioner.errors import UserError

# Four speakers: LibriSpeech 1089 (two recordings), 1995 and 61, and LJ Speech's reader.
CLIPS = ("en_ls_1089-134686-0000", "en_ls_1089-134691-0001", "en_ls_1995-1837-0001", "en_ls_61-70968-0000",
         "en_ljspeech_LJ001-0001")


@pytest.fixture(scope="module")
def embeddings(speech_clips):
    from captioner.engine.offline_speakers import hear_recording
    from captioner.models.speaker.encoder import SpeakerEncoder
    from captioner.models.speaker.weights import load_weights

    try:
        weights = load_weights()
    except UserError as exc:
        pytest.skip(str(exc))
    encoder = SpeakerEncoder("cpu", weights, intra_threads=1)
    ours, theirs = {}, {}
    for clip_id in CLIPS:
        audio = read_audio_16k(speech_clips[clip_id].wav)
        track = hear_recording([audio[i:i + 4000] for i in range(0, audio.shape[0], 4000)], encoder=encoder, vad=False)
        ours[clip_id] = track.embedding_of(0.0, audio.shape[0] / 16000)[0]
        theirs[clip_id] = embed_utterance(weights, audio)
    return ours, theirs


def test_engine_embeddings_are_resemblyzers_within_cosine_0_99(embeddings):
    ours, theirs = embeddings
    cosines = {clip_id: float(ours[clip_id] @ theirs[clip_id]) for clip_id in CLIPS}
    assert min(cosines.values()) >= 0.99, cosines


def test_same_speaker_is_closer_than_any_other(embeddings):
    ours, _ = embeddings
    same = float(ours["en_ls_1089-134686-0000"] @ ours["en_ls_1089-134691-0001"])
    others = {clip_id: float(ours["en_ls_1089-134686-0000"] @ ours[clip_id]) for clip_id in CLIPS[2:]}
    assert same > max(others.values()), (same, others)
