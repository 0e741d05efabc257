"""VadBank decides exactly as VoiceActivity (its specification), for many streams at once."""

from __future__ import annotations

import numpy as np
import pytest

from captioner.engine.vad import VadConfig, VoiceActivity
from captioner.engine.vad_bank import VadBank


def _energies(rng, n_frames: int) -> np.ndarray:
    """Room noise near -70 dB with bursts of "speech" near -25 dB and single loud clicks:
    onsets, hangovers, floors that move."""
    e = rng.normal(-70.0, 2.0, n_frames)
    t = 0
    while t < n_frames:
        t += int(rng.integers(5, 120))
        length = int(rng.integers(1, 80))
        e[t:t + length] = rng.normal(-25.0, 4.0, max(0, min(length, n_frames - t)))
        t += length
    return e.astype(np.float32)


def _changes(rng, n_frames: int) -> np.ndarray:
    """Spectral changes that stay low for a while (held notes) and high for a while (speech), with
    single articulated frames in the low stretches (note onsets): both articulation tests engage."""
    c = np.empty(n_frames, np.float32)
    t = 0
    while t < n_frames:
        length = int(rng.integers(5, 150))
        high = rng.random() < 0.6
        c[t:t + length] = rng.normal(5.0 if high else 0.5, 1.5 if high else 0.4, len(c[t:t + length]))
        t += length
    c[rng.random(n_frames) < 0.05] = 6.0
    return c


def _streams(seed: int, n_streams: int, n_frames: int):
    """(rng, energies, changes, a VoiceActivity per stream, a bank, a row per stream)."""
    rng = np.random.default_rng(seed)
    config = VadConfig()
    energies = [_energies(rng, n_frames) for _ in range(n_streams)]
    changes = [_changes(rng, n_frames) for _ in range(n_streams)]
    bank = VadBank(config)
    return rng, energies, changes, [VoiceActivity(config) for _ in range(n_streams)], bank, \
        [bank.acquire() for _ in range(n_streams)]


@pytest.mark.parametrize("with_change", [False, True], ids=["energy", "energy-and-change"])
def test_the_bank_matches_voice_activity_row_by_row_whatever_the_push_sizes(with_change):
    n_streams, n_frames = 70, 900
    rng, energies, changes, singles, bank, rows = _streams(7, n_streams, n_frames)
    config = bank.config
    assert bank.capacity >= n_streams
    position = [0] * n_streams
    held_seen = False
    while min(position) < n_frames:
        # Pushes of the same length go together, as the engine groups them; lengths vary.
        size = int(rng.choice([1, 3, 10, 10, 10, 37]))
        group = [i for i in range(n_streams) if position[i] + size <= n_frames and rng.random() < 0.8]
        if not group:
            group = [i for i in range(n_streams) if position[i] < n_frames]
            size = min(n_frames - position[i] for i in group)
        block = np.stack([energies[i][position[i]:position[i] + size] for i in group])
        change = np.stack([changes[i][position[i]:position[i] + size] for i in group]) if with_change else None
        got = bank.push([rows[i] for i in group], block, change)
        held_seen |= bool(bank._held[[rows[i] for i in group]].any())
        for k, i in enumerate(group):
            want = singles[i].push(block[k], None if change is None else change[k])
            assert np.array_equal(got[k], want), (i, position[i])
            assert bank.articulated_share[rows[i]] == singles[i].articulated_share
            assert bank.voiced_frames[rows[i]] == singles[i].voiced_frames
            assert bank.silence_frames(rows[i]) == singles[i].silence_frames()
            assert bank.floor_db[rows[i]] == singles[i].floor_db
            assert bool(bank.speaking[rows[i]]) == singles[i].speaking
            position[i] += size
    if with_change:  # the articulation tests did drop loud frames, and not all of them
        assert held_seen  # and held sounds inside speech were carried
        loud = VadBank(config)
        plain = [loud.acquire() for _ in range(n_streams)]
        loud.push(plain, np.stack(energies))
        assert 0 < bank.voiced_frames[rows].sum() < loud.voiced_frames[plain].sum()


def test_a_released_row_starts_afresh():
    bank = VadBank()
    row = bank.acquire()
    bank.push([row], np.concatenate([np.full(30, -70.0), np.full(20, -20.0)])[None])
    assert bank.voiced_frames[row] > 0
    bank.release(row)
    again = bank.acquire()
    assert again == row and bank.voiced_frames[row] == 0 and bank.silence_frames(row) == 0
    assert bank.articulated_share[row] == VadConfig().articulated_share_start
    single = VoiceActivity()
    e = np.concatenate([np.full(20, -70.0), np.full(10, -20.0)])
    assert np.array_equal(bank.push([row], e[None])[0], single.push(e))


@pytest.mark.parametrize("with_change", [False, True], ids=["energy", "energy-and-change"])
def test_a_ragged_push_decides_as_voice_activity_for_every_row(with_change):
    """push_ragged: rows with 0..70 new frames each in one call (network clients deliver ragged
    amounts); every row's decisions, counts and state as its own VoiceActivity's."""
    n_streams, n_frames = 60, 700
    rng, energies, changes, singles, bank, rows = _streams(11, n_streams, n_frames)
    position = [0] * n_streams
    pushes = 0
    while min(position) < n_frames:
        counts = [min(n_frames - position[i], int(rng.choice([0, 1, 2, 3, 7, 8, 10, 10, 13, 31, 40, 70])))
                  for i in range(n_streams)]
        group = [i for i in range(n_streams) if counts[i] > 0]
        energy = np.concatenate([energies[i][position[i]:position[i] + counts[i]] for i in group])
        change = np.concatenate([changes[i][position[i]:position[i] + counts[i]] for i in group]) if with_change \
            else None
        got = bank.push_ragged([rows[i] for i in group], [counts[i] for i in group], energy, change)
        pushes += 1
        for k, i in enumerate(group):
            piece = slice(position[i], position[i] + counts[i])
            want = singles[i].push(energies[i][piece], changes[i][piece] if with_change else None)
            assert got[k] == bool(want.any()), (i, position[i])
            assert bank.voiced_frames[rows[i]] == singles[i].voiced_frames
            assert bank.silence_frames(rows[i]) == singles[i].silence_frames()
            assert bank.floor_db[rows[i]] == singles[i].floor_db
            assert bank.articulated_share[rows[i]] == singles[i].articulated_share
            assert bool(bank.speaking[rows[i]]) == singles[i].speaking
            position[i] += counts[i]
    assert pushes > 10 and any(bank.voiced_frames[rows] > 0)
