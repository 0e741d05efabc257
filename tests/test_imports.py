"""Every module imports on a machine with no GPU, no PortAudio device and no display, and importing
loads none of the hardware libraries: each is imported lazily, in its one module, when used."""

import subprocess
import sys

SCRIPT = r"""
import importlib, pkgutil, sys
import captioner
names = [m.name for m in pkgutil.walk_packages(captioner.__path__, "captioner.") if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
loaded = [k for k in ("cupy", "onnxruntime", "sounddevice", "pynvml", "ctranslate2") if k in sys.modules]
print(len(names), ",".join(loaded))
"""


def test_every_module_imports_without_hardware_or_display():
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "CAPTIONER_DEVICE": "cpu"}  # no DISPLAY
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    count, loaded = result.stdout.strip().split(" ", 1) if " " in result.stdout.strip() else (result.stdout.strip(), "")
    assert int(count) > 50
    assert loaded == "", f"imported at module level: {loaded}"
