"""Host work while the fixed-cache runtime's encoder runs (runtime.Overlap).

On CUDA the encoder's run is queued without waiting (``OrtModel.run_into(wait=False)``), the work
runs, and the device is synchronised before the states are read. The CPU provider runs
synchronously either way; what is checked here is the order (work, then the wait), that the work
runs once, and that the states are those of a plain encode."""

from __future__ import annotations

import numpy as np
from graph_fixtures import fixed_cache_runtimes, tiny_files  # noqa: F401 - fixture

from captioner.models import session
from captioner.models.runtime import Overlap


def test_the_work_runs_once_between_queueing_and_waiting_and_the_states_are_the_same(tiny_files, tmp_path_factory):  # noqa: F811
    runtime = fixed_cache_runtimes(tiny_files, tmp_path_factory, "matmul").fixed
    mel = np.random.default_rng(0).standard_normal((5, runtime.n_mels, 3000)).astype(np.float32) * 0.1
    plain = session.to_numpy(runtime.encode(mel).value)[:5].copy()
    order: list[str] = []
    waits = []
    original = runtime.encoder.run_into

    def watched(*args, wait=True, **kwargs):
        waits.append(wait)
        order.append("queued")
        return original(*args, wait=wait, **kwargs)
    runtime.encoder.run_into = watched
    overlap = Overlap(lambda: order.append("work"), lambda: order.append("wait"))
    states = session.to_numpy(runtime.encode(mel, overlap).value)[:5]
    assert order == ["queued", "work", "wait"] and waits == [False]
    np.testing.assert_array_equal(states, plain)
    runtime.encode(mel, overlap)  # a second encode (a temperature fallback): nothing more to do
    assert order == ["queued", "work", "wait", "queued"] and waits == [False, True]
