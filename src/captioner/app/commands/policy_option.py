"""``--policy``, the streaming commit policy of the live engine, the same in every live command.

Not a command itself: the option, and the :class:`~captioner.engine.core.EngineConfig` it makes.
``auto`` (the default) lets the engine take the policy measured better on its device class
(:data:`captioner.engine.policies.DEFAULT_BY_DEVICE`, see docs/latency.md).
"""

from __future__ import annotations

import argparse

POLICY_CHOICES = ("auto", "localagreement", "alignatt", "alignatt-gpu")
"""Every name :func:`captioner.engine.policies.names` knows (a test keeps them the same); a
literal, so that parsing the command line does not import the engine."""
POLICY_HELP = ("when a word is final: localagreement (two updates agree on it), alignatt (the model's "
               "attention says it was heard whole; sooner), alignatt-gpu (alignatt tuned for a fast GPU "
               "step: sooner still), or auto (the better one measured for the device; default)")


def add_policy_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", choices=POLICY_CHOICES, default="auto", help=POLICY_HELP)


def engine_config(args: argparse.Namespace):
    """The live engine's configuration for these arguments (its defaults, the policy chosen)."""
    from captioner.engine.core import EngineConfig
    from captioner.engine.policy import PolicyConfig

    return EngineConfig(policy=PolicyConfig(kind=getattr(args, "policy", None) or "auto"))
