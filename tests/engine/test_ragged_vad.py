"""Streams fed ragged amounts of audio (network clients: one has 3 new frames at a step, another
40) step the VAD bank in one ragged call instead of one push per distinct count; the captions,
their times and the streams' silences are those of the grouped pushes."""

from __future__ import annotations

import numpy as np
from scripted import ScriptedRecognizer, keys, phrase, render_speech
from test_engine_scripted import make_live

import captioner.engine.vad_bank as vad_bank
from captioner.engine.simulate import SimClock
from captioner.engine.vad_bank import VadBank
from captioner.events import SAMPLE_RATE_HZ

DURATION_S = 8.0
SCRIPTS = {f"s{k}": phrase(text, 0.8 + 0.35 * k) for k, text in enumerate((
    "the birch canoe slid on the smooth planks", "glue the sheet to the dark blue background",
    "it is easy to tell the depth of a well", "these days a chicken leg is a rare dish",
    "rice is often served in round bowls", "the juice of lemons makes fine punch"))}


def _caption(counts_before_ragged: int, monkeypatch) -> tuple[list[tuple], list[tuple], int]:
    """Each stream fed its own chunk sizes (10 to 230 ms, drawn per stream per round), the
    engine stepped after every round; the updates, every stream's silence after each round, and
    how many times the VAD bank was pushed."""
    monkeypatch.setattr(vad_bank, "RAGGED_COUNTS", counts_before_ragged)
    pushes = [0]
    push = VadBank.push

    def counted(self, *args, **kwargs):
        pushes[0] += 1
        return push(self, *args, **kwargs)

    monkeypatch.setattr(VadBank, "push", counted)
    clock = SimClock()
    live = make_live(ScriptedRecognizer(dict(SCRIPTS)), clock)
    audio = {label: render_speech(words, DURATION_S, seed=k) for k, (label, words) in enumerate(SCRIPTS.items())}
    streams = {label: live.open_stream(label) for label in SCRIPTS}
    fed = dict.fromkeys(SCRIPTS, 0)
    rng = np.random.default_rng(3)
    updates, silences = [], []
    total = int(DURATION_S * SAMPLE_RATE_HZ)
    while min(fed.values()) < total:
        clock.advance(0.05)
        for label, stream in streams.items():
            n = int(rng.choice([160, 480, 800, 1600, 1600, 2400, 3680]))
            piece = audio[label][fed[label]:fed[label] + n]
            if piece.size:
                stream.accept_waveform(SAMPLE_RATE_HZ, piece, capture_ns=clock())
                fed[label] += piece.size
        updates += live.step()
        silences.append(tuple(live.engine.vad.silence_frames(live.engine._streams[label].vad_row)
                              for label in SCRIPTS))
    for stream in streams.values():
        stream.finish()
    for _ in range(40):
        clock.advance(0.05)
        updates += live.step()
    return [(u.stream, u.kind, u.text, u.start_s, u.end_s) for u in updates], silences, pushes[0]


def test_ragged_arrival_steps_the_vad_as_grouped_pushes_do(monkeypatch):
    grouped = _caption(1000, monkeypatch)  # one push per distinct count, always
    ragged = _caption(0, monkeypatch)  # push_ragged at every step
    assert ragged[:2] == grouped[:2]
    assert ragged[2] != grouped[2]  # the two paths did differ in how they pushed
    finals: dict[str, list[str]] = {}
    for stream, kind, text, *_ in ragged[0]:
        if kind == "final":
            finals.setdefault(stream, []).extend(keys(text))
    assert finals == {label: keys(words) for label, words in SCRIPTS.items()}


def test_a_ragged_step_pushes_once_per_bit_of_the_largest_count():
    bank = VadBank()
    rows = [bank.acquire() for _ in range(40)]
    counts = [1 + (7 * k) % 23 for k in range(40)]  # 1..23 frames: 23 distinct counts
    pushes = []
    push = bank.push
    bank.push = lambda r, e, c=None: pushes.append(len(r)) or push(r, e, c)
    bank.push_ragged(rows, counts, np.full(sum(counts), -70.0), np.zeros(sum(counts)))
    assert len(pushes) == 5  # 16, 8, 4, 2, 1 (23 = 0b10111)
    assert bank.frames_seen[rows].tolist() == counts
