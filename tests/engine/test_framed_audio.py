"""Audio a server's front-ends framed reaches the engine as one item per front-end frame
(``FramedAudio``) and is captioned as the same audio sent connection by connection would be.

Issue 13: with a thousand connections the serving process took ten thousand chunks a second
through one interpreter lock, each resampled, framed, queued and kept on its own (about 0.8 ms of
the lock per connection-second on this machine's CPU). The front-ends now frame the audio in their
own processes; the worker passes it on. The scripted listener hears a word only where the audio
it is given really holds it, so a block at the wrong place on a stream's clock loses words."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest
import soxr
from scripted import Delivered, keys, render_speech
from test_host_batching import SCRIPTS, ScriptFactory

from captioner.engine.host import HostCore, HostSpec
from captioner.engine.supervisor import SupervisedCaptioner
from captioner.engine.worker import CloseStream, OpenStream, Worker
from captioner.events import SAMPLE_RATE_HZ, FramedAudio
from captioner.serve.gather import AudioGather

SPEECH_S = 9.0
RATES_HZ = {"a": 16_000, "b": 48_000, "c": 44_100}  # as the clients send it: b and c are resampled
MESSAGE_S = 0.1


def _captioner(isolation: str):
    spec = HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory())
    if isolation == "none":  # the worker holds the LiveCaptioner itself
        return lambda: HostCore(spec).live
    return lambda: SupervisedCaptioner(spec, isolation=isolation, standby=False)


def _client_pcm(label: str, seed: int) -> bytes:
    audio = render_speech(SCRIPTS[label], SPEECH_S, seed=seed)
    if RATES_HZ[label] != SAMPLE_RATE_HZ:
        audio = soxr.resample(audio, SAMPLE_RATE_HZ, RATES_HZ[label])
    return np.round(np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def _framed(index, data: bytes, labels: dict[int, str]) -> FramedAudio:
    """What the hub makes of a front-end's frame for one engine (EngineLink.push_framed)."""
    sids, firsts, lengths, stamps = zip(*index)
    return FramedAudio(tuple(labels[sid] for sid in sids), firsts, stamps, lengths,
                       np.frombuffer(data, dtype=np.float32))


@pytest.mark.parametrize("isolation", ["process", "inline", "none"])
def test_framed_audio_of_three_connections_is_captioned_word_for_word(isolation):
    inbox: queue.Queue = queue.Queue(maxsize=1000)
    deliver = Delivered()
    worker = Worker(_captioner(isolation), inbox, deliver, lambda status: None)
    worker.start()
    try:
        assert worker.ready.wait(60) and worker.error is None
        labels = dict(enumerate(SCRIPTS, start=1))
        pcm = {sid: _client_pcm(label, seed=sid) for sid, label in labels.items()}
        for label in SCRIPTS:
            inbox.put(OpenStream(label))
        gather = AudioGather()
        offsets = dict.fromkeys(labels, 0)
        while any(offsets[sid] < len(pcm[sid]) for sid in labels):
            for sid, label in labels.items():
                n_bytes = 2 * int(MESSAGE_S * RATES_HZ[label])
                piece = pcm[sid][offsets[sid]:offsets[sid] + n_bytes]
                offsets[sid] += n_bytes
                if piece:
                    gather.add(sid, RATES_HZ[label], piece, len(piece) // 2, time.monotonic_ns())
            index, data = gather.take()
            if index:
                inbox.put(_framed(index, data, labels))
        for sid in labels:
            gather.end(sid, time.monotonic_ns())
        index, data = gather.take()
        inbox.put(_framed(index, data, labels))
        for label in SCRIPTS:
            inbox.put(CloseStream(label))
        # Audio sent before a close but taken after it (the hub's loop and a stop meet): left out.
        late = render_speech(SCRIPTS["a"], 0.5, seed=9)[:1600]
        inbox.put(FramedAudio(("a", "nobody"), (10**6, 0), (0, 0), (1600, 0), late))
        deadline_s = time.monotonic() + 60
        wanted = {label: keys(words) for label, words in SCRIPTS.items()}
        while time.monotonic() < deadline_s:
            said = deliver.said(SCRIPTS)
            if said == wanted and worker.all_ended.is_set():
                break
            time.sleep(0.05)
        assert said == wanted
        assert worker.error is None
        # Each stream's life comes in order with its updates: opened once before any of them,
        # done once after the last (a server ends a connection on it).
        for label in SCRIPTS:
            life = [type(item).__name__ for item in deliver.in_order()
                    if getattr(item, "label", getattr(item, "stream", None)) == label]
            assert life[0] == "StreamOpened" and life[-1] == "StreamDone", (label, life)
            assert life.count("StreamOpened") == 1 and life.count("StreamDone") == 1, (label, life)
            assert "CaptionUpdate" in life
    finally:
        worker.stop_event.set()
        worker.wake()
        worker.join(30)
    assert not worker.is_alive() and worker.error is None


def test_framed_audio_holds_whole_frames_per_stream():
    with pytest.raises(ValueError, match="whole 160-sample frames"):
        FramedAudio(("a",), (0,), (0,), (100,), np.zeros(100, np.float32))
    with pytest.raises(ValueError, match="320 samples"):
        FramedAudio(("a", "b"), (0, 0), (0, 0), (160, 160), np.zeros(160, np.float32))
    with pytest.raises(ValueError, match="one first sample"):
        FramedAudio(("a", "b"), (0,), (0, 0), (160, 160), np.zeros(320, np.float32))
    audio = FramedAudio(("a", "b"), (320, 0), (5, 6), (160, 320), np.arange(480, dtype=np.float32))
    assert [(s, f, c, p[0], p.shape[0]) for s, f, c, p in audio.pieces()] == [("a", 320, 5, 0.0, 160),
                                                                             ("b", 0, 6, 160.0, 320)]
    assert not audio.samples.flags.writeable


def test_a_streams_replay_ring_does_not_pin_the_whole_frame():
    """Each stream keeps its part for a re-feed as its own copy: a view would keep every stream's
    audio of that front-end frame alive for as long as the longest ring (up to 30 s)."""
    captioner = _captioner("inline")()
    try:
        for label in ("a", "b"):
            captioner.open_stream(label)
        frame = np.arange(3200, dtype=np.float32) / 3200
        audio = FramedAudio(("a", "b"), (0, 0), (1, 2), (1600, 1600), frame)
        captioner.accept_framed(audio)
        for label, start in (("a", 0), ("b", 1600)):
            (first, capture_ns, kept), = captioner.streams[label].ring
            assert first == 0 and not np.shares_memory(kept, audio.samples)
            np.testing.assert_array_equal(kept, frame[start:start + 1600])
    finally:
        captioner.close()


def test_framed_items_go_to_the_host_with_the_steps_batch():
    """Each front-end frame is an inbox item; the audio of a whole drain goes to the model's host
    in one message at the step, as chunks do, not one message per frame."""
    captioner = _captioner("inline")()
    try:
        for label in ("a", "b"):
            captioner.open_stream(label)
        sent = []
        send = captioner._host.send
        captioner._host.send = lambda message, **kw: (sent.append(type(message)), send(message, **kw))[1]
        for label, seed in (("a", 1), ("b", 2)):
            captioner.accept_framed(FramedAudio((label,), (0,), (seed,), (1600,), np.zeros(1600, np.float32)))
        assert sent == []
        captioner.step()
        assert sent.count(FramedAudio) == 1
        (first, _, kept), = captioner.streams["b"].ring
        assert first == 0 and kept.shape == (1600,)
    finally:
        captioner.close()


def test_a_host_takes_framed_audio_as_it_is_and_captions_it_as_the_same_audio_ingested():
    """A model's host is sent whole 16 kHz frames (the supervisor framed them): they go to the
    engine as they are, not through a second ingest, and give the same captions, gaps included,
    as the same samples handed to ``accept_waveform``."""
    from captioner.audio.ingest import StreamIngest

    audio = render_speech(SCRIPTS["a"], SPEECH_S, seed=3)
    cut = audio.shape[0] // 2
    lost = 4 * 1600  # 400 ms lost on the way: the engine hears silence there
    pieces = [(first, audio[first:first + 1600]) for first in range(0, audio.shape[0], 1600)
              if not cut <= first < cut + lost]

    def run(framed: bool) -> list[tuple]:
        live = HostCore(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory())).live
        stream = live.open_stream("a")
        calls, updates = [], []
        accept = StreamIngest.accept
        StreamIngest.accept = lambda self, *args, **kwargs: (calls.append(1), accept(self, *args, **kwargs))[1]
        try:
            for first, chunk in pieces:
                if framed:
                    live.accept_framed(FramedAudio(("a",), (first,), (time.monotonic_ns(),), (chunk.shape[0],), chunk))
                else:
                    stream.accept_waveform(SAMPLE_RATE_HZ, chunk, first_sample=first)
                updates += live.step()
        finally:
            StreamIngest.accept = accept
        assert (calls == []) == framed  # the framed audio met no ingest
        stream.finish()
        while not stream.done:
            updates += live.step()
        return [(u.kind, u.text, round(u.start_s, 3), round(u.end_s, 3)) for u in updates if u.kind == "final"]

    framed = run(True)
    assert framed == run(False)
    assert keys(" ".join(text for _, text, _, _ in framed)) == keys(SCRIPTS["a"])


def test_a_stream_takes_framed_audio_or_waveforms_not_both():
    live = HostCore(HostSpec("scripted", "cpu", recognizer_factory=ScriptFactory())).live
    framed, waved = live.open_stream("f"), live.open_stream("w")
    framed.accept_frames(0, 0, np.zeros(320, np.float32))
    with pytest.raises(ValueError, match="framed"):
        framed.accept_waveform(SAMPLE_RATE_HZ, np.zeros(320, np.float32))
    waved.accept_waveform(SAMPLE_RATE_HZ, np.zeros(320, np.float32))
    with pytest.raises(ValueError, match="accept_waveform"):
        waved.accept_frames(320, 0, np.zeros(320, np.float32))
    with pytest.raises(ValueError, match="whole 160-sample frames"):
        framed.accept_frames(320, 0, np.zeros(100, np.float32))
    live.close()
