"""The public API reads channels-first audio (torchaudio, librosa) as channels-first: the same
words as ``[n, channels]``; a chunk whose layout cannot be told is one line, not a misreading.
The shape rule itself: tests/audio/test_channel_layout.py."""

from __future__ import annotations

import numpy as np
import pytest
from scripted import ScriptedRecognizer

import captioner
from captioner.data import sample_speech_path
from captioner.engine.simulate import SimClock


def _stereo() -> tuple[np.ndarray, int]:
    """6 s of the bundled JFK recording as ``[n, 2]``, the right channel the same speech 2 ms
    later at 0.8 of the level (the channels differ, as a real stereo pair's do)."""
    import soundfile as sf

    mono, rate = sf.read(str(sample_speech_path()), dtype="float32", frames=6 * 16000)
    delay = int(0.002 * rate)
    right = np.concatenate([np.zeros(delay, np.float32), 0.8 * mono[:-delay]])
    return np.stack([mono, right], axis=1), rate


def test_the_api_takes_channels_first_and_refuses_an_ambiguous_chunk():
    live = captioner.LiveCaptioner(recognizer=ScriptedRecognizer({}))
    me = live.open_stream("Me")
    with pytest.raises(ValueError, match=r"^samples of shape \(4, 2\) are ambiguous: pass \[n\] \(mono\)"):
        me.accept_waveform(16000, np.zeros((4, 2), np.float32))
    me.accept_waveform(16000, np.zeros((2, 1600), np.float32))  # channels first: 0.1 s, not 2 samples
    assert me.pending_s == pytest.approx(0.1)
    me.accept_waveform(16000, np.zeros((1600, 2), np.int16))  # channels last, as before
    assert me.pending_s == pytest.approx(0.2)
    live.close()


def _caption(recognizer, backend, rate: int, layout: np.ndarray, channels_first: bool) -> list[str]:
    """The committed words of ``layout`` fed 100 ms at a time through the public API on a
    simulated clock (no step costs time on it, so both layouts meet the same schedule)."""
    clock = SimClock()
    live = captioner.LiveCaptioner(recognizer=recognizer, backend=backend, clock_ns=clock, timer_ns=clock)
    me = live.open_stream("Me")
    chunk = rate // 10
    n = layout.shape[1] if channels_first else layout.shape[0]
    finals = []
    for start in range(0, n, chunk):
        me.accept_waveform(rate, layout[:, start:start + chunk] if channels_first else layout[start:start + chunk],
                           capture_ns=clock())
        clock.advance(0.1)
        finals += [u.text for u in live.step() if u.kind == "final"]
    me.finish()
    while not me.done:
        clock.advance(0.1)
        finals += [u.text for u in live.step() if u.kind == "final"]
    live.close()
    return " ".join(finals).split()


@pytest.mark.slow
def test_channels_first_gives_the_words_of_channels_last():
    """tiny.en on the CPU: 6 s of real stereo speech, fed each way through the public API."""
    from captioner.engine.live import load_recognizer

    samples, rate = _stereo()
    backend, recognizer = load_recognizer("tiny.en", "cpu")
    last = _caption(recognizer, backend, rate, samples, channels_first=False)
    first = _caption(recognizer, backend, rate, np.ascontiguousarray(samples.T), channels_first=True)
    assert first == last
    assert {"fellow", "americans"} <= {w.strip(",.").lower() for w in last}, last


def test_a_device_chunk_is_never_guessed():
    # The app's worker hands the API its sources' chunks, [n, channels] by contract: a block of
    # 8 frames, or an interface of 16 channels, is taken as that, not refused as ambiguous.
    import queue
    import time

    from captioner.audio.source import RawChunk
    from captioner.engine.worker import OpenStream, Worker

    live = captioner.LiveCaptioner(recognizer=ScriptedRecognizer({}))
    worker = Worker(lambda: live, queue.Queue(), deliver=lambda updates: None, publish_status=lambda status: None)
    worker._apply(live, OpenStream("Mic"))
    worker._apply(live, RawChunk("Mic", 16000, 0, time.monotonic_ns(), np.zeros((8, 2), np.float32)))
    worker._apply(live, RawChunk("Mic", 16000, 8, time.monotonic_ns(), np.zeros((1600, 16), np.float32)))
    assert live.streams["Mic"].pending_s == pytest.approx(1600 / 16000)  # whole 10 ms frames: 8 samples wait
    live.close()
