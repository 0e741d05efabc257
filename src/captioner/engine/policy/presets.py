"""The streaming policies by name: what ``PolicyConfig.kind`` (``--policy``) chooses.

A name is a policy (``localagreement``, ``alignatt``), a preset (a policy with some of its
:class:`~captioner.engine.policy.config.PolicyConfig` fields set, measured for a device class: see
:data:`PRESETS`), or ``auto`` (the default of the engine's device class, :data:`DEFAULT_BY_DEVICE`).
"""

from __future__ import annotations

from dataclasses import fields, replace

from captioner.engine.policy.alignatt import AlignAttPolicy
from captioner.engine.policy.config import POLICIES, PolicyConfig
from captioner.engine.policy.local_agreement import LocalAgreementPolicy

PRESETS: dict[str, dict] = {
    "alignatt-gpu": {"kind": "alignatt", "first_context_s": 1.5, "sentence_context_s": 1.0, "attend_margin_s": 0.1,
                     "close_overlap_s": 3.0, "sure_p": 0.9},
}
"""Named settings. ``alignatt-gpu``: AlignAtt for a device whose model step takes tens of
milliseconds (tiny.en on a data-centre GPU), updated every 0.5 s: the first three words of a sentence wait for
1.5 s of speech after them (not 2.5 s), 1 s for a sentence that follows a committed one of the
same segment, or none when the decoder chose each of their tokens with
p >= 0.9; a word is held only while its attention lies within 0.1 s of the end (not 0.4 s);
a segment's closing window keeps the last 3 s of committed words (``close_overlap_s``). Chosen
on the CPU with the clock charged 40 ms per step, which gives a GPU's captions to the word
(docs/latency.md)."""

DEFAULT_BY_DEVICE = {"cuda": "alignatt-gpu", "cpu": "alignatt"}
"""``"auto"``: the policy per device class, chosen by measurement (docs/latency.md, read speech
and conversation side by side). CPU: AlignAtt, which loses less than LocalAgreement on
conversation; CUDA: the ``alignatt-gpu`` preset (a preset name is a valid default), which
commits read speech as soon as LocalAgreement with a third of its loss against offline."""


def preset(name: str, **overrides) -> PolicyConfig:
    """The configuration a policy or preset ``name`` stands for, with ``overrides`` (PolicyConfig
    fields) on top; ``ValueError`` for an unknown name. ``"auto"`` stays ``"auto"``."""
    if name in PRESETS:
        config = PolicyConfig(**PRESETS[name])
    elif name in POLICIES:
        config = PolicyConfig(kind=name)
    else:
        raise ValueError(f"unknown streaming policy {name!r}; choose one of {', '.join(names())}")
    return replace(config, **overrides)


def names() -> tuple[str, ...]:
    """Every name ``--policy`` may take."""
    return (*POLICIES, *PRESETS)


def resolve(config: PolicyConfig, provider: str) -> PolicyConfig:
    """``config`` with ``"auto"`` replaced by the default of the device class of ``provider``
    (an ONNX Runtime provider name: CUDA's, or anything else for the CPU), and a preset's name by
    the policy and fields it stands for (fields the caller set to other values than the
    defaults are kept)."""
    kind = config.kind
    if kind == "auto":
        kind = DEFAULT_BY_DEVICE["cuda" if "CUDA" in str(provider).upper() else "cpu"]
    if kind not in PRESETS:
        return replace(config, kind=kind)
    default = PolicyConfig()
    mine = {f.name: getattr(config, f.name) for f in fields(PolicyConfig)
            if f.name != "kind" and getattr(config, f.name) != getattr(default, f.name)}
    return preset(kind, **mine)


def make_policy(stream: str, config: PolicyConfig | None = None, start_s: float = 0.0) -> LocalAgreementPolicy:
    """The streaming policy ``config.kind`` names, for one stream (called where the stream is
    opened, by the engine's thread; ``"auto"`` and presets must be resolved first, see
    :func:`resolve`)."""
    config = config or PolicyConfig()
    if config.kind == "alignatt":
        return AlignAttPolicy(stream, config, start_s)
    if config.kind not in POLICIES or config.kind == "auto":
        raise ValueError(f"unknown streaming policy {config.kind!r}; choose one of {', '.join(POLICIES)}")
    return LocalAgreementPolicy(stream, config, start_s)
