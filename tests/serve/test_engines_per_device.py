"""`captioner serve --engines-per-device N`: N engines on each device, the connections spread over
them by the link's least-loaded choice. (One engine's Python thread is what held a served H200
back, not the GPU: docs/serve.md.)"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from serve_helpers import TOKEN, stream_recording

from captioner.app.commands.serve import serve_devices
from captioner.errors import UserError
from captioner.serve import protocol


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _scraped_streams(port: int) -> dict[str, float]:
    """``captioner_streams`` by its ``engine`` label, as Prometheus would scrape it ({} before the
    exporter answers)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    return {sample.labels.get("engine", ""): sample.value for family in text_string_to_metric_families(text)
            if family.name == "captioner_streams" for sample in family.samples}


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))


def test_each_device_is_listed_once_per_engine_round_by_round():
    assert serve_devices("cpu") == ["cpu"]
    assert serve_devices("cpu", 3) == ["cpu", "cpu", "cpu"]
    for bad in (0, -1, 9):
        with pytest.raises(UserError, match=r"--engines-per-device must be 1\.\.8"):
            serve_devices("cpu", bad)


def test_cli_refuses_a_bad_count_in_one_line():
    for args in (["--engines-per-device", "0"], ["--engines-per-device", "9"], ["--engines-per-device", "2", "--ray"]):
        done = subprocess.run([sys.executable, "-m", "captioner", "serve", "--device", "cpu", "--port", "0", *args],
                              capture_output=True, text=True, timeout=60, env=_env())
        assert done.returncode == 2, done.stderr
        assert "--engines-per-device" in done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.slow
def test_two_engines_on_one_device_each_caption_their_own_connection(tmp_path, speech_clips):
    """The command with two engines on the CPU: two clients at once each land on an engine of
    their own (every status a client gets counts one stream, where one engine would count two),
    each gets its own recording's words, and both close normally."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    metrics_port = _free_port()
    command = [sys.executable, "-m", "captioner", "serve", "--port", "0", "--model", "tiny.en", "--device", "cpu",
               "--engines-per-device", "2", "--token-file", str(token_file), "--metrics-port", str(metrics_port)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        port = int(server.stdout.readline())
        url = f"ws://127.0.0.1:{port}"
        clips = {"A": speech_clips["en_ls_1089-134691-0001"], "B": speech_clips["en_jfk_inaugural_excerpt"]}
        sessions = {}

        def run(label):
            sessions[label] = stream_recording(url, clips[label].wav, label=label, timeout_s=180)

        threads = [threading.Thread(target=run, args=(label,)) for label in clips]
        for thread in threads:
            thread.start()
        # While both stream: the Prometheus exporter has one series per engine, one stream each.
        per_engine: dict[str, float] = {}
        deadline = time.monotonic() + 60
        while per_engine != {"0": 1.0, "1": 1.0} and time.monotonic() < deadline:
            time.sleep(0.5)
            per_engine = _scraped_streams(metrics_port)
        for thread in threads:
            thread.join(240)
    finally:
        server.terminate()
        server.wait(60)
    err = server.stderr.read()
    assert "served 2 connection(s)" in err and "the serving loop ran late p50" in err, err
    assert per_engine == {"0": 1.0, "1": 1.0}, per_engine
    expected = {"A": ("full", "hour"), "B": ("country", "ask")}
    for label, session in sessions.items():
        assert session.close_code == protocol.CLOSE_NORMAL, (label, session.close_code, session.close_reason)
        words = session.committed.lower()
        assert all(w in words for w in expected[label]), (label, session.captions)
        streams = {s["streams"] for s in session.statuses if s["connections"]}
        assert streams == {1}, (label, streams)


def test_engines_sharing_a_gpu_without_mps_are_warned_about(tmp_path, monkeypatch):
    from captioner.app.commands.serve import shared_gpu_warning
    from captioner.gpu.mps import mps_running

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert not mps_running()
    line = shared_gpu_warning(["cuda:0", "cuda:1", "cuda:0", "cuda:1"])
    assert "cuda:0, cuda:1 will run 2 engines without NVIDIA MPS" in line and "nvidia-cuda-mps-control -d" in line
    assert shared_gpu_warning(["cuda:0", "cuda:1"]) == ""  # one engine a GPU: nothing shares
    assert shared_gpu_warning(["cpu", "cpu"]) == ""  # MPS is a GPU's matter
    (tmp_path / "control").touch()  # the daemon's pipe, as `nvidia-cuda-mps-control -d` leaves it
    assert mps_running() and shared_gpu_warning(["cuda:0", "cuda:0"]) == ""
