"""A real `captioner serve` engine on a free loopback port (tiny.en on the CPU)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

import pytest
from serve_helpers import MAX_AHEAD_S, MAX_STREAMS, TOKEN


@dataclass
class Served:
    url: str
    token: str
    server: object
    link: object
    transcripts: object


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from captioner.app.transcript import TranscriptWriter
    from captioner.engine.admission import AdmissionConfig
    from captioner.engine.core import EngineConfig
    from captioner.engine.pipeline import Pipeline
    from captioner.gpu.backend import cpu_backend
    from captioner.gpu.features import FeaturePool
    from captioner.gpu.telemetry import TelemetrySampler
    from captioner.serve.engine_link import EngineLink
    from captioner.serve.server import CaptionServer, ServerThread

    # The engine's own admission refuses the stream after MAX_STREAMS: a memory budget that holds
    # that many feature banks of one stream above its 15 % floor, not one more (and no step-time
    # limit that a busy 2-core CPU would hit first).
    base = EngineConfig()
    bank_bytes = FeaturePool(cpu_backend(), n_mels=80, ring_frames=base.ring_frames, block_streams=1).block_bytes
    admission = AdmissionConfig(vram_budget_bytes=int((MAX_STREAMS + 0.6) / 0.85 * bank_bytes), max_interval_s=600.0)

    def make_pipeline(device):
        return Pipeline([], model="tiny.en", device=device,
                        config=EngineConfig(block_streams=1, admission=admission))

    link = EngineLink(["cpu"], make_pipeline, lambda device: TelemetrySampler(gpu_index=0))
    link.start()
    folder = tmp_path_factory.mktemp("transcripts")
    server = CaptionServer(link, "127.0.0.1", 0, token=TOKEN, max_ahead_s=MAX_AHEAD_S,
                           transcripts=lambda title: TranscriptWriter(directory=folder, title=title))
    thread = ServerThread(server)
    thread.start()
    try:
        yield Served(thread.url, TOKEN, server, link, folder)
    finally:
        thread.stop()
        link.stop()




@pytest.fixture
def tls_certificate(tmp_path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key (``cert.pem``, ``key.pem`` paths)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)
