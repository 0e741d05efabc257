"""A stream stopped in the middle of speech (listen's Ctrl-C, the app's Stop) commits only the
words its audio holds (issue 47, item 6).

Before, the close committed everything its last window's hypothesis held, and Whisper decodes
a window cut inside speech with a guess at what follows: "It was not so much" as "... not so
much to me.", a cut inside "the" as "the fact that". The alignment gives such words no audio of
their own (or only the sliver before the cut), which :func:`heard_before_cut` reads.

Hand-made hypotheses for the policy; the engine with a scripted listener that guesses the word
cut by the stop; and (slow) the real tiny.en on the CPU over a recording stopped mid-sentence.
"""

from __future__ import annotations

import pytest
from attentive import AttentiveScriptedRecognizer
from scripted import feed, finals, finish_all, keys, phrase, render_speech

from captioner.audio.file_source import read_audio_16k
from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.policy.alignatt import AlignAttPolicy
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.local_agreement import LocalAgreementPolicy
from captioner.engine.policy.words import Hypothesis, Word, heard_before_cut
from captioner.engine.simulate import SimClock, replay


def timed(*words, attend=True):
    """(text, start_s, end_s[, attend_s]) -> words with measured times (attention where a word
    ends unless given), or spread ones (``attend=False``)."""
    return [Word(" " + w[0], w[1], w[2], 0, attend_s=(w[3] if len(w) > 3 else w[2]) if attend else None)
            for w in words]


def committed(updates) -> list[str]:
    return [k for u in updates if u.kind == "final" for k in keys(u.text)]


# tiny.en's closing hypotheses of real recordings cut mid-sentence (times as measured; the cut
# is the window's end).
HEARD = [("it", 2.66, 2.90), ("was", 2.90, 3.08), ("not", 3.08, 3.32), ("so", 3.32, 3.50), ("much", 3.50, 3.74)]
CASES = {
    # guesses at what follows, placed at the cut with no audio of their own
    "two words guessed": (HEARD + [("to", 3.76, 3.76, 29.9), ("me.", 3.76, 3.76, 29.9)], 3.78, 5),
    # a guess placed before the cut, the audio after it given to the word before
    "a guess before the cut": (HEARD + [("the", 3.74, 3.74, 3.80)], 3.90, 5),
    # a word begun at the cut, heard as another ("loss" cut after 80 ms heard as "last")
    "a word's first sound": (HEARD + [("the", 3.74, 3.98), ("last", 3.98, 4.06, 4.10)], 4.08, 6),
    # a whole last word that ends at the cut is kept ("country." at the end of JFK's recording)
    "a last word heard whole": (HEARD + [("the", 3.74, 3.98), ("loss", 3.98, 4.30)], 4.31, 7),
    # a short last word that ends well before the cut is kept
    "a short word before the cut": (HEARD + [("a", 3.76, 3.80)], 4.00, 6),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_words_the_audio_holds(case):
    words, end_s, held = CASES[case]
    assert heard_before_cut(timed(*words), end_s) == held


def test_words_without_measured_times_are_not_judged():
    words, end_s, _ = CASES["two words guessed"]
    assert heard_before_cut(timed(*words, attend=False), end_s) == len(words)


@pytest.mark.parametrize("kind", ["alignatt", "localagreement"])
def test_a_close_cut_in_speech_leaves_out_the_guesses_shown_ones_too(kind):
    policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=0.0)) if kind == "alignatt" \
        else LocalAgreementPolicy("s")
    # An update shows "... so much to" (a guess at its window's end), then the stream stops and
    # the closing window hears "so much" and guesses "to me.".
    shown = timed(*HEARD, ("to", 3.70, 3.70, 29.9))
    out = policy.update(Hypothesis(tuple(shown), 2.6, 3.70, (float("inf"),)), 3.70, 3.70)
    assert policy.partial_text.endswith("much to")
    words, end_s, _ = CASES["two words guessed"]
    out += policy.update(Hypothesis(tuple(timed(*words)), 2.6, end_s, (float("inf"),)), end_s, end_s,
                         close_segment=True, cut_in_speech=True)
    assert committed(out) == ["it", "was", "not", "so", "much"]
    assert policy.partial_text == ""


def test_a_close_after_speech_that_ended_commits_the_hypothesis_whole():
    """A close at a pause or at the end of a file whose speech had ended: as before."""
    policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=0.0))
    words, end_s, _ = CASES["two words guessed"]
    out = policy.update(Hypothesis(tuple(timed(*words)), 2.6, end_s, (float("inf"),)), end_s, end_s,
                        close_segment=True)
    assert committed(out) == ["it", "was", "not", "so", "much", "to", "me"]


# -- the engine: which closes are cut in speech --------------------------------------------------
SCRIPT = phrase("we ate the hot fat boiled mutton", 0.5)  # "mutton" from 2.9 s to 3.2 s


@pytest.mark.parametrize("kind", ["alignatt", "localagreement"])
@pytest.mark.parametrize("stop_s,expected", [
    (2.95, "we ate the hot fat boiled"),  # stopped 50 ms into "mutton", which the listener guesses
    (4.0, "we ate the hot fat boiled mutton"),  # stopped in the quiet after the sentence
])
def test_a_stream_stopped_inside_a_word_commits_the_words_before_it(kind, stop_s, expected):
    recognizer = AttentiveScriptedRecognizer({"Me": SCRIPT}, guess_s=0.3)
    clock = SimClock()
    live = LiveCaptioner(recognizer=recognizer, config=EngineConfig(policy=PolicyConfig(kind=kind)),
                         clock_ns=clock, timer_ns=clock)
    live.open_stream("Me")
    updates = feed(live, clock, {"Me": render_speech(SCRIPT, stop_s)})
    updates += finish_all(live, clock)
    assert committed(finals(updates)) == expected.split()
    # LocalAgreement reads no attention, but its window cut in speech is timed by it.
    assert recognizer.alignment_asked[-1] == (kind == "alignatt" or stop_s < 3.2)


# -- the real model ------------------------------------------------------------------------------
JFK = "en_jfk_inaugural_excerpt"


def _same_word(a: str, b: str) -> bool:
    """As a reader would count it said: tiny.en hears JFK's "ask" as "asked"."""
    return a == b or (min(len(a), len(b)) >= 3 and (a.startswith(b) or b.startswith(a)))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["alignatt", "localagreement"])
def test_a_recording_stopped_mid_sentence_commits_no_word_past_the_stop(tiny_en_cpu, speech_clips, kind):
    """JFK's "... ask not what your country" stopped at the start of "your" (5.72 s): tiny.en
    decoded the last window as "... what you are", and both words were committed. Now the last
    committed words are words said by then, the one cut by the stop included or left out."""
    clip = speech_clips[JFK]
    said = keys(clip.reference)[:9]
    assert said[-4:] == ["ask", "not", "what", "your"]  # "your" begun at the stop
    backend, recognizer = tiny_en_cpu
    config = EngineConfig(policy=PolicyConfig(kind=kind))
    audio = read_audio_16k(clip.wav)[:int(5.72 * 16_000)]
    result = replay(lambda clock, timer: LiveCaptioner(recognizer=recognizer, backend=backend, config=config,
                                                       clock_ns=clock, timer_ns=timer), {"s": audio}, compute=0.3)
    words = committed(result.updates)
    assert len(words) >= 6 and all(any(_same_word(w, s) for s in said[-4:]) for w in words[-3:]), words
