"""AlignAtt's lag/stability settings (issue 14): the hybrid rule (attention or agreement,
whichever commits more), the first-words rule at a segment's start only, and the named presets
that ``--policy`` and ``auto`` resolve. Hand-made hypotheses with scripted attention; no model."""

from __future__ import annotations

import pytest

from captioner.engine.policy.alignatt import AlignAttPolicy
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.presets import (
    DEFAULT_BY_DEVICE,
    PRESETS,
    make_policy,
    names,
    preset,
    resolve,
)
from captioner.engine.policy.words import Hypothesis, Word


def hyp(words, end_s):
    """(text, start_s, end_s, attend_s) words, one open segment from 0 to ``end_s``."""
    return Hypothesis(tuple(Word(" " + t, a, b, 0, attend_s=att) for t, a, b, att in words), 0.0, end_s,
                      (float("inf"),))


def committed(updates):
    return " ".join(u.text for u in updates if u.kind == "final")


# "fox" attends late, into the margin of both hypotheses; the rest attends where it ends.
FIRST = [("the", 0.2, 0.4, 0.4), ("quick", 0.5, 0.8, 0.8), ("brown", 0.9, 1.2, 1.2), ("fox", 1.3, 1.6, 2.05)]
SECOND = FIRST[:3] + [("fox", 1.3, 1.6, 2.2), ("jumps", 1.7, 2.0, 2.45)]


def test_hybrid_commits_what_two_hypotheses_agree_on_beyond_the_attention_rule():
    plain = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=0.0, attend_margin_s=0.4))
    hybrid = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=0.0, attend_margin_s=0.4,
                                              commit_on_agreement=True))
    for policy in (plain, hybrid):
        assert committed(policy.update(hyp(FIRST, 2.1), 2.1, 2.1)) == "the quick brown"
    # At 2.5 s "fox" still attended within 0.4 s of the end (2.2 > 2.1): the attention rule
    # holds it; the two hypotheses agree on it, so the hybrid commits it. "jumps" is new: neither.
    assert committed(plain.update(hyp(SECOND, 2.5), 2.5, 2.5)) == ""
    assert committed(hybrid.update(hyp(SECOND, 2.5), 2.5, 2.5)) == "fox"
    assert hybrid.partial_text == "jumps"


def test_hybrid_keeps_the_first_words_waiting_for_their_context():
    config = PolicyConfig(kind="alignatt", first_context_s=1.5, first_words=3, commit_on_agreement=True)
    policy = AlignAttPolicy("s", config)
    early = [("the", 0.2, 0.4, 0.4), ("quick", 0.5, 0.8, 0.8)]
    assert committed(policy.update(hyp(early, 1.2), 1.2, 1.2)) == ""
    # Both hypotheses agree on "the quick", but only "the" has 1.5 s of speech after it (to 1.9 s).
    out = policy.update(hyp(early + [("brown", 0.9, 1.2, 1.2), ("fox", 1.5, 1.9, 1.9)], 2.0), 2.0, 2.0)
    assert committed(out) == "the"


def test_first_words_rule_at_a_segment_start_only():
    words = [("Ask", 0.1, 0.4, 0.4), ("not.", 0.5, 0.8, 0.8), ("What", 1.2, 1.5, 1.5), ("your", 1.6, 1.8, 1.8),
             ("country", 1.9, 2.35, 2.35)]
    each = PolicyConfig(kind="alignatt", first_context_s=1.5, first_words=3, attend_margin_s=0.0)
    start = PolicyConfig(kind="alignatt", first_context_s=1.5, first_words=3, attend_margin_s=0.0,
                         first_words_per_sentence=False)
    # Speech heard up to 2.35 s: "Ask" and "not." have 1.5 s of it after them; "What", the first
    # word of a sentence, waits under the per-sentence rule; at a segment's start only it is the
    # third word and waits too, and "your", the fourth, may not pass it.
    out_each = AlignAttPolicy("s", each).update(hyp(words, 2.4), 2.4, 2.4)
    out_start = AlignAttPolicy("s", start).update(hyp(words, 2.4), 2.4, 2.4)
    assert committed(out_each) == committed(out_start) == "Ask not."
    # Heard up to 3.0 s, "What" has its 1.5 s; "your" (1.2 s) is the second word of its sentence
    # (waits under the per-sentence rule) but the fourth of the segment (free otherwise).
    more = words + [("can", 2.4, 2.6, 2.6), ("do", 2.7, 3.0, 3.0)]
    each_policy, start_policy = AlignAttPolicy("s", each), AlignAttPolicy("s", start)
    each_policy.update(hyp(words, 2.4), 2.4, 2.4)
    start_policy.update(hyp(words, 2.4), 2.4, 2.4)
    assert committed(each_policy.update(hyp(more, 3.1), 3.1, 3.1)) == "What"
    assert committed(start_policy.update(hyp(more, 3.1), 3.1, 3.1)) == "What your country can do"


def test_a_preset_names_a_policy_with_its_fields():
    config = preset("alignatt-gpu")
    assert config.kind == "alignatt"
    for name, value in PRESETS["alignatt-gpu"].items():
        assert getattr(config, name) == value
    assert type(make_policy("s", resolve(PolicyConfig(kind="alignatt-gpu"), "CUDAExecutionProvider"))) is AlignAttPolicy
    # Fields the caller set stay the caller's; the rest come from the preset.
    mine = resolve(PolicyConfig(kind="alignatt-gpu", trim_after_s=8.0), "CPUExecutionProvider")
    assert mine.trim_after_s == 8.0 and mine.first_context_s == PRESETS["alignatt-gpu"]["first_context_s"]
    assert preset("alignatt", first_words=1).first_words == 1
    assert set(names()) >= {"auto", "localagreement", "alignatt", "alignatt-gpu"}
    with pytest.raises(ValueError, match="unknown streaming policy"):
        preset("waitk")


def test_auto_resolves_to_a_runnable_policy_on_every_device_class():
    for provider, device_class in (("CUDAExecutionProvider", "cuda"), ("CPUExecutionProvider", "cpu")):
        config = resolve(PolicyConfig(kind="auto"), provider)
        assert config == resolve(PolicyConfig(kind=DEFAULT_BY_DEVICE[device_class]), provider)
        assert config.kind in ("localagreement", "alignatt")
        make_policy("s", config)


def test_a_closing_window_overlaps_the_last_committed_words():
    """With ``close_overlap_s`` the closing window starts before the last committed word, which
    the closing hypothesis holds again: it is matched, not committed twice, and the word after it
    is heard from its start."""
    words = [("concord", 0.3, 0.9, 0.9), ("returned", 1.0, 1.5, 1.5), ("to", 1.6, 1.7, 1.7), ("its", 1.8, 1.9, 1.9),
             ("place", 2.0, 2.4, 2.4), ("amidst", 2.5, 2.9, 2.9), ("the", 3.0, 3.2, 3.2), ("tents.", 3.3, 3.8, 4.2)]
    for overlap_s, start_s in ((0.0, 3.2), (0.5, 2.9)):
        policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=0.0, attend_margin_s=0.4,
                                                  close_overlap_s=overlap_s))
        out = policy.update(hyp(words, 3.9), 3.9, 3.9)
        assert committed(out) == "concord returned to its place amidst the"
        policy.start_after_committed()
        assert policy.buffer_start_s == pytest.approx(start_s)
        again = [w for w in words if w[1] >= start_s]
        close = Hypothesis(tuple(Word(" " + t, a, b, 0, attend_s=att) for t, a, b, att in again), start_s, 4.6,
                           (float("inf"),))
        out = policy.update(close, 4.6, 4.6, close_segment=True)
        assert committed(out) == "tents."


def test_a_closing_window_of_committed_words_within_the_overlap_stays_where_it_is():
    policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=0.0, attend_margin_s=0.4,
                                              close_overlap_s=1.2))
    policy.update(hyp([("he", 0.5, 0.8, 0.8), ("could", 0.9, 1.2, 1.2), ("wait", 1.3, 1.6, 1.6)], 2.1), 2.1, 2.1)
    policy.start_after_committed()
    assert policy.buffer_start_s == 0.0
