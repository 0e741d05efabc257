"""`captioner serve` on a GPU (marked `gpu`): a real server on cuda:0, eight clients streaming
the English recordings at real-time pace, each captioned as well as the offline path on the same
device, with status messages that carry the GPU's telemetry."""

from __future__ import annotations

import threading

import pytest
from serve_helpers import Session, stream_recording

from captioner.serve import protocol
from e2e_helpers import plain_wer

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def test_eight_clients_on_cuda(speech_clips):
    import captioner
    from captioner.engine.pipeline import Pipeline, telemetry_gpu_index
    from captioner.gpu.telemetry import TelemetrySampler
    from captioner.serve.engine_link import EngineLink
    from captioner.serve.server import CaptionServer, ServerThread

    clips = sorted((c for c in speech_clips.values() if c.language == "en" and c.duration_s <= 35),
                   key=lambda c: c.id)[:8]
    from captioner.app.commands.serve import SERVE_ISOLATION

    link = EngineLink(["cuda:0"], lambda device: Pipeline([], model="tiny.en", device=device, isolation=SERVE_ISOLATION),
                      lambda device: TelemetrySampler(gpu_index=telemetry_gpu_index(device)))
    link.start()
    thread = ServerThread(CaptionServer(link, "127.0.0.1", 0, token="gpu-test-token-0123456789"))
    thread.start()
    sessions: dict[str, Session] = {}
    try:
        def run(clip):
            sessions[clip.id] = stream_recording(thread.url, clip.wav, label=clip.id[:20],
                                                 token="gpu-test-token-0123456789")

        threads = [threading.Thread(target=run, args=(clip,)) for clip in clips]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        thread.stop()
        link.stop()
    offline = [captioner.transcribe(c.wav, model="tiny.en", language="en", device="cuda:0").text for c in clips]
    live = [sessions[c.id].committed for c in clips]
    references = [c.reference for c in clips]
    served, direct = plain_wer(references, live), plain_wer(references, offline)
    print(f"{len(clips)} clients on cuda:0: served WER {served:.3f}, offline {direct:.3f}")
    assert served <= direct + 0.02, (live, offline)
    for clip in clips:
        session = sessions[clip.id]
        assert session.close_code == protocol.CLOSE_NORMAL, session.close_reason
        status = session.statuses[-1]
        assert status["provider"] == "CUDAExecutionProvider"
        assert status["gpu"]["gpu_name"] and status["gpu"]["vram_total_bytes"] and status["gpu"]["temperature_c"] is not None
