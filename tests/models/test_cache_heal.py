"""The model cache heals itself: a damaged, truncated or missing file is found and the folder
rebuilt once; a build killed half-way leaves nothing behind for long; a full disk is one line."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from graph_fixtures import tiny_files  # noqa: F401 - fixture

from captioner.errors import UserError
from captioner.models import onnx_export
from onnx_cache import session_cache_dir

pytestmark = pytest.mark.slow  # converts tiny.en (fp32): once a session, again where a case rebuilds


@pytest.fixture(scope="module")
def built_once(tmp_path_factory, tiny_files):  # noqa: F811
    """One real conversion of tiny.en (fp32), made as any first use makes it, in the session's
    private cache (onnx_cache.session_cache_dir: converted there once a run, by whichever test
    asks first); the cases below each damage a copy of it, never the folder itself."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("CAPTIONER_CACHE_DIR", str(session_cache_dir(tmp_path_factory)))
        built = onnx_export.ensure_onnx(tiny_files, "fp32")
    assert onnx_export.cache_problem(built.folder, "fp32") is None
    return built.folder


@pytest.fixture()
def cache(tmp_path, monkeypatch, built_once):
    """A cache folder of this test's own, byte for byte and mtime for mtime the built one (the
    manifest's records then hold for it, as for a folder just built)."""
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    folder = onnx_export.cache_root() / built_once.name
    shutil.copytree(built_once, folder)  # copy2: sizes and nanosecond mtimes are kept
    return folder


def _ensure(tiny_files):  # noqa: F811
    messages = []
    files = onnx_export.ensure_onnx(tiny_files, "fp32", lambda m, f: messages.append(m))
    return files, messages


def test_the_manifest_records_every_file(cache):
    records = json.loads((cache / "manifest.json").read_text())["files"]
    assert {"encoder.onnx", "decoder.onnx.data", "cross_kv.onnx"} <= set(records)
    assert all(len(r["sha256"]) == 64 and r["size"] > 0 for r in records.values())
    assert onnx_export.cache_problem(cache, "fp32") is None


def test_random_bytes_in_the_weights_with_the_time_kept_rebuild_the_cache(cache, tiny_files):  # noqa: F811
    """Issue 47, item 3: 4 MiB of garbage inside encoder.onnx.data, its size and modification
    time as they were (a bad sector, a restore that keeps times): only the bytes can tell, and
    they are hashed at a process's first load. Before, such a cache passed as good and decoded
    nothing. A folder found whole earlier in this process is hashed again too: the damage moved
    its ctime, which no call puts back."""
    data = cache / "encoder.onnx.data"
    assert onnx_export.cache_problem(cache, "fp32") is None  # hashed and found whole: remembered
    before = data.stat()
    with data.open("r+b") as f:
        f.seek(before.st_size // 2)
        f.write(os.urandom(4 << 20))
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert data.stat().st_mtime_ns == before.st_mtime_ns and data.stat().st_size == before.st_size
    assert onnx_export.cache_problem(cache, "fp32") == "encoder.onnx.data is damaged (its contents changed)"
    files, messages = _ensure(tiny_files)
    assert files.built
    assert messages[0] == ("tiny.en: the model cache is damaged (encoder.onnx.data is damaged (its contents "
                           "changed)); rebuilding")
    assert onnx_export.cache_problem(files.folder, "fp32") is None


@pytest.mark.parametrize("damage", ["delete_graph", "truncate_weights"])
def test_a_missing_or_truncated_file_rebuilds_the_cache(cache, tiny_files, damage):  # noqa: F811
    if damage == "delete_graph":
        (cache / "decoder.onnx").unlink()
    else:
        data = cache / "encoder.onnx.data"
        os.truncate(data, data.stat().st_size // 3)
    files, _ = _ensure(tiny_files)
    assert files.built and onnx_export.cache_problem(files.folder, "fp32") is None


def test_a_touched_but_intact_file_is_kept(cache, tiny_files):  # noqa: F811
    os.utime(cache / "encoder.onnx.data")  # a backup tool restored it, say: same bytes, new time
    files, messages = _ensure(tiny_files)
    assert not files.built and messages == ["tiny.en: ONNX graphs cached"]


def test_a_killed_build_leaves_no_folder_behind(tmp_path, monkeypatch, tiny_files):  # noqa: F811
    """A conversion killed with SIGKILL leaves its temporary folder; the next build removes it,
    while a folder whose build is still running (its lock held) stays."""
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))
    script = ("import time, captioner.models.onnx_export as e, captioner.models.registry as r\n"
              "files = r.resolve_model('tiny.en')\n"
              "e.ensure_onnx(files, 'fp32', lambda m, f: print(f, flush=True) or (f > 0.3 and time.sleep(60)))\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, CAPTIONER_CACHE_DIR=str(tmp_path)))
    try:
        for line in child.stdout:
            if float(line) > 0.3:
                break
        (running,) = [p for p in (tmp_path / "onnx").iterdir() if ".tmp-" in p.name]
        assert onnx_export.remove_stale_builds(tmp_path / "onnx") == []  # its lock is held: kept
        child.kill()
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
    assert running.exists()
    files = onnx_export.ensure_onnx(tiny_files, "fp32")
    assert not running.exists()
    assert sorted(p.name for p in (tmp_path / "onnx").iterdir()) == [files.folder.name]


def test_an_old_unlocked_temporary_folder_is_removed(tmp_path):
    stale = tmp_path / ".abc-v5-fp32.tmp-xyz"
    stale.mkdir()
    (stale / "encoder.onnx").write_bytes(b"half")
    fresh = tmp_path / ".abc-v5-fp32.tmp-new"
    fresh.mkdir()
    old_s = time.time() - 3600
    os.utime(stale, (old_s, old_s))
    assert onnx_export.remove_stale_builds(tmp_path) == [stale.name]
    assert fresh.exists()  # too young to judge: its builder may be about to lock it


def test_a_full_cache_disk_is_one_line(tmp_path, monkeypatch, tiny_files):  # noqa: F811
    monkeypatch.setenv("CAPTIONER_CACHE_DIR", str(tmp_path))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(onnx_export, "_save", full)
    with pytest.raises(UserError, match="no space left for the model cache") as info:
        onnx_export.ensure_onnx(tiny_files, "fp32")
    assert "\n" not in str(info.value)
    assert [p for p in (tmp_path / "onnx").iterdir()] == []
