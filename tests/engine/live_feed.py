"""Feeding real recordings to the public API as a microphone would: shared by the CPU and GPU
tests of ``LiveCaptioner``."""

from __future__ import annotations

import captioner


def caption_live(clips, device: str, streams_at_once: int = 4) -> dict[str, str]:
    """Each clip's committed text, the clips captioned ``streams_at_once`` at a time as streams
    of one captioner, fed 100 ms at a time with a ``step()`` after each. Also checks that the
    streams shared model steps and that the captioner ran where it was asked to."""
    import soundfile as sf

    live = captioner.LiveCaptioner(model="tiny.en", device=device)
    if device.startswith("cuda"):
        assert live.provider == "CUDAExecutionProvider"
    finals: dict[str, list[str]] = {c.id: [] for c in clips}
    batch_sizes = [0]

    def collect(updates):
        for u in updates:
            if u.kind == "final":
                finals[u.stream].append(u.text)
        batch_sizes.append(live.status().batch_size)

    for first in range(0, len(clips), streams_at_once):
        group = clips[first:first + streams_at_once]
        audio = {c.id: sf.read(c.wav, dtype="float32") for c in group}
        streams = {c.id: live.open_stream(c.id) for c in group}
        longest_s = max(len(samples) / rate for samples, rate in audio.values())
        for tenth in range(int(longest_s * 10) + 1):
            for clip_id, (samples, rate) in audio.items():
                chunk = samples[tenth * rate // 10:(tenth + 1) * rate // 10]
                if chunk.size:
                    streams[clip_id].accept_waveform(rate, chunk)
            collect(live.step())
        for stream in streams.values():
            stream.finish()
        while any(not s.done for s in streams.values()):
            collect(live.step())
    live.close()
    assert len(clips) < 2 or max(batch_sizes) >= 2  # streams shared model steps
    return {clip_id: " ".join(texts) for clip_id, texts in finals.items()}
