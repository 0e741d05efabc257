"""`--device` is the compute device in every command, decided by one rule
(:func:`captioner.compute.resolve_device`) that the array back-end and the ONNX Runtime sessions
share: a device that does not exist or cannot be used is one line and exit status 2 in every
command, before any model loads and with no output file left behind; "auto" never fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from captioner.app.commands.device_option import check_device
from captioner.compute import resolve_device
from captioner.data import sample_speech_path
from captioner.errors import UserError
from captioner.gpu import backend
from captioner.models import session

SAMPLE = str(sample_speech_path())


def usable_gpus() -> int:
    """GPUs that both sides of the engine can use here (0 on a machine without CUDA)."""
    return min(backend._cuda_device_count(), session._cuda_provider_devices()[0])


# -- the rule -------------------------------------------------------------------------------------

def test_auto_takes_the_gpu_when_usable_else_the_cpu(monkeypatch):
    monkeypatch.delenv("CAPTIONER_DEVICE", raising=False)
    assert resolve_device(None, 0) == resolve_device("auto", 0) == "cpu"
    assert resolve_device(None, 2) == resolve_device("AUTO", 2) == "cuda:0"
    assert resolve_device("cpu", 2) == "cpu"


def test_a_named_gpu_must_exist_and_be_usable(monkeypatch):
    monkeypatch.delenv("CAPTIONER_DEVICE", raising=False)
    assert resolve_device("cuda", 1) == "cuda:0" and resolve_device("cuda:1", 2) == "cuda:1"
    with pytest.raises(UserError, match=r"cuda:0 was asked for but no CUDA device is usable here \(no driver\)"):
        resolve_device("cuda:0", 0, "no driver")
    with pytest.raises(UserError, match=r"cuda:7 does not exist: this machine has 1 usable CUDA device \(cuda:0\)"):
        resolve_device("cuda:7", 1)
    with pytest.raises(UserError, match="unknown device 'tpu'"):
        resolve_device("tpu", 8)


def test_the_environment_is_a_request_like_the_option(monkeypatch):
    monkeypatch.setenv("CAPTIONER_DEVICE", "cuda:3")
    with pytest.raises(UserError, match="cuda:3"):
        resolve_device(None, 1)
    assert resolve_device("cpu", 1) == "cpu"  # the option beats the environment


def test_back_end_and_model_sessions_agree(monkeypatch):
    monkeypatch.delenv("CAPTIONER_DEVICE", raising=False)
    features = backend.get_backend(None).name
    model = session.choose_provider(None)
    if usable_gpus() == 0:
        assert features == "cpu" and model.provider == session.CPU
    for name in ("cuda:63", "tpu"):
        with pytest.raises(UserError) as from_features:
            backend.get_backend(name)
        with pytest.raises(UserError) as from_model:
            session.choose_provider(name)
        assert name in str(from_features.value) and name in str(from_model.value)


def test_check_device_names_the_environment(monkeypatch):
    monkeypatch.setenv("CAPTIONER_DEVICE", "tpu")
    with pytest.raises(UserError, match="^CAPTIONER_DEVICE=tpu: unknown device 'tpu'"):
        check_device(None)
    check_device("cpu")  # the option beats the environment: no error
    monkeypatch.setenv("CAPTIONER_DEVICE", "auto")
    check_device(None)


def test_auto_never_splits_features_and_model(monkeypatch):
    # CuPy runs but ONNX Runtime's CUDA provider does not (a CPU-only onnxruntime beside CuPy,
    # as seen on a GPU machine): the live engine would take the GPU for its features and then
    # ask for it by name for the model. "auto" sends both to the CPU instead, silently.
    from captioner.app.commands.device_option import engine_device

    monkeypatch.delenv("CAPTIONER_DEVICE", raising=False)
    monkeypatch.setattr(backend, "cuda_usable", lambda: True)
    monkeypatch.setattr(session, "choose_provider", lambda device=None: session.ProviderChoice(session.CPU, None, "cpu"))
    assert engine_device(None) == "cpu" and engine_device("auto") == "cpu"
    assert engine_device("cpu") == "cpu"
    monkeypatch.setattr(session, "choose_provider", lambda device=None: session.ProviderChoice(session.CUDA, 0, "cuda:0"))
    assert engine_device(None) is None  # both sides have the GPU: the engine takes it
    monkeypatch.setattr(backend, "cuda_usable", lambda: False)
    assert engine_device(None) is None


# -- every command --------------------------------------------------------------------------------

def bad_devices() -> list[str]:
    bad = ["tpu", "cuda:7" if usable_gpus() == 1 else "cuda:63"]
    if usable_gpus() == 0:
        bad.append("cuda:0")
    return bad


def run(argv: list[str], env_device: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CAPTIONER_DEVICE"}
    if env_device is not None:
        env["CAPTIONER_DEVICE"] = env_device
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def commands(tmp_path: Path) -> dict[str, list[str]]:
    return {
        "gui": ["-m", "captioner", "gui", "--no-start"],
        "transcribe": ["-m", "captioner", "transcribe", SAMPLE, "-o", str(tmp_path / "out.srt")],
        "transcribe --realtime": ["-m", "captioner", "transcribe", SAMPLE, "--realtime", "-o", str(tmp_path / "live.txt")],
        "listen": ["-m", "captioner", "listen", "--transcript", str(tmp_path / "transcript.txt")],
        "record_trace": ["-m", "captioner.app.record_trace", "--file", SAMPLE, "--out", str(tmp_path / "run.trace.jsonl")],
        "serve": ["-m", "captioner", "serve", "--port", "0", "--transcripts", str(tmp_path / "transcripts")],
    }


def in_process(argv: list[str], env_device: str | None, monkeypatch, capfd) -> subprocess.CompletedProcess:
    """``argv`` (``-m MODULE ARGS``) run by the module's ``main`` in this process: the same
    argument handling and device check as the command line, without an interpreter start.
    ``capfd`` reads file descriptors 1 and 2, so a native library writing there is seen too."""
    from captioner.app import cli, record_trace

    assert argv[0] == "-m"
    main = {"captioner": cli.main, "captioner.app.record_trace": record_trace.main}[argv[1]]
    # What a command sets up for its own process before the device is checked (serve: its
    # OpenBLAS default, its SIGTERM handler) must not stay in the test process.
    environment = dict(os.environ)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with monkeypatch.context() as env:
            env.delenv("CAPTIONER_DEVICE", raising=False)
            if env_device is not None:
                env.setenv("CAPTIONER_DEVICE", env_device)
            capfd.readouterr()
            try:
                code = main(argv[2:])
            except SystemExit as exit_:  # argparse's own refusals
                code = exit_.code
            out, err = capfd.readouterr()
    finally:
        os.environ.clear()
        os.environ.update(environment)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return subprocess.CompletedProcess(argv, code, out, err)


@pytest.mark.parametrize("command", ["gui", "transcribe", "transcribe --realtime", "listen", "record_trace", "serve"])
def test_a_device_that_cannot_be_used_is_one_line_and_exit_2(command, tmp_path, monkeypatch, capfd):
    """Every bad device, by option and by environment, through the command's ``main``; and one
    real process per command (the first bad device, by option), whose exit status and stderr
    are the process's own."""
    argv = commands(tmp_path)[command]
    devices = bad_devices()
    runs = [(f"process, --device {devices[0]}", run([*argv, "--device", devices[0]]), devices[0])]
    for device in devices:
        runs.append((f"--device {device}", in_process([*argv, "--device", device], None, monkeypatch, capfd), device))
        runs.append((f"CAPTIONER_DEVICE={device}", in_process(argv, device, monkeypatch, capfd), device))
    for how, done, device in runs:
        assert done.returncode == 2, (how, done.stderr)
        assert done.stderr.count("\n") == 1 and device in done.stderr, (how, done.stderr)
        assert "error:" in done.stderr and "Traceback" not in done.stderr, (how, done.stderr)
        assert done.stdout == "", how
        assert list(tmp_path.iterdir()) == [], f"a refused run ({how}) left a file behind"


def test_listen_points_an_old_input_device_at_input(tmp_path):
    done = run(["-m", "captioner", "listen", "--device", "monitor", "--no-transcript"])
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "unknown device 'monitor'" in done.stderr and "--input monitor" in done.stderr


def test_help_texts_say_the_same_about_device(monkeypatch, capfd):
    # Read through each command's main in this process: a help text is the parser's, whatever
    # starts it (`captioner transcribe --help` in a process of its own: test_cli_transcribe).
    from captioner.app.commands.device_option import DEVICE_HELP

    monkeypatch.setenv("COLUMNS", "80")  # the width a process writing to a pipe wraps its help at
    for argv in (["-m", "captioner", "transcribe", "--help"], ["-m", "captioner", "listen", "--help"],
                 ["-m", "captioner", "gui", "--help"], ["-m", "captioner.app.record_trace", "--help"]):
        done = in_process(argv, None, monkeypatch, capfd)
        assert done.returncode == 0
        flat = " ".join(done.stdout.split())
        assert "--device cpu|cuda|cuda:N" in flat and " ".join(DEVICE_HELP.split()) in flat, argv
        if argv[2] == "listen":
            assert "--input" in done.stdout and "--compute" not in done.stdout  # the old alias is hidden
