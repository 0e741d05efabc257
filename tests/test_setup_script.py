"""scripts/setup.sh skips what it already did: after a set-up that succeeded, a second call with
nothing changed runs neither the apt checks nor pip; a changed pyproject.toml, another mode, or
an uninstalled captioner set up again. The first set-up shows pip's own output.

Run in a scratch copy with a fake .venv whose python only logs how it was called (and "installs"
a dist-info folder as pip would), and a dpkg-query that logs and says every package is installed:
no network, no root, a fraction of a second per call."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/bin/sh
echo "python $*" >> "$CALLS"
case "$*" in
  *"pip install"*"-e ."*)
    echo "pip: Successfully installed captioner-0.1.0"
    mkdir -p "$(dirname "$0")/../lib/python3.11/site-packages/captioner-0.1.0.dist-info" ;;
esac
"""

FAKE_DPKG_QUERY = """#!/bin/sh
echo "dpkg-query $*" >> "$CALLS"
printf 'install ok installed'
"""


def executable(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture()
def checkout(tmp_path):
    if shutil.which("bash") is None or shutil.which("sha256sum") is None:
        pytest.skip("needs bash and coreutils")
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    venv_bin = root / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (root / ".venv" / "pyvenv.cfg").write_text("version = 3.11.7\n", encoding="utf-8")
    executable(venv_bin / "python", FAKE_PYTHON)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    executable(stubs / "dpkg-query", FAKE_DPKG_QUERY)
    return root


def setup(root: Path, mode: str = "app") -> tuple[str, list[str]]:
    calls = root.parent / "calls.log"
    calls.unlink(missing_ok=True)
    env = {"PATH": f"{root.parent / 'stubs'}:/usr/bin:/bin", "CALLS": str(calls), "HOME": str(root.parent)}
    done = subprocess.run(["bash", "scripts/setup.sh", mode], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, calls.read_text(encoding="utf-8").splitlines() if calls.exists() else []


def pip_calls(calls: list[str]) -> list[str]:
    return [c for c in calls if "-m pip install" in c]


def test_second_call_skips_apt_and_pip(checkout):
    out, calls = setup(checkout)
    assert pip_calls(calls) and any(c.startswith("dpkg-query") for c in calls)
    assert "pip: Successfully installed" in out  # pip's own output is shown, not hidden
    assert "ready" in out
    # the default model's graphs are built by the set-up, not behind the first window
    assert any(c == "python -m captioner.app.prepare" for c in calls), calls
    out, calls = setup(checkout)
    assert calls == [], "nothing should run when nothing changed"
    assert "up to date" in out and "skipping apt and pip" in out


def test_changed_sources_need_nothing_but_a_changed_pyproject_sets_up_again(checkout):
    setup(checkout)
    (checkout / "src").mkdir()
    (checkout / "src" / "new_module.py").write_text("x = 1\n", encoding="utf-8")  # editable install
    assert setup(checkout)[1] == []
    with (checkout / "pyproject.toml").open("a", encoding="utf-8") as f:
        f.write("\n# a new dependency would go here\n")
    assert pip_calls(setup(checkout)[1])
    assert setup(checkout)[1] == []


def test_an_uninstalled_captioner_is_installed_again(checkout):
    setup(checkout)
    shutil.rmtree(next((checkout / ".venv" / "lib").glob("python*/site-packages/captioner-*.dist-info")))
    assert pip_calls(setup(checkout)[1])


def test_test_mode_covers_app_but_not_the_other_way_round(checkout):
    setup(checkout, "app")
    calls = setup(checkout, "test")[1]
    assert any("[test]" in c or "[test," in c for c in pip_calls(calls)), calls
    assert any("espeak-ng" in c for c in calls)  # the test packages were checked
    assert setup(checkout, "app")[1] == [] and setup(checkout, "test")[1] == []


def test_a_failed_set_up_leaves_no_stamp(checkout):
    executable(checkout / ".venv" / "bin" / "python", FAKE_PYTHON + 'case "$*" in *"-e ."*) exit 1 ;; esac\n')
    env = {"PATH": f"{checkout.parent / 'stubs'}:/usr/bin:/bin", "CALLS": os.devnull, "HOME": str(checkout.parent)}
    done = subprocess.run(["bash", "scripts/setup.sh", "app"], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert not list((checkout / ".venv").glob(".captioner-setup-*"))
