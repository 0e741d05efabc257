"""The policy names the user can pick (issue 14): ``--policy`` on every live command and the
app's policy list offer exactly the names the engine knows (policies and presets), and a preset
picked there reaches the engine as its policy and fields. No model, no Qt."""

from __future__ import annotations

import argparse

from captioner.app.commands.policy_option import (
    POLICY_CHOICES,
    add_policy_argument,
    engine_config,
)
from captioner.engine.policy.presets import PRESETS, make_policy, names, resolve
from captioner.ui.run_config import POLICIES


def test_the_cli_and_the_app_offer_every_name_the_engine_knows():
    assert set(POLICY_CHOICES) == set(names())
    assert [code for code, _ in POLICIES] == list(POLICY_CHOICES)
    assert len({label for _, label in POLICIES}) == len(POLICIES)


def test_the_gpu_preset_from_the_command_line_reaches_the_engine():
    parser = argparse.ArgumentParser()
    add_policy_argument(parser)
    config = engine_config(parser.parse_args(["--policy", "alignatt-gpu"])).policy
    assert config.kind == "alignatt-gpu"
    resolved = resolve(config, "CUDAExecutionProvider")
    assert resolved.kind == "alignatt"
    for field, value in PRESETS["alignatt-gpu"].items():
        assert getattr(resolved, field) == value
    assert type(make_policy("s", resolved)).__name__ == "AlignAttPolicy"


def test_the_api_default_is_the_cli_default_on_every_device_class():
    """``captioner.LiveCaptioner`` (an ``EngineConfig`` left as it is) and the command line (no
    ``--policy``) resolve to the same policy and fields, per device class."""
    from captioner.engine.core import EngineConfig

    parser = argparse.ArgumentParser()
    add_policy_argument(parser)
    cli = engine_config(parser.parse_args([])).policy
    api = EngineConfig().policy
    for provider in ("CUDAExecutionProvider", "CPUExecutionProvider"):
        assert resolve(api, provider) == resolve(cli, provider)
        assert type(make_policy("s", resolve(api, provider))).__name__ == "AlignAttPolicy"  # words with times


def test_speakers_offers_the_engines_modes_and_reaches_its_config():
    from captioner.app.commands.policy_option import (
        SPEAKERS_CHOICES,
        add_speakers_argument,
    )
    from captioner.engine.speakers import MODES

    assert set(SPEAKERS_CHOICES) == set(MODES)
    parser = argparse.ArgumentParser()
    add_speakers_argument(parser)
    assert engine_config(parser.parse_args([])).speakers.mode == "auto"
    assert engine_config(parser.parse_args(["--speakers", "off"])).speakers.mode == "off"
