"""The model families the engine can load as its recognizer, one loader each.

A model name or path is loaded by the first family that claims it. Whisper claims every name
today (its own names, and a path it checks and refuses in its own words); a second family (a
CTC or transducer model) goes before it with a loader beside :mod:`captioner.engine.whisper`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from captioner.engine.recognizer import Recognizer


@dataclass(frozen=True, slots=True)
class ModelFamily:
    name: str
    claims: Callable[[str], bool]
    """Whether ``model`` (a name or a path) is one of this family's."""
    load: Callable[..., Recognizer]
    """``load(model, backend, task, progress)``: the recognizer on ``backend``'s device."""


def _load_whisper(model: str, backend, task: str, progress) -> Recognizer:
    from captioner.engine.whisper import load_whisper

    return load_whisper(model, backend, task, progress)


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily("whisper", claims=lambda model: True, load=_load_whisper),
)


def family_of(model: str) -> ModelFamily:
    """The family that loads ``model``."""
    return next(family for family in FAMILIES if family.claims(model))
