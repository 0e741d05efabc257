"""`captioner listen` options: --input is the audio, --device the compute device (as in every
command), the old --compute still works and says once that it is deprecated, and a duration that
is not a positive number of seconds is refused on one line before any device is opened."""

from __future__ import annotations

import pytest

from captioner.app.cli import build_parser, main


def parse(*argv: str):
    return build_parser().parse_args(["listen", *argv])


def test_input_is_audio_and_device_is_compute():
    args = parse("--input", "monitor", "-i", "3", "--device", "cpu")
    assert args.input == ["monitor", "3"] and args.device == "cpu"


def test_compute_is_a_deprecated_alias_of_device(capsys):
    args = parse("--compute", "cuda:1", "--compute", "cpu")
    assert args.device == "cpu"
    err = capsys.readouterr().err
    assert err.count("--compute is deprecated; use --device") == 1, err


@pytest.mark.parametrize("seconds", ["-5", "0", "nan"])
def test_duration_must_be_positive(seconds, capsys):
    assert main(["listen", "--duration", seconds, "--device", "cpu", "--no-transcript"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("captioner: error: --duration must be a positive number of seconds")
