"""The whole app: the real pipeline behind the window, the command line, a headless smoke run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from PySide6.QtGui import QImage

from captioner.app import cli
from captioner.events import CaptionUpdate, PipelineStatus
from captioner.trace import load_trace
from captioner.ui.controls import RunConfig, SourceChoice

CLIP = "en_ls_1089-134691-0001"  # "for a full hour he had paced up and down waiting but he could wait no longer"


@pytest.fixture
def transcripts(tmp_path, monkeypatch):
    directory = tmp_path / "transcripts"
    monkeypatch.setenv("CAPTIONER_TRANSCRIPT_DIR", str(directory))
    return directory


@pytest.mark.slow
def test_real_pipeline_drives_the_window(window, qtbot, speech_clips, transcripts):
    from captioner.app.gui_app import LiveController
    from captioner.app.gui_main import connect_window

    clip = speech_clips[CLIP]
    progress = []

    class ProgressTap:
        """The window's session view, keeping a copy of the progress reports."""

        def __getattr__(self, name):
            return getattr(window.session, name)

        def session_progress(self, message, fraction):
            progress.append((message, fraction))
            window.session.session_progress(message, fraction)

    controller = LiveController(ProgressTap(), device="cpu", metrics_port=0)
    connect_window(window, controller)
    try:
        config = RunConfig(sources=(SourceChoice("file", "Meeting", clip.wav.name, path=str(clip.wav)),), model="tiny.en")
        window.start_requested.emit(config)
        qtbot.waitUntil(lambda: window.controls.running and controller.pipeline is not None, timeout=240_000)
        # the file plays at real-time pace, then the app stops by itself and commits the rest
        qtbot.waitUntil(lambda: controller.pipeline is None and not controller.busy and not window.controls.running,
                        timeout=240_000)
        with urllib.request.urlopen(f"http://127.0.0.1:{controller.metrics.port}/metrics", timeout=5) as r:
            families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    finally:
        leftovers = controller.shutdown()
    window.apply_captions(leftovers)

    # the model preparation reported its progress (GRAPH's callback) on the way up
    assert progress and all(0.0 <= f <= 1.0 for _, f in progress) and "tiny.en" in progress[-1][0]
    updates = [e for e in window.record if isinstance(e, CaptionUpdate)]
    kinds = [u.kind for u in updates if u.text.strip()]
    assert "partial" in kinds and "final" in kinds
    assert kinds.index("partial") < kinds.index("final")  # shown provisionally before committed
    view_text = window.caption_view.committed_text().lower()
    # A file's speakers are labelled (speakers "auto"): its one voice heads the view.
    assert view_text.startswith("meeting (speaker 1): ")
    assert window.caption_view.toPlainText().startswith("Meeting · Speaker 1\n")
    # the words may be committed in several pieces (and segments): read them as one text
    committed = " ".join(" ".join(u.text for u in updates if u.kind == "final").lower().split())
    assert "wait no longer" in committed, updates
    assert all(w in view_text for w in committed.replace(".", "").replace(",", "").split())
    assert window.caption_view.partial_text("Meeting") == ""
    assert window.controls.start_button.text() == "Start"
    statuses = [e for e in window.record if isinstance(e, PipelineStatus)]
    assert statuses and statuses[-1].provider == "CPUExecutionProvider"
    # The stream was on the dashboard while it played; once its file ended it left the engine.
    assert any(s.streams == ("Meeting",) for s in statuses)
    assert window.provider_label.text() == "Provider: CPU" and window.streams_label.text() == "Streams: 0"
    # the engine's transcript writer saved every committed line as it came
    (transcript,) = transcripts.glob("*.txt")
    # one line per committed piece ("[start --> end] Meeting: text"): read the pieces as one text
    pieces = [re.match(r"^\[[^\]]*\] [^:]*: (.*)$", line) for line in transcript.read_text().splitlines()]
    assert "wait no longer" in " ".join(" ".join(m.group(1) for m in pieces if m).lower().split())
    assert str(transcript) in window.history.transcript_label.text()
    counts = {s.labels["kind"]: s.value for s in families["captioner_caption_latency_seconds"].samples
              if s.name == "captioner_caption_latency_seconds_count"}
    shown = [u for u in updates if u.text.strip()]
    assert counts == {kind: sum(u.kind == kind for u in shown) for kind in ("partial", "final")}


def test_cli_rejects_bad_arguments(tmp_path, capsys):
    assert cli.main(["gui", "--file", str(tmp_path / "missing.wav")]) == 2
    assert "no such audio file" in capsys.readouterr().err
    assert cli.main(["gui", "--screenshot", str(tmp_path / "x.png")]) == 2
    assert "--quit-after" in capsys.readouterr().err
    assert cli.main(["gui", "--trace", str(tmp_path / "none.jsonl")]) == 2


def _xvfb_command() -> list[str] | None:
    if shutil.which("xvfb-run"):
        return ["xvfb-run", "-a", "-s", "-screen 0 1920x1080x24"]
    return None


@pytest.mark.slow
def test_headless_smoke_run_under_xvfb(tmp_path, speech_clips):
    """`captioner gui --file` in a real X server: starts, captions, plots, quits by itself."""
    xvfb = _xvfb_command()
    if xvfb is None:
        pytest.skip("xvfb-run is not installed")
    clip = speech_clips[CLIP]
    shot = tmp_path / "smoke.png"
    trace = tmp_path / "smoke.trace.jsonl"
    env = dict(os.environ, CAPTIONER_TRANSCRIPT_DIR=str(tmp_path / "transcripts"), CAPTIONER_DEVICE="cpu")
    env.pop("QT_QPA_PLATFORM", None)  # the real xcb platform this time
    result = subprocess.run(
        [*xvfb, sys.executable, "-m", "captioner", "gui", "--settings", str(tmp_path / "s.ini"),
         "--file", str(clip.wav), "--overlay", "--quit-after", "25", "--screenshot", str(shot),
         "--save-trace", str(trace)],
        env=env, capture_output=True, text=True, timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    # No overlay shot: by the end the clip has long finished, and an overlay with nothing new to
    # show for OVERLAY_IDLE_S hides (tests/ui/test_main_window.py shows it while captions come).
    for name in ("smoke.png", "smoke-dashboard.png"):
        image = QImage(str(tmp_path / name))
        assert not image.isNull() and image.width() > 300, name
    image = QImage(str(shot))
    assert image.width() >= 1000 and image.height() >= 700
    # Not a blank frame: many distinct colours (text, curves, grids).
    ptr = image.convertToFormat(QImage.Format.Format_RGB32).constBits()
    pixels = np.frombuffer(ptr, dtype=np.uint32)
    assert len(np.unique(pixels)) > 50
    recorded = load_trace(trace)
    committed = " ".join(c.text for c in recorded.final_captions()).lower()
    assert "wait no longer" in committed, committed
    assert len(recorded.statuses) >= 1 and len(recorded.telemetry) >= 20
    assert recorded.statuses[-1].step_latency_ms is not None


def test_stream_labels_are_made_unique():
    from captioner.app.gui_app import unique_streams

    mic = SourceChoice("device", "Me", "mic", device=1)
    headset = SourceChoice("device", "Me", "headset", device=2)
    meeting = SourceChoice("device", "Meeting", "monitor", device="pulse:x.monitor")
    assert [label for _, label in unique_streams((mic, headset, meeting))] == ["Me", "Me 2", "Meeting"]


def test_no_sources_is_a_clear_error():
    from captioner.app.gui_app import open_sources
    from captioner.errors import UserError

    with pytest.raises(UserError, match="at least one source"):
        open_sources(RunConfig(sources=()))


def test_ui_layer_imports_no_hardware_library():
    code = (
        "import sys\n"
        "import captioner.ui.main_window, captioner.ui.dashboard, captioner.ui.controls, captioner.ui.overlay\n"
        "import captioner.ui.history, captioner.ui.settings, captioner.ui.caption_view, captioner.trace\n"
        "bad = [m for m in ('cupy', 'onnxruntime', 'sounddevice', 'pynvml') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""
