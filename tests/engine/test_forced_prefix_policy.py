"""The forced prefix from the policy's side (LocalAgreementPolicy.forced_prefix): after an update,
the tokens of the committed words at the buffer's start, cut where a committed word ends on a
token boundary, for a window that starts where that hypothesis' did; nothing after anything
that moves the buffer's start, nothing for AlignAtt. Fake token ids (one per word, and timestamps
at 1000+) stand for a decoder's: the policy never reads them, it only cuts them."""

from __future__ import annotations

from captioner.engine.policy.alignatt import AlignAttPolicy
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.local_agreement import LocalAgreementPolicy
from captioner.engine.policy.words import Hypothesis, words_from_segments

TS = 1000


def hyp(text: str, start_s: float = 0.0, end_s: float | None = None, inside: tuple[int, ...] = (),
        segments: list[tuple[float, float, str]] | None = None) -> Hypothesis:
    """A hypothesis of one segment (or ``segments``) whose tokens are a start timestamp and one
    token per word (words at ``inside`` end inside a token: -1)."""
    segments = segments or [(0.0, len(text.split()) * 0.4, " " + text)]
    words, ends = words_from_segments(segments, start_s)
    tokens, token_ends = [], []
    for k, seg in enumerate(segments):
        tokens.append(TS + k)
        for _ in seg[2].split():
            tokens.append(len(tokens))
            token_ends.append(len(tokens))
    token_ends = [-1 if i in inside else e for i, e in enumerate(token_ends)]
    end_s = max(ends) if end_s is None else end_s
    return Hypothesis(tuple(words), start_s, end_s, tuple(ends), tokens=tuple(tokens), token_ends=tuple(token_ends))


def update(policy, h: Hypothesis, **kw):
    return policy.update(h, h.end_s, h.end_s, **kw)


def test_the_committed_words_tokens_become_the_next_windows_prefix():
    p = LocalAgreementPolicy("s")
    assert p.forced_prefix(0.0) == ()
    update(p, hyp("and so my"))
    assert p.forced_prefix(0.0) == ()  # nothing committed yet
    second = hyp("and so my fellow")
    update(p, second)  # "and so my" committed
    assert p.forced_prefix(0.0) == second.tokens[:4]  # the timestamp and three words
    assert p.forced_prefix(0.5) == ()  # a window starting elsewhere: its timestamps would be off
    third = hyp("and so my fellow americans ask")
    update(p, third)  # "fellow" committed too
    assert p.forced_prefix(0.0) == third.tokens[:5]


def test_a_word_ending_inside_a_token_cuts_the_prefix_before_it():
    p = LocalAgreementPolicy("s")
    update(p, hyp("fat mutton pieces"))
    update(p, hyp("fat mutton pieces to be", inside=(2,)))  # "pieces" ends inside a token
    assert p.forced_prefix(0.0) == (TS, 1, 2)


def test_no_prefix_where_hypothesis_and_committed_words_do_not_line_up():
    p = LocalAgreementPolicy("s")
    update(p, hyp("red green blue"))
    update(p, hyp("red green blue cat"))
    assert p.forced_prefix(0.0)
    update(p, hyp("black red green blue cat dog"))  # a word before the committed ones
    assert p.forced_prefix(0.0) == ()


def test_a_close_or_a_trim_drops_the_prefix():
    p = LocalAgreementPolicy("s")
    update(p, hyp("red green blue"))
    update(p, hyp("red green blue cat"))
    assert p.forced_prefix(0.0)
    update(p, hyp("red green blue cat dog"), close_segment=True)
    assert p.forced_prefix(p.buffer_start_s) == ()

    trim = LocalAgreementPolicy("t", PolicyConfig(trim_after_s=2.0))
    long = [(0.0, 1.6, " the first sentence here."), (1.6, 2.4, " and more")]
    update(trim, hyp("", segments=long[:1] + [(1.6, 2.0, " and")]))
    update(trim, hyp("", segments=long))
    assert trim.buffer_start_s == 1.6  # cut at the committed sentence's end
    assert trim.forced_prefix(1.6) == () and trim.forced_prefix(0.0) == ()


def test_off_by_configuration_and_for_alignatt():
    for policy in (LocalAgreementPolicy("s", PolicyConfig(forced_prefix=False)), AlignAttPolicy("a")):
        update(policy, hyp("and so my"))
        update(policy, hyp("and so my fellow"))
        update(policy, hyp("and so my fellow americans"))
        assert policy.forced_prefix(0.0) == ()


def test_a_rejected_hypothesis_keeps_the_prefix():
    p = LocalAgreementPolicy("s")
    update(p, hyp("red green blue"))
    update(p, hyp("red green blue cat"))
    kept = p.forced_prefix(0.0)
    p.update(Hypothesis((), 0.0, 3.0, rejected=True, reason="compression"), 3.0, 3.0)
    assert p.forced_prefix(0.0) == kept
