"""The optional members of a recognizer are read in one place, with one default each."""

from __future__ import annotations

from scripted import ScriptedRecognizer

from captioner.engine.recognizer import Capabilities, capabilities_of
from captioner.engine.simulate import ChargedRecognizer, SimClock


def test_a_model_that_declares_nothing_is_english_only_and_has_no_extras():
    class Bare:
        name, provider, device_name, n_mels = "bare", "CPUExecutionProvider", "cpu", 80

        def decode(self, requests):
            return []

    assert capabilities_of(Bare()) == Capabilities()
    assert capabilities_of(None) == Capabilities()
    assert not Capabilities().is_multilingual


def test_declared_members_are_the_models_own_through_a_wrapper():
    """A wrapper that hands its model's members on (the simulated clock's) is read as the model."""
    model = ScriptedRecognizer({}, is_multilingual=True)
    for recognizer in (model, ChargedRecognizer(model, SimClock(), "free")):
        can = capabilities_of(recognizer)
        assert can.is_multilingual
        assert can.check_language("de") == "de" and can.check_language("auto") is None
        assert can.warm_up is None and can.decode_pending is None and not can.takes_host_work
