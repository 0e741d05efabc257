"""``--policy``, the streaming commit policy of the live engine, the same in every live command,
and ``--speakers`` where a live command labels who speaks.

Not a command itself: the options, and the :class:`~captioner.engine.core.EngineConfig` they make.
``auto`` (the default) lets the engine take the policy measured better on its device class
(:data:`captioner.engine.policy.presets.DEFAULT_BY_DEVICE`, see docs/latency.md).
"""

from __future__ import annotations

import argparse

POLICY_CHOICES = ("auto", "localagreement", "alignatt", "alignatt-gpu")
"""Every name :func:`captioner.engine.policy.presets.names` knows (a test keeps them the same); a
literal, so that parsing the command line does not import the engine."""
POLICY_HELP = ("when a word is final: localagreement (two updates agree on it), alignatt (the model's "
               "attention says it was heard whole; sooner), alignatt-gpu (alignatt tuned for a fast GPU "
               "step: sooner still), or auto (the better one measured for the device; default)")


SPEAKERS_CHOICES = ("auto", "on", "off")
""":data:`captioner.engine.speakers.MODES` (a test keeps them the same), literal for the same reason."""
LIVE_SPEAKERS_HELP = ("label who speaks (Speaker 1, Speaker 2, ...): auto (the default) labels a meeting's "
                      "audio (a monitor of an output), files and a server's clients, not a microphone; on "
                      "labels every stream, off none")


def add_policy_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", choices=POLICY_CHOICES, default="auto", help=POLICY_HELP)


def add_speakers_argument(parser: argparse.ArgumentParser, help_text: str = LIVE_SPEAKERS_HELP) -> None:
    parser.add_argument("--speakers", choices=SPEAKERS_CHOICES, default="auto", help=help_text)


def engine_config(args: argparse.Namespace):
    """The live engine's configuration for these arguments (its defaults, the policy and the
    speakers chosen)."""
    from captioner.engine.core import EngineConfig
    from captioner.engine.policy.config import PolicyConfig
    from captioner.engine.speakers import SpeakerConfig

    return EngineConfig(policy=PolicyConfig(kind=getattr(args, "policy", None) or "auto"),
                        speakers=SpeakerConfig(mode=getattr(args, "speakers", None) or "auto"))
