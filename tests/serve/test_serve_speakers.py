"""`captioner serve --speakers auto|on|off`: the mode reaches every engine's configuration, in
the single-process server and behind front-end processes alike (no model: the pipeline is a
stand-in that records what it was given)."""

from __future__ import annotations

import argparse
import signal

import pytest

from captioner.app.commands import serve as serve_command
from captioner.errors import UserError


class _Pipeline:
    """Records the configuration the command builds each engine with."""

    made: list = []

    def __init__(self, sources, **options) -> None:
        self.options = options
        _Pipeline.made.append(self)

    def start(self, *args, **kwargs) -> None:
        pass

    def stop(self, *args, **kwargs) -> None:
        pass


class _Sampler:
    def __init__(self, **options) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class _ServerThread:
    """Takes the server the command made, then stops at once, as Ctrl-C would."""

    servers: list = []

    def __init__(self, server) -> None:
        _ServerThread.servers.append(server)

    def start(self, *args, **kwargs) -> int:
        raise KeyboardInterrupt

    def stop(self, *args, **kwargs) -> None:
        pass


def _args(*argv: str):
    parser = argparse.ArgumentParser()
    serve_command.add_arguments(parser)
    return parser.parse_args(["--device", "cpu", "--port", "0", "--quiet", *argv])


@pytest.fixture
def stand_ins(monkeypatch):
    import captioner.engine.pipeline
    import captioner.gpu.telemetry
    import captioner.heap
    import captioner.serve.server

    monkeypatch.setattr(captioner.engine.pipeline, "Pipeline", _Pipeline)
    monkeypatch.setattr(captioner.gpu.telemetry, "TelemetrySampler", _Sampler)
    monkeypatch.setattr(captioner.heap, "freeze_start_up", lambda: None)
    monkeypatch.setattr(captioner.serve.server, "ServerThread", _ServerThread)
    _Pipeline.made, _ServerThread.servers = [], []
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


@pytest.mark.parametrize("frontends", ["1", "2"])
@pytest.mark.parametrize("mode", ["auto", "on", "off"])
def test_the_mode_reaches_every_engine_in_both_server_modes(stand_ins, mode, frontends):
    from captioner.serve.hub import FrontendHub
    from captioner.serve.server import CaptionServer

    assert serve_command.run(_args("--speakers", mode, "--frontends", frontends, "--engines-per-device", "2")) == 0
    assert len(_Pipeline.made) == 2
    assert {p.options["config"].speakers.mode for p in _Pipeline.made} == {mode}
    assert all(p.options["config"].warm_up for p in _Pipeline.made)  # still the server's configuration
    assert type(_ServerThread.servers[0]) is (FrontendHub if frontends == "2" else CaptionServer)


def test_auto_is_the_default(stand_ins):
    assert serve_command.run(_args()) == 0
    assert _Pipeline.made[0].options["config"].speakers.mode == "auto"


def test_without_the_voice_encoder_on_is_refused_and_auto_serves_unlabelled(stand_ins, monkeypatch, capsys):
    """Every labelled stream would fail at its open without the encoder's weights: ``on`` is
    refused on one line before any model loads, ``auto`` serves without labels and says so."""
    import captioner.models.speaker.weights as weights

    def missing():
        raise UserError("speaker labels need the voice encoder of the resemblyzer package: "
                        "pip install --no-deps resemblyzer==0.1.4")

    monkeypatch.setattr(weights, "checkpoint_path", missing)
    with pytest.raises(UserError, match=r"^--speakers on: speaker labels need the voice encoder"):
        serve_command.run(_args("--speakers", "on"))
    assert not _Pipeline.made
    assert serve_command.run(_args("--speakers", "auto")) == 0
    assert _Pipeline.made[0].options["config"].speakers.mode == "off"
    assert "captioner: speaker labels are off: speaker labels need the voice encoder" in capsys.readouterr().err
    _Pipeline.made.clear()
    assert serve_command.run(_args("--speakers", "off")) == 0  # nothing to look for
    assert _Pipeline.made[0].options["config"].speakers.mode == "off"


def test_the_ray_replicas_get_the_mode_too():
    import inspect

    from captioner.serve.engine_link import server_engine_config
    from captioner.serve.ray_app import build_app

    assert inspect.signature(build_app).parameters["speakers"].default == "auto"
    assert server_engine_config("on").speakers.mode == "on"
    with pytest.raises(ValueError, match="speakers must be one of auto, on, off"):
        server_engine_config("yes")
