"""What one client may hold (serve/bounds.py), and the options that set the bounds."""

from __future__ import annotations

import argparse

import pytest

from captioner.errors import UserError
from captioner.serve.bounds import ConnectionCounter, client_address


def test_connections_are_counted_per_client_address():
    assert client_address("127.0.0.1:5555") == "127.0.0.1"
    assert client_address("::1:5555") == "::1"
    assert client_address("?") == "?"
    counter = ConnectionCounter(2)
    assert counter.take("10.0.0.1:1") == "" and counter.take("10.0.0.1:2") == ""
    refused = counter.take("10.0.0.1:3")
    assert refused == "too many connections from 10.0.0.1: 2 open, 2 allowed per client (--max-connections-per-client)"
    assert counter.take("10.0.0.2:1") == "", "another client is not touched"
    counter.give_back("10.0.0.1:1")
    assert counter.take("10.0.0.1:4") == ""
    for peer in ("10.0.0.1:2", "10.0.0.1:4", "10.0.0.2:1"):
        counter.give_back(peer)
    assert counter.held("10.0.0.1:9") == 0 and counter.held("10.0.0.2:9") == 0
    unlimited = ConnectionCounter(None)
    assert all(unlimited.take("10.0.0.1:1") == "" for _ in range(1000))


def _args(*argv):
    from captioner.app.commands.serve import add_arguments, check_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    check_arguments(args)
    return args


def test_the_bound_options_take_their_values_and_refuse_others_in_one_line():
    args = _args()
    assert (args.drain_s, args.idle_timeout_s, args.max_connections_per_client) == (10.0, 60.0, 16)
    args = _args("--drain-s", "2.5", "--idle-timeout-s", "0", "--max-connections-per-client", "0")
    assert (args.drain_s, args.idle_timeout_s, args.max_connections_per_client) == (2.5, None, None)
    for argv, words in ((("--drain-s", "-1"), "--drain-s must be a number of seconds from 0 to 3600"),
                        (("--drain-s", "soon"), "--drain-s must be"),
                        (("--idle-timeout-s", "0.5"), "--idle-timeout-s must be a number of seconds from 1"),
                        (("--max-connections-per-client", "-2"), "--max-connections-per-client must be a whole number"),
                        (("--max-connections-per-client", "many"), "--max-connections-per-client must be"),
                        (("--ray", "--drain-s", "3"), "are for the plain server")):
        with pytest.raises(UserError) as refused:
            _args(*argv)
        assert words in str(refused.value) and "\n" not in str(refused.value)


def test_serve_takes_a_gpu_memory_budget_in_gib_and_puts_the_engines_on_a_capped_arena(monkeypatch):
    import os

    from captioner.models import gpu_memory
    from captioner.serve.engine_link import server_engine_config

    # Both are set by --gpu-memory for the engine processes; the test leaves them as they were.
    monkeypatch.setenv(gpu_memory.ARENA_ENV, "")
    monkeypatch.setenv(gpu_memory.GPU_MEMORY_ENV, "")

    assert _args().gpu_memory_bytes is None
    args = _args("--gpu-memory", "20")
    assert args.gpu_memory_bytes == 20 * 2**30
    assert os.environ[gpu_memory.GPU_MEMORY_ENV] == "20" and gpu_memory.arena_mode() == "shared"
    assert server_engine_config("off", args.gpu_memory_bytes).admission.gpu_memory_bytes == 20 * 2**30
    for argv, words in ((("--gpu-memory", "0"), "--gpu-memory='0': give the GPU memory in GiB"),
                        (("--gpu-memory", "a lot"), "a positive number"),
                        (("--ray", "--gpu-memory", "8"), "--gpu-memory is for the plain server")):
        with pytest.raises(UserError) as refused:
            _args(*argv)
        assert words in str(refused.value) and "\n" not in str(refused.value)


def test_serve_runs_the_policy_its_capacity_is_measured_with_unless_told_otherwise():
    from captioner.engine.policy.presets import names
    from captioner.serve.engine_link import SERVER_POLICY, server_engine_config

    assert SERVER_POLICY in names()
    assert _args().policy == "auto"
    assert server_engine_config(policy=_args().policy).policy.kind == SERVER_POLICY == "localagreement"
    args = _args("--policy", "alignatt-gpu")
    assert server_engine_config("off", None, args.policy).policy.kind == "alignatt-gpu"
