"""AlignAtt (issue 14): commit what the cross-attention says was heard whole, on one hypothesis.

The policy's rules are checked on hand-made hypotheses with scripted attention, then through
the whole engine on a simulated clock with a scripted recognizer that scripts attention
(:mod:`attentive`), and the DTW word timing on synthetic attention. No model runs here.
"""

from __future__ import annotations

import numpy as np
import pytest
from attentive import AttentiveScriptedRecognizer
from scripted import feed, finals, finish_all, keys, phrase, render_speech, script_end_s

from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.policy.alignatt import AlignAttPolicy
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.local_agreement import LocalAgreementPolicy
from captioner.engine.policy.presets import make_policy
from captioner.engine.policy.words import Hypothesis, Word, ends_sentence
from captioner.engine.simulate import SimClock
from captioner.engine.wordtiming import attended_frames, dtw, token_times


def hyp(words, end_s, start_s=0.0, attend_lag_s=0.0):
    """A hypothesis of (text, start_s, end_s[, attend_s]) words, one segment, open at the end."""
    out = []
    for w in words:
        attend = w[3] if len(w) > 3 else w[2] + attend_lag_s
        out.append(Word(" " + w[0], w[1], w[2], 0, attend_s=attend))
    return Hypothesis(tuple(out), start_s, end_s, (float("inf"),))


def committed(updates):
    return " ".join(u.text for u in updates if u.kind == "final")


# Words well inside the audio: (text, start, end)
SPEECH = [("the", 0.2, 0.4), ("quick", 0.5, 0.8), ("brown", 0.9, 1.2), ("fox", 1.3, 1.6),
          ("jumps", 1.7, 2.0), ("over", 2.1, 2.4), ("the", 2.5, 2.6), ("lazy", 2.7, 3.0)]


def no_first_context(**kw):
    """AlignAtt's attention rule alone: no wait for context."""
    return PolicyConfig(kind="alignatt", first_context_s=0.0, **kw)


# -- the commit rule ------------------------------------------------------------------------------
def test_words_heard_whole_are_committed_from_one_hypothesis():
    """LocalAgreement needs a second hypothesis; AlignAtt commits at once every word before the
    first one that attended within the margin of the audio's end."""
    h = hyp(SPEECH[:6], end_s=2.5)  # "over" ends at 2.4, within 0.4 s of the end
    la = LocalAgreementPolicy("s").update(h, 2.5, 2.5)
    aa = AlignAttPolicy("s", no_first_context()).update(h, 2.5, 2.5)
    assert committed(la) == ""
    assert committed(aa) == "the quick brown fox jumps"
    assert [u.text for u in aa if u.kind == "partial"] == ["over"]


def test_a_word_that_looked_past_the_audio_stops_the_commit_even_if_later_ones_did_not():
    words = list(SPEECH[:5])
    words[2] = ("brown", 0.9, 1.2, 5.0)  # the model looked beyond the window for this one
    out = AlignAttPolicy("s", no_first_context()).update(hyp(words, end_s=3.0), 3.0, 3.0)
    assert committed(out) == "the quick"


def test_first_words_wait_for_context_after_them():
    config = PolicyConfig(kind="alignatt", first_context_s=1.5, first_words=3)
    policy = AlignAttPolicy("s", config)
    out = policy.update(hyp(SPEECH[:6], end_s=2.5), 2.5, 2.5)
    # Speech is heard up to 2.4 s: "the" (ends 0.4) and "quick" (0.8) have 1.5 s of it after
    # them; "brown" (1.2) only 1.2 s: it waits (the silence after the last word is no context).
    assert committed(out) == "the quick"
    out = policy.update(hyp(SPEECH, end_s=3.3), 3.3, 3.3)
    # "brown" now has 1.8 s of speech after it; past the third first word only the margin counts.
    assert committed(out) == "brown fox jumps over the"


def test_a_sentence_ended_in_the_same_update_gives_the_next_words_the_first_words_rule():
    """ "with that. What is the transfer": the words after "that." are a new sentence's first
    words, whether "that." was committed before or in the same update."""
    words = [("to", 0.1, 0.3), ("help", 0.4, 0.6), ("with", 0.7, 0.9), ("that.", 1.0, 1.3),
             ("One", 1.5, 1.7), ("is", 1.8, 1.9), ("the", 2.0, 2.1), ("transfer", 2.2, 2.6), ("amount", 2.7, 3.3)]
    policy = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=1.5, attend_margin_s=0.1, first_words=3))
    out = policy.update(hyp(words, end_s=3.5), 3.5, 3.5)
    assert committed(out) == "to help with that. One"  # "is" has 1.4 s of speech after it, not 1.5


def test_a_sentence_begun_inside_a_segment_waits_for_less_context_than_a_segment_start():
    """``sentence_context_s``: the first words of a sentence whose window already holds the
    speech before it ("Yes. What is it") wait for 1 s of speech after them; the same words at a
    segment's start, with nothing heard before them, wait for ``first_context_s``; after a
    segment closes, its next line is a segment start again."""
    config = PolicyConfig(kind="alignatt", first_context_s=1.5, sentence_context_s=1.0, attend_margin_s=0.1, first_words=3)
    question = [("What", 0.8, 1.0), ("is", 1.1, 1.2), ("it", 1.3, 1.5), ("now", 1.6, 2.3)]
    policy = AlignAttPolicy("s", config)
    out = policy.update(hyp([("Yes.", 0.1, 0.5), *question[:1]], end_s=1.1), 1.1, 1.1)
    assert committed(out) == ""  # "Yes." has 0.5 s of speech after it, not 1.5
    out = policy.update(hyp([("Yes.", 0.1, 0.5), *question], end_s=2.4), 2.4, 2.4)
    # "What" and "is" have 1.3 and 1.1 s of speech after them; "it" 0.8 s.
    assert committed(out) == "Yes. What is"
    alone = AlignAttPolicy("s", config).update(hyp(question, end_s=2.4), 2.4, 2.4)
    assert committed(alone) == ""  # a segment's first words: 1.3 s is not 1.5 s
    policy.update(hyp([("Yes.", 0.1, 0.5), *question], end_s=2.4), 2.4, 2.4, close_segment=True)
    later = [(w, a + 10.0, b + 10.0) for w, a, b in question]
    assert committed(policy.update(hyp(later, end_s=12.4, start_s=9.5), 12.4, 12.4)) == ""


def test_a_committed_word_never_changes_though_later_hypotheses_disagree():
    policy = AlignAttPolicy("s", no_first_context())
    out = policy.update(hyp(SPEECH[:4], end_s=2.0), 2.0, 2.0)
    assert committed(out) == "the quick brown fox"
    revised = [("a", 0.2, 0.4), ("quick", 0.5, 0.8), ("brown", 0.9, 1.2), ("fox", 1.3, 1.6), ("jumps", 1.7, 2.0),
               ("over", 2.1, 2.4)]
    out += policy.update(hyp(revised, end_s=3.0), 3.0, 3.0)
    out += policy.update(hyp(revised, end_s=3.0), 3.0, 3.0, close_segment=True)
    assert committed(out) == "the quick brown fox jumps over"


def test_without_attention_it_agrees_like_localagreement():
    plain = Hypothesis(tuple(Word(" " + t, a, b) for t, a, b in SPEECH[:4]), 0.0, 2.0, (float("inf"),))
    aa, la = AlignAttPolicy("s", no_first_context()), LocalAgreementPolicy("s")
    assert committed(aa.update(plain, 2.0, 2.0)) == committed(la.update(plain, 2.0, 2.0)) == ""
    assert committed(aa.update(plain, 2.1, 2.1)) == committed(la.update(plain, 2.1, 2.1)) == "the quick brown fox"


def test_a_sentence_end_ends_the_line():
    words = [("Ask", 0.1, 0.4), ("not.", 0.5, 0.8), ("What", 1.2, 1.5), ("your", 1.6, 1.8)]
    out = AlignAttPolicy("s", no_first_context()).update(hyp(words, end_s=3.0), 3.0, 3.0)
    lines = [(u.segment, u.text) for u in out if u.kind == "final"]
    assert lines == [(0, "Ask not."), (1, "What your")]
    assert ends_sentence(Word(' done."', 0, 1)) and not ends_sentence(Word(" Mr", 0, 1))


def test_a_pause_keeps_the_segment_and_its_audio_open_until_a_long_silence():
    """A pause is no cut: the segment stays open (the next speech is decoded in the same window,
    so words that lack context get it). Settling a pause the last update heard needs no model:
    at ``hold_s`` the words shown are committed, at ``long_pause_s`` the segment closes."""
    config = PolicyConfig(kind="alignatt", first_context_s=2.5, hold_s=1.5, long_pause_s=4.0)
    policy = AlignAttPolicy("s", config)
    out = policy.update(hyp(SPEECH[:3], end_s=1.8), 1.8, 1.8)
    # The first words lack context: nothing committed, the words shown.
    assert committed(out) == "" and policy.partial_text == "the quick brown"
    assert policy.settles_at_s() == 1.5
    assert policy.settle(0.6, 1.5, 1.8, 1.8) == [] and policy.has_uncommitted_text
    # Speech resumes in the same window: the first words now have context.
    out = policy.update(hyp(SPEECH, end_s=3.4), 3.4, 3.4)
    assert policy.buffer_start_s == 0.0
    # ("quick", ending at 0.8 s, has only 2.2 s of speech after it, up to 3.0 s: it waits.)
    assert committed(out) == "the"
    # A silence of hold_s commits what is shown, without a model step; the segment stays open...
    out = policy.settle(1.5, 3.1, 4.5, 4.5)
    assert committed(out) == "quick brown fox jumps over the lazy" and policy.partial_text == ""
    assert policy.has_pending_text and policy.settles_at_s() == 4.0
    # ...until a long silence closes it: its words become the prompt, the buffer starts anew.
    assert policy.settle(2.0, 3.1, 5.0, 5.0) == [] and policy.has_pending_text
    assert policy.settle(4.0, 6.7, 7.0, 7.0) == [] and not policy.has_pending_text
    assert policy.buffer_start_s == 6.7 and policy.prompt_text().endswith("lazy")


def test_words_guessed_in_the_pause_wait_for_the_speech_after_it():
    """``hold_min_p``: at a hold, the words at the end that attended past the audio their
    hypothesis held (the padding) and were chosen with low probability are not committed: call
    00d6's agent paused after "what is the source", tiny.en ended the window with "of count?"
    (p 0.50 and 0.32), and "account?" came 3 s later. They stay shown until the speech after the
    pause is heard with them, or a long pause commits them (a real "Bye." looks alike). A last
    word the model was sure of ("account?", p 0.98) attends to the padding too: the hold commits it."""
    def word(text, start_s, end_s, attend_s, p):
        return Word(" " + text, start_s, end_s, 0, attend_s=attend_s, confidence=p)

    def heard(*words, end_s):
        return Hypothesis(tuple(words), 0.0, end_s, (float("inf"),))

    said = [word("what", 0.2, 0.4, 0.3, 0.98), word("is", 0.5, 0.6, 0.5, 0.99), word("the", 0.7, 0.8, 0.7, 0.9),
            word("source", 0.9, 1.3, 1.0, 0.99)]
    guesses = [word("of", 1.4, 1.6, 1.5, 0.50), word("count?", 1.7, 2.2, 29.9, 0.32)]
    config = PolicyConfig(kind="alignatt", first_context_s=2.5, hold_s=1.5, long_pause_s=4.0, hold_min_p=0.6)
    policy = AlignAttPolicy("s", config)
    assert committed(policy.update(heard(*said, *guesses, end_s=2.3), 2.3, 2.3)) == ""
    out = policy.settle(1.6, 2.3, 2.9, 2.9)
    # "of" attended inside the audio: only "count?" may be a guess past it, and waits.
    assert committed(out) == "what is the source of" and policy.partial_text == "count?"
    assert policy.settles_at_s() == 4.0 and policy.settle(2.5, 2.3, 3.8, 3.8) == []
    # The speech after the pause is heard with the guess's audio: "account?", and no "count?".
    resumed = heard(*said, word("of", 1.4, 1.6, 1.5, 0.5), word("account?", 4.1, 4.6, 4.5, 0.9),
                    word("And", 4.8, 5.0, 4.9, 0.9), end_s=6.0)
    out = policy.update(resumed, 6.0, 6.0)
    assert committed(out).startswith("account?")
    # At the end of what is said, a long pause commits a guess: a real word may look like one.
    ending = AlignAttPolicy("s", config)
    ending.update(heard(*said, word("bye.", 1.4, 1.8, 29.9, 0.4), end_s=2.3), 2.3, 2.3)
    assert committed(ending.settle(1.6, 2.3, 2.9, 2.9)) == "what is the source"
    assert committed(ending.settle(4.0, 2.3, 6.3, 6.3)) == "bye."
    sure = AlignAttPolicy("s", config)
    sure.update(heard(*said, word("account?", 1.4, 2.2, 29.9, 0.98), end_s=2.3), 2.3, 2.3)
    assert committed(sure.settle(1.6, 2.3, 2.9, 2.9)) == "what is the source account?"
    unset = AlignAttPolicy("s", PolicyConfig(kind="alignatt", first_context_s=2.5, hold_s=1.5, hold_min_p=None))
    unset.update(heard(*said, *guesses, end_s=2.3), 2.3, 2.3)
    assert committed(unset.settle(1.6, 2.3, 2.9, 2.9)) == "what is the source of count?"


def test_a_rejected_hypothesis_closes_the_segment_with_a_window_from_the_committed_words():
    """What the guards rejected must not stay in every window until a long silence: at the pause
    the segment closes with a window of its own that starts where the committed words end."""
    policy = AlignAttPolicy("s", no_first_context(close_overlap_s=3.0))
    policy.update(hyp(SPEECH[:3], end_s=2.0), 2.0, 2.0)
    assert policy.has_pending_text and not policy.needs_closing_window
    policy.update(Hypothesis((), 0.0, 2.5, (), rejected=True, reason="repetition"), 2.5, 2.5)
    assert policy.needs_closing_window
    policy.start_after_committed()  # no overlap kept: the window starts after "brown"
    assert policy.buffer_start_s == SPEECH[2][2] and policy.prompt_text() == "the quick brown"


def test_text_whose_attention_follows_nothing_is_not_shown():
    """Whisper's " you" on music: every word attends to the window's first frame."""
    you = hyp([("you", 10.0, 12.9, 10.0)], start_s=10.0, end_s=13.0)
    out = AlignAttPolicy("s", no_first_context()).update(you, 13.0, 13.0)
    assert not [u for u in out if u.text.strip()]
    # A real word at the start of a short window is kept.
    yes = hyp([("yes", 10.0, 10.3, 10.0)], start_s=10.0, end_s=10.6)
    assert [u.text for u in AlignAttPolicy("s", no_first_context()).update(yes, 10.6, 10.6)] == ["yes"]


def test_make_policy_names_the_kinds():
    assert type(make_policy("s", PolicyConfig(kind="alignatt"))) is AlignAttPolicy
    assert type(make_policy("s", PolicyConfig(kind="localagreement"))) is LocalAgreementPolicy
    with pytest.raises(ValueError, match="unknown streaming policy"):
        make_policy("s", PolicyConfig(kind="waitk"))


# -- through the engine, on a simulated clock -----------------------------------------------------
SENTENCES = phrase("and so my fellow americans.", 0.5) + phrase("ask not what your country can do for you.", 3.2) \
    + phrase("ask what you can do for your country.", 7.6)


def run_engine(script, duration_s, kind="alignatt", audio=None, policy=None, **recognizer_options):
    recognizer = AttentiveScriptedRecognizer({"Me": script}, **recognizer_options)
    clock = SimClock()
    live = LiveCaptioner(recognizer=recognizer, config=EngineConfig(policy=PolicyConfig(kind=kind, **(policy or {}))),
                         clock_ns=clock, timer_ns=clock)
    live.open_stream("Me")
    samples = render_speech(script, duration_s) if audio is None else audio
    updates = feed(live, clock, {"Me": samples})
    updates += finish_all(live, clock)
    return updates, recognizer


def test_engine_asks_for_attention_only_for_alignatt_streams():
    _, rec = run_engine(SENTENCES[:5], 4.0)
    _, rec_la = run_engine(SENTENCES[:5], 4.0, kind="localagreement")
    assert rec.alignment_asked and all(rec.alignment_asked)
    assert rec_la.alignment_asked and not any(rec_la.alignment_asked)


def test_same_audio_same_committed_lines_twice_and_lines_end_at_sentences():
    duration_s = script_end_s(SENTENCES) + 2.0
    runs = []
    for _ in range(2):
        updates, _ = run_engine(SENTENCES, duration_s, guess_s=0.3, mishear={2: ("am I", 2.0)})
        runs.append([(u.segment, u.text, round(u.start_s, 6), round(u.end_s, 6)) for u in finals(updates)])
    assert runs[0] == runs[1]
    lines: dict[int, str] = {}
    for segment, text, _, _ in runs[0]:
        lines[segment] = (lines.get(segment, "") + " " + text).strip()
    assert list(lines.values()) == ["and so my fellow americans.", "ask not what your country can do for you.",
                                    "ask what you can do for your country."]


def test_committed_words_never_change_and_context_fixes_a_mishearing():
    """The listener hears "my" as "am I" until 2 s of audio follow it: the shown partial may say
    "am I", the committed text never does, and nothing committed is ever taken back."""
    duration_s = script_end_s(SENTENCES) + 2.0
    updates, _ = run_engine(SENTENCES, duration_s, guess_s=0.3, mishear={2: ("am I", 2.0)})
    assert any("am i" in u.text.lower() for u in updates if u.kind == "partial"), "the mishearing was never shown"
    assert keys(" ".join(u.text for u in finals(updates))) == keys(SENTENCES)


def test_commits_come_sooner_than_localagreement():
    """One hypothesis against two agreeing ones (the first-words rule, which holds a sentence's
    first words for their context whatever the policy, left out)."""
    duration_s = script_end_s(SENTENCES) + 2.0
    delays = {}
    for kind in ("alignatt", "localagreement"):
        updates, _ = run_engine(SENTENCES, duration_s, kind=kind, policy={"first_context_s": 0.0})
        # per committed word: when it was committed minus when it ended
        per_word = [u.emitted_audio_s - u.end_s for u in finals(updates)]
        delays[kind] = float(np.median(per_word))
    assert delays["alignatt"] < delays["localagreement"]


@pytest.mark.parametrize("kind", ["silence", "noise", "music"])
def test_no_words_on_silence_noise_or_music(kind):
    from captioner.audio.synthetic import noise, tone

    n_s = 60.0
    if kind == "silence":
        audio = np.zeros(int(n_s * 16_000), np.float32)
    elif kind == "noise":
        audio = noise(n_s, amplitude=10 ** (-45 / 20), seed=3)
    else:
        audio = sum(tone(f, n_s, amplitude=0.05) for f in (261.63, 329.63, 392.0)).astype(np.float32)
    # The script has no words: whatever the VAD lets through, the listener hears nothing.
    updates, _ = run_engine([], n_s, audio=audio)
    assert not [u for u in updates if u.text.strip()]


# -- word times from attention --------------------------------------------------------------------
def test_dtw_finds_the_cheapest_monotonic_path():
    rng = np.random.default_rng(0)
    for _ in range(20):
        cost = rng.random((int(rng.integers(1, 7)), int(rng.integers(1, 11))))
        rows, cols = dtw(cost)
        full = np.full((cost.shape[0] + 1, cost.shape[1] + 1), np.inf)
        full[0, 0] = 0
        for i in range(1, full.shape[0]):
            for j in range(1, full.shape[1]):
                full[i, j] = cost[i - 1, j - 1] + min(full[i - 1, j - 1], full[i - 1, j], full[i, j - 1])
        assert abs(cost[rows, cols].sum() - full[-1, -1]) < 1e-9
        assert (np.diff(rows) >= 0).all() and (np.diff(cols) >= 0).all()


def test_dtw_walks_back_as_a_step_by_step_walk_does_ties_included():
    """The way back, taken a row at a time, is the walk that takes the cheapest of diagonal, up
    and left at every cell (in that order on a tie), on costs with many ties and without."""
    from captioner.engine.wordtiming import _path_back

    def walk(total):
        i, j = total.shape[0] - 1, total.shape[1] - 1
        rows, cols = [i], [j]
        while i > 0 or j > 0:
            if i == 0:
                j -= 1
            elif j == 0:
                i -= 1
            else:
                k = int(np.argmin((total[i - 1, j - 1], total[i - 1, j], total[i, j - 1])))
                i, j = (i - 1, j - 1) if k == 0 else (i - 1, j) if k == 1 else (i, j - 1)
            rows.append(i)
            cols.append(j)
        return rows[::-1], cols[::-1]

    rng = np.random.default_rng(2)
    for trial in range(400):
        cost = rng.random((int(rng.integers(1, 9)), int(rng.integers(1, 14))))
        if trial % 2:
            cost = np.round(cost * 3) / 3  # ties everywhere
        n, m = cost.shape
        total = np.full((n, m), np.inf)
        for i in range(n):
            for j in range(m):
                before = [total[i - 1, j - 1] if i and j else np.inf, total[i - 1, j] if i else np.inf,
                          total[i, j - 1] if j else np.inf]
                total[i, j] = cost[i, j] + (0.0 if i == j == 0 else min(before))
        rows, cols = _path_back(total)
        assert (list(rows), list(cols)) == walk(total)


def test_the_attention_median_is_numpys_median_over_seven_frames():
    from captioner.engine.wordtiming import _median_filter

    rng = np.random.default_rng(3)
    for shape in ((8, 40, 1200), (2, 7), (1, 9), (3, 2, 30)):
        x = rng.random(shape)
        x[..., ::3] = np.round(x[..., ::3] * 2) / 2  # ties
        padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(3, 3)], mode="reflect")
        expected = np.median(np.lib.stride_tricks.sliding_window_view(padded, 7, axis=-1), axis=-1)
        assert np.array_equal(_median_filter(x, 7), expected)


def test_token_times_follow_the_attention_inside_the_audio():
    """Scripted attention: token k looks at frames around 20 + 15 k (plus noise) over 8 heads;
    the end token looks into the padding. Times come out increasing, inside the audio, near the
    scripted frames."""
    rng = np.random.default_rng(1)
    n_tokens, n_frames, heads = 6, 1500, 8
    centres = [20 + 15 * k for k in range(n_tokens)] + [1490]
    rows = np.zeros((n_tokens + 1, heads, n_frames), np.float32)
    frames = np.arange(n_frames)
    for k, c in enumerate(centres):
        for h in range(heads):
            bump = np.exp(-0.5 * ((frames - c - rng.normal(0, 1)) / 3.0) ** 2) + 1e-3 * rng.random(n_frames)
            rows[k, h] = bump / bump.sum()
    assert list(attended_frames(rows)[:n_tokens]) == pytest.approx(centres[:n_tokens], abs=3)
    audio_frames = 120
    starts, ends = token_times(rows, audio_frames, ended=True)
    assert len(starts) == n_tokens and (np.diff(starts) > 0).all() and (ends >= starts).all()
    assert ends[-1] <= audio_frames * 0.02 + 1e-9
    # each token starts within 4 frames (80 ms) before its centre
    for k in range(1, n_tokens):
        assert abs(starts[k] - 0.02 * (centres[k] - 7)) < 0.1


def test_word_times_of_scripted_words_lie_inside_their_segment_and_increase():
    script = phrase("one two three four five six", 0.5)
    updates, _ = run_engine(script, script_end_s(script) + 2.0)
    spans = [(u.start_s, u.end_s) for u in finals(updates)]
    assert spans and all(a <= b for a, b in spans)
    assert all(spans[i][1] <= spans[i + 1][0] + 1e-6 for i in range(len(spans) - 1))
    assert spans[0][0] >= script[0].start_s - 1e-6 and spans[-1][1] <= script[-1].end_s + 1e-6



def test_auto_takes_the_default_of_the_device_class():
    from captioner.engine.policy.presets import DEFAULT_BY_DEVICE, resolve

    auto = PolicyConfig(kind="auto")
    for provider, device_class in (("CUDAExecutionProvider", "cuda"), ("CPUExecutionProvider", "cpu")):
        assert resolve(auto, provider) == resolve(PolicyConfig(kind=DEFAULT_BY_DEVICE[device_class]), provider)
    # CUDA: the GPU preset, AlignAtt with its closing-window overlap (docs/latency.md)
    gpu = resolve(auto, "CUDAExecutionProvider")
    assert gpu.kind == "alignatt" and gpu.close_overlap_s > 0 and gpu.first_context_s < PolicyConfig().first_context_s
    assert gpu.sentence_context_s < gpu.first_context_s
    assert resolve(PolicyConfig(kind="alignatt"), "CPUExecutionProvider").kind == "alignatt"
    with pytest.raises(ValueError):
        make_policy("s", auto)  # unresolved


def test_a_rejected_long_window_is_heard_again_from_the_committed_words_at_the_pause():
    """Whisper loops on a long window of crosstalk ("a real estate company, or a real estate
    company"): the guards reject it, and with it the words after the committed ones. At the next
    pause the segment closes with a window of its own, from the committed words on, which hears
    them: no word is lost."""
    script = phrase("so I was wondering", 0.5) + phrase("whether we could put a screen on it", 2.6)
    end_s = script_end_s(script)

    def loops(request, heard):  # every window that spans both phrases loops
        return "repetition" if request.start_s < 1.0 and request.start_s + request.log_mel.shape[1] / 100 > 4.0 else None

    updates, recognizer = run_engine(script, end_s + 3.0, reject=loops, policy={"first_context_s": 0.0})
    assert recognizer.rejected, "no window was rejected"
    assert keys(" ".join(u.text for u in finals(updates))) == keys(script)
