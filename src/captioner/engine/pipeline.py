"""The live captioning pipeline: sources -> capture pump -> worker -> outboxes.

Threads, each named, with a stop event, joined by :meth:`Pipeline.stop`:

- ``captioner-capture``: drains every source (their own device callbacks only copy and enqueue)
  into one bounded queue of blocks; it never waits on the model, so a slow model step never
  backs up into a device queue. When that queue is full the oldest blocks are dropped and
  counted.
- ``captioner-worker``: owns the model and (on a GPU) the device; see
  :class:`captioner.engine.worker.Worker`.

The GUI or the CLI drains the outboxes without blocking: :meth:`drain_captions` and
:meth:`latest_status`. Commands (add/remove a source, change language or model) go to the
worker, which applies them between model steps.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Callable, Iterable

from captioner.errors import UserError, one_line
from captioner.events import MIN_FREE_VRAM_FRACTION, AudioBlock, CaptionUpdate, PipelineStatus
from captioner.engine.core import Engine, EngineConfig
from captioner.engine.worker import Command, EndOfStream, Worker


def check_room_for_stream(status: PipelineStatus | None) -> None:
    """Refuse a new stream while the GPU has under ``MIN_FREE_VRAM_FRACTION`` of its memory free
    (as the worker last measured it); the CPU, or no measurement yet, never refuses."""
    free = dict(status.extra).get("vram_free_fraction") if status is not None else None
    if free is not None and free < MIN_FREE_VRAM_FRACTION:
        raise UserError(
            f"GPU memory is {100 * free:.0f}% free, under the {100 * MIN_FREE_VRAM_FRACTION:.0f}% kept "
            "for the streams already captioned: close another program on the GPU or stop a stream first"
        )


def unique_labels(labels: Iterable[str]) -> list[str]:
    """The labels made distinct, as the pipeline needs them: a repeat is numbered ("Me", "Me 2")."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} {seen[label]}")
    return out


def telemetry_gpu_index(device: str | None) -> int:
    """The GPU whose telemetry goes with ``device``: N for "cuda:N", else 0 (where "auto" runs);
    a bad name is left for the pipeline to refuse with its own message."""
    from captioner.gpu.backend import parse_device

    try:
        _, index = parse_device(device) if device else ("auto", None)
    except UserError:
        return 0
    return index or 0


def load_recognizer(model: str, device: str | None, task: str = "transcribe", progress=None):
    """The backend and a Whisper recognizer for ``model`` on ``device`` (worker thread)."""
    from captioner.gpu.backend import get_backend
    from captioner.engine.whisper import WhisperRecognizer
    from captioner.models.runtime import load_runtime
    from captioner.models.tokenizer import WhisperTokenizer

    backend = get_backend(device)
    backend.use()  # this thread works the GPU from now on (CuPy allocates on the current device)
    runtime = load_runtime(model, device=backend.name, progress=progress)
    tokenizer = WhisperTokenizer(runtime.files.tokenizer_path, runtime.files.config_path, n_vocab=runtime.n_vocab)
    return backend, WhisperRecognizer(runtime, tokenizer, xp=backend.xp, task=task,
                                      synchronize=backend.synchronize if backend.is_cuda else None)


class _CapturePump(threading.Thread):
    def __init__(self, sources: list, out: "queue.Queue[list[AudioBlock]]", poll_s: float = 0.005) -> None:
        super().__init__(name="captioner-capture", daemon=True)
        self.sources = list(sources)
        self._lock = threading.Lock()
        self.out = out
        self.poll_s = poll_s
        self.stop_event = threading.Event()
        self.all_exhausted = threading.Event()
        self.dropped_blocks = 0
        self.error: BaseException | None = None
        self._ended: set[int] = set()  # ids of sources whose end was announced

    def add(self, source) -> None:
        with self._lock:
            self.sources.append(source)
            self.all_exhausted.clear()

    def remove(self, stream: str):
        with self._lock:
            for source in self.sources:
                if source.stream == stream:
                    self.sources.remove(source)
                    return source
        return None

    def run(self) -> None:
        try:
            while not self.stop_event.is_set():
                with self._lock:
                    sources = list(self.sources)
                got = []
                for source in sources:
                    got += source.read(0.0)
                    if source.exhausted and id(source) not in self._ended:
                        # After its last blocks, in order: the worker commits what it still shows.
                        self._ended.add(id(source))
                        got.append(EndOfStream(source.stream))
                if got:
                    self._put(got)
                elif sources and all(s.exhausted for s in sources):
                    self.all_exhausted.set()
                    self.stop_event.wait(0.05)
                else:
                    time.sleep(self.poll_s)
        except BaseException as error:
            self.error = error

    def _put(self, blocks: list[AudioBlock]) -> None:
        while True:
            try:
                self.out.put_nowait(blocks)
                return
            except queue.Full:
                try:
                    self.out.get_nowait()  # the oldest audio goes; the engine fills the gap with silence
                    self.dropped_blocks += 1
                except queue.Empty:
                    pass

    def stats(self) -> tuple[int, int]:
        with self._lock:
            sources = list(self.sources)
        depth = drops = 0
        for source in sources:
            st = source.stats()
            depth += st.queue_depth
            drops += st.dropped_blocks
        return depth, drops + self.dropped_blocks


class Pipeline:
    """Owns the sources and threads of one captioning session.

    ``sources``: audio sources (``AudioSource``), each with a distinct ``stream`` label.
    ``recognizer_factory``: optional ``() -> (backend, recognizer)`` to use instead of loading
    ``model`` (tests, benchmarks). ``transcript``: a TranscriptWriter that gets every committed
    line.
    """

    def __init__(
        self,
        sources: Iterable,
        model: str = "tiny.en",
        language: str | None = None,
        task: str = "transcribe",
        device: str | None = None,
        config: EngineConfig | None = None,
        transcript=None,
        recognizer_factory: Callable[[], tuple] | None = None,
        queue_blocks: int = 6000,
        progress=None,
    ) -> None:
        self.sources = list(sources)
        names = [s.stream for s in self.sources]
        if len(set(names)) != len(names):
            raise UserError(f"two sources have the same label: {names}")
        self.model = model
        self.language = None if language in (None, "", "auto") else language
        self.task = task
        self.device = device
        self.config = config or EngineConfig()
        self.config.language = self.language
        self.transcript = transcript
        self._factory = recognizer_factory or (lambda: load_recognizer(model, device, task, progress))
        self._blocks: "queue.Queue[list[AudioBlock]]" = queue.Queue(maxsize=queue_blocks)
        self._captions: deque[CaptionUpdate] = deque()
        self._captions_lock = threading.Lock()
        self._status: PipelineStatus | None = None
        self._status_lock = threading.Lock()
        self._pump: _CapturePump | None = None
        self._worker: Worker | None = None
        self._started = False
        self.backend = None

    # -- lifecycle (owner thread) -----------------------------------------------------------------
    def start(self, timeout_s: float = 600.0) -> None:
        """Load the model (in the worker thread), start capturing; raises ``UserError`` when the
        model or a device cannot be used."""
        if self._started:
            return

        def make_engine() -> Engine:
            backend, recognizer = self._factory()
            self.backend = backend
            if hasattr(recognizer, "check_language"):
                self.config.language = recognizer.check_language(self.language)
            engine = Engine(backend, recognizer, self.config)
            for source in self.sources:
                engine.add_stream(source.stream)
            return engine

        def make_recognizer(model: str):
            backend, recognizer = load_recognizer(model, self.device, self.task)
            return recognizer

        self._worker = Worker(make_engine, self._blocks, self._deliver, self._publish,
                              source_stats=self._source_stats, make_recognizer=make_recognizer)
        self._worker.start()
        self._worker.ready.wait(timeout_s)
        if self._worker.error is not None:
            self._worker.join(5)
            error = self._worker.error
            if isinstance(error, UserError):
                raise error
            raise UserError(f"the captioning engine could not start: {one_line(error)}") from error
        started = []
        try:
            for source in self.sources:
                source.start()
                started.append(source)
        except BaseException:
            for source in started:
                source.stop()
            self._worker.stop_event.set()
            self._worker.join(10)
            raise
        self._pump = _CapturePump(self.sources, self._blocks)
        self._pump.start()
        self._started = True

    def wait_exhausted(self, timeout_s: float | None = None) -> bool:
        """Block until every (finite) source has delivered everything."""
        if self._pump is None:
            return True
        return self._pump.all_exhausted.wait(timeout_s)

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop capturing, let the worker commit what is pending, join every thread."""
        if not self._started:
            return
        self._started = False
        assert self._pump is not None and self._worker is not None
        self._pump.stop_event.set()
        self._pump.join(timeout_s)
        for source in self.sources:
            source.stop()
        self._worker.stop_event.set()
        self._worker.join(timeout_s)
        if self.transcript is not None:
            self.transcript.close()

    @property
    def provider(self) -> str:
        """Where the model runs (e.g. "CUDAExecutionProvider"), once started."""
        engine = self._worker.engine if self._worker is not None else None
        return getattr(engine.recognizer, "provider", "") if engine is not None else ""

    @property
    def running(self) -> bool:
        """False once stopped, or once the worker or the capture pump has failed."""
        return (self._started and self._worker is not None and self._worker.is_alive()
                and (self._pump is None or self._pump.error is None))

    @property
    def error(self) -> BaseException | None:
        if self._worker is not None and self._worker.error is not None:
            return self._worker.error
        if self._pump is not None and self._pump.error is not None:
            return self._pump.error
        return None

    # -- commands (any thread) ---------------------------------------------------------------------
    def command(self, kind: str, value=None) -> None:
        """``"language"`` (code or "auto"), ``"model"`` (name or folder), ``"add_source"`` (a
        source), ``"remove_source"`` (a stream label), ``"stop"``."""
        if kind == "stop":
            self.stop()
            return
        if self._worker is None:
            raise RuntimeError("pipeline not started")
        if kind == "add_source":
            source = value
            check_room_for_stream(self.latest_status())
            source.start()
            self.sources.append(source)
            self._worker.commands.put(Command("add_stream", source.stream))
            assert self._pump is not None
            self._pump.add(source)
        elif kind == "remove_source":
            assert self._pump is not None
            source = self._pump.remove(str(value))
            if source is not None:
                source.stop()
                self.sources.remove(source)
            self._worker.commands.put(Command("remove_stream", str(value)))
        elif kind == "language":
            engine = self._worker.engine
            if engine is not None and hasattr(engine.recognizer, "check_language"):
                value = engine.recognizer.check_language(None if value in (None, "", "auto") else str(value))
            self._worker.commands.put(Command(kind, value))
        elif kind == "model":
            self._worker.commands.put(Command(kind, value))
        else:
            raise ValueError(f"unknown pipeline command {kind!r}")

    # -- outboxes ------------------------------------------------------------------------------------
    def drain_captions(self) -> list[CaptionUpdate]:
        """Every caption update since the last call (never blocks)."""
        with self._captions_lock:
            out = list(self._captions)
            self._captions.clear()
        return out

    def latest_status(self) -> PipelineStatus | None:
        with self._status_lock:
            return self._status

    # -- worker-thread callbacks -------------------------------------------------------------------
    def _deliver(self, updates: list[CaptionUpdate]) -> None:
        if self.transcript is not None:
            for u in updates:
                if u.kind == "final":
                    self.transcript.write(u)
        with self._captions_lock:
            self._captions.extend(updates)

    def _publish(self, status: PipelineStatus) -> None:
        with self._status_lock:
            self._status = status

    def _source_stats(self) -> tuple[int, int]:
        return self._pump.stats() if self._pump is not None else (0, 0)
