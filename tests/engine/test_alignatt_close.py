"""A segment's closing window that keeps the last committed words (``close_overlap_s``, issue 14).

The closing window starts before the last committed words, so its hypothesis holds them again,
heard as they were, reworded, or alone (tiny.en at times stops at them). Whatever it holds, the
close must commit every word shown as partial that the hypothesis does not cover, and none of
the committed words again. Hand-made hypotheses with scripted attention; no model.
"""

from __future__ import annotations

import pytest

from captioner.engine.policy.alignatt import AlignAttPolicy
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.words import Hypothesis, Word, normalize_word


def hyp(words, start_s, end_s):
    """(text, start_s, end_s[, attend_s]) words, one open segment; attention where a word ends
    unless given."""
    return Hypothesis(tuple(Word(" " + w[0], w[1], w[2], 0, attend_s=w[3] if len(w) > 3 else w[2]) for w in words),
                      start_s, end_s, (float("inf"),))


def final_words(updates) -> list[str]:
    return [normalize_word(t) for u in updates if u.kind == "final" for t in u.text.split()]


def overlap_policy() -> AlignAttPolicy:
    return AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=0.0, attend_margin_s=0.1,
                                            close_overlap_s=3.0))


# Committed up to "cabbage" (4.6 s); "pieces" attended past the audio (5.6 s), so it and the
# words after it are shown as partial.
SPOKEN = [("we", 0.2, 0.5), ("ate", 0.6, 0.9), ("the", 1.0, 1.2), ("hot", 1.3, 1.6), ("fat", 1.7, 2.0),
          ("boiled", 2.1, 2.6), ("mutton", 2.7, 3.1), ("with", 3.2, 3.5), ("its", 3.6, 3.8), ("cabbage", 3.9, 4.6),
          ("pieces", 4.7, 5.1, 5.6), ("to", 5.2, 5.3), ("be", 5.4, 5.5)]
COMMITTED = ["we", "ate", "the", "hot", "fat", "boiled", "mutton", "with", "its", "cabbage"]
SHOWN = ["pieces", "to", "be"]


def open_segment(policy, words, end_s):
    """First update, then the close's start: the window keeps the committed words of the last 3 s."""
    out = policy.update(hyp(words, 0.0, end_s), end_s, end_s)
    policy.start_after_committed()
    return out


CLOSING = {
    # (a) the kept committed words alone, the last one drawn out to the window's end (DTW puts a
    # last word's end where the attention stopped)
    "kept words alone": [("fat", 1.7, 2.0), ("boiled", 2.1, 2.6), ("mutton", 2.7, 3.1), ("with", 3.2, 3.5),
                         ("its", 3.6, 3.8), ("cabbage", 3.9, 5.9)],
    # (a) part of them, then end-of-text
    "some kept words": [("fat", 1.7, 2.0), ("boiled", 2.1, 2.6), ("mutton", 2.7, 3.2)],
    # (b) reworded, the last one drawn out over the shown words
    "kept words reworded": [("fat", 1.8, 2.1), ("bold", 2.2, 2.7), ("mutton", 2.8, 3.2), ("within", 3.3, 4.0),
                            ("cabbages", 4.1, 5.8)],
    # (b) reworded, then the first shown word, the rest not heard
    "reworded, then a shown word": [("fat", 1.8, 2.1), ("bolt", 2.2, 2.7), ("button", 2.8, 3.2), ("with", 3.3, 3.6),
                                    ("it's", 3.7, 4.0), ("cabbage", 4.1, 4.7), ("pieces", 4.8, 5.2)],
    # the kept words, then the first shown word drawn out over the others' audio: the text stops
    # short of what was shown, whatever the times say
    "a shown word drawn out": [w[:3] for w in SPOKEN[4:10]] + [("pieces", 4.7, 5.9)],
}


@pytest.mark.parametrize("case", sorted(CLOSING))
def test_a_close_commits_the_shown_words_the_hypothesis_stops_short_of(case):
    policy = overlap_policy()
    first = open_segment(policy, SPOKEN, 5.6)
    assert final_words(first) == COMMITTED and policy.partial_text == "pieces to be"
    assert policy.buffer_start_s == pytest.approx(1.6)  # the committed words from "fat" on are kept
    out = policy.update(hyp(CLOSING[case], policy.buffer_start_s, 6.0), 6.0, 6.0, close_segment=True)
    assert final_words(out) == SHOWN, case
    assert out[-1].kind == "final"


def test_a_close_commits_the_words_after_the_shown_ones_once():
    policy = overlap_policy()
    open_segment(policy, SPOKEN, 5.6)
    heard = [w[:3] for w in SPOKEN[4:]] + [("ladled", 5.6, 6.0), ("out.", 6.1, 6.4)]
    out = policy.update(hyp(heard, policy.buffer_start_s, 7.0), 7.0, 7.0, close_segment=True)
    assert final_words(out) == SHOWN + ["ladled", "out"]


SAUCE = [("and", 0.2, 0.4), ("thick", 0.5, 0.9), ("peppered", 1.0, 1.6), ("flower", 1.7, 2.1), ("fat", 2.2, 2.4),
         ("and", 2.5, 2.6), ("sauce.", 2.7, 3.2)]


@pytest.mark.parametrize("closing", [
    [w for w in SAUCE[1:]],
    [("thick", 0.6, 1.0), ("peppered", 1.1, 1.7), ("flour", 1.8, 2.3), ("fattened", 2.4, 2.9), ("sauce.", 3.0, 3.6)],
    [("thick", 0.6, 1.0), ("pepper", 1.1, 1.7), ("flour", 1.8, 2.3), ("fattened", 2.4, 2.9), ("sauce.", 3.0, 3.6)],
    [("pepper", 1.1, 1.7), ("flour", 1.8, 2.3), ("fattened", 2.4, 2.9), ("sauce.", 3.0, 3.6)],
    [("sauce.", 3.0, 3.6)],
], ids=["same", "reworded", "reworded more", "from the middle", "last word alone"])
def test_a_committed_last_word_heard_again_is_not_committed_twice(closing):
    """(c) Everything was committed, up to the sentence's end; the closing window hears the kept
    words again, more or less, its times a little later (DTW of another window)."""
    policy = overlap_policy()
    first = open_segment(policy, SAUCE, 3.8)
    assert final_words(first) == [normalize_word(w[0]) for w in SAUCE] and policy.partial_text == ""
    out = policy.update(hyp(closing, policy.buffer_start_s, 4.5), 4.5, 4.5, close_segment=True)
    assert final_words(out) == []


def test_a_new_word_after_the_kept_ones_is_committed_though_one_kept_word_was_not_heard():
    policy = overlap_policy()
    open_segment(policy, SAUCE, 3.8)
    # "and" before "sauce." not heard; "served" is new (after the committed end)
    closing = [("thick", 0.5, 0.9), ("peppered", 1.0, 1.6), ("flower", 1.7, 2.1), ("fat", 2.2, 2.5),
               ("sauce.", 2.7, 3.2), ("Served", 3.9, 4.3), ("hot.", 4.4, 4.7)]
    out = policy.update(hyp(closing, policy.buffer_start_s, 5.0), 5.0, 5.0, close_segment=True)
    assert final_words(out) == ["served", "hot"]


def test_a_pause_while_the_next_sentences_first_words_lack_context_keeps_them_shown():
    """A pause came 1.2 s after "stew." while the next sentence's first words, shown, lack their
    context (rule 2 of :mod:`captioner.engine.policy.alignatt`): no window is decoded for the silence
    (it could be heard as the kept words alone); the words stay shown, and a silence of
    ``hold_s`` commits them as they were shown."""
    spoken = [("he", 0.2, 0.5), ("hoped", 0.6, 1.0), ("there", 1.1, 1.3), ("would", 1.4, 1.6), ("be", 1.7, 1.8),
              ("stew.", 2.4, 3.0), ("Pieces", 3.1, 3.4, 4.0), ("to", 3.5, 3.6), ("be", 3.7, 3.8)]
    policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=1.5, attend_margin_s=0.1,
                                              close_overlap_s=3.0, hold_s=1.5))
    first = policy.update(hyp(spoken, 0.0, 4.0), 4.0, 4.0)
    assert final_words(first) == ["he", "hoped", "there", "would", "be", "stew"]
    assert policy.partial_text == "Pieces to be"
    assert policy.settle(0.7, 4.2, 4.5, 4.5) == [] and policy.partial_text == "Pieces to be"
    out = policy.settle(1.5, 5.0, 5.3, 5.3)
    assert final_words(out) == ["pieces", "to", "be"] and policy.partial_text == ""


@pytest.mark.parametrize("kind", ["alignatt", "localagreement"])
def test_a_window_decoded_as_its_first_sentence_alone_keeps_the_partial_and_the_buffer(kind):
    """A stream fed faster than real time: a 15 s window that begins with a committed sentence is
    decoded as that sentence alone, its closing timestamp at the window's end. That says nothing
    about the words after the committed text: the partial on screen stays (and is committed at
    the close), and the buffer is not trimmed past audio nobody committed."""
    from captioner.engine.policy.presets import make_policy

    policy = make_policy("s", PolicyConfig(kind=kind, first_context_s=0.0, attend_margin_s=0.1))
    sentence = [("Stuff", 0.2, 0.5), ("it", 0.6, 0.7), ("into", 0.8, 1.0), ("you.", 1.1, 1.5)]
    more = [("He", 2.0, 2.2), ("hoped", 2.3, 2.7), ("for", 2.8, 3.0), ("stew", 3.1, 3.5), ("and", 3.6, 3.8)]
    shown = [("thick", 13.0, 13.4, 14.1), ("sauce.", 13.5, 14.0)]
    heard = sentence + more + [(t, 4.0 + i * 0.9, 4.7 + i * 0.9) for i, t in enumerate(
        ["turnips", "and", "carrots", "and", "bruised", "potatoes", "and", "fat", "mutton", "pieces"])]
    policy.update(hyp(heard, 0.0, 12.9), 12.9, 12.9)  # LocalAgreement commits these on the next one
    policy.update(hyp(heard + shown, 0.0, 14.1), 14.1, 14.1)
    assert policy.partial_text == "thick sauce."
    committed_before = policy.committed_words_total
    short = Hypothesis(tuple(Word(" " + t, a, b, 0, attend_s=b) for t, a, b in sentence), 0.0, 15.0, (15.0,))
    out = policy.update(short, 15.0, 15.0)
    assert out == [] and policy.partial_text == "thick sauce." and policy.buffer_start_s < 13.0
    close = policy.update(Hypothesis((), policy.buffer_start_s, 15.5), 15.5, 15.5, close_segment=True)
    assert final_words(close) == ["thick", "sauce"]
    assert policy.committed_words_total == committed_before + 2
