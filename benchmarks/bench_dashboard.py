"""CPU cost of the desktop app's GUI thread: captions scrolling and every dashboard plot live.

Runs the real MainWindow for N seconds per scenario, in one process, side by side:

- ``idle``: window shown, 30 Hz pump running, nothing arriving;
- ``live``: the live load of a busy session — two streams, a partial caption every 250 ms and a
  committed one every 2 s per stream, pipeline status at 10 Hz, telemetry from the real 2 Hz
  sampler (plus GPU-like values so every GPU plot draws), overlay shown;
- ``live-hidden-dashboard``: the same with the dashboard dock closed.

Cost = process CPU time (user+system, os.times) / wall time, in % of one core; the target is
under 10% for ``live``. Run under a real X server for realistic painting:

    xvfb-run -a -s "-screen 0 1920x1080x24" python benchmarks/bench_dashboard.py --seconds 30
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import tempfile
import time

WORDS = ("so the plan for this quarter is to move the captioning engine onto the new servers and measure how "
         "far we can push the number of streams before latency goes above one second").split()


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def run_scenario(app, name: str, seconds: float, feed_events: bool, show_dashboard: bool) -> dict:
    from PySide6.QtCore import QEventLoop, QTimer

    from captioner.events import CaptionUpdate, PipelineStatus, TelemetrySample
    from captioner.gpu.telemetry import TelemetrySampler
    from captioner.ui.main_window import MainWindow
    from captioner.ui.settings import open_settings

    settings = open_settings(os.path.join(tempfile.mkdtemp(), "bench.ini"))
    window = MainWindow(settings)
    window.resize(1600, 1000)
    window.show()
    window.dashboard_dock.setVisible(show_dashboard)
    if feed_events:
        window.set_overlay_visible(True)
    sampler = TelemetrySampler()
    sampler.start()
    start = time.monotonic()
    state = {"word": itertools.cycle(WORDS), "segment": [0, 0], "text": ["", ""], "n_updates": 0}
    streams = ("Me", "Meeting")

    class Feed:
        """Events as the engine makes them, released on the engine's schedule."""

        def __init__(self):
            self.pending: list = []
            self.status = None
            self.sample = None

        def drain_captions(self):
            out, self.pending = self.pending, []
            return out

        def latest_status(self):
            return self.status

        def latest_telemetry(self):
            return self.sample

    feed = Feed()
    window.set_feed(feed)
    timers = []

    def every(ms, fn):
        timer = QTimer()
        timer.setInterval(ms)
        timer.timeout.connect(fn)
        timer.start()
        timers.append(timer)

    def partial():
        t = time.monotonic() - start
        for i, stream in enumerate(streams):
            state["text"][i] = (state["text"][i] + " " + next(state["word"])).strip()
            feed.pending.append(CaptionUpdate(stream, "partial", state["text"][i], t - 2, t - 0.4, t, t + 0.05,
                                              segment=state["segment"][i]))
            state["n_updates"] += 1

    def commit():
        t = time.monotonic() - start
        for i, stream in enumerate(streams):
            if state["text"][i]:
                feed.pending.append(CaptionUpdate(stream, "final", state["text"][i], t - 2, t - 0.6, t, t + 0.05,
                                                  segment=state["segment"][i]))
                state["text"][i] = ""
                state["segment"][i] += 1
                state["n_updates"] += 1

    def status():
        now = time.monotonic()
        k = int((now - start) * 10)
        feed.status = PipelineStatus(
            time_s=now, provider="CUDAExecutionProvider", model="tiny.en", device_name="bench", streams=streams,
            frame_latency_ms=0.6 + 0.1 * (k % 5), step_latency_ms=20.0 + k % 7, caption_latency_s=0.8,
            dropped_frames=k // 100, real_time_factor=0.05, input_levels_dbfs=(-20.0 - k % 9, -33.0 + k % 4),
            batch_size=2)

    def telemetry():
        real = sampler.latest()
        if real is None:
            return
        k = int((real.time_s - start) * 2)
        gib = 1 << 30
        # the real host CPU figures, with GPU values so that every GPU plot draws a curve
        feed.sample = TelemetrySample(
            time_s=real.time_s, gpu_index=0, gpu_name="bench GPU", temperature_c=45.0 + k % 10, slowdown_temp_c=90.0,
            power_w=150.0 + 5 * (k % 8), power_limit_w=700.0, sm_clock_mhz=1980.0, mem_clock_mhz=3201.0,
            utilization_pct=30.0 + k % 20, vram_used_bytes=(5 + k % 3) * gib, vram_total_bytes=140 * gib,
            vram_process_bytes=2 * gib, cpu_pct=real.cpu_pct, process_cpu_pct=real.process_cpu_pct)

    if feed_events:
        every(250, partial)
        every(2000, commit)
        every(100, status)
        every(500, telemetry)

    # The real event loop, as in the app (a polling loop would measure itself).
    loop = QEventLoop()
    QTimer.singleShot(1000, loop.quit)  # settle: first layout, fonts, first samples
    loop.exec()
    redraws0 = window.dashboard.redraws
    wall0, cpu0 = time.monotonic(), cpu_s()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()
    wall, cpu = time.monotonic() - wall0, cpu_s() - cpu0
    redraws = window.dashboard.redraws - redraws0
    for timer in timers:
        timer.stop()
    sampler.stop()
    window.close()
    window.overlay.deleteLater()
    window.deleteLater()
    app.processEvents()
    return {"scenario": name, "seconds": round(wall, 2), "cpu_s": round(cpu, 3),
            "cpu_pct_of_one_core": round(100 * cpu / wall, 2), "dashboard_redraws_per_s": round(redraws / wall, 1),
            "caption_updates": state["n_updates"]}


def caption_view_scaling(app, sizes=(100, 2000, 8000), updates: int = 50) -> list[dict]:
    """CPU per caption update (a committed sentence plus a new partial) as the session grows:
    committed text is appended and only the partial tail is rewritten, so it should stay flat."""
    from captioner.events import CaptionUpdate
    from captioner.ui.caption_view import CaptionView

    view = CaptionView()
    view.resize(1000, 400)
    view.show()

    def batch(i: int) -> list:
        return [CaptionUpdate("Me", "final", f"sentence number {i} with a few more words in it.", i, i + 1, i + 1.5,
                              i + 1.6, segment=i),
                CaptionUpdate("Me", "partial", "and then some more provisional words", i + 1, i + 2, i + 2, i + 2,
                              segment=i + 1)]

    rows = []
    for size in sizes:
        while len(view._paragraphs) < size:
            view.apply_updates(batch(len(view._paragraphs)))
        app.processEvents()
        cpu0 = cpu_s()
        for _ in range(updates):
            view.apply_updates(batch(len(view._paragraphs)))
            app.processEvents()
        rows.append({"paragraphs": size, "cpu_ms_per_update": round(1000 * (cpu_s() - cpu0) / updates, 2)})
    view.close()
    view.deleteLater()
    app.processEvents()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    from PySide6.QtCore import QCoreApplication, QEvent
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(sys.argv[:1])
    results = [
        run_scenario(app, "idle", args.seconds, feed_events=False, show_dashboard=True),
        run_scenario(app, "live", args.seconds, feed_events=True, show_dashboard=True),
        run_scenario(app, "live-hidden-dashboard", args.seconds, feed_events=True, show_dashboard=False),
    ]
    scaling = caption_view_scaling(app)
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    info = {"platform": app.platformName(), "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    print(json.dumps(info))
    print(f"{'scenario':<24}{'CPU % of one core':>18}{'redraws/s':>11}{'updates':>9}")
    for r in results:
        print(f"{r['scenario']:<24}{r['cpu_pct_of_one_core']:>18.2f}{r['dashboard_redraws_per_s']:>11.1f}"
              f"{r['caption_updates']:>9}")
    idle, live = results[0]["cpu_pct_of_one_core"], results[1]["cpu_pct_of_one_core"]
    print(f"live / idle = {live / idle:.2f}x" if idle > 0 else "idle cost too small to compare")
    print("caption view, CPU per update as the session grows: "
          + ", ".join(f"{r['paragraphs']} paragraphs {r['cpu_ms_per_update']} ms" for r in scaling))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results, "caption_view_scaling": scaling}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
