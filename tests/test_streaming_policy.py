"""LocalAgreement-2 streaming policy, fed hypotheses the way a decoder produces them."""

from __future__ import annotations

from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.local_agreement import LocalAgreementPolicy
from captioner.engine.policy.words import (
    Hypothesis,
    Word,
    normalize_word,
    words_from_segments,
)


def hyp(segments, start_s=0.0, end_s=None, rejected=False):
    words, ends = words_from_segments(segments, start_s)
    if end_s is None:
        end_s = max(ends) if ends else start_s
    return Hypothesis(tuple(words), start_s, end_s, tuple(ends), rejected=rejected)


def run(policy, hyps, close_last=False):
    out = []
    for i, h in enumerate(hyps):
        last = close_last and i == len(hyps) - 1
        out += policy.update(h, emitted_audio_s=h.end_s, emitted_wall_s=h.end_s, close_segment=last)
    return out


def finals(updates):
    return " ".join(u.text for u in updates if u.kind == "final")


def test_words_from_segments_keep_text_and_spread_times():
    words, ends = words_from_segments([(0.0, 2.0, " Hello there."), (2.0, 3.0, " Bye")], window_start_s=10.0)
    assert [w.text for w in words] == [" Hello", " there.", " Bye"]
    assert words[0].start_s == 10.0 and abs(words[1].end_s - 12.0) < 1e-9
    assert words[0].end_s < words[1].start_s + 1e-9
    assert ends == [12.0, 13.0]
    assert [w.segment for w in words] == [0, 0, 1]


def test_normalize_word_ignores_case_and_punctuation():
    assert normalize_word(" Hello,") == normalize_word("hello") == "hello"
    assert normalize_word("Don\u2019t!") == "don't"


def test_agreed_prefix_is_committed_rest_is_partial():
    p = LocalAgreementPolicy("Me")
    u1 = p.update(hyp([(0, 1.0, " The quick")]), 1.0, 1.0)
    assert [u.kind for u in u1] == ["partial"] and u1[0].text == "The quick"
    u2 = p.update(hyp([(0, 2.0, " The quick brown fox")]), 2.0, 2.0)
    assert finals(u2) == "The quick"
    assert [u for u in u2 if u.kind == "partial"][-1].text == "brown fox"
    # The model changes its mind about the uncommitted tail: only the partial changes.
    u3 = p.update(hyp([(0, 3.0, " The quick brown socks jumped")]), 3.0, 3.0)
    assert finals(u3) == "brown"
    assert [u for u in u3 if u.kind == "partial"][-1].text == "socks jumped"


def test_committed_text_is_never_repeated_even_when_rephrased():
    p = LocalAgreementPolicy("Me")
    seq = [
        hyp([(0, 1.0, " I think that")]),
        hyp([(0, 2.0, " I think that we should")]),
        hyp([(0, 3.0, " I think, that we should go")]),  # punctuation changes inside committed
        hyp([(0, 4.0, " I think that we should go home now")]),
        hyp([(0, 5.0, " I thing that we should go home now.")]),  # a committed word re-heard differently
    ]
    out = run(p, seq, close_last=True)
    text = finals(out)
    assert text.split() == ["I", "think", "that", "we", "should", "go", "home", "now."]


def test_partial_never_contradicts_committed():
    p = LocalAgreementPolicy("Me")
    texts = [" one two", " one two three", " one two three four", " one too three four five", " one two three four five six"]
    committed: list[str] = []
    for i, t in enumerate(texts):
        for u in p.update(hyp([(0, i + 1.0, t)]), i + 1.0, i + 1.0):
            if u.kind == "final":
                committed += [normalize_word(w) for w in u.text.split()]
            else:
                shown = committed + [normalize_word(w) for w in u.text.split()]
                # What is shown starts with everything committed, in order, and never repeats it.
                assert shown[: len(committed)] == committed
                # Nothing is shown twice: committed + partial is never longer than the hypothesis.
                assert len(shown) <= len(t.split())


def test_guard_rejected_hypothesis_never_shown():
    p = LocalAgreementPolicy("Me")
    out = run(p, [
        hyp([(0, 1.0, " Thank you for watching")], rejected=True),
        hyp([(0, 2.0, " Thank you for watching")], rejected=True),
    ], close_last=True)
    assert [u for u in out if u.text] == []


def test_close_commits_everything_and_restarts_buffer():
    p = LocalAgreementPolicy("Me")
    run(p, [hyp([(0, 1.0, " good morning")])])
    out = p.update(hyp([(0, 1.5, " good morning everyone")]), 2.2, 2.2, close_segment=True, close_at_s=2.0)
    assert finals(out) == "good morning everyone"
    assert out[-1].kind == "final"  # a final takes the partial off the screen: no empty partial after it
    assert p.buffer_start_s == 2.0 and p.segment == 1
    assert p.prompt_text() == "good morning everyone"
    assert not p.has_pending_text


def test_trim_at_committed_segment_end_and_prompt_carries_text():
    p = LocalAgreementPolicy("Me", PolicyConfig(trim_after_s=4.0))
    s1 = (0.0, 3.0, " First sentence here.")
    run(p, [hyp([s1, (3.0, 4.0, " Second")]), hyp([s1, (3.0, 5.0, " Second one")])])
    # Both hypotheses agree on the whole first segment: it is committed and the buffer cut there.
    assert p.buffer_start_s == 3.0
    assert p.prompt_text() == "First sentence here."
    # The next window starts at 3.0 s and holds only the second segment.
    out = p.update(hyp([(0.0, 3.0, " Second one goes on")], start_s=3.0), 6.0, 6.0)
    assert finals(out) == "one"  # "Second" was committed already; never repeated
    assert [u for u in out if u.kind == "partial"][-1].text == "goes on"


def test_full_buffer_without_boundary_commits_and_restarts():
    p = LocalAgreementPolicy("Me", PolicyConfig(trim_after_s=5.0, max_buffer_s=10.0))
    long_text = " " + " ".join(f"w{i}" for i in range(30))
    run(p, [hyp([(0.0, 9.0, long_text[:40])])])
    out = p.update(Hypothesis(tuple(words_from_segments([(0.0, 10.0, long_text)])[0]), 0.0, 10.5, ()), 10.5, 10.5)
    assert finals(out).split()[-1] == "w29"
    assert p.buffer_start_s == 10.5
    assert not p.has_pending_text


def test_flush_commits_remaining_partial():
    p = LocalAgreementPolicy("Me")
    run(p, [hyp([(0, 1.0, " last words")])])
    out = p.flush(1.0, 1.0)
    assert finals(out) == "last words"


def test_deterministic():
    seq = [hyp([(0, i + 1.0, " a b c d e f g h"[: 2 * (i + 2)])]) for i in range(7)]
    a = run(LocalAgreementPolicy("x"), seq, close_last=True)
    b = run(LocalAgreementPolicy("x"), seq, close_last=True)
    assert a == b
    assert finals(a).split() == list("abcdefgh")


def test_hyphenated_rewording_neither_repeats_nor_drops():
    p = LocalAgreementPolicy("Me")
    run(p, [hyp([(0, 2.0, " and fat mutton")]), hyp([(0, 2.5, " and fat mutton pieces")])])
    # The model now writes the committed words as a compound and goes on.
    out = p.update(hyp([(0, 3.0, " and fat-mutton pieces to be")]), 3.0, 3.0)
    out += p.update(hyp([(0, 3.5, " and fat-mutton pieces to be ladled")]), 3.5, 3.5, close_segment=True)
    words = [normalize_word(w) for u in out if u.kind == "final" for w in u.text.replace("-", " ").split()]
    assert words == ["pieces", "to", "be", "ladled"]


def test_rejected_closing_hypothesis_keeps_the_shown_partial():
    p = LocalAgreementPolicy("Me")
    run(p, [hyp([(0, 1.0, " by the grave")])])
    out = p.update(hyp([(0, 2.0, " by the grave and thee thee thee")], rejected=True), 2.5, 2.5, close_segment=True)
    assert finals(out) == "by the grave"
    assert out[-1].kind == "final"


def test_captions_carry_word_times_only_where_they_were_measured():
    """AlignAtt's words have attention (DTW) times: every partial and final update carries them,
    within the update's span and rising. LocalAgreement's are spread over segments by length:
    no word times are given for them."""
    from captioner.engine.policy.alignatt import AlignAttPolicy

    def timed(texts_times, end_s):
        words = tuple(Word(t, a, b, 0, attend_s=b) for t, a, b in texts_times)
        return Hypothesis(words, 0.0, end_s, (end_s,))

    policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_words=0))
    said = [(" Ask", 0.1, 0.4), (" not", 0.4, 0.8), (" what", 1.0, 1.3), (" your", 1.3, 1.6)]
    updates = policy.update(timed(said, 1.8), 1.8, 1.9)  # "your" attends within 0.4 s of the end
    assert [u.kind for u in updates] == ["final", "partial"]
    final, partial = updates
    assert final.words == (("Ask", 0.1, 0.4), ("not", 0.4, 0.8), ("what", 1.0, 1.3))
    assert partial.words == (("your", 1.3, 1.6),)
    for u in updates:
        assert [w for w, _, _ in u.words] == u.text.split()
        assert all(u.start_s <= a <= b <= u.end_s for _, a, b in u.words)

    agreement = LocalAgreementPolicy("s")
    spread = Hypothesis(tuple(Word(t, a, b) for t, a, b in said), 0.0, 2.0, (2.0,))
    out = agreement.update(spread, 2.0, 2.1) + agreement.update(spread, 2.5, 2.6)
    assert any(u.kind == "final" for u in out) and all(u.words == () for u in out)


def test_the_prompt_is_the_last_committed_words_kept_as_plain_text():
    """A served model process holds this history for hundreds of streams: kept as Words (named
    tuples, which the cyclic GC walks in every full collection) and 200 a stream, it was most of
    what a GPU model process held at 333 streams, and its full collections took 40-90 ms."""
    import gc

    p = LocalAgreementPolicy("Me", PolicyConfig(prompt_words=5))
    for k in range(4):  # each window closed: its words are committed and leave the buffer
        p.update(hyp([(0.0, 1.0, f" w{3 * k} w{3 * k + 1} w{3 * k + 2}")], start_s=2.0 * k), 2.0 * k + 1.5,
                 2.0 * k + 1.5, close_segment=True, close_at_s=2.0 * k + 1.2)
    assert p.prompt_text() == "w7 w8 w9 w10 w11"
    assert not any(gc.is_tracked(text) for text in p._s.history) and len(p._s.history) == 5


def test_a_commit_never_ends_inside_a_word_or_a_dictated_number():
    """Whisper writes a spoken "seven zero zero two three" as "7-00", "700 two three" or "70023"
    depending on what it has heard around it: a number is committed with the rest of it."""
    from captioner.engine.policy.words import whole_words

    def cut(*texts):
        words = [Word(t, 0.0, 0.0) for t in texts]
        return whole_words(words, len(words))

    assert cut(" zip", " code", " is", " seven", " zero", " zero") == 3
    assert cut(" is", " 7", " 0.", " Thanks") == 4  # the number ended: a word follows it
    assert cut(" is", " 700", " two", " three") == 1
    assert cut(" the", " one", " I", " want") == 4  # a number's name alone is a word like others
    assert cut(" a", " self-") == 1 and cut(" or", " 42-") == 1
    pieces = [Word(t, 0.0, 0.0) for t in (" or", " 42", "line", " Bible")]
    assert whole_words(pieces, 2) == 1 and whole_words(pieces, 3) == 3  # never "42" | "line"


def test_a_number_at_a_pause_waits_for_the_long_pause():
    """At ``hold_s`` of silence the words shown are committed, but not a number at their end: a
    speaker dictating digits pauses between them. A long pause commits it."""
    from captioner.engine.policy.alignatt import AlignAttPolicy

    words = [(" zip", 0.1, 0.4), (" code", 0.4, 0.7), (" is", 0.7, 0.9), (" seven", 1.2, 1.6)]
    policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=5.0, hold_s=1.5, long_pause_s=4.0))
    policy.update(Hypothesis(tuple(Word(t, a, b, 0, attend_s=b) for t, a, b in words), 0.0, 1.8, (float("inf"),)),
                  1.8, 1.8)
    assert policy.partial_text == "zip code is seven"
    out = policy.settle(1.5, 3.0, 3.3, 3.3)
    assert finals(out) == "zip code is" and policy.partial_text == "seven"
    assert policy.settles_at_s() == 4.0 and policy.settle(3.0, 4.5, 4.8, 4.8) == []
    out = policy.settle(4.0, 5.5, 5.8, 5.8)
    assert finals(out) == "seven" and not policy.has_pending_text


def test_a_dictated_number_is_committed_as_one_number():
    """A zip code read out digit by digit is written "70023", as Whisper writes it offline, not
    "7, 0, 0, 2, 3." as a live window ending between the digits hears it; counting stays a list.
    The joined word spans the digits' times, and the committed text is still matched whole by
    the hypotheses that follow (nothing is committed twice)."""
    from captioner.engine.policy.alignatt import AlignAttPolicy
    from captioner.engine.policy.words import join_dictated_digits

    texts = [" it's", " 7,", " 0,", " 0,", " 2,", " 3.", " Thanks."]
    words = tuple(Word(t, 0.4 * i, 0.4 * i + 0.3, 0, attend_s=0.4 * i + 0.3) for i, t in enumerate(texts))
    policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=0.0, attend_margin_s=0.0))
    out = policy.update(Hypothesis(words, 0.0, 6.0, (float("inf"),)), 6.0, 6.0)
    out += policy.update(Hypothesis(words + (Word(" Bye.", 3.0, 3.3, 0, attend_s=3.3),), 0.0, 8.0, (float("inf"),)),
                         8.0, 8.0, close_segment=True)
    assert finals(out) == "it's 70023. Thanks. Bye."
    number = next(u for u in out if u.kind == "final").words[1]
    assert number == ("70023.", 0.4, 2.3)

    def joined(*texts):
        return "".join(w.text for w in join_dictated_digits([Word(t, 0.0, 0.0) for t in texts]))

    assert joined(" 1,", " 2,", " 3,", " go.") == " 1, 2, 3, go."  # three: counting, not a number
    assert joined(" PIN", " 4-", "0-", "9-", "1", " please") == " PIN 4091 please"
    assert joined(" call", " 5", " 5", " 5", " 0,", " then") == " call 5550, then"
    assert joined(" in", " 1999", " 2", " 3", " 4") == " in 1999 2 3 4"  # digits alone only


def test_a_long_window_without_a_decoder_timestamp_is_trimmed_in_a_pause_after_a_committed_sentence():
    """Conversation often comes as one decoder segment: the buffer is cut where the words'
    measured times leave a pause after a committed sentence, and only there."""
    from captioner.engine.policy.alignatt import AlignAttPolicy

    names = [chr(ord("a") + i) * 2 for i in range(24)]  # "aa", "bb", ...: words, not numbers
    said = [(" " + name, 0.5 * i, 0.5 * i + 0.4) for i, name in enumerate(names)]  # 12 s, 0.1 s apart
    said[9] = (" jj.", 4.5, 4.9)  # a sentence ends with no pause after it
    said[15] = (" pp.", 7.5, 7.6)  # and one with a pause of 0.4 s after it
    words = tuple(Word(t, a, b, 0, attend_s=b) for t, a, b in said)
    policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_words=0, attend_margin_s=0.1))
    policy.update(Hypothesis(words, 0.0, 12.5, (float("inf"),)), 12.5, 12.5)
    assert abs(policy.buffer_start_s - 7.7) < 1e-9  # just after it: a measured start may come late
    assert policy.prompt_text().endswith("oo pp.")


def test_a_window_is_not_trimmed_in_a_pause_the_last_partial_did_not_have():
    """A word's measured start moves between hypotheses: the pause before the first word still
    to commit must be there in the partial shown before too. The sonnet's "niggarding" was shown
    right after the committed "in", the next hypothesis put it 0.8 s later, the cut fell inside
    it, and the next window never heard it."""
    from captioner.engine.policy.alignatt import AlignAttPolicy

    names = [chr(ord("a") + i) * 2 for i in range(16)]
    said = [(" " + name, 0.5 * i, 0.5 * i + 0.4) for i, name in enumerate(names)]
    said[15] = (" pp.", 7.5, 7.6)
    heard = [Word(t, a, b, 0, attend_s=b) for t, a, b in said]

    def run(qq_shown_at_s: float) -> float:
        policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_words=0, attend_margin_s=0.1))
        # "qq" shown first (at the window's end: not committed), where the decoder placed it then...
        policy.update(Hypothesis(tuple(heard) + (Word(" qq", qq_shown_at_s, 11.8, 0, attend_s=11.85),), 0.0, 11.9,
                                 (float("inf"),)), 11.9, 11.9)
        assert policy.partial_text.strip() == "qq"
        # ...then 0.4 s after "pp." in a buffer long enough to be trimmed.
        policy.update(Hypothesis(tuple(heard) + (Word(" qq", 8.0, 12.4, 0, attend_s=12.45),), 0.0, 12.5,
                                 (float("inf"),)), 12.5, 12.5)
        return policy.buffer_start_s

    assert run(qq_shown_at_s=7.62) == 0.0  # the pause was not there before: no cut
    assert abs(run(qq_shown_at_s=8.0) - 7.7) < 1e-9  # there both times: cut in it


def test_a_committed_word_the_next_window_leaves_out_is_not_matched_to_a_later_one():
    """The sonnet's "thyself thy foe, to thy sweet": "thy" committed, then a window that does not
    hear it again begins "foe, to thy sweet". The committed "thy" is no anchor in the later
    "thy" 1.4 s on: that dropped "foe, to" as if they were committed."""
    from captioner.engine.policy.alignatt import AlignAttPolicy

    policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_words=0, attend_margin_s=0.1))
    first = policy.update(Hypothesis((Word(" thy", 0.3, 0.6, 0, attend_s=0.6),
                                      Word(" foe", 0.7, 2.9, 0, attend_s=2.95)), 0.0, 3.0, (float("inf"),)), 3.0, 3.0)
    assert [u.text for u in first if u.kind == "final"] == ["thy"]
    again = policy.update(Hypothesis((Word(" foe,", 0.7, 1.5, 0, attend_s=1.4), Word(" to", 1.5, 1.7, 0, attend_s=1.6),
                                      Word(" thy", 1.7, 2.0, 0, attend_s=1.9),
                                      Word(" sweet", 2.0, 3.9, 0, attend_s=3.95)), 0.0, 4.0, (float("inf"),)), 4.0, 4.0)
    assert " ".join(u.text for u in again if u.kind == "final") == "foe, to thy"
    assert policy.partial_text.strip() == "sweet"
