"""The desktop app as a client: `captioner gui --server URL --token-file F` captions a file on a
real server (tiny.en on the CPU), and its dashboard plots the server's telemetry, from the
status messages, instead of this machine's."""

from __future__ import annotations

import argparse
import os

import pytest
from serve_helpers import TOKEN

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before Qt is imported, as tests/ui does

pytestmark = pytest.mark.slow

CLIP = "en_ls_1089-134691-0001"  # "for a full hour he had paced up and down ..."


def test_gui_captions_on_the_server_and_plots_its_telemetry(served, speech_clips, qtbot, tmp_path, monkeypatch):
    from captioner.app.commands import gui
    from captioner.app.gui_main import open_window

    monkeypatch.setenv("CAPTIONER_TRANSCRIPT_DIR", str(tmp_path / "transcripts"))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    parser = argparse.ArgumentParser()
    gui.add_arguments(parser)
    args = parser.parse_args(["--settings", str(tmp_path / "settings.ini"), "--server", served.url,
                              "--token-file", str(token_file), "--file", str(speech_clips[CLIP].wav)])
    from captioner.app.remote_listen import check_server_arguments

    check_server_arguments(args, local_device_allowed=True)  # what `captioner gui` checks (reads the token)
    window, controller = open_window(args)
    qtbot.addWidget(window)
    qtbot.addWidget(window.overlay)
    try:
        assert window.controls.server() == served.url

        def remote_sample():
            pipeline = controller.pipeline
            return pipeline.latest_telemetry() if pipeline is not None else None

        qtbot.waitUntil(lambda: remote_sample() is not None, timeout=60_000)
        pipeline = controller.pipeline
        assert pipeline.server == served.url and controller.session_meta()["server"] == served.url
        # The dashboard is fed the server's readings (a CPU server: its host CPU, no GPU), not ours.
        qtbot.waitUntil(lambda: window.dashboard._latest_sample is pipeline.latest_telemetry(), timeout=10_000)
        sample = window.dashboard._latest_sample
        assert sample.cpu_pct is not None and sample.gpu_name is None
        status = controller.latest_status()
        assert status.model == "tiny.en" and served.url.split("//")[1] in status.device_name
        qtbot.waitUntil(lambda: "paced" in window.caption_view.committed_text().lower(), timeout=120_000)
        qtbot.waitUntil(lambda: not controller.busy and controller.pipeline is None, timeout=120_000)
        assert "hour" in window.caption_view.committed_text().lower()
        window.collect_settings()
        assert window.settings.server == served.url
    finally:
        controller.shutdown(timeout_s=30)
