"""While a window is open, garbage is collected on the GUI thread only (captioner/ui/collector.py):
the cycles a worker thread leaves are destroyed here, never on the worker."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
from PySide6.QtCore import QCoreApplication, QEvent

from captioner.ui.collector import OldestGeneration, generation_due

THRESHOLDS = (700, 10, 10)


def never():
    raise AssertionError("asked about a full collection that was not otherwise due")


@pytest.mark.parametrize("counts, expected", [
    ((0, 0, 0), None),
    ((700, 9, 9), None),       # a threshold is passed only when exceeded
    ((701, 0, 0), 0),
    ((701, 11, 0), 1),
    ((5, 11, 3), None),        # nothing until the youngest passes its own, as in the interpreter
])
def test_the_generation_due_is_the_oldest_past_its_threshold(counts, expected):
    assert generation_due(counts, THRESHOLDS, never) == expected


def test_a_full_collection_waits_for_enough_new_old_objects():
    assert generation_due((701, 11, 11), THRESHOLDS, lambda: True) == 2
    assert generation_due((701, 11, 11), THRESHOLDS, lambda: False) == 1  # the next one down
    assert generation_due((701, 0, 11), THRESHOLDS, lambda: False) == 0


def test_collection_turned_off_by_a_zero_threshold_stays_off():
    assert generation_due((10**6, 100, 100), (0, 10, 10), lambda: True) is None


def test_the_full_collection_gate_counts_the_objects_that_joined_the_oldest_generation():
    gc.collect()
    oldest = OldestGeneration()
    assert not oldest.full_allowed()
    kept = [[] for _ in range(oldest.survivors // 4 + 1000)]
    gc.collect(1)  # the new lists move up to the oldest generation
    assert oldest.full_allowed()
    assert not oldest.full_allowed()  # asked again before anything more moved up: not counted twice
    gc.collect()
    oldest.collected_full()
    assert not oldest.full_allowed()
    del kept


class Node:
    """A reference cycle: only the cyclic collector can free it."""

    def __init__(self) -> None:
        self.me = self


def test_a_worker_threads_cycles_are_destroyed_on_the_gui_thread(window, qtbot):
    assert not gc.isenabled()
    destroyed_on: list[int] = []
    kept: list[list[int]] = []

    def worker() -> None:
        for _ in range(20):
            node = Node()
            weakref.finalize(node, lambda: destroyed_on.append(threading.get_ident()))
            del node
        # Allocate as the engine does, far past every threshold: left automatic, these
        # allocations would collect the cycles above here, on this thread.
        kept.extend([i] for i in range(200_000))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    qtbot.waitUntil(lambda: len(destroyed_on) == 20, timeout=5_000)
    assert set(destroyed_on) == {threading.get_ident()}
    assert sum(window.collector.collections) >= 1


def test_automatic_collection_comes_back_when_the_last_window_is_deleted(qtbot, settings_store):
    from captioner.ui.main_window import MainWindow

    assert gc.isenabled()
    first, second = MainWindow(settings_store), MainWindow(settings_store)
    assert not gc.isenabled()
    first.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert not gc.isenabled()  # the other window is still open
    second.overlay.deleteLater()
    second.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert gc.isenabled()
    first.overlay.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
