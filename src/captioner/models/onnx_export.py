"""Build the ONNX graphs of a Whisper model once and keep them in the user cache.

Cache layout: ``<user cache>/captioner/onnx/<model-hash>-v<CONVERTER_VERSION>-<precision>[-fused]/`` with
``encoder.onnx``, ``cross_kv.onnx``, ``decoder.onnx`` (weights in ``*.onnx.data`` beside each, so
models above protobuf's 2 GB limit work too) and ``manifest.json``. A folder is built under a
temporary name in the same parent and renamed into place when complete, so a crash or a
concurrent build never leaves a half cache behind: a cache folder either exists whole or not at all.

The cache heals itself: the manifest records every file's size and SHA-256, and a process's first
use hashes every file again (on a few threads: hashlib lets go of the GIL). A missing file, a
wrong size or a wrong hash rebuilds the folder once, with progress, instead of failing or decoding
garbage. Modification times are not trusted: bytes changed in place with the time put back (a bad
sector, a restore, a tool that keeps times) pass a check by time. SHA-256, not a faster
checksum: the manifests of caches built before record it (no rebuild for them), and with the
CPU's SHA instructions it runs near a gigabyte a second, well under what opening the graphs
costs (docs/models.md has the figures). Within one process a folder found
whole is not hashed again while its files' inode, size, mtime and ctime stay as they were (a
model swap, a restarted worker, a test run pay once): any write moves the ctime, and so does
``os.utime``, and no call sets it back. A build holds a lock on its temporary folder; one left by
a killed build (no lock held) is removed by the next build.

The model hash is cheap by design (a 145 MB model must not be read whole at every start): SHA-256
over, for each part of model.bin, its size, its first 4 MiB (header, variable table start) and its
last 4 MiB (the tail variables and the alias table). Any re-conversion changes the size or those
bytes in practice; a deliberate same-size edit in the middle would not be seen, which is accepted.
Bump CONVERTER_VERSION whenever the graphs change.

Shorter audio contexts (see :mod:`captioner.models.onnx_graphs`) live in folders of their own
beside the model's, named with a variant suffix, built only when a runtime enables them:
``...-ctx500/`` holds ``encoder.onnx`` and ``cross_kv.onnx`` for 500 positions (10 s), and
``...-frames/`` the decoder graphs that take cross K/V of any length, shared by every short
context. The 30 s folder is never touched by them, so turning short contexts on or off neither
rebuilds nor changes it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from captioner.errors import UserError
from captioner.models.registry import ModelFiles

CONVERTER_VERSION = 11  # 6: decoder graphs output the alignment heads' cross-attention; 7: per-row positions (ragged batches);
# 8: the step graph writes its cache column in place (ScatterElements); 9: the prefill's logits at a
# second position per row too (``probe``: <|startoftranscript|> before forced tokens); 10: the
# prefill writes its columns in place (ScatterElements) instead of a one-hot product and a Where;
# 11: the fused prefill weighs only each row's last query against the audio for the alignment heads
PRECISIONS = {"fp32": np.float32, "fp16": np.float16}
# fp32 runs on the CPU with the concatenating decoder; fp16 runs on CUDA with the fixed-cache
# decoder step that is captured as a CUDA graph (see onnx_graphs).
# A prompt is prefilled in one run of ``decoder_prefill``, which writes the same fixed cache.
GRAPHS = {"fp32": ("encoder", "cross_kv", "decoder"), "fp16": ("encoder", "cross_kv", "decoder_step", "decoder_prefill")}
FRAMES_VARIANT = "frames"
"""The variant whose decoder graphs take cross K/V of any number of audio positions."""
FRAMES_DIM = "frames"
"""The symbolic dimension those graphs declare for it."""


def context_variant(n_audio_ctx: int) -> str:
    """The variant holding the encoder and cross K/V graphs of ``n_audio_ctx`` positions."""
    return f"ctx{int(n_audio_ctx)}"


def variant_graphs(precision: str, variant: str = "") -> tuple[str, ...]:
    """The graphs a cache folder of ``variant`` holds ("": the model's own, 30 s)."""
    if not variant:
        return GRAPHS[precision]
    if variant == FRAMES_VARIANT:
        return tuple(g for g in GRAPHS[precision] if g.startswith("decoder"))
    if variant.startswith("ctx") and variant[3:].isdigit():
        return ("encoder", "cross_kv")
    raise ValueError(f"unknown graph variant {variant!r}")
_HASH_EDGE_BYTES = 4 << 20

# progress(message, fraction in [0, 1]); called from the thread that loads the model.
ProgressFn = Callable[[str, float], None]


@dataclass(frozen=True)
class OnnxFiles:
    folder: Path
    precision: str
    built: bool  # False when taken from the cache

    def path(self, graph: str) -> Path:
        return self.folder / f"{graph}.onnx"


def model_hash(files: ModelFiles) -> str:
    h = hashlib.sha256()
    for p in files.model_paths:
        size = p.stat().st_size
        h.update(size.to_bytes(8, "little"))
        with p.open("rb") as f:
            h.update(f.read(_HASH_EDGE_BYTES))
            if size > _HASH_EDGE_BYTES:
                f.seek(max(_HASH_EDGE_BYTES, size - _HASH_EDGE_BYTES))
                h.update(f.read())
    return h.hexdigest()[:20]


def cache_root() -> Path:
    """``CAPTIONER_CACHE_DIR`` if set, else platformdirs' user cache dir for captioner."""
    override = os.environ.get("CAPTIONER_CACHE_DIR")
    if override:
        return Path(override) / "onnx"
    import platformdirs

    return Path(platformdirs.user_cache_dir("captioner", appauthor=False)) / "onnx"


def cache_folder(files: ModelFiles, precision: str, fused_attention: bool = False, variant: str = "") -> Path:
    suffix = f"-{variant}" if variant else ""
    return cache_root() / f"{model_hash(files)}-v{CONVERTER_VERSION}-{precision}{'-fused' if fused_attention else ''}{suffix}"


_TMP_MARK = ".tmp-"
_LOCK_NAME = ".building"
_STALE_UNLOCKED_S = 600.0
"""A temporary build folder with no lock file is left alone this long (its builder may be
between creating it and locking it), then removed."""


def _file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _sha256s(paths: list[Path]) -> list[str]:
    """The SHA-256 of each file, in order; the biggest are started first, on a thread each of
    up to four (the weights files are most of the bytes)."""
    from concurrent.futures import ThreadPoolExecutor

    if len(paths) < 2:
        return [_file_sha256(p) for p in paths]
    order = sorted(range(len(paths)), key=lambda i: -paths[i].stat().st_size)
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1, len(paths))) as pool:
        digests = dict(zip(order, pool.map(_file_sha256, [paths[i] for i in order])))
    return [digests[i] for i in range(len(paths))]


def _file_records(folder: Path) -> dict[str, dict]:
    """Size and SHA-256 of every file of a built folder but the manifest."""
    paths = [p for p in sorted(folder.iterdir()) if p.is_file() and p.name not in ("manifest.json", _LOCK_NAME)]
    return {p.name: {"size": p.stat().st_size, "sha256": digest} for p, digest in zip(paths, _sha256s(paths))}


def _write_manifest(folder: Path, manifest: dict) -> None:
    tmp = folder / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, folder / "manifest.json")


_verified: dict[Path, tuple] = {}
"""Cache folders this process hashed and found whole, with their files' stat signature then."""


def _signature(folder: Path, names: list[str]) -> tuple:
    out = []
    for name in names:
        st = (folder / name).stat()
        out.append((name, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


def cache_problem(folder: Path, precision: str, variant: str = "") -> str | None:
    """Why the cache folder cannot be used as it is (``None``: it can): a file missing, of
    another size, or whose bytes hash to another SHA-256 than the manifest recorded at build."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "incomplete"
    except (OSError, ValueError):
        return "its manifest is unreadable"
    for graph in variant_graphs(precision, variant):
        if not (folder / f"{graph}.onnx").is_file():
            return f"{graph}.onnx is missing"
    records = manifest.get("files")
    if not isinstance(records, dict):
        # A cache from before the records: take it as it is and record it now.
        manifest["files"] = _file_records(folder)
        with contextlib.suppress(OSError):
            _write_manifest(folder, manifest)
        return None
    for name, record in records.items():
        try:
            size = (folder / name).stat().st_size
        except FileNotFoundError:
            return f"{name} is missing"
        if size != record.get("size"):
            return f"{name} has {size} bytes, not {record.get('size')}"
    names = sorted(records)
    try:
        signature = _signature(folder, names)
        if _verified.get(folder) == signature:
            return None
        digests = _sha256s([folder / name for name in names])
    except OSError as error:  # unreadable (permissions, an I/O error): as damaged as a wrong hash
        return f"a file cannot be read ({error.strerror or error})"
    for name, digest in zip(names, digests):
        if digest != records[name].get("sha256"):
            return f"{name} is damaged (its contents changed)"
    _verified[folder] = signature
    return None


def _remove(folder: Path) -> None:
    """Take a folder out of the way at once (rename), then delete it."""
    trash = folder.with_name(f".{folder.name}{_TMP_MARK}removed-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(folder, trash)
    except OSError:
        trash = folder
    shutil.rmtree(trash, ignore_errors=True)


def _lock(folder: Path):
    """An exclusive lock on a build folder, held while the returned file stays open (POSIX);
    ``None`` where locks are not available."""
    try:
        import fcntl
    except ImportError:  # Windows: stale folders are then recognised by age alone
        return None
    handle = open(folder / _LOCK_NAME, "w")  # noqa: SIM115 - held open for the whole build
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return handle


def remove_stale_builds(parent: Path) -> list[str]:
    """Delete temporary build folders whose builder is gone (a killed conversion); returns
    their names. A folder whose lock is held belongs to a build in progress and stays."""
    removed = []
    try:
        candidates = [p for p in parent.iterdir() if p.is_dir() and p.name.startswith(".") and _TMP_MARK in p.name]
    except OSError:
        return removed
    for folder in candidates:
        lock_path = folder / _LOCK_NAME
        if lock_path.exists():
            try:
                handle = _lock(folder)
            except OSError:
                continue  # locked: a build is running
            if handle is not None:
                handle.close()
        else:
            try:
                age_s = time.time() - folder.stat().st_mtime
            except OSError:
                continue
            if age_s < _STALE_UNLOCKED_S:
                continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder.name)
    return removed


def ensure_onnx(
    files: ModelFiles, precision: str, progress: ProgressFn | None = None, fused_attention: bool | None = None,
    rebuild: bool = False, variant: str = "",
) -> OnnxFiles:
    """The cached graphs for ``files`` at ``precision`` ("fp32" or "fp16"), built if missing or
    damaged (or when ``rebuild`` says the last use failed). ``fused_attention`` (default: on for
    fp16, i.e. CUDA) uses ONNX Runtime's MultiHeadAttention contrib op; the fp32 CPU graphs keep
    plain MatMul attention, which matches CTranslate2 exactly. ``variant``: "" (the model's
    graphs), :func:`context_variant` or :data:`FRAMES_VARIANT` (shorter audio contexts)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}")
    if fused_attention is None:
        fused_attention = precision == "fp16"
    variant_graphs(precision, variant)  # ValueError for an unknown variant
    report = progress or (lambda message, fraction: None)
    folder = cache_folder(files, precision, fused_attention, variant)
    problem = "it failed to load" if rebuild else (cache_problem(folder, precision, variant) if folder.exists() else "absent")
    if problem is None:
        report(f"{files.name}: ONNX graphs cached", 1.0)
        return OnnxFiles(folder, precision, built=False)
    if folder.exists():
        report(f"{files.name}: the model cache is damaged ({problem}); rebuilding", 0.0)
        _remove(folder)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_builds(folder.parent)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}{_TMP_MARK}", dir=folder.parent))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is ordinary user data
        lock = _lock(tmp)
    except OSError as e:
        raise UserError(f"cannot write the model cache at {folder.parent}: {e.strerror}") from None
    try:
        _build_into(files, precision, tmp, report, fused_attention, variant)
        (tmp / _LOCK_NAME).unlink(missing_ok=True)
        try:
            os.rename(tmp, folder)
        except OSError:
            # Another process finished the same build first: keep theirs.
            if cache_problem(folder, precision, variant) is not None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(f"no space left for the model cache at {folder.parent}: free some space, or point "
                            "CAPTIONER_CACHE_DIR at a disk with room") from None
        raise UserError(f"cannot write the model cache at {folder.parent}: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            lock.close()
    report(f"{files.name}: ONNX graphs ready", 1.0)
    return OnnxFiles(folder, precision, built=True)


def _build_into(files: ModelFiles, precision: str, out: Path, report: ProgressFn, fused_attention: bool = False,
                variant: str = "") -> None:
    import onnx

    from captioner.models import onnx_graphs

    dtype = PRECISIONS[precision]
    weights = files.open_weights()
    started = time.monotonic()
    dims = files.dims
    try:
        if variant:
            dims = _build_variant(onnx, onnx_graphs, files, weights, dtype, precision, out, report, fused_attention, variant)
        else:
            _build_model_graphs(onnx, onnx_graphs, files, weights, dtype, precision, out, report, fused_attention)
    finally:
        weights.close()
    manifest = {
        "model": files.name,
        "model_paths": [str(p) for p in files.model_paths],
        "model_hash": model_hash(files),
        "converter_version": CONVERTER_VERSION,
        "precision": precision,
        "fused_attention": fused_attention,
        "dims": dims.__dict__,
        "build_s": round(time.monotonic() - started, 2),
    }
    if variant:
        manifest["variant"] = variant
    manifest["files"] = _file_records(out)
    _write_manifest(out, manifest)


def _build_variant(onnx, onnx_graphs, files: ModelFiles, weights, dtype, precision: str, out: Path, report: ProgressFn,
                   fused_attention: bool, variant: str):
    """The graphs of a shorter audio context (encoder + cross K/V), or the decoders that take
    cross K/V of any length; returns the dimensions they were built for."""
    if variant == FRAMES_VARIANT:
        frames = {"audio_frames": FRAMES_DIM}
        if "decoder" in GRAPHS[precision]:
            report(f"{files.name}: building decoder for short windows", 0.2)
            _save(onnx, onnx_graphs.build_decoder(weights, files.dims, dtype, files.alignment_heads, **frames), out / "decoder.onnx")
        else:
            report(f"{files.name}: building decoder step for short windows", 0.2)
            _save(onnx, onnx_graphs.build_decoder_step(weights, files.dims, dtype, fused_attention, files.alignment_heads, **frames),
                  out / "decoder_step.onnx")
            report(f"{files.name}: building prompt prefill for short windows", 0.6)
            _save(onnx, onnx_graphs.build_decoder_prefill(weights, files.dims, dtype, fused_attention, files.alignment_heads, **frames),
                  out / "decoder_prefill.onnx")
        return files.dims
    dims = files.dims.with_audio_ctx(int(variant[3:]))
    window_s = f"{dims.n_audio_ctx * 0.02:g} s"
    report(f"{files.name}: building encoder for {window_s} windows ({precision})", 0.0)
    enc = onnx_graphs.build_encoder(
        weights, dims, dtype, fused_attention=fused_attention,
        progress=lambda f: report(f"{files.name}: building encoder for {window_s} windows ({precision})", 0.8 * f),
    )
    _save(onnx, enc, out / "encoder.onnx")
    del enc
    report(f"{files.name}: building cross-attention K/V for {window_s} windows", 0.85)
    _save(onnx, onnx_graphs.build_cross_kv(weights, dims, dtype, fused_attention), out / "cross_kv.onnx")
    return dims


def _build_model_graphs(onnx, onnx_graphs, files: ModelFiles, weights, dtype, precision: str, out: Path, report: ProgressFn,
                        fused_attention: bool) -> None:
    # Fractions: encoder 0-0.4 (per layer), cross K/V 0.45, decoder 0.55, saving it 0.85-1.
    report(f"{files.name}: building encoder ({precision})", 0.0)
    enc = onnx_graphs.build_encoder(
        weights, files.dims, dtype,
        progress=lambda f: report(f"{files.name}: building encoder ({precision})", 0.4 * f),
        fused_attention=fused_attention,
    )
    _save(onnx, enc, out / "encoder.onnx")
    del enc
    report(f"{files.name}: building cross-attention K/V", 0.45)
    _save(onnx, onnx_graphs.build_cross_kv(weights, files.dims, dtype, fused_attention), out / "cross_kv.onnx")
    if "decoder" in GRAPHS[precision]:
        report(f"{files.name}: building decoder", 0.55)
        dec = onnx_graphs.build_decoder(weights, files.dims, dtype, files.alignment_heads)
    else:
        report(f"{files.name}: building decoder step (fixed cache)", 0.55)
        dec = onnx_graphs.build_decoder_step(weights, files.dims, dtype, fused_attention, files.alignment_heads)
    report(f"{files.name}: saving decoder", 0.7)
    name = "decoder" if "decoder" in GRAPHS[precision] else "decoder_step"
    _save(onnx, dec, out / f"{name}.onnx")
    del dec
    if "decoder_prefill" in GRAPHS[precision]:
        report(f"{files.name}: building prompt prefill", 0.85)
        _save(onnx, onnx_graphs.build_decoder_prefill(weights, files.dims, dtype, fused_attention, files.alignment_heads), out / "decoder_prefill.onnx")


def _save(onnx, model, path: Path) -> None:
    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
        location=path.name + ".data", size_threshold=1024,
    )
