"""Inputs that are audio only in name (issue 47, item 6): a FIFO that nobody writes to is
refused on one line by every reader and every command that takes a file, never a hang; a float
file written at the wrong scale is brought to ±1 with a one-line warning (and transcribes to
the words of the original), and a float file a little past full scale is read as it is.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
import soundfile as sf

from captioner.app.cli import main
from captioner.audio.file_source import (
    FileSource,
    audio_16k_blocks,
    check_audio_samples,
    open_audio_file,
    read_audio_16k,
)
from captioner.engine.policy.words import normalize_word
from captioner.errors import UserError

READERS = {
    "open_audio_file": open_audio_file,
    "read_audio_16k": read_audio_16k,
    "FileSource": FileSource,
    "check_audio_samples": check_audio_samples,
}


@pytest.fixture()
def fifo(tmp_path):
    """A FIFO with no writer. Should a reader block on it anyway, a writer opened after 10 s
    frees it, and the test fails on what it got instead of hanging the run."""
    path = tmp_path / "fifo"
    os.mkfifo(path)
    stop = threading.Event()

    def rescue():
        if not stop.wait(10.0):
            with contextlib.suppress(OSError):  # ENXIO: nobody is reading it
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    rescuer = threading.Thread(target=rescue, daemon=True)
    rescuer.start()
    yield path
    stop.set()
    rescuer.join()


@pytest.mark.parametrize("reader", READERS)
def test_a_fifo_is_refused_on_one_line_at_once(fifo, reader):
    with pytest.raises(UserError) as caught:
        READERS[reader](fifo)
    message = str(caught.value)
    assert message == f"{fifo} is a named pipe (FIFO), not a regular file: save the audio to a file and give its path"
    assert caught.value.__cause__ is None


def _captioner(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "captioner", *argv], env=dict(os.environ, CAPTIONER_DEVICE="cpu"),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def test_transcribe_refuses_a_fifo_on_one_line(fifo):
    # The command of the issue, as typed: it hung on the FIFO's open before.
    done = _captioner("transcribe", str(fifo))
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr == f"captioner: error: {fifo} is a named pipe (FIFO), not a regular file: " \
                          "save the audio to a file and give its path\n"


@pytest.mark.parametrize("argv", [["transcribe", "--realtime"], ["listen", "--device", "cpu", "--file"],
                                  ["gui", "--file"]])
def test_every_command_that_takes_a_file_refuses_a_fifo(fifo, capsys, argv):
    assert main([*argv, str(fifo)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("captioner: error: ")
    assert f"{fifo} is a named pipe (FIFO)" in err


def test_a_character_device_is_refused_too():
    with pytest.raises(UserError, match="is a character device, not a regular file"):
        open_audio_file("/dev/zero")


@pytest.fixture(scope="module")
def speech(speech_clips):
    """A real recording, 16 kHz mono float32 in [-1, 1]."""
    return read_audio_16k(speech_clips["en_ls_1089-134686-0001"].wav)


def _write(path, samples, subtype="FLOAT"):
    sf.write(str(path), samples, 16_000, subtype=subtype)
    return path


def test_a_float_file_scaled_by_a_million_is_read_at_full_scale_with_a_warning(tmp_path, speech):
    peak = float(np.abs(speech).max())
    path = _write(tmp_path / "loud.wav", speech * np.float32(1e6))
    for read in (read_audio_16k, lambda p: np.concatenate(list(audio_16k_blocks(p)[1]))):
        with pytest.warns(UserWarning) as caught:
            samples = read(path)
        (warning,) = caught
        assert str(warning.message) == f"{path}: samples reach {peak * 1e6:.3g}: the file is not normalised " \
                                       "(full scale is ±1); scaled to ±1"
        assert abs(float(np.abs(samples).max()) - 1.0) < 1e-3
        np.testing.assert_allclose(samples, speech / peak, atol=1e-4)
    # The replayed source reads it at the same gain.
    with pytest.warns(UserWarning, match="samples reach"):
        source = FileSource(path)
    assert source.info.gain == pytest.approx(1.0 / (peak * 1e6))


@pytest.mark.parametrize("peak,subtype", [(1.5, "FLOAT"), (1.0, "DOUBLE"), (0.9, "PCM_16")])
def test_a_file_near_full_scale_is_read_as_it_is(tmp_path, speech, peak, subtype):
    x = speech * np.float32(peak / float(np.abs(speech).max()))
    path = _write(tmp_path / "near.wav", x, subtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        samples = read_audio_16k(path)
        assert check_audio_samples(path).gain == 1.0
    np.testing.assert_allclose(samples, x, atol=1e-4 if subtype == "PCM_16" else 1e-6)


@pytest.mark.slow
def test_transcribe_of_a_float_file_scaled_by_a_million_gives_the_original_words(tmp_path, speech_clips, speech,
                                                                                   offline_tiny_en):
    """Before: "and and that and", and nothing said about the samples."""
    path = _write(tmp_path / "loud.wav", speech * np.float32(1e6))
    done = _captioner("transcribe", str(path))
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"captioner: warning: {path}: samples reach ") and line.endswith("; scaled to ±1"), line
    original = offline_tiny_en(speech_clips["en_ls_1089-134686-0001"]).text

    def words(text):
        return [k for k in (normalize_word(w) for w in text.split()) if k]

    assert words(done.stdout) == words(original) and len(words(original)) >= 5, (done.stdout, original)
