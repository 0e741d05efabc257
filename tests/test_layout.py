"""Captions laid out as captions (captioner.layout): at most 42 characters a line, 2 lines a cue,
0.83-7 s a cue, broken at a sentence's end, a pause or punctuation before inside a phrase; the
same cues live as offline. Hand-made captions; the real recordings' files are checked in
test_transcript_lines_cli.py and by benchmarks/bench_latency.py."""

from __future__ import annotations

import random

import pytest

from captioner import layout
from captioner.events import CaptionUpdate
from captioner.formats import Caption

MONOLOGUE = ("So the first thing I want to say is that we looked at the remote control, and the buttons are "
             "far too small for most people. Uh, my idea is that we could have a menu on an LCD display, "
             "like on a mobile phone. That would make it easier to browse. What do you think? I think it "
             "depends on the price of the screen, because that is the part that costs the most, and we "
             "have a budget of twelve euros fifty per unit.")


def timed_words(text: str, start_s: float = 0.0, word_s: float = 0.28, gap_s: float = 0.07,
                pauses: dict[int, float] | None = None) -> list[tuple[str, float, float]]:
    """Words spoken at a steady pace, with extra silence after the words at ``pauses`` (index:
    seconds); a sentence's end is followed by a short breath."""
    out, t = [], start_s
    for i, word in enumerate(text.split()):
        out.append((word, round(t, 3), round(t + word_s, 3)))
        t += word_s + gap_s + (pauses or {}).get(i, 0.0) + (0.25 if layout.ends_sentence(word) else 0.0)
    return out


def commits(words, sizes, stream: str = "Me") -> list[CaptionUpdate]:
    """The words committed in pieces of ``sizes`` words (cycled), as live finals."""
    out, at, k = [], 0, 0
    while at < len(words):
        piece = words[at:at + sizes[k % len(sizes)]]
        out.append(CaptionUpdate(stream, "final", " ".join(w for w, _, _ in piece), piece[0][1], piece[-1][2],
                                 piece[-1][2], piece[-1][2], words=tuple(piece)))
        at += len(piece)
        k += 1
    return out


def test_a_monologue_is_laid_out_by_every_rule():
    words = timed_words(MONOLOGUE, pauses={30: 0.6})
    cues = layout.cues(commits(words, [3]))
    assert layout.check(cues) == []
    assert all(len(line) <= layout.MAX_LINE_CHARS for cue in cues for line in cue.lines)
    assert all(1 <= len(cue.lines) <= layout.MAX_LINES for cue in cues)
    assert all(layout.MIN_CUE_S - 1e-3 <= cue.end_s - cue.start_s <= layout.MAX_CUE_S + 1e-3 for cue in cues)
    # Every word, once, in order.
    assert " ".join(" ".join(cue.lines) for cue in cues).split() == MONOLOGUE.split()
    # Cues end at sentence ends and punctuation far more often than inside a phrase.
    ends = [cue.lines[-1].split()[-1] for cue in cues[:-1]]
    natural = [e for e in ends if e[-1] in ".?!,"]
    assert len(natural) >= len(ends) * 2 // 3, ends


def test_the_same_words_give_the_same_cues_however_they_were_committed():
    words = timed_words(MONOLOGUE)
    reference = layout.cues(commits(words, [len(words)]))
    for sizes in ([1], [2, 5], [7, 1, 3], [4]):
        assert layout.cues(commits(words, sizes)) == reference, sizes


def test_live_layout_hands_each_cue_out_once_no_later_word_can_change_it():
    words = timed_words(MONOLOGUE)
    live = layout.LiveLayout()
    got = []
    for update in commits(words, [2]):
        new = live.add([update])
        for cue in new:
            # No cue holds a word committed after the update that handed it out.
            assert cue.words[-1][2] <= update.end_s
        got += new
    assert live.open_words("Me")  # the last cue is still open before the end
    got += live.flush()
    assert got == layout.cues(commits(words, [len(words)]))


def test_a_long_silence_and_a_pause_after_a_sentence_end_end_the_cue():
    words = timed_words("We are done. Then we start again after the break", pauses={2: 0.6, 6: 1.6})
    cues = layout.cues(commits(words, [1]))
    assert [" ".join(c.lines) for c in cues] == ["We are done.", "Then we start again", "after the break"]


def test_a_silence_closes_the_open_cue_as_the_next_words_would():
    words = timed_words("We are done. Then we start again after the break", pauses={2: 0.6, 6: 1.6})
    live = layout.LiveLayout()
    got = live.add(commits(words[:2], [2]))
    # No word before 0.5 s after "are": no sentence end, no long silence: it stays open.
    assert got == [] and live.close_idle("Me", words[1][2] + 0.5) == []
    got += live.add(commits(words[2:3], [1]))
    assert live.close_idle("Me", words[2][2] + 0.3) == []  # a pause too short after the sentence
    got += live.close_idle("Me", words[2][2] + 0.6)
    assert [" ".join(c.lines) for c in got] == ["We are done."] and live.open_words("Me") == []
    got += live.add(commits(words[3:7], [4]))
    assert live.close_idle("Me", words[6][2] + 1.0) == []  # no sentence end: a long silence it needs
    got += live.close_idle("Me", words[6][2] + 1.6)
    got += live.add(commits(words[7:], [3])) + live.flush()
    assert got == layout.cues(commits(words, [1]))


def test_a_short_cue_is_shown_long_enough_and_the_next_one_waits():
    # "Yes." (0.28 s) and "No." right after a pause: the first is shown 5/6 s, into the silence.
    words = [("Yes.", 0.0, 0.28), ("No.", 0.8, 1.0), ("Right.", 1.55, 1.9)]
    cues = layout.cues(commits(words, [1]))
    assert [c.lines for c in cues] == [("Yes.",), ("No.",), ("Right.",)]
    assert cues[0].end_s == pytest.approx(layout.MIN_CUE_S, abs=1e-3)
    assert cues[1].start_s == pytest.approx(cues[0].end_s, abs=1e-3)  # starts a little late, never overlaps
    assert layout.check(cues) == []


def test_a_cue_of_a_fast_speaker_stays_until_it_can_be_read():
    words = timed_words("I think it depends on the price of the screen honestly", word_s=0.15, gap_s=0.02)
    words.append(("Right.", 6.0, 6.3))
    cue = layout.cues(commits(words, [len(words) - 1, 1]))[0]
    chars = sum(len(line) for line in cue.lines)
    assert cue.end_s - cue.start_s >= chars / layout.READING_CHARS_PER_S - 1e-3
    assert cue.end_s <= 6.0  # not into the next words


def test_lines_break_at_punctuation_and_before_conjunctions_and_stay_about_equal():
    words = timed_words("My idea is that we could have a menu, like on a mobile phone")
    (cue,) = layout.cues(commits(words, [len(words)]))
    assert cue.lines == ("My idea is that we could have a menu,", "like on a mobile phone")
    words = timed_words("the buttons are far too small and people cannot read them")
    (cue,) = layout.cues(commits(words, [len(words)]))
    assert cue.lines == ("the buttons are far too small", "and people cannot read them")


def test_a_compound_split_between_two_commits_stays_one_word():
    updates = [CaptionUpdate("Me", "final", "a self-", 0.0, 0.6, 0.6, 0.6, words=(("a", 0.0, 0.1), ("self-", 0.2, 0.6))),
               CaptionUpdate("Me", "final", "checkout lane", 0.6, 1.5, 1.5, 1.5,
                             words=(("checkout", 0.6, 1.0), ("lane", 1.1, 1.5)))]
    (cue,) = layout.cues(updates)
    assert cue.lines == ("a self-checkout lane",)


def test_streams_are_laid_out_apart_and_a_label_takes_room():
    words = timed_words(MONOLOGUE)
    updates = commits(words, [3], "Meeting") + commits(timed_words("Okay, thanks.", 2.0), [1], "Me")
    label = lambda stream: f"{stream}: "  # noqa: E731
    cues = layout.cues(updates, label=label)
    assert {c.stream for c in cues} == {"Me", "Meeting"}
    assert layout.check(cues, label=label) == []
    assert all(len(label(c.stream)) + len(c.lines[0]) <= layout.MAX_LINE_CHARS for c in cues)


def test_times_without_word_times_are_spread_over_the_caption():
    cues = layout.cues([Caption(0.0, 9.0, "one two three four five six seven eight nine ten eleven twelve "
                                          "thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty")])
    assert layout.check(cues) == [] and len(cues) >= 2 and all(not c.words for c in cues)


def test_check_names_every_broken_rule():
    bad = [layout.Cue(0.0, 0.3, ("x" * 10 + " " + "y" * 40,), "Me"),
           layout.Cue(0.2, 8.0, ("a", "b", "c"), "Me")]
    problems = layout.check(bad)
    assert any("characters" in p for p in problems)
    assert any("shown 0.300 s" in p for p in problems)
    assert any("3 lines" in p for p in problems)
    assert any("overlaps" in p for p in problems)
    assert any("shown 7.800 s" in p for p in problems)


def test_random_conversation_always_keeps_the_rules():
    rng = random.Random(4)
    vocabulary = MONOLOGUE.split() + ["uh,", "um", "yeah.", "okay?", "self-", "twelve-fifty"]
    for _ in range(30):
        text = " ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, 80)))
        pauses = {rng.randrange(0, 80): rng.choice([0.3, 0.6, 2.0]) for _ in range(5)}
        words = timed_words(text, word_s=rng.uniform(0.08, 0.5), pauses=pauses)
        cues = layout.cues(commits(words, [rng.randint(1, 6)]))
        assert layout.check(cues) == [], text
        assert " ".join(" ".join(c.lines) for c in cues).replace("- ", "-").split() == \
            text.replace("- ", "-").split()


def test_the_open_lines_of_a_live_view_show_the_partial_after_the_committed_words():
    live = layout.LiveLayout()
    live.add(commits(timed_words("So the first thing I want to say is that"), [4]))
    lines = live.open_lines("Me", "we looked at the remote")
    texts = [layout.join(line) for line in lines]
    assert texts and all(len(t) <= layout.MAX_LINE_CHARS for t in texts) and len(texts) <= 2
    assert " ".join(texts).endswith("we looked at the remote")
    words = [w for line in lines for w in line]
    assert [w.text for w in words if w.provisional] == "we looked at the remote".split()
    assert not any(w.provisional for w in words[:-5])


def test_a_lone_word_spread_over_a_long_segment_is_shown_seven_seconds_at_most():
    cues = layout.cues([Caption(32.43, 40.43, "okay"), Caption(41.0, 41.5, "Right.")])
    assert cues[0].end_s - cues[0].start_s <= layout.MAX_CUE_S and layout.check(cues) == []
