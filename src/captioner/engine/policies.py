"""The streaming policies by name: what ``PolicyConfig.kind`` (``--policy``) chooses."""

from __future__ import annotations

from dataclasses import replace

from captioner.engine.alignatt import AlignAttPolicy
from captioner.engine.policy import POLICIES, LocalAgreementPolicy, PolicyConfig

DEFAULT_BY_DEVICE = {"cuda": "localagreement", "cpu": "alignatt"}
"""``"auto"``: the policy per device class, chosen by measurement (docs/latency.md, "AlignAtt
against LocalAgreement"). CPU: AlignAtt commits sooner at every update interval (committed p50
0.9-2.5 s earlier on the loaded 2-core machine) with a lower streaming WER (5.1-5.5 % against
5.9-6.3 %, offline 4.3 %). CUDA: LocalAgreement until the H200 run of the same benchmark."""


def resolve(config: PolicyConfig, provider: str) -> PolicyConfig:
    """``config`` with ``"auto"`` replaced by the default of the device class of ``provider``
    (an ONNX Runtime provider name: CUDA's, or anything else for the CPU)."""
    if config.kind != "auto":
        return config
    device_class = "cuda" if "CUDA" in str(provider).upper() else "cpu"
    return replace(config, kind=DEFAULT_BY_DEVICE[device_class])


def make_policy(stream: str, config: PolicyConfig | None = None, start_s: float = 0.0) -> LocalAgreementPolicy:
    """The streaming policy ``config.kind`` names, for one stream (called where the stream is
    opened, by the engine's thread; ``"auto"`` must be resolved first, see :func:`resolve`)."""
    config = config or PolicyConfig()
    if config.kind == "alignatt":
        return AlignAttPolicy(stream, config, start_s)
    if config.kind not in POLICIES or config.kind == "auto":
        raise ValueError(f"unknown streaming policy {config.kind!r}; choose one of {', '.join(POLICIES)}")
    return LocalAgreementPolicy(stream, config, start_s)
