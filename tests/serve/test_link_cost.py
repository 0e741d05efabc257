"""What the loop thread does per message and per poll stays small (issue 13: one process took in
1,000 connections' audio on an H200 and saturated).

A connection's messages are joined as bytes and converted to float32 once per chunk handed to
the engine, with every sample as sent; the pump works out the connections' batch sizes only
when the engine's status changed, and a stream goes opening -> open -> done by the engine's
lifecycle events. A real pipeline with a scripted recognizer, as in test_input_pressure.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from scripted import ScriptedRecognizer  # noqa: E402

from captioner.engine.core import EngineConfig  # noqa: E402
from captioner.engine.pipeline import Pipeline  # noqa: E402
from captioner.gpu.backend import cpu_backend  # noqa: E402
from captioner.serve.engine_link import RESCAN_S, EngineLink, NetworkSource  # noqa: E402


def test_messages_joined_into_one_chunk_keep_every_sample_as_sent():
    chunks = []
    source = NetworkSource("s#1", 16000)
    source.start(lambda chunk: chunks.append(chunk) or True)
    rng = np.random.default_rng(1)
    sent = rng.integers(-32768, 32768, 3 * 1600 + 800, dtype=np.int64).astype("<i2")
    source.batch_samples = 4000  # 250 ms: three 100 ms messages are held, the third flushes
    for start in range(0, 4800, 1600):
        assert source.push(sent[start:start + 1600].tobytes(), 1_000 + start)
    assert len(chunks) == 1
    source.batch_samples = 0  # each message as it came
    assert source.push(sent[4800:].tobytes(), 9_000)
    assert [c.first_sample for c in chunks] == [0, 4800]
    assert [c.capture_ns for c in chunks] == [1_000 + 3200, 9_000]
    got = np.concatenate([c.samples for c in chunks])
    assert got.dtype == np.float32
    assert np.array_equal(got, sent.astype(np.float32) / np.float32(32768.0))
    assert source.stats().delivered_samples == sent.shape[0]


def test_the_pump_works_out_the_batch_sizes_when_the_status_changes_not_on_every_poll():
    def make_pipeline(device):
        return Pipeline([], config=EngineConfig(),
                        recognizer_factory=lambda: (cpu_backend(), ScriptedRecognizer({})))

    link = EngineLink(["cpu"], make_pipeline)
    link.start()
    worker = link.workers[0]
    try:
        leases = [link.open(f"c{k}", None, 16000) for k in range(3)]
        deadline = time.monotonic() + 30
        while any(lease.state != "open" for lease in leases) and time.monotonic() < deadline:
            link.poll()
            time.sleep(0.005)
        assert [lease.state for lease in leases] == ["open"] * 3
        # Polled 200 times a second for 1.5 s: the batch sizes are worked out once per status the
        # worker published (4 a second) and once a second regardless, not on every poll.
        scans, polls, statuses = 0, 0, set()
        last = worker.scanned_s
        start_s = time.monotonic()
        while time.monotonic() - start_s < 1.5:
            for lease in leases:
                lease.push(np.zeros(1600, "<i2").tobytes())
            link.poll()
            polls += 1
            statuses.add(id(worker.scanned))
            if worker.scanned_s != last:
                scans, last = scans + 1, worker.scanned_s
            time.sleep(0.005)
        assert polls > 100
        assert 1 <= scans <= len(statuses) + 1.5 / RESCAN_S + 1
        assert scans < polls / 4
        for lease in leases:
            link.close(lease)
        deadline = time.monotonic() + 30
        while any(lease.state != "done" for lease in leases) and time.monotonic() < deadline:
            link.poll()
            time.sleep(0.005)
        assert [lease.state for lease in leases] == ["done"] * 3
        assert not worker.leases
    finally:
        link.stop()


def test_a_finished_connection_is_freed_without_the_cycle_collector():
    """A server's connection holds its lease and the lease's callback holds the connection (the
    hub's and the plain server's alike). Once the lease is done the link lets go of the callback,
    so the connection is freed as it is dropped: a full collection of the serving process does
    not find 19 objects of each closed connection (5,717 at the close of 300)."""
    import gc
    import weakref

    def make_pipeline(device):
        return Pipeline([], config=EngineConfig(),
                        recognizer_factory=lambda: (cpu_backend(), ScriptedRecognizer({})))

    class Connection:
        lease = None

        def changed(self, lease) -> None:
            self.state = lease.state

    link = EngineLink(["cpu"], make_pipeline)
    link.start()
    try:
        conn = Connection()
        conn.lease = link.open("c", None, 16000, conn.changed)
        deadline = time.monotonic() + 30
        while conn.lease.state != "open" and time.monotonic() < deadline:
            link.poll()
            time.sleep(0.005)
        link.close(conn.lease)
        while conn.lease.state != "done" and time.monotonic() < deadline:
            link.poll()
            time.sleep(0.005)
        assert conn.state == "done" and conn.lease.on_change is None
        gone = weakref.ref(conn)
        gc.disable()  # freed by reference counting alone, or not at all
        try:
            del conn
            assert gone() is None, "the connection and its lease are a cycle left for the collector"
        finally:
            gc.enable()
    finally:
        link.stop()
