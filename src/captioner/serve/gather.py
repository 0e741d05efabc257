"""A front-end's audio on its way to the hub: every connection's int16 messages since the last
frame, converted to float32 in one NumPy call for all of them, then resampled and cut into whole
10 ms frames at 16 kHz per connection (:class:`~captioner.audio.ingest.StreamIngest`, as the
engine would), so the serving process only passes the frames on.

Why here: the ingest is Python work per message (benchmarks/results/serve/HISTORY.md, "The front-ends
frame the audio"), and in the serving process that is the one interpreter lock its loop and every
engine's worker share; a front-end is a process of its own, one of several.

One thread (the front-end's loop). Pure: no sockets, testable as it is.
"""

from __future__ import annotations

import numpy as np

from captioner.audio.ingest import StreamIngest, pcm16_to_float32


class _Held:
    __slots__ = ("ingest", "rate_hz", "pieces", "n_samples", "capture_ns", "ending")

    def __init__(self, sid: int, rate_hz: int) -> None:
        self.ingest = StreamIngest(str(sid))
        self.rate_hz = rate_hz
        self.pieces: list[bytes] = []
        self.n_samples = 0
        self.capture_ns = 0
        self.ending = False


class AudioGather:
    """Connections' audio between two frames to the hub."""

    def __init__(self) -> None:
        self._held: dict[int, _Held] = {}  # every connection that sent audio and has not ended
        self._due: dict[int, _Held] = {}  # those with audio (or an end) since the last take, in order
        self.bytes_held = 0
        """int16 bytes received since the last :meth:`take` (a frame goes early past a limit)."""

    def add(self, sid: int, rate_hz: int, pcm: bytes, n_samples: int, capture_ns: int) -> None:
        """``pcm``: ``n_samples`` little-endian int16 samples at ``rate_hz`` received at ``capture_ns``."""
        held = self._held.get(sid)
        if held is None:
            held = self._held[sid] = _Held(sid, rate_hz)
        self._due[sid] = held
        held.pieces.append(pcm)
        held.n_samples += n_samples
        held.capture_ns = capture_ns
        self.bytes_held += len(pcm)

    def end(self, sid: int, capture_ns: int) -> None:
        """The connection's audio is over (its end, or it is gone): the next :meth:`take` hands
        out what its ingest still holds, the last partial frame padded, and forgets it."""
        held = self._held.get(sid)
        if held is not None:
            self._due[sid] = held
            held.ending = True
            held.capture_ns = max(held.capture_ns, capture_ns)

    def take(self) -> tuple[list[tuple[int, int, int, int]], bytes]:
        """What was gathered as ``(index, samples)``: per connection with whole frames now
        ``(sid, first_sample, n_samples, capture_ns)`` on its 16 kHz clock, and the float32 bytes
        of all of them in that order."""
        if not self._due:
            return [], b""
        due, self._due = self._due, {}
        parts = [piece for held in due.values() for piece in held.pieces]
        pcm = parts[0] if len(parts) == 1 else b"".join(parts)
        converted = pcm16_to_float32(pcm)
        index: list[tuple[int, int, int, int]] = []
        blocks: list[np.ndarray] = []
        offset = 0
        for sid, held in due.items():
            out = []  # this connection's blocks: its new whole frames, then its padded tail
            if held.n_samples:
                out.append(held.ingest.accept(held.rate_hz, converted[offset:offset + held.n_samples], held.capture_ns))
                offset += held.n_samples
                held.pieces, held.n_samples = [], 0
            if held.ending:
                out.append(held.ingest.flush(held.capture_ns))
                del self._held[sid]
            out = [block for block in out if block is not None]
            if out:  # frames follow each other on the clock: one entry from the first block on
                index.append((sid, out[0].first_sample, sum(b.n_samples for b in out), out[-1].capture_ns))
                blocks.extend(block.samples for block in out)
        self.bytes_held = 0
        if not blocks:
            return [], b""
        return index, (blocks[0] if len(blocks) == 1 else np.concatenate(blocks)).tobytes()
