"""``--metrics-port N``: the dashboard's figures for Prometheus, on 127.0.0.1 only.

GPU figures use the names the NVIDIA DCGM exporter publishes (``DCGM_FI_DEV_GPU_TEMP`` ...,
labels ``gpu`` and ``modelName``), so existing GPU dashboards and alerts work unchanged;
framebuffer (VRAM) figures are in MiB as DCGM's are. Pipeline figures are ``captioner_*``.
Caption latency is a histogram, observed once per caption update.

Values are read at scrape time from the newest sample/status (a custom collector), so a figure
that is N/A is simply absent from the scrape instead of a stale or fake number.

A server with several engines (``serve --device all``, ``--engines-per-device``) hands each
engine's status with its name: the pipeline figures then carry an ``engine`` label, one series
per engine; GPU figures come one series per GPU (the DCGM ``gpu`` label). The desktop app's one
pipeline has no ``engine`` label.

A server also says whether each engine is up (``captioner_engine_up``, 1 or 0: 0 from its failure
until a fresh engine has taken its place) and how often one was restarted
(``captioner_engine_restarts_total``), from :meth:`MetricsExporter.update_engine`.

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
        samples, statuses = self._exporter.snapshot()
        input_losses = self._exporter.input_losses()
        engines = self._exporter.engines()
        yield from _gpu_families([s for s in samples if s.gpu_name is not None])
        if samples:
            from prometheus_client.core import GaugeMetricFamily

            host = samples[-1]  # the host's figures are the same in every sample: the newest
            for name, help_text, attr in (
                ("captioner_host_cpu_percent", "Host CPU load, all cores (%).", "cpu_pct"),
                ("captioner_process_cpu_percent", "This process's CPU use (% of one core).", "process_cpu_pct"),
            ):
                value = getattr(host, attr)
                if value is not None:
                    yield GaugeMetricFamily(name, help_text, value=float(value))
        if statuses:
            yield from _pipeline_families(statuses)
        if engines:
            yield from _engine_families(engines)
        if input_losses:
            from prometheus_client.core import CounterMetricFamily

            # The family is "captioner_input_lost"; Prometheus names its sample ..._total.
            losses = CounterMetricFamily("captioner_input_lost", "Times an input's device stopped, per stream.",
                                         labels=["stream"])
            for stream, count in sorted(input_losses.items()):
                losses.add_metric([stream], float(count))
            yield losses


def _gpu_families(samples: list[TelemetrySample]) -> Iterator[Any]:
    """The DCGM-named gauges, one series per GPU sampled (absent where a figure is N/A)."""
    from prometheus_client.core import GaugeMetricFamily

    labels = ["gpu", "modelName"]
    keyed = [([str(s.gpu_index if s.gpu_index is not None else 0), s.gpu_name], s) for s in samples]

    def family(name: str, help_text: str, values: list[tuple[list[str], float | None]]):
        present = [(key, value) for key, value in values if value is not None]
        if not present:
            return None
        built = GaugeMetricFamily(name, help_text, labels=labels)
        for key, value in present:
            built.add_metric(key, float(value))
        return built

    built = [family(name, help_text, [(key, None if getattr(s, attr) is None else getattr(s, attr) * scale)
                                      for key, s in keyed])
             for name, help_text, attr, scale in _DCGM_GAUGES]
    built.append(family("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
                        [(key, None if s.vram_used_bytes is None or s.vram_total_bytes is None
                          else (s.vram_total_bytes - s.vram_used_bytes) / MIB) for key, s in keyed]))
    built.append(family("captioner_process_vram_bytes", "GPU memory used by this process (bytes).",
                        [(key, s.vram_process_bytes) for key, s in keyed]))
    yield from (f for f in built if f is not None)


def _pipeline_families(statuses: dict[str, PipelineStatus]) -> Iterator[Any]:
    """The pipeline figures of each engine: labelled ``engine`` when the engines are named (a
    server's), unlabelled for the desktop app's one pipeline."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    named = any(statuses)
    engine = ["engine"] if named else []

    def per_engine(family_type, name: str, help_text: str, values, extra: tuple[str, ...] = ()):
        family = family_type(name, help_text, labels=engine + list(extra))
        added = False
        for key, status in statuses.items():
            for labels, value in values(status):
                if value is not None:
                    family.add_metric(([key] if named else []) + list(labels), float(value))
                    added = True
        return family if added else None

    families = [
        per_engine(GaugeMetricFamily, "captioner_pipeline_info", "Provider, model and device of the pipeline.",
                   lambda st: [([st.provider, st.model, st.device_name, st.state], 1.0)],
                   ("provider", "model", "device", "state")),
        per_engine(GaugeMetricFamily, "captioner_streams", "Streams being captioned.",
                   lambda st: [([], len(st.streams))]),
        *(per_engine(GaugeMetricFamily, name, help_text, lambda st, attr=attr: [([], getattr(st, attr))])
          for name, help_text, attr in _STATUS_GAUGES),
        per_engine(CounterMetricFamily, "captioner_dropped_frames", "Audio frames dropped since the start.",
                   lambda st: [([], st.dropped_frames)]),
        per_engine(GaugeMetricFamily, "captioner_inputs_lost", "Inputs whose device stopped and is waited for.",
                   lambda st: [([], len(st.lost_inputs))]),
        per_engine(GaugeMetricFamily, "captioner_input_level_dbfs", "Audio input level per stream (dBFS).",
                   lambda st: [([st.streams[i] if i < len(st.streams) else str(i)], level)
                               for i, level in enumerate(st.input_levels_dbfs)], ("stream",)),
    ]
    yield from (f for f in families if f is not None)


def _engine_families(engines: dict[str, tuple[bool, int]]) -> Iterator[Any]:
    """A server's engines: up or not, and restarts (labelled ``engine`` when there are several)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    named = any(engines)
    labels = ["engine"] if named else []
    up = GaugeMetricFamily("captioner_engine_up", "1 while the engine takes streams, 0 from its failure until a "
                           "fresh one has taken its place.", labels=labels)
    restarts = CounterMetricFamily("captioner_engine_restarts", "Fresh engines started in a failed one's place.",
                                   labels=labels)
    for key, (is_up, count) in sorted(engines.items()):
        up.add_metric([key] if named else [], 1.0 if is_up else 0.0)
        restarts.add_metric([key] if named else [], float(count))
    yield up
    yield restarts


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
        self._samples: dict[int, TelemetrySample] = {}  # by GPU index
        self._statuses: dict[str, PipelineStatus] = {}  # by engine name ("": the app's one pipeline)
        self._input_losses: dict[str, int] = {}
        self._engines: dict[str, tuple[bool, int]] = {}  # a server's engines: (up, restarts) by name
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

    def snapshot(self) -> tuple[list[TelemetrySample], dict[str, PipelineStatus]]:
        """Each GPU's newest sample (oldest first) and each engine's newest status."""
        with self._lock:
            return sorted(self._samples.values(), key=lambda s: s.time_s), dict(self._statuses)

    def update_telemetry(self, sample: TelemetrySample) -> None:
        """The newest sample of its GPU (one sampler per GPU; a GPU that fell off the bus has its
        figures absent, the others' stay)."""
        with self._lock:
            self._samples[sample.gpu_index if sample.gpu_index is not None else 0] = sample

    def update_status(self, status: PipelineStatus, engine: str = "") -> None:
        """``engine``: the engine's name on a server of several (its series' ``engine`` label)."""
        with self._lock:
            previous = self._statuses.get(engine)
            was_lost = set(previous.lost_inputs) if previous is not None else set()
            for stream in status.streams:
                self._input_losses.setdefault(stream, 0)  # a counter starts at 0, before its first loss
            for stream in status.lost_inputs:
                if stream not in was_lost:
                    self._input_losses[stream] = self._input_losses.get(stream, 0) + 1
            self._statuses[engine] = status

    def update_engine(self, up: bool, restarts: int, engine: str = "") -> None:
        """A server's engine: whether it takes streams now, and how often it was restarted."""
        with self._lock:
            self._engines[engine] = (up, restarts)

    def engines(self) -> dict[str, tuple[bool, int]]:
        with self._lock:
            return dict(self._engines)

    def input_losses(self) -> dict[str, int]:
        """Each stream seen so far, with how many times it was lost."""
        with self._lock:
            return dict(self._input_losses)

    def observe_caption(self, update: CaptionUpdate) -> None:
        if update.kind != "clear":  # nothing shown: no latency
            self._latency.labels(kind=update.kind).observe(caption_latency_s(update))
