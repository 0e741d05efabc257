import os
import subprocess
import sys

from captioner.app.commands.devices import format_gpus, format_input_devices
from captioner.audio.devices import InputDevice, is_loopback_name
from captioner.gpu.backend import GpuInfo, describe_gpus


def test_command_runs_and_says_where_captioning_will_run(tmp_path):
    env = dict(os.environ, PULSE_SERVER=f"unix:{tmp_path}/no-server")
    done = subprocess.run([sys.executable, "-m", "captioner", "devices"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout.startswith("Audio input devices")
    gpus = describe_gpus()
    if gpus:
        assert all(g.name in done.stdout for g in gpus)
    else:
        assert "No usable CUDA GPU: captioning will run on the CPU." in done.stdout


def test_formatting_marks_monitors_and_defaults():
    devices = [
        InputDevice(3, "USB Mic", "ALSA", 1, 48_000, is_monitor=False, is_default=True),
        InputDevice(None, "alsa_output.pci.analog-stereo.monitor", "PulseAudio", 2, 44_100, is_monitor=True),
    ]
    mic, monitor = format_input_devices(devices)
    assert "USB Mic" in mic and "[default]" in mic and "[monitor]" not in mic and "--input 3" in mic
    assert "[monitor]" in monitor and "44100 Hz" in monitor
    assert "--input pulse:alsa_output.pci.analog-stereo.monitor" in monitor
    assert "none found" in format_input_devices([])[0]


def test_gpu_lines():
    line, = format_gpus([GpuInfo(0, "NVIDIA H200", 150_754_820_096, "580.65 (CUDA 13.0)", "9.0")])
    assert line.strip() == "cuda:0  NVIDIA H200  (140.4 GiB VRAM, driver 580.65 (CUDA 13.0))"
    assert format_gpus([]) == ["  No usable CUDA GPU: captioning will run on the CPU."]


def test_loopback_names():
    assert is_loopback_name("Monitor of Built-in Audio")
    assert is_loopback_name("Stereo Mix (Realtek)")
    assert not is_loopback_name("HD Pro Webcam C920")
