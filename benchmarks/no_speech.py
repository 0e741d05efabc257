"""Minutes without speech for the latency benchmark and the engine's tests: digital silence, room
noise and two synthesised pieces of music (no downloads). Every word captioned on them is
invented."""

from __future__ import annotations

import numpy as np

SR = 16_000


NO_SPEECH = ("silence", "noise", "music", "music-drums")


def no_speech_audio(kind: str, seconds: float = 60.0) -> np.ndarray:
    """60 s of digital silence, of room noise (pink-ish, -45 dBFS: white noise through a one-pole
    low-pass), of music (a I-vi-IV-V progression of three-tone chords with a bass note, one
    chord a second, with decaying notes) or of music with drums (:func:`music_with_drums`)."""
    n = int(seconds * SR)
    rng = np.random.default_rng(11)
    if kind == "music-drums":
        return music_with_drums(seconds)
    if kind == "silence":
        return np.zeros(n, np.float32)
    if kind == "noise":
        # White noise through a one-pole low-pass: the dull hiss of a room (fans, traffic).
        white = rng.standard_normal(n)
        alpha = 0.97
        spectrum = np.fft.rfft(white) * (1 - alpha) / (1 - alpha * np.exp(-2j * np.pi * np.fft.rfftfreq(n)))
        room = np.fft.irfft(spectrum, n)
        room *= 10 ** (-45 / 20) / (np.sqrt(np.mean(room ** 2)) + 1e-12)
        return room.astype(np.float32)
    chords = [(261.63, 329.63, 392.0, 130.81), (220.0, 261.63, 329.63, 110.0),
              (174.61, 220.0, 261.63, 87.31), (196.0, 246.94, 293.66, 98.0)]
    t = np.arange(SR) / SR
    decay = np.exp(-2.5 * t)
    out = []
    for i in range(int(seconds)):
        chord = chords[i % 4]
        out.append(sum(0.06 * np.sin(2 * np.pi * f * t) * decay for f in chord))
    return np.concatenate(out).astype(np.float32)


def music_with_drums(seconds: float = 60.0, seed: int = 5) -> np.ndarray:
    """A second piece, at 120 beats a minute: a melody of eighth notes (five harmonics, a 5.5 Hz
    vibrato, plucked decays) wandering over a C major scale in phrases of three bars and a bar's
    rest, a plucked bass on every beat, a kick (a sine falling from 150 to 50 Hz) on beats one and
    three, a snare (a 120 ms burst of white noise) on two and four, and a hi-hat (40 ms of
    differentiated noise) on every eighth. Unlike the chords its drums and note onsets change the
    spectrum several times a second, as speech does."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SR)
    out = np.zeros(n + SR)
    scale_hz = [261.63, 293.66, 329.63, 349.23, 392.0, 440.0, 493.88, 523.25]
    eighth_s, beat_s = 0.25, 0.5
    step = 4
    for k in range(int(seconds / eighth_s)):
        if k % 16 >= 12:  # the fourth bar of every four rests
            continue
        step = int(np.clip(step + rng.integers(-2, 3), 0, len(scale_hz) - 1))
        t = np.arange(int(0.3 * SR)) / SR
        envelope = np.minimum(1.0, t / 0.01) * np.exp(-9 * t)
        phase = 2 * np.pi * scale_hz[step] * np.cumsum(1 + 0.004 * np.sin(2 * np.pi * 5.5 * t)) / SR
        a = int(k * eighth_s * SR)
        out[a:a + t.size] += 0.08 * envelope * sum(np.sin(h * phase) / h for h in range(1, 6))
    roots_hz = [130.81, 110.0, 87.31, 98.0]
    for k in range(int(seconds / beat_s)):
        a = int(k * beat_s * SR)
        t = np.arange(int(0.45 * SR)) / SR
        root = roots_hz[(k // 2) % 4]
        out[a:a + t.size] += 0.06 * np.exp(-7 * t) * (np.sin(2 * np.pi * root * t) + 0.4 * np.sin(4 * np.pi * root * t))
        if k % 2 == 0:
            t = np.arange(int(0.15 * SR)) / SR
            out[a:a + t.size] += 0.25 * np.exp(-20 * t) * np.sin(2 * np.pi * np.cumsum(50 + 100 * np.exp(-30 * t)) / SR)
        else:
            m = int(0.12 * SR)
            out[a:a + m] += 0.08 * np.exp(-30 * np.arange(m) / SR) * rng.standard_normal(m)
    for k in range(int(seconds / eighth_s)):
        a, m = int(k * eighth_s * SR), int(0.04 * SR)
        out[a:a + m] += 0.03 * np.exp(-80 * np.arange(m) / SR) * np.diff(np.concatenate([[0.0], rng.standard_normal(m)]))
    return out[:n].astype(np.float32)
