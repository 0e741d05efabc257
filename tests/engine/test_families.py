"""A model is loaded by the first family that claims it; Whisper claims the rest."""

from __future__ import annotations

import pytest
from scripted import ScriptedRecognizer

from captioner.engine import families
from captioner.engine.live import load_recognizer
from captioner.errors import UserError


def test_whisper_claims_its_names_and_paths():
    assert {families.family_of(m).name for m in ("tiny.en", "base", "/models/whisper-small")} == {"whisper"}


def test_a_second_family_loads_the_names_it_claims_on_the_devices_backend(monkeypatch):
    loaded = []

    def load(model, backend, task, progress):
        loaded.append((model, backend.name, task))
        return ScriptedRecognizer({}, name=model)

    ctc = families.ModelFamily("ctc", claims=lambda model: model.startswith("ctc-"), load=load)
    monkeypatch.setattr(families, "FAMILIES", (ctc, *families.FAMILIES))
    backend, recognizer = load_recognizer("ctc-small", "cpu")
    assert (recognizer.name, loaded) == ("ctc-small", [("ctc-small", "cpu", "transcribe")])
    assert families.family_of("tiny.en").name == "whisper"


def test_an_unknown_name_is_refused_in_whispers_words():
    with pytest.raises(UserError, match="nosuch"):
        load_recognizer("nosuch", "cpu")
