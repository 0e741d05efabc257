"""The streaming policies by name: what ``PolicyConfig.kind`` (``--policy``) chooses."""

from __future__ import annotations

from captioner.engine.alignatt import AlignAttPolicy
from captioner.engine.policy import POLICIES, LocalAgreementPolicy, PolicyConfig


def make_policy(stream: str, config: PolicyConfig | None = None, start_s: float = 0.0) -> LocalAgreementPolicy:
    """The streaming policy ``config.kind`` names, for one stream (called where the stream is
    opened, by the engine's thread)."""
    config = config or PolicyConfig()
    if config.kind == "alignatt":
        return AlignAttPolicy(stream, config, start_s)
    if config.kind != "localagreement":
        raise ValueError(f"unknown streaming policy {config.kind!r}; choose one of {', '.join(POLICIES)}")
    return LocalAgreementPolicy(stream, config, start_s)
