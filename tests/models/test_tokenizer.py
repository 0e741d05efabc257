"""The Whisper tokenizer on the packaged models' real files: special ids looked up (never
hard-coded) and consistent with the CTranslate2 vocabulary the weights were converted with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captioner.errors import UserError
from captioner.models.registry import resolve_model
from captioner.models.tokenizer import N_TIMESTAMP_TOKENS, WhisperTokenizer


def _tokenizer(name: str) -> tuple[WhisperTokenizer, object]:
    files = resolve_model(name)
    return WhisperTokenizer(files.tokenizer_path, files.config_path, n_vocab=files.dims.n_vocab), files


@pytest.fixture(scope="module", params=["tiny.en", "base"])
def model(request):
    return _tokenizer(request.param)


def _ct2_vocabulary(files) -> list[str]:
    """The CTranslate2 vocabulary shipped beside the weights (vocabulary.txt or .json)."""
    for folder in {Path(p).parent for p in files.model_paths} | {Path(files.tokenizer_path).parent}:
        if (folder / "vocabulary.txt").is_file():
            return (folder / "vocabulary.txt").read_text(encoding="utf-8").split("\n")[:files.dims.n_vocab]
        if (folder / "vocabulary.json").is_file():
            return json.loads((folder / "vocabulary.json").read_text(encoding="utf-8"))
    pytest.skip("no CTranslate2 vocabulary beside the model")


def test_special_ids_match_the_ct2_vocabulary(model):
    tok, files = model
    vocab = _ct2_vocabulary(files)
    assert len(vocab) == tok.n_vocab == files.dims.n_vocab
    s = tok.special
    assert vocab[s.eot] == "<|endoftext|>"
    assert vocab[s.sot] == "<|startoftranscript|>"
    assert vocab[s.sot_prev] == "<|startofprev|>"
    assert vocab[s.transcribe] == "<|transcribe|>"
    assert vocab[s.translate] == "<|translate|>"
    assert vocab[s.no_timestamps] == "<|notimestamps|>"
    assert vocab[s.no_speech] in ("<|nospeech|>", "<|nocaptions|>")
    assert vocab[s.timestamp_begin] == "<|0.00|>"
    assert vocab[s.timestamp_end] == "<|30.00|>"
    assert s.timestamp_end == tok.n_vocab - 1
    assert vocab[tok.timestamp_token(1.08)] == "<|1.08|>"
    assert tok.token_text(tok.timestamp_token(29.98)) == "<|29.98|>"
    # The registry (GRAPH) reads the same facts independently.
    assert files.special.eot == s.eot and files.special.no_timestamps == s.no_timestamps
    assert files.special.timestamp_begin == s.timestamp_begin


def test_english_only_and_multilingual_differ():
    tiny, _ = _tokenizer("tiny.en")
    base, base_files = _tokenizer("base")
    assert not tiny.is_multilingual and base.is_multilingual
    assert tiny.eot == 50256 and base.eot == 50257  # the reason nothing is hard-coded
    assert tiny.language_ids == {}
    assert len(base.language_ids) == len(base_files.config["lang_ids"]) == 99
    assert base.token_text(base.language_ids["de"]) == "<|de|>"
    assert base.token_text(base.language_ids["zh"]) == "<|zh|>"
    assert list(base.language_ids.values()) == base_files.config["lang_ids"]


def test_sot_sequences_and_prompts():
    tiny, _ = _tokenizer("tiny.en")
    base, _ = _tokenizer("base")
    s = base.special
    assert tiny.sot_sequence() == [tiny.special.sot]
    assert tiny.sot_sequence("en") == [tiny.special.sot]
    assert base.sot_sequence("de", "translate") == [s.sot, base.language_ids["de"], s.translate]
    assert base.sot_sequence(None) == [s.sot, s.transcribe]
    previous = base.encode(" Guten Morgen.") + [s.timestamp_begin + 5, s.eot]
    prompt = base.prompt("de", previous_tokens=previous, without_timestamps=True)
    assert prompt[0] == s.sot_prev
    assert prompt[-4:] == [s.sot, base.language_ids["de"], s.transcribe, s.no_timestamps]
    assert s.eot not in prompt
    long_prompt = base.prompt("en", previous_tokens=list(range(1000, 1500)))
    assert long_prompt[1:-3] == list(range(1500 - 223, 1500))
    with pytest.raises(UserError, match="English-only"):
        tiny.sot_sequence("de")
    with pytest.raises(UserError, match="cannot translate"):
        tiny.sot_sequence("en", "translate")
    with pytest.raises(UserError, match="unknown language"):
        base.sot_sequence("xx")
    with pytest.raises(UserError, match="unknown task"):
        base.sot_sequence("en", "summarise")


@pytest.mark.parametrize(
    "text",
    [
        " And so my fellow Americans, ask not what your country can do for you.",
        " Grüße aus Köln: Übermäßig schöne Straßen!",
        " 甚至出现交易几乎停滞的情况",
        " Señor D. Manuel Tamayo y Baus — 20 de Septiembre de 1881.",
    ],
)
def test_text_round_trips(model, text):
    tok, _ = model
    ids = tok.encode(text)
    assert ids and max(ids) < tok.eot
    assert tok.decode(ids) == text
    # Special and timestamp tokens never leak into text.
    s = tok.special
    assert tok.decode([s.sot, s.timestamp_begin, *ids, s.timestamp_begin + 50, s.eot]) == text


def test_decode_with_timestamps(model):
    tok, _ = model
    first, second = tok.encode(" Hello there."), tok.encode(" General Kenobi.")
    ids = [tok.timestamp_token(0.0), *first, tok.timestamp_token(1.5), tok.timestamp_token(1.5), *second,
           tok.timestamp_token(3.24), tok.eot]
    assert tok.decode_with_timestamps(ids) == "<|0.00|> Hello there.<|1.50|><|1.50|> General Kenobi.<|3.24|>"
    assert tok.timestamp_s(tok.timestamp_token(3.24)) == pytest.approx(3.24)
    assert tok.is_timestamp(tok.timestamp_begin) and not tok.is_timestamp(tok.eot)
    with pytest.raises(ValueError):
        tok.timestamp_token(30.02)
    assert N_TIMESTAMP_TOKENS == 1501


def test_suppression_sets_match_config(model):
    tok, files = model
    s = tok.special
    config_ids = set(files.config["suppress_ids"])
    assert set(tok.suppress_ids) == config_ids
    # Whisper's non-speech rule, computed from the tokenizer, gives exactly the config's list
    # once the task/start specials are added: the config is what CTranslate2 suppresses.
    specials = {s.sot, s.sot_prev, s.sot_lm, s.transcribe, s.translate, s.no_speech}
    assert set(tok.non_speech_tokens) | specials == config_ids
    assert set(tok.suppress_ids_begin) == set(files.config["suppress_ids_begin"]) == {*tok.encode(" "), s.eot}
    # Music notes and brackets are in, ordinary words are not.
    assert tok.encode(" ♪")[0] in tok.non_speech_tokens
    assert tok.encode(" [")[0] in tok.non_speech_tokens
    assert not set(tok.encode(" hello world")) & set(tok.suppress_ids)


def test_config_free_fallback_matches(tmp_path):
    """Without config.json the suppression lists are computed and agree with the config's."""
    _, files = _tokenizer("base")
    bare = WhisperTokenizer(files.tokenizer_path, tmp_path / "missing.json", n_vocab=files.dims.n_vocab)
    assert set(bare.suppress_ids) == set(files.config["suppress_ids"])
    assert set(bare.suppress_ids_begin) == set(files.config["suppress_ids_begin"])
    assert bare.language_ids["de"] == files.special.lang_ids["de"]


def test_bad_tokenizer_file_is_a_user_error(tmp_path):
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(UserError, match="cannot read tokenizer"):
        WhisperTokenizer(broken)
