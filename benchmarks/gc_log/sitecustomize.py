"""Imported at the start of every Python process whose path holds this folder (bench_serve
``--gc-log`` puts it there for the server, its front-ends and model processes): when
``CAPTIONER_BENCH_GC_LOG`` names a folder, each full garbage collection, and each younger one of
1 ms or more, is appended to ``<pid>.txt`` there (see benchmarks/gc_pauses.py). Nothing is
logged without the variable."""

import os

if os.environ.get("CAPTIONER_BENCH_GC_LOG"):
    import gc_pauses

    gc_pauses.log_this_process(os.environ["CAPTIONER_BENCH_GC_LOG"])
