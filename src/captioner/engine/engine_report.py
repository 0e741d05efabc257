"""What the engine reports of itself: device memory for admission, the measured update
intervals and lag, and the status the app, the server and the benchmarks read.

:class:`EngineReport` is one of :class:`~captioner.engine.core.Engine`'s three parts (the audio
side is :mod:`captioner.engine.audio_front`'s, the model steps ``core.py``'s); it reads the
engine's streams, costs, timers and recognizer and changes none of them.
"""

from __future__ import annotations

import itertools

import numpy as np

from captioner.engine.admission import LAG_WINDOW_S, Memory
from captioner.engine.recognizer import capabilities_of
from captioner.events import FRAME_SAMPLES, PipelineStatus


class EngineReport:
    """The engine's measurements and status (mixed into ``Engine``; its thread only)."""

    def memory(self) -> Memory | None:
        """Device memory for admission: the configured budget less what the pools hold, else
        the back-end's measurement (``None`` on the CPU)."""
        budget = self.config.admission.vram_budget_bytes
        if budget is not None:
            return Memory(budget - self.features.bytes_allocated, budget)
        measure = getattr(self.backend, "vram_bytes", None)
        measured = measure() if measure is not None else None
        return Memory(*measured) if measured is not None else None

    def _model_buffer_bytes(self) -> dict[str, float]:
        """The model's own device buffers: the decoder's slots and the encoder's buffers
        (``WhisperRuntime.buffer_bytes``; empty for a recognizer without them)."""
        buffer_bytes = capabilities_of(self.recognizer).buffer_bytes
        return buffer_bytes() if buffer_bytes is not None else {}

    def _accounted_bytes(self) -> int:
        """The device memory the engine's own pools and the model's buffers hold (what stands in
        for the process's memory where NVML cannot count it)."""
        model = self._model_buffer_bytes()
        return int(self.features.bytes_allocated + model.get("decoder_slot_bytes", 0) + model.get("encoder_buffer_bytes", 0))

    def measured_interval_p99_s(self) -> float | None:
        """p99 of the engine's recent update intervals (clock time between two updates of a
        stream with speech in between; the last 4,096), ``None`` before 20 or with no stream open.
        Worked out once per model step: a burst of opened streams asks for it each time."""
        if not self._streams or len(self._intervals_s) < 20:
            return None
        if self._interval_p99 is None or self._interval_p99[0] != self.steps:
            self._interval_p99 = (self.steps, float(np.percentile(self._intervals_s, 99)))
        return self._interval_p99[1]

    def measured_lag_s(self) -> float | None:
        """The median lag of the updates in the last :data:`LAG_WINDOW_S` of the engine's clock
        (how long the newest audio of each had waited when its update was done), ``None`` with
        fewer than 3 of them or no stream open."""
        if not self._streams:
            return None
        since_ns = self.clock_ns() - int(LAG_WINDOW_S * 1e9)
        recent = [lag for _, lag in itertools.takewhile(lambda item: item[0] >= since_ns, reversed(self._lags))]
        return float(np.median(recent)) if len(recent) >= 3 else None

    # -- status ----------------------------------------------------------------------------------
    def status(self, queue_depth: int = 0, dropped_blocks: int = 0, state: str = "running",
               message: str = "") -> PipelineStatus:
        """``dropped_frames`` counts the 10 ms frames missing from the streams' sample clocks
        (every drop upstream shows as such a gap, so nothing is counted twice); the sources'
        and the pump's own count of dropped blocks goes into ``extra``."""
        now_ns = self.clock_ns()
        window_ns = 10 * 1_000_000_000
        while self._busy and self._busy[0][0] < now_ns - window_ns:
            self._busy.popleft()
        span_s = min(window_ns, now_ns - self._created_ns) / 1e9
        rtf = (sum(b for _, b in self._busy) / span_s) if span_s > 0.5 else None
        frame_ms = float(np.median(self._frame_latency_ms)) if self._frame_latency_ms else None
        gaps = sum(s.gap_samples for s in self._streams.values()) // FRAME_SAMPLES
        estimate = self.load_estimate(with_host=True)
        main_cost = self._costs["main"]
        fixed_s, per_update_s = main_cost.fit()
        interval_p99_s = self.measured_interval_p99_s()
        capacity = (
            ("stream_slots", float(self.features.capacity)), ("feature_pool_bytes", float(self.features.bytes_allocated)),
            ("predicted_interval_s", estimate.interval_s),
            ("step_fixed_s", fixed_s), ("step_per_update_s", per_update_s),
            ("host_s_per_stream_audio_s", self.host_cost.per_audio_s),
        ) + ((("update_interval_p99_s", interval_p99_s),) if interval_p99_s is not None else ()) \
          + ((("light_steps", float(self.light_steps)),) if self.light_recognizer is not None else ())
        capacity += tuple(self._model_buffer_bytes().items())  # where a GPU's memory goes
        if self.process_memory is not None:  # --gpu-memory: the process's own memory and its budget
            capacity += (("gpu_memory_used_bytes", float(self.process_memory.used_bytes())),
                         ("gpu_memory_budget_bytes", float(self.process_memory.budget_bytes)))
        chooser = capabilities_of(self.recognizer).decode_chooser
        if chooser is not None:  # from how many rows the device decodes now (models/decode_choice.py)
            capacity += (("device_decoding_from_rows", float(chooser.device_from_rows())),)
        return PipelineStatus(
            time_s=now_ns / 1e9,
            provider=self.recognizer.provider,
            model=self.recognizer.name,
            device_name=self.recognizer.device_name,
            streams=self.streams,
            frame_latency_ms=frame_ms,
            step_latency_ms=self._step_latency_ms,
            caption_latency_s=self._caption_latency_s,
            queue_depth=queue_depth,
            dropped_frames=gaps,
            lag_s=self._lags[-1][1] if self._lags else 0.0,
            real_time_factor=rtf,
            input_levels_dbfs=tuple(round(s.level_dbfs, 1) for s in self._streams.values()),
            batch_size=self.last_batch_size,
            state=state,
            message=message,
            admitted_load=estimate.load if main_cost.measured else None,
            streams_refused=self.admission.refusals,
            light_model=(self.light_recognizer.name if self.light_recognizer is not None and self.admission.light_active
                         else ""),
            extra=(("update_interval_s", self.scheduler.interval_s), ("steps", float(self.steps)),
                   ("step_s_total", self.step_s_total), ("dropped_blocks", float(dropped_blocks))) + capacity
            + tuple((f"host_{part}_s_total", seconds) for part, seconds in self.host_s.items())
            + ((("vram_free_fraction", vram_free),) if (vram_free := self.backend.vram_free_fraction()) is not None else ()),
        )
