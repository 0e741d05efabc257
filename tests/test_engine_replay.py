"""The live engine on real recordings, replayed on a simulated clock (tiny.en on the CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from captioner.engine.core import Engine, EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.policy.words import normalize_word
from captioner.engine.scheduler import SchedulerConfig
from captioner.engine.simulate import replay

pytestmark = pytest.mark.slow
SR = 16_000


@pytest.fixture(scope="module")
def whisper(tiny_en_cpu):
    return tiny_en_cpu  # conftest: loaded once a session


def wer(reference: str, hypothesis: str) -> float:
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    return jiwer.wer(norm(reference), norm(hypothesis))


def padded_wav(tmp_path, clip, before_s=1.0, after_s=1.5, name=None):
    audio, rate = sf.read(clip.wav, dtype="float32")
    assert rate == SR
    rng = np.random.default_rng(0)
    room = lambda s: (rng.standard_normal(int(s * SR)) * 10 ** (-70 / 20)).astype(np.float32)
    path = tmp_path / f"{name or clip.id}.wav"
    sf.write(path, np.concatenate([room(before_s), audio, room(after_s)]), SR)
    return path


def run_replay(whisper, files: dict[str, object], compute="free", interval_s=1.0):
    backend, recognizer = whisper
    config = EngineConfig(scheduler=SchedulerConfig(base_interval_s=interval_s))
    return replay(
        lambda clock, timer: LiveCaptioner(recognizer=recognizer, backend=backend, config=config,
                                           clock_ns=clock, timer_ns=timer),
        files,
        compute=compute,
    )


def committed(updates, stream=None) -> str:
    return " ".join(u.text for u in updates if u.kind == "final" and (stream is None or u.stream == stream))


def check_partials_continue_committed(updates):
    """What is shown (committed + partial) always starts with everything committed, and a
    partial never repeats committed words."""
    shown_committed: dict[str, list[str]] = {}
    for u in updates:
        words = [normalize_word(w) for w in u.text.split()]
        done = shown_committed.setdefault(u.stream, [])
        if u.kind == "final":
            assert words, "empty committed update"
            done += words
        elif words and len(done) >= 3:
            # The partial may not begin by restating the last committed words.
            assert words[: 3] != done[-3:], (done[-3:], words)
    return shown_committed


def test_replay_is_deterministic_and_partials_never_contradict(whisper, speech_clips, tmp_path):
    clip = speech_clips["en_ls_1089-134691-0001"]
    path = padded_wav(tmp_path, clip)
    first = run_replay(whisper, {"Me": path})
    second = run_replay(whisper, {"Me": path})
    assert first.updates == second.updates
    assert first.steps > 2
    check_partials_continue_committed(first.updates)
    assert [u.kind for u in first.updates].count("partial") >= 1
    assert wer(clip.reference, committed(first.updates)) <= 0.15
    # Captions say which audio they cover and when they were made.
    finals = [u for u in first.updates if u.kind == "final"]
    assert all(0.5 <= u.start_s <= u.end_s <= 1.0 + clip.duration_s + 1.5 for u in finals)
    assert all(u.emitted_audio_s >= u.end_s - 0.05 for u in finals)


def test_silence_produces_no_caption(whisper, tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "room.wav"
    sf.write(path, (rng.standard_normal(6 * SR) * 10 ** (-60 / 20)).astype(np.float32), SR)
    result = run_replay(whisper, {"Me": path})
    assert result.updates == []
    assert result.steps == 0  # the VAD kept the model from even looking


def test_committed_streaming_text_matches_reference(whisper, speech_clips, tmp_path):
    clip = speech_clips["en_ls_1089-134686-0000"]
    path = padded_wav(tmp_path, clip)
    result = run_replay(whisper, {"Me": path}, interval_s=0.5)
    # The offline decode of the same recording by the same model, in one window.
    from captioner.engine.recognizer import WindowRequest
    from captioner.gpu.features_ref import log_mel_spectrogram

    audio, _ = sf.read(clip.wav, dtype="float32")
    offline = whisper[1].decode([WindowRequest("x", log_mel_spectrogram(audio), 0.0, "", None)])[0].text
    streaming_wer = wer(clip.reference, committed(result.updates))
    assert streaming_wer <= wer(clip.reference, offline) + 0.1, (committed(result.updates), offline)


def test_two_streams_are_batched_and_labelled(whisper, speech_clips, tmp_path):
    me = speech_clips["en_ls_1089-134691-0000"]
    meeting = speech_clips["en_ls_1089-134691-0001"]
    result = run_replay(whisper, {"Me": padded_wav(tmp_path, me), "Meeting": padded_wav(tmp_path, meeting)})
    assert wer(me.reference, committed(result.updates, "Me")) <= 0.2
    assert wer(meeting.reference, committed(result.updates, "Meeting")) <= 0.2
    assert max(s.batch_size for s in result.statuses) == 2
    assert {u.stream for u in result.updates} == {"Me", "Meeting"}


def test_dropped_blocks_become_counted_silence(whisper):
    from captioner.events import AudioBlock

    backend, recognizer = whisper
    engine = Engine(backend, recognizer, EngineConfig())
    engine.add_stream("Me")
    quiet = np.zeros(1600, np.float32)
    engine.push([AudioBlock("Me", 0, 1, quiet)])
    engine.push([AudioBlock("Me", 4800, 2, quiet)])  # 3200 samples (20 frames) never arrived
    engine.push([AudioBlock("Other", 0, 3, quiet)])  # not a stream of this engine: ignored
    (view,) = engine.views()
    # The stream clock stays sample-exact across the gap (features lag one 10 ms frame).
    assert view.audio_end_s == pytest.approx((6400 / 160 - 1) / 100)
    status = engine.status()
    assert status.dropped_frames == 20 and status.streams == ("Me",)
    assert engine.tick() == [] and engine.steps == 0
