"""Word-level times from AlignAtt with the real tiny.en model on the CPU and CUDA (slow, issue 14):
each committed caption carries its words' times, inside the caption and the audio and rising;
the transcript files carry them (SRT/WebVTT that parse); two replays on a simulated clock give
the same sentence-shaped lines; LocalAgreement, which has no measured word times, gives none."""

from __future__ import annotations

import io

import pytest
import srt
import webvtt

from captioner.app.file_lines import file_lines
from captioner.audio.file_source import read_audio_16k
from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner, load_recognizer
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.simulate import replay
from captioner.formats import captions_from_updates, render

pytestmark = pytest.mark.slow

CLIPS = ["en_jfk_inaugural_excerpt", "en_ami_ES2011a_hs0_40-46s"]


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda:0", marks=pytest.mark.gpu)])
def cpu_model(request):
    """tiny.en on the CPU (conftest's, loaded once a session), and on CUDA where one is usable
    (the H200: fp16 step graph)."""
    if request.param == "cpu":
        return request.getfixturevalue("tiny_en_cpu")
    return load_recognizer("tiny.en", request.param)


def _finals(cpu_model, audio, kind="alignatt"):
    backend, recognizer = cpu_model
    config = EngineConfig(policy=PolicyConfig(kind=kind))
    result = replay(lambda clock, timer: LiveCaptioner(recognizer=recognizer, backend=backend, config=config,
                                                       clock_ns=clock, timer_ns=timer),
                    {"s": audio}, compute=0.3)
    return [u for u in result.updates if u.kind == "final"]


@pytest.fixture(scope="module")
def replayed(cpu_model, alignatt_replay):
    """``replayed(clip, run=0)``: the AlignAtt finals of a replay of ``clip`` (``_finals``'s
    replay), made once a session per device (conftest's ``alignatt_replay``, which the AlignAtt
    tests read too): the word-time checks and the determinism check read the same replay, which
    the latter compares with a second one (``run=1``)."""

    def finals(clip: str, run: int = 0):
        return [u for u in alignatt_replay(cpu_model, clip, run) if u.kind == "final"]

    return finals


@pytest.mark.parametrize("clip", CLIPS)
def test_alignatt_word_times_are_inside_the_caption_and_rising(replayed, speech_clips, clip):
    audio = read_audio_16k(speech_clips[clip].wav)
    duration_s = len(audio) / 16_000
    finals = replayed(clip)
    assert finals
    starts = []
    for u in finals:
        assert u.words, u  # every AlignAtt caption of real speech has measured word times
        assert " ".join(w for w, _, _ in u.words).replace("- ", "-").split() == u.text.split()
        for _, start_s, end_s in u.words:
            assert u.start_s - 1e-6 <= start_s <= end_s <= u.end_s + 1e-6
            assert 0.0 <= start_s and end_s <= duration_s + 0.02
        starts.extend(start_s for _, start_s, _ in u.words)
    assert starts == sorted(starts)  # across captions too: the words come in the audio's order
    assert len(set(starts)) > len(starts) // 2  # and they are spread over it, not one time

    # The files carry them: SRT and WebVTT parse, the VTT cues hold a timestamp per later word.
    captions = file_lines(captions_from_updates(finals), "vtt")
    cues = list(webvtt.from_buffer(io.StringIO(render(captions, "vtt"))))
    assert len(cues) == len(captions) and any("<00:" in c.raw_text for c in cues)
    subs = list(srt.parse(render(file_lines(captions_from_updates(finals), "srt"), "srt"), ignore_errors=False))
    assert subs[0].start.total_seconds() == pytest.approx(finals[0].words[0][1], abs=0.001)
    assert " ".join(s.content for s in subs).split() == " ".join(u.text for u in finals).split()


def test_two_simulated_replays_give_the_same_lines(replayed):
    runs = []
    for finals in (replayed(CLIPS[0]), replayed(CLIPS[0], run=1)):  # the shared replay, and a second one
        lines = file_lines(captions_from_updates(finals), "srt")
        runs.append(render(lines, "srt"))
    assert runs[0] == runs[1]
    # Lines end at a sentence end or a pause, never in the middle of JFK's first sentence.
    first = runs[0].split("\n\n")[0].splitlines()[2]
    assert first.lower().startswith("and so my fellow americans"), runs[0]


def test_localagreement_invents_no_word_times(cpu_model, speech_clips):
    # Half JFK's length, and committed as three lines: a policy without measured word times
    # shows that on any caption it commits.
    finals = _finals(cpu_model, read_audio_16k(speech_clips["en_ls_1089-134691-0001"].wav), kind="localagreement")
    assert len(finals) >= 2 and all(u.words == () for u in finals), finals
