"""The objects a long-running process makes at its start, kept out of the cyclic garbage
collector's way.

Every full collection walks every container object the process holds, with every thread stopped
meanwhile. A GPU model process holds tens of thousands of them once its model is loaded (the
runtime, the imported modules), and a busy server's processes paused for long full collections
every few seconds (benchmarks/results/serve/HISTORY.md, "pauses of the garbage collector"). What a
process made before it serves lives as long as it does, so it is frozen: later collections walk only
what serving makes.
"""

from __future__ import annotations

import gc


def freeze_start_up() -> int:
    """Collects what start-up left behind, then moves everything still alive to the permanent
    generation (``gc.freeze``). Returns how many objects that was."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
