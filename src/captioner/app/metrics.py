"""``--metrics-port N``: the dashboard's figures for Prometheus, on 127.0.0.1 only.

GPU figures use the names the NVIDIA DCGM exporter publishes (``DCGM_FI_DEV_GPU_TEMP`` ...,
labels ``gpu`` and ``modelName``), so existing GPU dashboards and alerts work unchanged;
framebuffer (VRAM) figures are in MiB as DCGM's are. Pipeline figures are ``captioner_*``.
Caption latency is a histogram, observed once per caption update.

Values are read at scrape time from the newest sample/status (a custom collector), so a figure
that is N/A is simply absent from the scrape instead of a stale or fake number.

Lost inputs: ``captioner_inputs_lost`` is how many inputs are away now, and
``captioner_input_lost_total{stream}`` counts each stream's losses, from the statuses handed to
:meth:`MetricsExporter.update_status` (a stream counts once each time it turns up lost; a loss
lasts at least the 0.5 s before its device is looked for, and statuses come several times a second).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from captioner.errors import UserError
from captioner.events import CaptionUpdate, PipelineStatus, TelemetrySample
from captioner.trace import caption_latency_s

MIB = 1024 * 1024

# Caption latency (s): the interesting range is 0.2-5 s; beyond 10 s captions are useless.
LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0)

# (DCGM name, help, TelemetrySample field, scale)
_DCGM_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c", 1.0),
    ("DCGM_FI_DEV_SLOWDOWN_TEMP", "Temperature at which the GPU slows down (in C).", "slowdown_temp_c", 1.0),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w", 1.0),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Enforced power limit (in W).", "power_limit_w", 1.0),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "sm_clock_mhz", 1.0),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "mem_clock_mhz", 1.0),
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "utilization_pct", 1.0),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "vram_used_bytes", 1.0 / MIB),
    ("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", "vram_total_bytes", 1.0 / MIB),
)

# (name, help, PipelineStatus field)
_STATUS_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("captioner_frame_latency_ms", "Capture of a 10 ms frame to its features ready (ms).", "frame_latency_ms"),
    ("captioner_step_latency_ms", "One model update, encoder and decoder (ms).", "step_latency_ms"),
    ("captioner_caption_latency_seconds_last", "Latest caption latency the pipeline measured (s).", "caption_latency_s"),
    ("captioner_queue_depth", "Audio blocks waiting for the GPU worker.", "queue_depth"),
    ("captioner_lag_seconds", "How far processing runs behind capture (s).", "lag_s"),
    ("captioner_real_time_factor", "Processing time over audio time (below 1 keeps up).", "real_time_factor"),
    ("captioner_batch_size", "Streams in the latest model step.", "batch_size"),
)


class _Collector:
    """Builds the gauge families from the newest values at each scrape."""

    def __init__(self, exporter: MetricsExporter) -> None:
        self._exporter = exporter

    def describe(self) -> list:
        return []  # values appear and disappear with availability; skip registration-time checks

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        sample, status = self._exporter.snapshot()
        input_losses = self._exporter.input_losses()
        if sample is not None and sample.gpu_name is not None:
            labels = ["gpu", "modelName"]
            values = [str(sample.gpu_index if sample.gpu_index is not None else 0), sample.gpu_name]
            for name, help_text, attr, scale in _DCGM_GAUGES:
                value = getattr(sample, attr)
                if value is None:
                    continue
                family = GaugeMetricFamily(name, help_text, labels=labels)
                family.add_metric(values, float(value) * scale)
                yield family
            if sample.vram_used_bytes is not None and sample.vram_total_bytes is not None:
                family = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=labels)
                family.add_metric(values, (sample.vram_total_bytes - sample.vram_used_bytes) / MIB)
                yield family
            if sample.vram_process_bytes is not None:
                family = GaugeMetricFamily(
                    "captioner_process_vram_bytes", "GPU memory used by this process (bytes).", labels=labels
                )
                family.add_metric(values, float(sample.vram_process_bytes))
                yield family
        if sample is not None:
            for name, help_text, attr in (
                ("captioner_host_cpu_percent", "Host CPU load, all cores (%).", "cpu_pct"),
                ("captioner_process_cpu_percent", "This process's CPU use (% of one core).", "process_cpu_pct"),
            ):
                value = getattr(sample, attr)
                if value is not None:
                    yield GaugeMetricFamily(name, help_text, value=float(value))
        if status is not None:
            info = GaugeMetricFamily(
                "captioner_pipeline_info", "Provider, model and device of the pipeline.",
                labels=["provider", "model", "device", "state"],
            )
            info.add_metric([status.provider, status.model, status.device_name, status.state], 1.0)
            yield info
            yield GaugeMetricFamily("captioner_streams", "Streams being captioned.", value=float(len(status.streams)))
            for name, help_text, attr in _STATUS_GAUGES:
                value = getattr(status, attr)
                if value is not None:
                    yield GaugeMetricFamily(name, help_text, value=float(value))
            dropped = CounterMetricFamily("captioner_dropped_frames", "Audio frames dropped since the start.")
            dropped.add_metric([], float(status.dropped_frames))
            yield dropped
            yield GaugeMetricFamily("captioner_inputs_lost", "Inputs whose device stopped and is waited for.",
                                    value=float(len(status.lost_inputs)))
            if status.input_levels_dbfs:
                levels = GaugeMetricFamily(
                    "captioner_input_level_dbfs", "Audio input level per stream (dBFS).", labels=["stream"]
                )
                for i, level in enumerate(status.input_levels_dbfs):
                    stream = status.streams[i] if i < len(status.streams) else str(i)
                    levels.add_metric([stream], float(level))
                yield levels
        if input_losses:
            # The family is "captioner_input_lost"; Prometheus names its sample ..._total.
            losses = CounterMetricFamily("captioner_input_lost", "Times an input's device stopped, per stream.",
                                         labels=["stream"])
            for stream, count in sorted(input_losses.items()):
                losses.add_metric([stream], float(count))
            yield losses


class MetricsExporter:
    """A Prometheus endpoint on ``127.0.0.1:port`` (port 0 picks a free one; see :attr:`port`).

    ``update_*``/``observe_caption`` may be called from any thread; the HTTP server runs on its
    own daemon thread and reads the newest values when scraped.
    """

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        from prometheus_client import CollectorRegistry, Histogram

        if not 0 <= port <= 65535:
            raise UserError(f"--metrics-port must be 0-65535, not {port}")
        self.host = host
        self.requested_port = port
        self.registry = CollectorRegistry(auto_describe=False)
        self._lock = threading.Lock()
        self._sample: TelemetrySample | None = None
        self._status: PipelineStatus | None = None
        self._input_losses: dict[str, int] = {}
        self.registry.register(_Collector(self))
        self._latency = Histogram(
            "captioner_caption_latency_seconds",
            "End of the audio a caption covers to the caption on screen (s).",
            labelnames=["kind"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self) -> int:
        from prometheus_client import start_http_server

        try:
            self._server, self._thread = start_http_server(self.requested_port, addr=self.host, registry=self.registry)
        except OSError as exc:
            raise UserError(
                f"cannot serve metrics on {self.host}:{self.requested_port}: {exc.strerror or exc}"
            ) from None
        self.port = int(self._server.server_port)
        return self.port

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=5.0)

    def snapshot(self) -> tuple[TelemetrySample | None, PipelineStatus | None]:
        with self._lock:
            return self._sample, self._status

    def update_telemetry(self, sample: TelemetrySample) -> None:
        with self._lock:
            self._sample = sample

    def update_status(self, status: PipelineStatus) -> None:
        with self._lock:
            was_lost = set(self._status.lost_inputs) if self._status is not None else set()
            for stream in status.streams:
                self._input_losses.setdefault(stream, 0)  # a counter starts at 0, before its first loss
            for stream in status.lost_inputs:
                if stream not in was_lost:
                    self._input_losses[stream] = self._input_losses.get(stream, 0) + 1
            self._status = status

    def input_losses(self) -> dict[str, int]:
        """Each stream seen so far, with how many times it was lost."""
        with self._lock:
            return dict(self._input_losses)

    def observe_caption(self, update: CaptionUpdate) -> None:
        self._latency.labels(kind=update.kind).observe(caption_latency_s(update))
