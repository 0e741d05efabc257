"""A step's text work folded while the next step encodes (EngineConfig.overlap_updates).

On a GPU the engine thread waits while the encoder runs (20 ms for 100 windows on an H200); the
previous step's hypotheses are folded into the streams' policies in that time instead of between
the steps. These tests hold the bookkeeping to the plain order on the CPU: the same captions for
every stream, in the same order, one tick later at most, nothing lost when a stream ends while its
hypothesis is held, and no holding back where nothing overlaps or the load is light."""

from __future__ import annotations

import numpy as np
import pytest
from scripted import (
    ScriptedRecognizer,
    feed,
    finals,
    finish_all,
    keys,
    phrase,
    render_speech,
)

from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.scheduler import SchedulerConfig
from captioner.engine.simulate import ChargedRecognizer, SimClock


class OverlappingScripted(ScriptedRecognizer):
    """The scripted recognizer with the overlap hook: ``while_encoding`` runs in the middle of
    decode (where the real one runs it during the encoder), and every call is logged."""

    def __init__(self, script, overlaps: bool = False, **kwargs) -> None:
        super().__init__(script, **kwargs)
        self.overlaps_host_work = overlaps
        self.hooked: list[bool] = []
        self.in_hook = False

    def decode(self, requests, while_encoding=None):
        self.hooked.append(while_encoding is not None)
        if while_encoding is not None:
            self.in_hook = True
            try:
                while_encoding()
            finally:
                self.in_hook = False
        return super().decode(requests)


class ReadLater:
    """What ``decode_pending`` gives: the hypotheses, read when asked (where is logged)."""

    def __init__(self, recognizer: ReadingLater, hypotheses) -> None:
        self._recognizer = recognizer
        self._hypotheses = hypotheses

    def hypotheses(self):
        self._recognizer.reads.append(self._recognizer.in_hook)
        return self._hypotheses


class ReadingLater(OverlappingScripted):
    """...with ``decode_pending`` as the real recognizer has it: the engine holding a step back
    reads its hypotheses at the fold. ``reads`` logs, per read, whether it ran during a later
    decode's encoding."""

    def __init__(self, script, overlaps: bool = False, **kwargs) -> None:
        super().__init__(script, overlaps=overlaps, **kwargs)
        self.reads: list[bool] = []
        self.pending_calls = 0

    def decode_pending(self, requests, while_encoding=None):
        self.pending_calls += 1
        return ReadLater(self, self.decode(requests, while_encoding))


def run(mode: str, n: int = 120, overlaps: bool = False, per_window_s: float = 0.002, audio_s: float = 6.0,
        stop_s: float | None = None, stop_when_held: bool = False, read_later: bool = False):
    """Stream ``n`` scripted speakers; with ``stop_s`` the audio ends there, or (``stop_when_held``)
    at the first tick from ``stop_s`` on that holds hypotheses back; ``read_later``: the
    recognizer has ``decode_pending``. Returns the script, the updates, the recognizer, the
    captioner, whether hypotheses were held when the audio ended, and where it ended (s)."""
    script = {f"s{i:03d}": phrase(f"stream {i} folds its words later", 0.4 + 0.05 * (i % 20)) for i in range(n)}
    audio = {label: render_speech(words, audio_s, seed=i % 5) for i, (label, words) in enumerate(script.items())}
    recognizer = (ReadingLater if read_later else OverlappingScripted)(script, overlaps=overlaps)
    clock = SimClock()
    config = EngineConfig(overlap_updates=mode, scheduler=SchedulerConfig(base_interval_s=1.0, max_batch=256))
    live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock, config=config)
    live.engine.recognizer = ChargedRecognizer(recognizer, clock, lambda rows: 0.04 + per_window_s * rows)
    for label in script:
        live.open_stream(label)
    if stop_s is None:
        updates = feed(live, clock, audio, chunk_s=0.05)
        end_s = audio_s
    else:
        updates, end_s = [], 0.0
        while end_s < audio_s - 1e-9:
            updates += feed(live, clock, audio, chunk_s=0.05, start_s=end_s, stop_s=end_s + 0.05)
            end_s = round(end_s + 0.05, 6)
            if end_s >= stop_s and (not stop_when_held or live.engine._pending is not None):
                break
    held_before_end = live.engine._pending is not None
    updates += finish_all(live, clock)
    return script, updates, recognizer, live, held_before_end, end_s


def per_stream(updates, label):
    return [(u.kind, u.text, u.segment) for u in updates if u.stream == label]


def audio_times(updates, label):
    return [u.emitted_audio_s for u in updates if u.stream == label]


@pytest.mark.parametrize("read_later", [False, True], ids=["read-at-step", "read-at-fold"])
def test_folding_during_the_next_step_gives_every_stream_the_same_captions_in_order(read_later):
    script, plain, *_ = run("off", read_later=read_later)
    _, held, recognizer, live, *_ = run("on", read_later=read_later)
    assert any(recognizer.hooked) and live.engine.overlapped_steps == sum(recognizer.hooked)
    if read_later:
        # Every held step was read once: during the next step's encoding wherever one followed
        # (the others at a tick with nothing due, or at the streams' ends).
        assert len(recognizer.reads) == recognizer.pending_calls > 10
        assert sum(recognizer.reads) == sum(recognizer.hooked) >= 8
    for label, words in script.items():
        assert keys(" ".join(u.text for u in finals(held, label))) == keys(words), label
        assert per_stream(held, label) == per_stream(plain, label), label
        # A held stream sits out one tick (its policy has not seen its hypothesis): an update
        # may come from a window a tick (50 ms here) longer, never from a shorter one.
        for a, b in zip(audio_times(plain, label), audio_times(held, label)):
            assert a - 1e-9 <= b <= a + 0.1 + 1e-9, label


def test_held_updates_are_dated_by_the_step_that_hands_them_over():
    """Streams' clocks start at the simulated clock's 0, so an update's ``emitted_wall_s`` is
    the clock when it was dated: a held update is dated after the call before the one that
    returns it, and never after that call returns (not when its hypothesis was decoded)."""
    script = {f"s{i:03d}": phrase(f"stream {i} is dated", 0.4 + 0.05 * (i % 20)) for i in range(120)}
    audio = {label: render_speech(words, 4.0, seed=i % 5) for i, (label, words) in enumerate(script.items())}
    recognizer = OverlappingScripted(script)
    clock = SimClock()
    live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock,
                         config=EngineConfig(overlap_updates="on"))
    live.engine.recognizer = ChargedRecognizer(recognizer, clock, lambda rows: 0.04 + 0.002 * rows)
    for label in script:
        live.open_stream(label)
    start_s = clock() / 1e9  # the streams' sample 0
    previous_s, checked = 0.0, 0
    for at in range(0, 4 * 16000, 800):
        clock.advance(0.05)
        for label, samples in audio.items():
            live.streams[label].accept_waveform(16000, samples[at:at + 800], capture_ns=clock())
        before_s = clock() / 1e9 - start_s
        updates = live.step()
        returned_s = clock() / 1e9 - start_s
        for u in updates:
            assert previous_s - 1e-9 <= u.emitted_wall_s <= returned_s + 1e-9, (u, previous_s, returned_s)
            checked += 1
        previous_s = before_s
    assert checked > 100 and live.engine.overlapped_steps > 0


@pytest.mark.parametrize("read_later", [False, True], ids=["read-at-step", "read-at-fold"])
def test_a_stream_that_ends_while_its_hypothesis_is_held_loses_nothing(read_later):
    """The audio stops mid-sentence, right after a step whose hypotheses were held back: every
    stream commits what the plain order commits from the same audio."""
    script, held, _, live, held_before_end, end_s = run("on", n=40, stop_s=2.6, stop_when_held=True,
                                                        read_later=read_later)
    _, plain, *_ = run("off", n=40, stop_s=end_s)
    assert held_before_end and end_s < 3.5 and live.engine._pending is None
    for label in script:
        said = keys(" ".join(u.text for u in finals(held, label)))
        assert said and said == keys(" ".join(u.text for u in finals(plain, label))), label


def test_nothing_is_held_back_where_nothing_overlaps_or_the_load_is_light():
    _, _, recognizer, live, *_ = run("auto", overlaps=False)  # the CPU: the fold would only add latency
    assert not any(recognizer.hooked) and live.engine.overlapped_steps == 0
    _, _, recognizer, live, *_ = run("auto", n=2, overlaps=True)  # two streams: load far under 0.5
    assert live.engine._last_load is not None and live.engine._last_load < 0.5
    assert not any(recognizer.hooked)
    _, _, recognizer, live, *_ = run("auto", overlaps=True, per_window_s=0.004)  # 120 streams: load over 0.5
    assert live.engine._last_load >= EngineConfig().overlap_min_load
    assert any(recognizer.hooked)


def test_an_idle_step_call_folds_what_is_held():
    """No audio waiting, no tick: LiveCaptioner.step folds the held hypotheses itself, so a
    caller whose audio stopped still gets them."""
    script = {"a": phrase("held words come out", 0.4)}
    recognizer = OverlappingScripted(script)
    clock = SimClock()
    live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock,
                         config=EngineConfig(overlap_updates="on"))
    live.open_stream("a")
    samples = render_speech(script["a"], 3.0)
    updates, held = [], False
    for at in range(0, samples.size, 800):
        clock.advance(0.05)
        live.streams["a"].accept_waveform(16000, samples[at:at + 800], capture_ns=clock())
        updates += live.step()
        if live.engine._pending is not None:
            held = True
            break
    updates += live.step()  # nothing waiting
    assert held and live.engine._pending is None
    assert updates and updates[-1].text  # the held update came out


def test_bad_setting_is_a_value_error():
    with pytest.raises(ValueError, match="overlap_updates"):
        LiveCaptioner(recognizer=OverlappingScripted({}), config=EngineConfig(overlap_updates="sometimes"))


# -- the real recognizer -----------------------------------------------------------------------
JFK = "en_jfk_inaugural_excerpt"


def test_the_recognizer_does_the_work_once_after_queueing_the_encoder_and_decodes_the_same(tiny_en_cpu, speech_clips):
    """tiny.en on the CPU: ``while_encoding`` runs once per decode, after the encoder has run (on
    CUDA: been queued), whatever the batch; the hypotheses are the plain decode's."""
    from captioner.audio.file_source import read_audio_16k
    from captioner.engine.recognizer import WindowRequest
    from captioner.gpu.features_ref import log_mel_spectrogram

    _, recognizer = tiny_en_cpu
    audio = read_audio_16k(speech_clips[JFK].wav)
    windows = [np.asarray(log_mel_spectrogram(audio[16_000 * a:16_000 * b], n_mels=recognizer.n_mels))
               for a, b in ((0, 4), (2, 9))]
    requests = [WindowRequest(f"s{i}", w, 0.0, "", None) for i, w in enumerate(windows)]
    encoders = recognizer.runtime.graph_models()["encoder"]
    seen = []
    plain = recognizer.decode(requests)
    got = recognizer.decode(requests, while_encoding=lambda: seen.append(sum(m.runs for m in encoders)))
    assert [h.words for h in got] == [h.words for h in plain] and got[0].words
    runs_before = sum(m.runs for m in encoders)
    assert len(seen) == 1 and seen[0] == runs_before  # after this decode's one encoder run
    assert not recognizer.overlaps_host_work  # the CPU: nothing runs beside the model
    recognizer.decode([], while_encoding=lambda: seen.append(-1))
    assert seen[-1] == -1  # no windows: the work is still done


def test_the_runtime_runs_the_work_between_queueing_the_encoder_and_waiting_for_it(tiny_en_cpu, speech_clips):
    from captioner.models.runtime import Overlap

    _, recognizer = tiny_en_cpu
    runtime = recognizer.runtime
    mel = np.zeros((3, recognizer.n_mels, 3000), np.float32)
    order: list[str] = []
    plain = runtime.encode(mel)
    plain_states = np.array(plain.value.numpy() if hasattr(plain.value, "numpy") else plain.value)[:3].copy()
    overlap = Overlap(lambda: order.append("work"), lambda: order.append("wait"))
    enc = runtime.encode(mel, overlap)
    states = np.array(enc.value.numpy() if hasattr(enc.value, "numpy") else enc.value)[:3]
    assert overlap.done and order == (["work", "wait"] if runtime.step_model is not None else ["work"])
    np.testing.assert_array_equal(states, plain_states)
    runtime.encode(mel, overlap)
    assert order.count("work") == 1  # once, however many encodes follow


def test_a_held_segment_keeps_its_detected_language_through_its_close():
    """A multilingual model's language of a segment is noted when its hypothesis is read, which
    a held step does at the fold, after the segment may have closed: the stream's last language
    is the one detected, as in the plain order."""
    def last_languages(mode: str) -> dict[str, str | None]:
        # One short word and a pause: the segment's closing update is its only one.
        script = {f"s{i}": phrase("hallo", 0.4 + 0.1 * i, word_s=0.4) for i in range(12)}
        # Long enough for the silence after the word to close each segment.
        audio = {label: render_speech(words, 2.5 + PolicyConfig().long_pause_s, seed=i % 5)
                 for i, (label, words) in enumerate(script.items())}
        recognizer = ReadingLater(script, overlaps=True, is_multilingual=True, languages=("de", "en"))
        clock = SimClock()
        live = LiveCaptioner(recognizer=recognizer, clock_ns=clock, timer_ns=clock,
                             config=EngineConfig(overlap_updates=mode))
        live.engine.recognizer = ChargedRecognizer(recognizer, clock, lambda rows: 0.04 + 0.002 * rows)
        for label in script:
            live.open_stream(label)  # no language: detected per segment
        feed(live, clock, audio, chunk_s=0.05)
        if mode == "on":
            assert len(recognizer.reads) == recognizer.pending_calls > 0  # each held step read at its fold
        return {name: s.last_language for name, s in live.engine._streams.items()}

    assert last_languages("on") == last_languages("off") == {f"s{i}": "de" for i in range(12)}


def test_the_recognizer_reads_put_off_hypotheses_without_the_model(tiny_en_cpu, speech_clips):
    """``decode_pending`` runs every graph before it returns; reading its hypotheses later runs
    none and gives the plain decode's hypotheses, once."""
    from captioner.audio.file_source import read_audio_16k
    from captioner.engine.recognizer import WindowRequest
    from captioner.gpu.features_ref import log_mel_spectrogram

    _, recognizer = tiny_en_cpu
    audio = read_audio_16k(speech_clips[JFK].wav)
    windows = [np.asarray(log_mel_spectrogram(audio[16_000 * a:16_000 * b], n_mels=recognizer.n_mels))
               for a, b in ((0, 5), (3, 10))]
    requests = [WindowRequest(f"s{i}", w, 0.0, "", None) for i, w in enumerate(windows)]
    plain = recognizer.decode(requests)
    pending = recognizer.decode_pending(requests)
    runs = sum(n for n, _ in recognizer.runtime.graph_runs().values())
    got = pending.hypotheses()
    assert sum(n for n, _ in recognizer.runtime.graph_runs().values()) == runs
    assert got == plain and got[0].words and got[1].tokens
    assert pending.hypotheses() is got
