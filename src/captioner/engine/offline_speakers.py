"""Speaker labels for an offline transcription: the live engine's voice encoder, partials and
clustering (:mod:`captioner.engine.speakers`) over the whole recording, then its captions
labelled in time order, as the live engine labels committed lines.

The recording is read again as 16 kHz blocks (bounded memory, any length): the features kernel's
NumPy twin makes Whisper's log-mel and the encoder's 40 bands of each 10 ms frame, the offline
path's VAD (speech-band energy against its noise floor) picks the speech frames, the encoder
hears them. Everything is heard before the first caption is labelled: unlike a live line, an
offline caption's speaker rests on all of its audio. Runs on the caller's thread, on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from captioner.engine.speakers import SpeakerBank, SpeakerConfig, SpeakerTrack
from captioner.engine.vad import VoiceActivity, band_energy_db, speech_band
from captioner.events import FRAME_SAMPLES, CaptionUpdate
from captioner.formats import Caption
from captioner.gpu.backend import cpu_backend
from captioner.gpu.features import FeaturePool

PUSH_FRAMES = 100  # 1 s of audio a push: the features' largest push by default
N_MELS = 80  # the VAD's bands (its speech band is set in mel bands of Whisper's features)
PAUSE_S = 0.2
"""A pause between two words of an offline caption at which it is labelled in two pieces."""


def hear_recording(blocks: Iterable[np.ndarray], config: SpeakerConfig | None = None, encoder=None,
                   vad: bool = True) -> SpeakerTrack:
    """A recording's 16 kHz audio (``blocks``) heard by the voice encoder: the track holds its
    partials (:meth:`~captioner.engine.speakers.SpeakerTrack.embedding_of` gives the embedding
    of any stretch). ``vad=False``: every frame is heard as speech. ``encoder``: a loaded
    :class:`~captioner.models.speaker.encoder.SpeakerEncoder` (one is made otherwise)."""
    from captioner.models.speaker.encoder import SpeakerEncoder

    config = config or SpeakerConfig(mode="on")
    backend = cpu_backend()
    pool = FeaturePool(backend, n_mels=N_MELS, speaker_bands=True, ring_frames=4 * PUSH_FRAMES, block_streams=1)
    slot = pool.acquire()
    bank = SpeakerBank(backend, pool, encoder or SpeakerEncoder("cpu", intra_threads=1), config)
    track = bank.open("recording", slot)
    judge = _Judge(VoiceActivity() if vad else None)
    heard = 0  # feature frames judged and heard
    pushed = 0  # samples pushed
    left = np.zeros(0, np.float32)
    for block in blocks:
        left = np.concatenate([left, np.asarray(block, np.float32).reshape(-1)])
        while left.shape[0] >= PUSH_FRAMES * FRAME_SAMPLES:
            chunk, left = left[:PUSH_FRAMES * FRAME_SAMPLES], left[PUSH_FRAMES * FRAME_SAMPLES:]
            heard, pushed = _hear(pool, slot, track, bank, judge, chunk, heard, pushed)
    whole = left.shape[0] // FRAME_SAMPLES * FRAME_SAMPLES
    if whole:
        _hear(pool, slot, track, bank, judge, left[:whole], heard, pushed)
    return track


def label_captions(blocks: Iterable[np.ndarray], captions: list[Caption], config: SpeakerConfig | None = None,
                   encoder=None) -> list[Caption]:
    """``captions`` (of one recording, whose 16 kHz audio ``blocks`` give) with their speakers:
    "Speaker 1", "Speaker 2", ... in the order the voices first speak; a caption with measured
    word times in which the voice changes is split there."""
    track = hear_recording(blocks, config, encoder)
    out = []
    for caption in sorted(captions, key=lambda c: (c.start_s, c.end_s)):
        for piece in _at_pauses(caption):
            line = CaptionUpdate(piece.stream, "final", piece.text, piece.start_s, piece.end_s, piece.end_s,
                                 piece.end_s, language=piece.language, words=piece.words)
            for part in track.label(line):
                out.append(replace(piece, text=part.text, start_s=part.start_s, end_s=part.end_s, words=part.words,
                                   speaker=part.speaker))
    return out


def _at_pauses(caption: Caption) -> list[Caption]:
    """``caption`` cut at every pause of :data:`PAUSE_S` between its words (where it has word
    times that spell its text). A Whisper segment runs on over a change of speaker where a live
    line would have been committed; labelled whole it would mix two voices (the layout joins the
    pieces of one speaker into cues again)."""
    from captioner.layout import join, spelled

    words = caption.words
    spelt = spelled(" ".join(caption.text.split()), words) if len(words) > 1 else None
    if spelt is None:
        return [caption]
    cuts = [i for i in range(1, len(words)) if words[i][1] - words[i - 1][2] >= PAUSE_S]
    if not cuts:
        return [caption]
    pieces = []
    for a, b in zip([0, *cuts], [*cuts, len(words)]):
        piece = words[a:b]
        pieces.append(replace(caption, text=join(spelt[a:b]), words=piece,
                              start_s=caption.start_s if a == 0 else piece[0][1],
                              end_s=caption.end_s if b == len(words) else piece[-1][2]))
    return pieces


class _Judge:
    """Which frames are speech: the offline VAD on the speech band's energy, or all of them."""

    def __init__(self, vad: VoiceActivity | None) -> None:
        self.vad = vad
        self.band = speech_band(N_MELS)

    def flags(self, log_mel: np.ndarray) -> np.ndarray:
        n = log_mel.shape[1]
        if self.vad is None:
            return np.ones(n, dtype=bool)
        flags = self.vad.push(band_energy_db(np, log_mel, self.band))
        return np.pad(flags, (0, max(0, n - flags.shape[0])))[:n]


def _hear(pool, slot, track, bank, judge: _Judge, chunk, heard: int, pushed: int) -> tuple[int, int]:
    track.add_samples(pushed // FRAME_SAMPLES, chunk)
    pool.push_batch([slot], chunk[None])
    ready = pool.frames_ready(slot)
    if ready > heard:
        track.add_frames(heard, judge.flags(pool.log_mel_window(slot, heard, ready - heard)), 0)
        bank.run()
    return ready, pushed + chunk.shape[0]
