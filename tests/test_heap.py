"""A long-running process's start-up objects are frozen out of the cyclic GC's full collections."""

from __future__ import annotations

import gc

from captioner.heap import freeze_start_up


def test_what_start_up_made_is_frozen_and_later_collections_walk_only_what_came_after():
    made = [[k] for k in range(50_000)]  # a loaded model's long-lived containers
    try:
        frozen = freeze_start_up()
        assert frozen >= len(made)
        walked = {id(o) for o in gc.get_objects()}  # what a full collection goes through
        assert not any(id(o) in walked for o in made)
        later = [[k] for k in range(10)]  # what serving makes is collected as before
        assert all(id(o) in {id(x) for x in gc.get_objects()} for o in later)
    finally:
        gc.unfreeze()
