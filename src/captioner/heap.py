"""The objects a long-running process makes at its start, kept out of the cyclic garbage
collector's way.

Every full collection walks every container object the process holds, with every thread stopped
meanwhile. A GPU model process holds some 67,000 of them once its model is loaded (the runtime,
the imported modules), and on an H200 a full collection of those alone took 19-24 ms; serving
1,000 connections, each of its three model processes and the serving process ran one every
8-30 s, of 45-120 ms (docs/serve.md). What a process made before it serves lives as long as it
does, so it is frozen: later collections walk only what serving makes.
"""

from __future__ import annotations

import gc


def freeze_start_up() -> int:
    """Collects what start-up left behind, then moves everything still alive to the permanent
    generation (``gc.freeze``). Returns how many objects that was."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
