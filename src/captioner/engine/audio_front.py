"""The engine's audio side: captured blocks into the feature rings, and the VAD over the new
log-mel frames.

:class:`AudioFront` is one of :class:`~captioner.engine.core.Engine`'s three parts (the model
steps are ``core.py``'s, what it reports is :mod:`captioner.engine.engine_report`'s); it works
on the engine's streams, feature pool, VAD bank and host timers.
"""

from __future__ import annotations

import numpy as np

from captioner.engine.stream_state import BlockSlice, StreamState
from captioner.engine.vad import FULL_SCALE_SINE_DB, band_energy_db, spectral_change_db
from captioner.events import FRAME_SAMPLES, FRAMES_PER_S, SAMPLE_RATE_HZ, AudioBlock


class AudioFront:
    """Feeds the streams' audio in and judges it (mixed into ``Engine``; its thread only)."""

    def push(self, blocks: list[AudioBlock | BlockSlice]) -> None:
        """Feed captured blocks (any streams, in order per stream) into features and the VAD.

        Streams that brought the same amount of audio are pushed in one batched call (one per
        bank of the pool), and judged by the VAD together. The per-stream Python here is kept to
        a few attribute updates: at 1,500 streams it runs 15,000 times a second."""
        streams = self._streams
        pieces: dict[str, list[np.ndarray]] = {}
        last_capture_ns: dict[str, int] = {}
        for block in blocks:
            s = streams.get(block.stream)
            if s is None:
                continue
            first_frame = s.next_sample // FRAME_SAMPLES - s.frame_offset
            piece = self._take_block(s, block)
            if s.speakers is not None and piece is not None:
                s.speakers.add_samples(first_frame, piece)
            last_capture_ns[block.stream] = block.capture_ns
            if piece is not None:
                pieces.setdefault(block.stream, []).append(piece)
        by_length: dict[int, tuple[list[int], list[np.ndarray]]] = {}
        for name, parts in pieces.items():
            samples = parts[0] if len(parts) == 1 else np.concatenate(parts)
            slots, rows = by_length.setdefault(samples.shape[0], ([], []))
            slots.append(streams[name].slot)
            rows.append(samples)
        for slots, rows in by_length.values():
            self.audio_pushed_s += len(slots) * rows[0].shape[0] / SAMPLE_RATE_HZ
            t0 = self.host_timer()
            self.features.push_batch(slots, np.stack(rows))
            self.host_s["features"] += self.host_timer() - t0
        t0 = self.host_timer()
        self._run_vad([streams[name] for name in last_capture_ns])
        self.host_s["vad"] += self.host_timer() - t0
        if self._speaker_bank is not None and self._speaker_bank.tracks:
            t0 = self.host_timer()
            self._speaker_bank.run()
            self.host_s["speakers"] += self.host_timer() - t0
        now_ns = self.clock_ns()
        keep = self._frame_latency_ms.maxlen or len(last_capture_ns)
        # Only the newest ``keep`` values stay in the deque: the others need not be worked out.
        for capture_ns in list(last_capture_ns.values())[-keep:]:
            self._frame_latency_ms.append((now_ns - capture_ns) / 1e6)

    def _take_block(self, s: StreamState, block: AudioBlock | BlockSlice) -> np.ndarray | None:
        """The samples of ``block`` that continue stream ``s`` (a gap before it is silence)."""
        samples = block.samples
        first = block.first_sample
        n_block = samples.shape[0]
        if first != s.next_sample:
            if first < s.next_sample:
                # Overlaps what we have (a source restarted its count): keep only the new part.
                skip = s.next_sample - first
                if skip >= n_block:
                    return None
                samples = samples[skip:]
            else:
                # Dropped blocks: fill the gap with silence so stream time stays sample-exact.
                gap = first - s.next_sample
                s.gap_samples += gap
                samples = np.concatenate([np.zeros(gap, dtype=np.float32), samples])
        end_sample = first + n_block
        if s.start_ns is None:
            s.start_ns = block.capture_ns - end_sample * 1_000_000_000 // SAMPLE_RATE_HZ
        n = samples.shape[0]
        s.next_sample += n
        # The newest frame's worth of audio, for a ring rebuilt by a model swap.
        s.tail = np.concatenate([s.tail, samples])[-FRAME_SAMPLES:] if n < FRAME_SAMPLES else samples[-FRAME_SAMPLES:]
        s.captures.append((end_sample, block.capture_ns))
        s.last_samples = block.samples
        return samples

    def _run_vad(self, streams: list[StreamState]) -> None:
        """The VAD over the new feature frames of ``streams``. On CUDA one kernel launch reads
        every stream's new frames from the rings and returns their band energy and spectral
        change (:meth:`~captioner.gpu.features.FeaturePool.speech_measures`); elsewhere streams
        with as many new frames go together (one read of the rings, the NumPy measures, one copy
        to the host). Streams with as many new frames then step the VAD bank together. That is
        what keeps thousands of streams affordable; the bookkeeping around it is in arrays across
        the streams too, and Python touches a stream only to store its results."""
        if not streams:
            return
        ready = self.features.frames_ready_many([s.slot for s in streams])
        seen = np.fromiter((s.vad_frames for s in streams), dtype=np.int64, count=len(streams))
        # Frames that fell out of the ring were never looked at; skip them.
        first = np.maximum(np.maximum(seen, ready - self.features.ring_frames), 0)
        for k in np.nonzero(first > seen)[0].tolist():
            s = streams[k]
            lost = int(first[k] - seen[k])
            self.vad.push([s.vad_row], np.full((1, lost), -120.0), np.zeros((1, lost)))
        counts = ready - first
        # The spectral change of a frame compares it with the frame `lag` before: those frames
        # are read again (all of them but at a stream's start, where the first frame stands in).
        lag = self.config.vad.change_lag_frames
        back = np.minimum(lag, first - np.maximum(ready - self.features.ring_frames, 0))
        judged = np.nonzero(counts > 0)[0]
        if not judged.size:
            return
        members, energy, change = self._speech_measures(streams, judged, first, counts, back)
        self._store_vad(streams, members, counts[members], energy, change, ready)

    def _speech_measures(self, streams: list[StreamState], judged: np.ndarray, first: np.ndarray,
                         counts: np.ndarray, back: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(members, energy, change)``: the ``judged`` streams (indices into ``streams``) in
        the order of their measures, and each one's ``counts`` new frames' band energy and
        spectral change one stream after another (flat host float arrays)."""
        vad = self.config.vad
        lag = vad.change_lag_frames
        if self.config.ring_kernels and self.features.measures_on_device:
            energy, change = self.features.speech_measures(
                [streams[k].slot for k in judged.tolist()], first[judged], counts[judged], back[judged],
                self._band, lag, vad.change_range_db, FULL_SCALE_SINE_DB)
            return judged, energy, change
        # Streams with as many new frames (and frames read again) are read from the rings together.
        xp = self.backend.xp
        parts = []
        for count, have in sorted({(int(c), int(b)) for c, b in zip(counts[judged].tolist(), back[judged].tolist())}):
            members = judged[(counts[judged] == count) & (back[judged] == have)]
            log_mel = self.features.log_mel_frames([streams[k].slot for k in members.tolist()],
                                                   first[members] - have, count + have)
            if have < lag:
                log_mel = xp.concatenate([xp.repeat(log_mel[..., :1], lag - have, axis=-1), log_mel], axis=-1)
            measured = xp.stack([band_energy_db(xp, log_mel[..., lag:], self._band),
                                 spectral_change_db(xp, log_mel, self._band, lag, vad.change_range_db)])
            energy, change = self.backend.asnumpy(measured)  # one copy to the host
            parts.append((members, energy.reshape(-1), change.reshape(-1)))
        return tuple(np.concatenate(column) for column in zip(*parts))

    def _store_vad(self, streams: list[StreamState], members: np.ndarray, counts: np.ndarray, energy: np.ndarray,
                   change: np.ndarray, ready: np.ndarray) -> None:
        """Step the VAD bank over the measures (``counts[i]`` frames of ``members[i]``, flat) and
        keep each stream's results: frames judged, speech since its update, an idle window."""
        lead_in_s = self.config.lead_in_s
        group = [streams[k] for k in members.tolist()]
        rows = np.fromiter((s.vad_row for s in group), dtype=np.int64, count=len(group))
        voiced_before = self.vad.voiced_frames[rows]
        if any(s.speakers is not None for s in group):
            speech, flags = self.vad.push_ragged(rows, counts, energy, change, frame_flags=True)
            ends = np.cumsum(counts)
            for s, n, end, last in zip(group, counts.tolist(), ends.tolist(), ready[members].tolist()):
                if s.speakers is not None:
                    s.speakers.add_frames(last - n, flags[end - n:end], s.frame_offset)
            any_speech = speech.tolist()
        else:
            any_speech = self.vad.push_ragged(rows, counts, energy, change).tolist()
        voiced_new = (self.vad.voiced_frames[rows] - voiced_before).tolist()
        # Streams whose last hypothesis is not folded yet: their policy does not know its text.
        held = self._pending.names if self._pending is not None else ()
        for s, speech, voiced, end in zip(group, any_speech, voiced_new, ready[members].tolist()):
            s.vad_frames = end
            if speech:
                s.speech_since_update = True
                # Only frames that sounded like speech: the hangover would make every click 0.3 s long.
                s.segment_speech_frames += voiced
            elif held and s.name in held:
                pass
            elif not s.speech_since_update and not s.policy.has_pending_text:
                # Nothing open: let the window start follow the silence, keeping a short lead-in;
                # the first update of the next segment comes an interval after its onset.
                end_s = (end + s.frame_offset) / FRAMES_PER_S
                s.policy.advance_idle(max(0.0, end_s - lead_in_s))
                s.segment_speech_frames = 0
                s.last_update_s = end_s
            elif not s.speech_since_update:
                # A segment kept open over a gap in the speech: the wait is no update interval of
                # the scheduler's. With its words all committed there is nothing to update until
                # the speaker goes on (an interval after they do) or the pause is settled.
                s.last_update_ns = None
                if not s.policy.has_uncommitted_text:
                    s.last_update_s = (end + s.frame_offset) / FRAMES_PER_S

    def _audio_end_s(self, s: StreamState) -> float:
        return (self.features.frames_ready(s.slot) + s.frame_offset) / FRAMES_PER_S
