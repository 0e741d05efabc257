"""Build the ONNX graphs of a Whisper model once and keep them in the user cache.

Cache layout: ``<user cache>/captioner/onnx/<model-hash>-v<CONVERTER_VERSION>-<precision>[-fused]/`` with
``encoder.onnx``, ``cross_kv.onnx``, ``decoder.onnx`` (weights in ``*.onnx.data`` beside each, so
models above protobuf's 2 GB limit work too) and ``manifest.json``. A folder is built under a
temporary name in the same parent and renamed into place when complete, so a crash or a
concurrent build never leaves a half cache behind: a cache folder either exists whole or not at all.

The model hash is cheap by design (a 145 MB model must not be read whole at every start): SHA-256
over, for each part of model.bin, its size, its first 4 MiB (header, variable table start) and its
last 4 MiB (the tail variables and the alias table). Any re-conversion changes the size or those
bytes in practice; a deliberate same-size edit in the middle would not be seen, which is accepted.
Bump CONVERTER_VERSION whenever the graphs change.
"""

from __future__ import annotations

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

CONVERTER_VERSION = 5
PRECISIONS = {"fp32": np.float32, "fp16": np.float16}
# fp32 runs on the CPU with the concatenating decoder; fp16 runs on CUDA with the fixed-cache
# decoder step that is captured as a CUDA graph (see onnx_graphs).
# A prompt is prefilled in one run of ``decoder_prefill``, which writes the same fixed cache.
GRAPHS = {"fp32": ("encoder", "cross_kv", "decoder"), "fp16": ("encoder", "cross_kv", "decoder_step", "decoder_prefill")}
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


def cache_folder(files: ModelFiles, precision: str, fused_attention: bool = False) -> Path:
    return cache_root() / f"{model_hash(files)}-v{CONVERTER_VERSION}-{precision}{'-fused' if fused_attention else ''}"


def _complete(folder: Path, precision: str) -> bool:
    if not (folder / "manifest.json").is_file():
        return False
    return all((folder / f"{g}.onnx").is_file() for g in GRAPHS[precision])


def ensure_onnx(
    files: ModelFiles, precision: str, progress: ProgressFn | None = None, fused_attention: bool | None = None,
) -> OnnxFiles:
    """The cached graphs for ``files`` at ``precision`` ("fp32" or "fp16"), built if missing.
    ``fused_attention`` (default: on for fp16, i.e. CUDA) uses ONNX Runtime's MultiHeadAttention
    contrib op; the fp32 CPU graphs keep plain MatMul attention, which matches CTranslate2 exactly."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}")
    if fused_attention is None:
        fused_attention = precision == "fp16"
    report = progress or (lambda message, fraction: None)
    folder = cache_folder(files, precision, fused_attention)
    if _complete(folder, precision):
        report(f"{files.name}: ONNX graphs cached", 1.0)
        return OnnxFiles(folder, precision, built=False)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is ordinary user data
    except OSError as e:
        raise UserError(f"cannot write the model cache at {folder.parent}: {e.strerror}") from None
    try:
        _build_into(files, precision, tmp, report, fused_attention)
        try:
            os.rename(tmp, folder)
        except OSError:
            # Another process finished the same build first: keep theirs.
            if not _complete(folder, precision):
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    report(f"{files.name}: ONNX graphs ready", 1.0)
    return OnnxFiles(folder, precision, built=True)


def _build_into(files: ModelFiles, precision: str, out: Path, report: ProgressFn, fused_attention: bool = False) -> None:
    import onnx

    from captioner.models import onnx_graphs

    dtype = PRECISIONS[precision]
    weights = files.open_weights()
    started = time.monotonic()
    try:
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
            dec = onnx_graphs.build_decoder(weights, files.dims, dtype)
        else:
            report(f"{files.name}: building decoder step (fixed cache)", 0.55)
            dec = onnx_graphs.build_decoder_step(weights, files.dims, dtype, fused_attention)
        report(f"{files.name}: saving decoder", 0.7)
        name = "decoder" if "decoder" in GRAPHS[precision] else "decoder_step"
        _save(onnx, dec, out / f"{name}.onnx")
        del dec
        if "decoder_prefill" in GRAPHS[precision]:
            report(f"{files.name}: building prompt prefill", 0.85)
            _save(onnx, onnx_graphs.build_decoder_prefill(weights, files.dims, dtype, fused_attention), out / "decoder_prefill.onnx")
    finally:
        weights.close()
    manifest = {
        "model": files.name,
        "model_paths": [str(p) for p in files.model_paths],
        "model_hash": model_hash(files),
        "converter_version": CONVERTER_VERSION,
        "precision": precision,
        "fused_attention": fused_attention,
        "dims": files.dims.__dict__,
        "build_s": round(time.monotonic() - started, 2),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def _save(onnx, model, path: Path) -> None:
    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
        location=path.name + ".data", size_threshold=1024,
    )
