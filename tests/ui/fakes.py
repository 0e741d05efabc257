"""Fakes of the controller's collaborators, shared by the session tests: a SessionView that
records its calls, and a pipeline (with its factory) that needs no model."""

from __future__ import annotations

import math
import struct
import threading
import time
import wave

from captioner.events import CaptionUpdate, PipelineStatus

TIMEOUT_S = 10.0


def write_tone_wav(path):
    """Half a second of a 440 Hz tone, 16 kHz mono, at ``path``: a file source that opens (the
    fake pipelines never read it); returns ``path``."""
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / 16000)))
                                 for i in range(8000)))
    return path


def final(stream, text, start_s=0.0, end_s=1.0):
    return CaptionUpdate(stream, "final", text, start_s, end_s, end_s + 0.5, end_s + 0.7, segment=1)


def status(streams=("Clip",)):
    return PipelineStatus(time_s=time.monotonic(), provider="CPUExecutionProvider", model="tiny.en",
                          device_name="cpu", streams=streams)


class RecordingView:
    """A SessionView that only records its calls (from whichever thread makes them)."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.failed_settings: list[str] = []  # the setting each session_failed was about
        self._changed = threading.Condition()

    def _record(self, *call):
        with self._changed:
            self.calls.append(call)
            self._changed.notify_all()

    def names(self):
        return [call[0] for call in self.calls]

    def wait_for(self, name, count=1):
        """The ``count``-th call named ``name``, once it was made."""
        with self._changed:
            assert self._changed.wait_for(lambda: self.names().count(name) >= count, TIMEOUT_S), self.calls
            return [call for call in self.calls if call[0] == name][count - 1]

    def devices_listed(self, devices, error):
        self._record("devices_listed", list(devices), error)

    def session_starting(self, model):
        self._record("session_starting", model)

    def session_progress(self, message, fraction):
        self._record("session_progress", message, fraction)

    def session_started(self, transcript_path, meta):
        self._record("session_started", transcript_path, dict(meta))

    def session_failed(self, message, setting=""):
        self._record("session_failed", message)
        self.failed_settings.append(setting)

    def session_stopping(self, finished):
        self._record("session_stopping", finished)

    def session_stopped(self, leftovers, status, error):
        self._record("session_stopped", list(leftovers), status, error)


class FakeBackend:
    name = "fake"


class FakePipeline:
    """What the controller uses of captioner.engine.pipeline.Pipeline, without a model."""

    def __init__(self, sources, model, language, task, device, transcript, progress, fail=None, gate=None):
        self.sources, self.model, self.language, self.task, self.device = sources, model, language, task, device
        self.transcript, self.progress = transcript, progress
        self.fail, self.gate = fail, gate
        self.captions: list[CaptionUpdate] = []
        self.leftovers: list[CaptionUpdate] = []  # what stop() commits
        self.status = status(tuple(s.stream for s in sources))
        self.error = None
        self.exhausted = False
        self.backend = None
        self.stopped = 0
        self.new_notices: list = []  # language notices notices() hands out next
        self.notices_at_stop: list = []  # those a check still running reports as it stops

    def start(self):
        if self.gate is not None:
            assert self.gate.wait(TIMEOUT_S)
        self.progress(f"{self.model}: building graphs", 0.5)
        if self.fail is not None:
            raise self.fail
        self.progress(f"{self.model}: ready", 1.0)
        self.backend = FakeBackend()

    def drain_captions(self):
        out, self.captions = self.captions, []
        return out

    def latest_status(self):
        return self.status

    def notices(self):
        out, self.new_notices = self.new_notices, []
        return out

    def wait_exhausted(self, timeout_s=None):
        return self.exhausted

    def stop(self, timeout_s=60.0):
        self.stopped += 1
        self.new_notices.extend(self.notices_at_stop)
        self.notices_at_stop = []
        self.captions.extend(self.leftovers)
        self.leftovers = []
        self.transcript.close()


class Factory:
    """Builds FakePipelines and keeps them, for the test to drive."""

    def __init__(self, **options):
        self.options = options
        self.built: list[FakePipeline] = []

    def __call__(self, sources, **kwargs):
        pipeline = FakePipeline(sources, **kwargs, **self.options)
        self.built.append(pipeline)
        return pipeline


class ConfigTakingFactory(Factory):
    """Builds the fake pipelines as the engine's Pipeline is built: with ``config=`` (an
    ``EngineConfig``), which it keeps for the test."""

    def __init__(self) -> None:
        super().__init__()
        self.configs: list = []

    def __call__(self, sources, config=None, **kwargs):
        self.configs.append(config)
        return super().__call__(sources, **kwargs)
