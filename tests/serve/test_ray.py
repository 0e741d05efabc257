"""The Ray Serve application for real: a local Ray instance, two CPU replicas of tiny.en behind
Serve's proxy, four clients streaming recordings at real-time pace; one replica is killed
mid-stream, its clients reconnect (to the other replica, or the one Ray restarts) and go on."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
from serve_helpers import TOKEN

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray Serve is in the test extra: pip install -e '.[test]'")

CLIPS = ("en_jfk_inaugural_excerpt", "en_ls_1089-134686-0000", "en_ljspeech_LJ001-0001", "en_ljspeech_LJ001-0003")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replica_streams(url: str, asks: int = 40) -> dict[int, int]:
    """The replicas' processes and the streams each holds, as their own route says (the proxy
    spreads the asks over them)."""
    import json
    import urllib.request

    http = url.replace("ws://", "http://") + "/v1/replica"
    streams = {}
    for _ in range(asks):
        with urllib.request.urlopen(http, timeout=10) as response:
            answer = json.load(response)
            streams[answer["pid"]] = answer["streams"]
    return streams


def replica_pids(url: str, asks: int = 40) -> set[int]:
    return set(replica_streams(url, asks))


@pytest.fixture(scope="module")
def ray_served():
    from ray import serve

    from captioner.serve.ray_app import build_app

    timings = {}
    t0 = time.monotonic()
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")  # logical CPUs: 2 replicas + Serve
    timings["ray_init_s"] = time.monotonic() - t0
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        t1 = time.monotonic()
        serve.run(build_app("tiny.en", token=TOKEN, num_replicas=2, replica_cpus=1), name="captioner", route_prefix="/")
        timings["deploy_s"] = time.monotonic() - t1
        print(f"ray.init {timings['ray_init_s']:.1f} s, two replicas deployed in {timings['deploy_s']:.1f} s")
        yield f"ws://127.0.0.1:{port}", timings
    finally:
        serve.shutdown()
        ray.shutdown()


def test_four_clients_two_replicas_one_killed(ray_served, speech_clips):
    from captioner.audio.file_source import FileSource
    from captioner.serve.client import RemotePipeline

    url, _ = ray_served
    pids = sorted(replica_pids(url))
    assert len(pids) == 2, pids
    sources = [FileSource(speech_clips[c].wav, stream=f"s{i}", realtime=True) for i, c in enumerate(CLIPS)]
    client = RemotePipeline(sources, url, token=TOKEN)
    client.start(timeout_s=120)
    updates = []
    try:
        time.sleep(4.0)
        updates += client.drain_captions()
        # A replica that holds streams dies mid-stream (the proxy may have put all four on one).
        busy = [pid for pid, streams in sorted(replica_streams(url).items()) if streams]
        assert busy, "no replica holds a stream"
        os.kill(busy[0], signal.SIGKILL)
        killed_at_s = 4.0
        deadline = time.monotonic() + 300
        while not client.wait_exhausted(0.5) and time.monotonic() < deadline:
            updates += client.drain_captions()
        assert client.wait_exhausted(0), "every stream ended, its finals received"
    finally:
        client.stop(30)
    updates += client.drain_captions()
    losses = client.input_losses
    assert losses, "the killed replica's clients lost their connection"
    assert not client.source_errors, client.source_errors
    for i, clip_id in enumerate(CLIPS):
        finals = [u for u in updates if u.stream == f"s{i}" and u.kind == "final" and u.text.strip()]
        assert finals, f"stream s{i} ({clip_id}) was captioned"
    for label in losses:
        late = [u for u in updates if u.stream == label and u.kind == "final" and u.end_s > killed_at_s + 1.0]
        assert late, f"{label} went on after its reconnection: {[(u.start_s, u.text) for u in updates if u.stream == label]}"
    assert replica_pids(url, asks=10), "the application still answers"
