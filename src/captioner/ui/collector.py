"""The cyclic garbage collector, run on the GUI thread only while a window is open.

Left automatic, a collection runs on whichever thread's allocation passes the threshold, and it
destroys every unreachable cycle it finds there, Qt objects included. A Qt object destroyed on
the engine's worker thread waited in its destructor for the interpreter lock while the GUI
thread, holding that lock, waited on Qt: the app hung (docs/ui.md, "A hang"). pyqtgraph
documents the same hazard.

So while a window lives, automatic collection is off, and a timer on the GUI thread collects
each generation when the interpreter itself would have: the youngest generation after its
allocation threshold, the older ones after their counts of younger collections, and a full
collection only once the objects that reached the oldest generation since the last full one
are a quarter of those that survived it (CPython's rule against quadratic full collections).
"""

from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

# A tenth of a second: the young generation stays small, so each collection of it is short
# (docs/decisions/003-waits-and-bounds.md), and garbage from other threads waits at most this long.
CHECK_INTERVAL_MS = 100

# How many collectors are running, and whether automatic collection was on before the first.
_running = 0
_enabled_before = True


def generation_due(counts: tuple[int, int, int], thresholds: tuple[int, ...],
                   full_allowed) -> int | None:
    """The generation the interpreter would collect now, or None. ``counts`` and ``thresholds``
    as ``gc.get_count()`` and ``gc.get_threshold()`` give them; ``full_allowed()`` says whether a
    full collection has enough new objects to be worth it (asked only when it is otherwise due).
    As in the interpreter, nothing is due until the youngest generation passes its threshold
    (its count is allocations less deallocations). A first threshold of 0 means collection was
    turned off: nothing is ever due."""
    if not thresholds or thresholds[0] == 0 or counts[0] <= thresholds[0]:
        return None
    for generation in (2, 1, 0):
        if generation >= len(thresholds) or counts[generation] <= thresholds[generation]:
            continue
        if generation == 2 and not full_allowed():
            continue
        return generation
    return None


class OldestGeneration:
    """CPython's gate on full collections: how many objects survived the last full collection,
    and whether those that joined the oldest generation since are at least a quarter of them.
    (Objects of the oldest generation freed by their reference counts meanwhile count against
    the newcomers, so this gate opens no earlier than the interpreter's.)"""

    def __init__(self) -> None:
        self.survivors = len(gc.get_objects(2))
        self._asked_at: int | None = None  # the oldest generation's count when last asked

    def full_allowed(self) -> bool:
        # Counting the oldest generation walks it, so the answer is worked out once per
        # collection of the middle one (which is what adds to it), not on every tick.
        asked_at = gc.get_count()[2]
        if asked_at == self._asked_at:
            return False
        self._asked_at = asked_at
        newcomers = len(gc.get_objects(2)) - self.survivors
        return newcomers > self.survivors // 4

    def collected_full(self) -> None:
        self.survivors = len(gc.get_objects(2))
        self._asked_at = None


def _hold() -> None:
    global _running, _enabled_before
    if _running == 0:
        _enabled_before = gc.isenabled()
    _running += 1
    gc.disable()


def _release(*_destroyed) -> None:
    """The collector is gone (its window deleted): the last one out gives automatic collection
    back as it was. A free function: the collector's Python side may already be gone."""
    global _running
    _running = max(0, _running - 1)
    if _running == 0 and _enabled_before:
        gc.enable()


class GuiThreadCollector(QObject):
    """Create it on the GUI thread, as a child of the window: from then until it is destroyed,
    garbage is collected only here."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        _hold()
        self.destroyed.connect(_release)
        self._oldest = OldestGeneration()
        self.collections = [0, 0, 0]  # run here, per generation
        self._timer = QTimer(self)
        self._timer.setInterval(CHECK_INTERVAL_MS)
        self._timer.timeout.connect(self.collect_due)
        self._timer.start()

    def collect_due(self) -> int | None:
        """Collects the generation that is due, if any; returns it."""
        if gc.isenabled():  # something turned automatic collection back on: off again
            gc.disable()
        generation = generation_due(gc.get_count(), gc.get_threshold(), self._oldest.full_allowed)
        if generation is None:
            return None
        gc.collect(generation)
        self.collections[generation] += 1
        if generation == 2:
            self._oldest.collected_full()
        return generation
