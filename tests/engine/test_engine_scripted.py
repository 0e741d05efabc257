"""The streaming engine driven through the public API with a scripted recognizer.

No model runs: :class:`~scripted.ScriptedRecognizer` answers each window with the scripted
words it can hear, so these tests check the engine's own paths (VAD segmenting, gaps, model
swap, batching, stream limits, backlog) in milliseconds. Audio is synthetic "speech" where the
script has words and room noise elsewhere, handed over in chunks on a simulated clock.
"""

from __future__ import annotations

import numpy as np
import pytest
from scripted import (
    ScriptedRecognizer,
    ScriptWord,
    click,
    feed,
    finals,
    finish_all,
    keys,
    phrase,
    render_speech,
    script_end_s,
)

from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.simulate import SimClock
from captioner.events import FRAMES_PER_S, SAMPLE_RATE_HZ

TIME_EPS_S = 1e-6


def make_live(recognizer: ScriptedRecognizer, clock: SimClock, config: EngineConfig | None = None,
              **kwargs) -> LiveCaptioner:
    return LiveCaptioner(recognizer=recognizer, config=config, clock_ns=clock, timer_ns=clock, **kwargs)


def caption(script: dict[str, list[ScriptWord]], duration_s: float, **recognizer_options):
    """Open one stream per script entry, feed each its rendered audio live, finish; returns
    (updates, recognizer, captioner)."""
    recognizer = ScriptedRecognizer(script, **recognizer_options)
    clock = SimClock()
    live = make_live(recognizer, clock)
    for label in script:
        live.open_stream(label)
    audio = {label: render_speech(words, duration_s, seed=i) for i, (label, words) in enumerate(script.items())}
    updates = feed(live, clock, audio)
    updates += finish_all(live, clock)
    return updates, recognizer, live


def committed_keys(updates, stream: str | None = None) -> list[str]:
    return keys(" ".join(u.text for u in finals(updates, stream)))


def check_shown_text_follows_script(updates, script_keys: list[str], stream: str) -> None:
    """At every update what the screen shows (committed + partial) is a prefix of the script,
    and committed text only grows."""
    committed: list[str] = []
    for u in (u for u in updates if u.stream == stream):
        if u.kind == "final":
            assert u.text.strip(), "an empty final"
            committed += keys(u.text)
            assert committed == script_keys[:len(committed)], (u, committed)
        else:
            shown = committed + keys(u.text)
            assert shown == script_keys[:len(shown)], (u, committed)


TWO_PHRASES = phrase("the quick brown fox.", 1.0) + phrase("jumps over the lazy dog", 3.5)


# -- segmenting -----------------------------------------------------------------------------------
def test_two_phrases_split_by_a_pause_are_two_segments_in_order_with_their_audio_times():
    """A sentence's end ends a line (the default policy's rule): each phrase comes out as its
    own committed segment, in order, and each final's times are those of its words' audio."""
    assert TWO_PHRASES[4].start_s - TWO_PHRASES[3].end_s > EngineConfig().pause_s
    updates, _, _ = caption({"Me": TWO_PHRASES}, 7.0)
    done = finals(updates)
    segments = sorted({u.segment for u in done})
    assert len(segments) == 2
    by_segment = [[u for u in done if u.segment == seg] for seg in segments]
    assert [keys(" ".join(u.text for u in seg)) for seg in by_segment] == [keys(TWO_PHRASES[:4]), keys(TWO_PHRASES[4:])]
    assert [u.segment for u in done] == sorted(u.segment for u in done)
    for seg, words in zip(by_segment, (TWO_PHRASES[:4], TWO_PHRASES[4:])):
        assert seg[0].start_s == pytest.approx(words[0].start_s, abs=TIME_EPS_S)
        assert seg[-1].end_s == pytest.approx(words[-1].end_s, abs=TIME_EPS_S)
        for u in seg:
            assert words[0].start_s - TIME_EPS_S <= u.start_s < u.end_s <= words[-1].end_s + TIME_EPS_S
            assert u.end_s <= u.emitted_audio_s  # nothing is committed before it was heard
    # The first phrase is final before the second one is.
    assert by_segment[0][-1].emitted_audio_s < by_segment[1][0].emitted_audio_s


def test_a_hesitation_keeps_the_segment_and_its_audio_open_until_a_long_silence():
    """The same pause with no sentence's end before it (a hesitation): the words before it are
    committed at the pause, the window goes on holding them while the next words are spoken, and
    only a silence of ``long_pause_s`` closes the segment."""
    words = phrase("the quick brown fox", 1.0) + phrase("jumps over the lazy dog", 3.5)
    recognizer = ScriptedRecognizer({"Me": words})
    clock = SimClock()
    live = make_live(recognizer, clock)
    live.open_stream("Me")
    long_pause_s = PolicyConfig().long_pause_s
    updates = feed(live, clock, {"Me": render_speech(words, words[-1].end_s + long_pause_s + 1.0)})
    done = finals(updates)
    assert keys(" ".join(u.text for u in done)) == keys(words)
    # "fox" is committed during the pause (LocalAgreement: by the update after the one at the
    # pause, which agrees with it), before "jumps" is...
    fox = next(u for u in done if "fox" in u.text)
    jumps = next(u for u in done if "jumps" in u.text)
    assert fox.emitted_audio_s < jumps.emitted_audio_s
    # ...and the windows that hear "jumps over the lazy dog" still start before "the quick".
    second = [r for r in recognizer.requests if r.end_s > words[5].end_s]
    assert second and all(r.start_s <= words[0].start_s for r in second)
    # One segment: the silence after "dog" closed it, after long_pause_s and not before.
    assert {u.segment for u in done} == {0}
    assert not live.engine._streams["Me"].policy.has_pending_text
    assert all(r.end_s < words[-1].end_s + long_pause_s + 0.2 for r in recognizer.requests)


def test_a_pause_kept_inside_a_segment_is_no_update_interval():
    """Admission and the capacity benchmark count the waits of a stream with speech to update:
    a 3 s pause inside one segment is not an interval of 3 s."""
    first = phrase("the quick brown fox", 1.0)
    words = first + phrase("jumps over the lazy dog", first[-1].end_s + 3.0)
    assert words[4].start_s - words[3].end_s < PolicyConfig().long_pause_s
    clock = SimClock()
    live = make_live(ScriptedRecognizer({"Me": words}), clock)
    live.open_stream("Me")
    live.engine.interval_log = intervals = []
    updates = feed(live, clock, {"Me": render_speech(words, words[-1].end_s + 1.0)})
    assert {u.segment for u in finals(updates)} == {0}
    # The segment's updates stop for the pause (its words committed, nothing to update)...
    times = sorted({u.emitted_audio_s for u in updates})
    assert max(b - a for a, b in zip(times, times[1:])) >= 2.0
    # ...and the engine counts no interval across it.
    base_s = live.engine.config.scheduler.base_interval_s
    assert len(intervals) >= 3 and max(intervals) <= base_s + 0.2


def test_pure_silence_asks_the_model_nothing_and_emits_no_update():
    """Room noise alone never opens a segment: no model step, no update, even at finish."""
    recognizer = ScriptedRecognizer({"Me": []})
    clock = SimClock()
    live = make_live(recognizer, clock)
    live.open_stream("Me")
    updates = feed(live, clock, {"Me": render_speech([], 5.0)})
    updates += finish_all(live, clock)
    assert updates == []
    assert recognizer.requests == []
    assert live.engine.steps == 0


def test_a_click_shorter_than_min_speech_asks_the_model_nothing():
    """A 40 ms click (loud enough to pass the VAD's onset) is less speech than ``min_speech_s``:
    its segment is dropped without a model step."""
    click_s = 0.04
    assert click_s < EngineConfig().min_speech_s
    recognizer = ScriptedRecognizer({"Me": []})
    clock = SimClock()
    live = make_live(recognizer, clock)
    live.open_stream("Me")
    updates = feed(live, clock, {"Me": click(1.0, click_s, 3.0)})
    updates += finish_all(live, clock)
    assert updates == []
    assert recognizer.requests == []


def test_committed_text_never_changes_and_partials_continue_it():
    """Finals concatenate to exactly the script's words (nothing repeated, lost or rewritten),
    and every partial continues the committed text with the script's next words."""
    words = phrase("she sells sea shells by the sea shore", 0.8) + phrase("the shells she sells are surely seashells", 5.0)
    updates, _, _ = caption({"Me": words}, script_end_s(words) + 1.5)
    assert committed_keys(updates) == keys(words)
    assert any(u.kind == "partial" and u.text for u in updates), "no partial was ever shown"
    check_shown_text_follows_script(updates, keys(words), "Me")


def test_rejected_hypotheses_never_reach_the_screen_nor_the_prompt():
    """Hypotheses the guards reject (here: any that holds the phrase "ghost ...") show nothing;
    the phrases around them are captioned, and the next window's prompt skips the rejected text."""
    ghost = phrase("ghost voices whisper", 3.5)
    words = phrase("hello there friend", 1.0) + ghost + phrase("good bye now", 6.5)
    ghost_keys = set(keys(ghost))
    reject = lambda request, heard: "no_speech" if ghost_keys & set(keys(heard)) else None
    updates, recognizer, _ = caption({"Me": words}, 9.0, reject=reject)
    assert recognizer.rejected, "the guard was never exercised"
    assert committed_keys(updates) == keys(words[:3] + words[6:])
    for u in updates:
        assert not ghost_keys & set(keys(u.text)), u
    last_prompts = [r.prompt for r in recognizer.requests if r.start_s > ghost[-1].end_s]
    assert last_prompts and all(keys(p) == keys(words[:3]) for p in last_prompts)


# -- gaps -----------------------------------------------------------------------------------------
GAP_WORDS = phrase("red green blue", 1.0) + phrase("cat dog bird", 5.0) + phrase("oak elm ash", 8.0)
LOST_FROM_S, LOST_TO_S = 2.5, 4.5


def feed_with_lost_audio(mark_gap: bool):
    """Feed GAP_WORDS' audio live, losing [LOST_FROM_S, LOST_TO_S); with ``mark_gap`` the chunk
    after the loss says where it belongs (``first_sample``), else it just follows."""
    recognizer = ScriptedRecognizer({"Me": GAP_WORDS})
    clock = SimClock()
    live = make_live(recognizer, clock)
    stream = live.open_stream("Me")
    audio = render_speech(GAP_WORDS, 10.0)
    updates = feed(live, clock, {"Me": audio}, stop_s=LOST_FROM_S)
    clock.advance(LOST_TO_S - LOST_FROM_S)
    chunk = int(0.05 * SAMPLE_RATE_HZ)
    for at in range(int(LOST_TO_S * SAMPLE_RATE_HZ), audio.shape[0], chunk):
        clock.advance(0.05)
        stream.accept_waveform(SAMPLE_RATE_HZ, audio[at:at + chunk], capture_ns=clock(),
                               first_sample=at if mark_gap else None)
        updates += live.step()
    dropped_frames = live.status().dropped_frames
    updates += finish_all(live, clock)
    return updates, dropped_frames


def test_lost_audio_marked_by_first_sample_keeps_stream_time_exact_and_is_counted():
    """A jump in ``first_sample`` becomes silence on the stream clock: words after the loss are
    captioned at their true times, and ``dropped_frames`` counts the lost 10 ms frames."""
    updates, dropped_frames = feed_with_lost_audio(mark_gap=True)
    assert dropped_frames == round((LOST_TO_S - LOST_FROM_S) * FRAMES_PER_S)
    assert committed_keys(updates) == keys(GAP_WORDS)
    done = finals(updates)
    for words in (GAP_WORDS[3:6], GAP_WORDS[6:]):
        mine = [u for u in done if keys(u.text)[0] in keys(words)]
        assert mine[0].start_s == pytest.approx(words[0].start_s, abs=TIME_EPS_S)
        assert mine[-1].end_s == pytest.approx(words[-1].end_s, abs=TIME_EPS_S)


def test_unmarked_loss_shifts_the_audio_and_the_listener_notices():
    """Control for the test above: the scripted listener checks the audio it is handed, so when
    lost audio is not marked (the stream clock silently runs 2 s short) the later phrases are
    not heard where the script puts them."""
    updates, dropped_frames = feed_with_lost_audio(mark_gap=False)
    assert dropped_frames == 0
    assert committed_keys(updates) == keys(GAP_WORDS[:3])


# -- model swap -----------------------------------------------------------------------------------
SWAP_WORDS = phrase("alpha bravo charlie delta echo", 1.0) + phrase("foxtrot golf hotel india", 4.5)
SWAP_AT_S = 2.55  # in the short gap between "delta" and "echo"


def swap_mid_phrase():
    script = {"Me": SWAP_WORDS}
    old = ScriptedRecognizer(script, name="mels80")
    new = ScriptedRecognizer(script, name="mels128", n_mels=128)
    clock = SimClock()
    live = make_live(old, clock)
    live.open_stream("Me")
    audio = {"Me": render_speech(SWAP_WORDS, 7.5)}
    before = feed(live, clock, audio, stop_s=SWAP_AT_S)
    at_swap = live.set_recognizer(new)
    after = feed(live, clock, audio, start_s=SWAP_AT_S)
    return live, clock, old, new, before, at_swap, after


def test_model_swap_to_other_mel_count_commits_open_text_and_the_stream_goes_on():
    """``set_recognizer`` with a 128-mel model mid-phrase: the text open at that moment is
    committed by the old model (returned by the call), the new one gets 128-band windows that
    start where the old ones ended, and later words are captioned at their true times."""
    live, clock, old, new, before, at_swap, after = swap_mid_phrase()
    tail = finish_all(live, clock)
    heard_before = [w for w in SWAP_WORDS if w.end_s <= SWAP_AT_S]
    assert any(u.kind == "partial" and u.text for u in before), "nothing was open at the swap"
    assert keys(" ".join(u.text for u in finals(before + at_swap))) == keys(heard_before)
    assert finals(at_swap), "the swap committed nothing"
    assert at_swap[-1].kind == "final"  # which took the partial off the screen
    assert all(r.n_mels == 80 and r.end_s <= SWAP_AT_S for r in old.requests)
    assert new.requests and all(r.n_mels == 128 for r in new.requests)
    assert new.requests[0].start_s >= SWAP_AT_S - 0.02
    rest = after + tail
    assert committed_keys(rest) == keys(SWAP_WORDS[len(heard_before):])
    second = [u for u in finals(rest) if keys(u.text)[0] in keys(SWAP_WORDS[5:])]
    assert second[0].start_s == pytest.approx(SWAP_WORDS[5].start_s, abs=TIME_EPS_S)
    assert second[-1].end_s == pytest.approx(SWAP_WORDS[-1].end_s, abs=TIME_EPS_S)
    assert live.status().model == "mels128"


def test_model_swap_counts_no_dropped_frames():
    """A model swap loses no audio, so ``dropped_frames`` stays 0."""
    live, *_ = swap_mid_phrase()
    assert live.status().dropped_frames == 0


# -- stream limits and bad arguments --------------------------------------------------------------
def assert_one_line_value_error(call, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        call()
    message = str(info.value)
    assert message and "\n" not in message


def test_a_stream_past_capacity_is_a_one_line_value_error():
    """A stream that does not fit (here: a memory budget for two streams' rings above the 15 %
    floor) is refused; the open ones stay."""
    from captioner.engine.admission import AdmissionConfig
    from captioner.gpu.features import bank_bytes

    config = EngineConfig(block_streams=1)
    ring_bytes = bank_bytes(1, 80, 40, config.ring_frames, 100)
    config.admission = AdmissionConfig(vram_budget_bytes=3 * ring_bytes)
    live = make_live(ScriptedRecognizer({}), SimClock(), config)
    live.open_stream("A")
    live.open_stream("B")
    assert_one_line_value_error(lambda: live.open_stream("C"), "2 streams")
    assert list(live.streams) == ["A", "B"]


@pytest.mark.parametrize("bad", [
    "duplicate label", "empty label", "blank label", "accept after finish", "rate 4000 Hz", "NaN samples",
    "3-D samples", "rate as a string",
])
def test_bad_arguments_raise_one_line_value_errors(bad):
    """Each misuse of the public API is a ``ValueError`` with a one-line message."""
    live = make_live(ScriptedRecognizer({}), SimClock())
    me = live.open_stream("Me")
    samples = np.zeros(1600, dtype=np.float32)
    calls = {
        "duplicate label": (lambda: live.open_stream("Me"), "already open"),
        "empty label": (lambda: live.open_stream(""), "label"),
        "blank label": (lambda: live.open_stream("   "), "label"),
        "accept after finish": (lambda: (me.finish(), me.accept_waveform(SAMPLE_RATE_HZ, samples)), "finished"),
        "rate 4000 Hz": (lambda: me.accept_waveform(4000, samples), "4000"),
        "NaN samples": (lambda: me.accept_waveform(SAMPLE_RATE_HZ, np.full(1600, np.nan, np.float32)), "NaN"),
        "3-D samples": (lambda: me.accept_waveform(SAMPLE_RATE_HZ, np.zeros((160, 2, 2), np.float32)), "shape"),
        "rate as a string": (lambda: me.accept_waveform("16000", samples), "sample_rate"),
    }
    call, match = calls[bad]
    assert_one_line_value_error(call, match)


def test_close_twice_is_fine_and_step_after_close_is_a_value_error():
    """``close`` commits what is open and returns it; a second ``close`` returns nothing; any
    later ``step`` or ``open_stream`` is refused."""
    words = phrase("closing time", 0.5)
    clock = SimClock()
    live = make_live(ScriptedRecognizer({"Me": words}), clock)
    live.open_stream("Me")
    feed(live, clock, {"Me": render_speech(words, 1.3)})
    first = live.close()
    assert committed_keys(first) == keys(words)
    assert live.close() == []
    assert live.streams == {}
    assert_one_line_value_error(live.step, "closed")
    assert_one_line_value_error(lambda: live.open_stream("Again"), "closed")


# -- several streams ------------------------------------------------------------------------------
def test_streams_speaking_at_once_share_model_steps_and_keep_their_labels():
    """Two streams talking at the same time are decoded in the same batched steps, and each
    stream's updates carry its own label and its own words."""
    script = {"Alice": phrase("red green blue yellow", 1.0), "Bob": phrase("one two three four five", 1.05)}
    updates, recognizer, live = caption(script, 4.0)
    shared = [call for call in recognizer.calls if {r.stream for r in call} == {"Alice", "Bob"}]
    assert shared, [[r.stream for r in call] for call in recognizer.calls]
    assert {u.stream for u in updates} == {"Alice", "Bob"}
    for label, words in script.items():
        assert committed_keys(updates, label) == keys(words)
        check_shown_text_follows_script(updates, keys(words), label)


def test_per_stream_language_reaches_the_window_request():
    """``open_stream(label, language="de")`` with a multilingual model: that stream's windows
    ask for German and its captions say so. A stream opened without one asks for none until the
    model has detected one, and then keeps the detected language for the rest of the segment."""
    script = {"X": phrase("guten morgen zusammen", 1.0), "Y": phrase("good morning everyone", 1.0)}
    recognizer = ScriptedRecognizer(script, is_multilingual=True)
    clock = SimClock()
    live = make_live(recognizer, clock)
    live.open_stream("X", language="de")
    live.open_stream("Y")
    updates = feed(live, clock, {label: render_speech(w, 3.0) for label, w in script.items()})
    updates += finish_all(live, clock)
    assert {r.language for r in recognizer.requests if r.stream == "X"} == {"de"}
    y_languages = [r.language for r in recognizer.requests if r.stream == "Y"]
    assert len(y_languages) >= 2 and y_languages[0] is None
    assert set(y_languages[1:]) == {recognizer.languages[0]}
    assert {u.language for u in finals(updates, "X")} == {"de"}
    assert committed_keys(updates, "X") == keys(script["X"])


def test_language_the_model_lacks_is_refused_when_the_stream_opens():
    """An English-only model refuses ``language="de"`` with a one-line ``ValueError``."""
    live = make_live(ScriptedRecognizer({}), SimClock())
    assert_one_line_value_error(lambda: live.open_stream("X", language="de"), "de")
    assert live.streams == {}


# -- backlog, finish, determinism -----------------------------------------------------------------
SENTENCES = ("the birch canoe slid on the smooth planks", "glue the sheet to the dark blue background",
             "it is easy to tell the depth of a well", "these days a chicken leg is a rare dish",
             "rice is often served in round bowls", "the juice of lemons makes fine punch")


def long_script(duration_s: float, gap_s: float = 1.2) -> list[ScriptWord]:
    """Sentences one after another, ``gap_s`` of silence between them, until ``duration_s``."""
    words: list[ScriptWord] = []
    start_s, index = 1.0, 0
    while True:
        sentence = phrase(SENTENCES[index % len(SENTENCES)], start_s)
        if sentence[-1].end_s > duration_s - 1.0:
            return words
        words += sentence
        start_s, index = sentence[-1].end_s + gap_s, index + 1


def test_a_minute_handed_over_at_once_is_captioned_whole():
    """60 s of audio accepted in one call and worked off by ``step``: every scripted word is
    committed once, in order, at its own time (the backlog is fed in slices, nothing skipped)."""
    duration_s = 60.0
    words = long_script(duration_s)
    assert len(words) > 100
    recognizer = ScriptedRecognizer({"Me": words})
    clock = SimClock()
    live = make_live(recognizer, clock)
    me = live.open_stream("Me")
    clock.advance(duration_s)
    me.accept_waveform(SAMPLE_RATE_HZ, render_speech(words, duration_s), capture_ns=clock())
    assert me.pending_s == pytest.approx(duration_s)
    updates = live.step()
    assert me.pending_s == 0.0
    updates += finish_all(live, clock)
    assert committed_keys(updates) == keys(words)
    check_shown_text_follows_script(updates, keys(words), "Me")
    done = finals(updates)
    assert done[0].start_s == pytest.approx(words[0].start_s, abs=TIME_EPS_S)
    assert done[-1].end_s == pytest.approx(words[-1].end_s, abs=TIME_EPS_S)
    # Every window stays within the Whisper-sized window the policy keeps the buffer under.
    assert max(r.n_frames for r in recognizer.requests) <= 30 * FRAMES_PER_S


def test_finished_stream_is_done_leaves_and_its_label_opens_again_on_a_fresh_clock():
    """After ``finish`` the stream commits its text, turns ``done`` and leaves ``streams``; a
    new stream under the same label starts its own clock at zero."""
    words = phrase("see you later", 1.0)
    recognizer = ScriptedRecognizer({"Me": words})
    clock = SimClock()
    live = make_live(recognizer, clock)
    audio = render_speech(words, 2.3)
    first = live.open_stream("Me")
    updates = feed(live, clock, {"Me": audio})
    first.finish()
    assert not first.done and "Me" in live.streams
    for _ in range(10):
        updates += live.step()
        if first.done:
            break
    assert first.done and "Me" not in live.streams
    assert committed_keys(updates) == keys(words)

    again = live.open_stream("Me")
    assert again is not first and live.streams["Me"] is again
    n_before = len(recognizer.requests)
    repeat = feed(live, clock, {"Me": audio}) + finish_all(live, clock)
    assert committed_keys(repeat) == keys(words)
    assert finals(repeat)[0].start_s == pytest.approx(words[0].start_s, abs=TIME_EPS_S)
    assert recognizer.requests[n_before].start_s == recognizer.requests[0].start_s


def test_the_same_script_twice_gives_identical_updates():
    """The engine on a simulated clock is deterministic: two runs, equal updates (text, times,
    segments, emission times) and equal requests."""
    words = phrase("one small step for a man", 0.7) + phrase("one giant leap for mankind", 4.2)
    first, rec1, _ = caption({"Me": words, "You": words[3:]}, 7.0)
    second, rec2, _ = caption({"Me": words, "You": words[3:]}, 7.0)
    assert first and first == second
    assert rec1.requests == rec2.requests
