"""Whisper's tokenizer: ``tokenizer.json`` through the ``tokenizers`` package, plus the special
tokens and suppression sets decoding needs.

Every special id is looked up in the model's own files (``tokenizer.json``, ``config.json``),
never hard-coded: English-only and multilingual Whisper number them differently (tiny.en's
``<|endoftext|>`` is 50256, base's 50257), and a user's own model may differ again.

Timestamp tokens ``<|0.00|>`` .. ``<|30.00|>`` follow ``<|notimestamps|>`` in the model's
vocabulary, one per 20 ms; some ``tokenizer.json`` files (tiny.en's) do not list them at all, so
they are computed from ``<|notimestamps|>`` as CTranslate2 and Whisper do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from captioner.errors import UserError

TIME_PRECISION_S = 0.02
"""Seconds per timestamp token step (the encoder's output frame: 2 mel hops of 10 ms)."""

N_TIMESTAMP_TOKENS = 1501
"""``<|0.00|>`` .. ``<|30.00|>``."""

MULTILINGUAL_MIN_VOCAB = 51865  # Whisper's own test: English-only vocabularies are smaller

# Whisper's list of symbols that are not speech; tokens that spell one of them alone are
# suppressed so that the model does not "caption" music notes or stage directions.
_NON_SPEECH_SYMBOLS = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』') + (
    "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
)
_MUSIC_SYMBOLS = set("♩♪♫♬♭♮♯")  # suppressed even when they only start a longer token


@dataclass(frozen=True, slots=True)
class SpecialTokens:
    """A Whisper vocabulary's special token ids: read by the tokenizer, and from the tokenizer's
    JSON alone when a model folder is checked (:func:`captioner.models.registry.resolve_model`)."""

    eot: int
    sot: int
    sot_prev: int
    sot_lm: int | None
    transcribe: int
    translate: int
    no_timestamps: int
    no_speech: int
    timestamp_begin: int
    timestamp_end: int
    lang_ids: dict[str, int] = field(default_factory=dict, compare=False)
    """"en" -> 50259 (base) / 50258 (tiny.en), in id order; empty where not read (the
    tokenizer keeps its own, :attr:`WhisperTokenizer.language_ids`)."""


def _require(tokenizer, token: str, path: Path) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise UserError(f"{path} is not a Whisper tokenizer: it has no {token} token")
    return int(token_id)


class WhisperTokenizer:
    """Text <-> token ids for one Whisper model.

    ``n_vocab`` is the model's output size when known (from the runtime); it decides whether the
    model is multilingual (>= 51865, as Whisper decides) and checks the timestamp range.
    """

    def __init__(self, tokenizer_path: str | Path, config_path: str | Path | None = None, *, n_vocab: int | None = None):
        from tokenizers import Tokenizer

        self.path = Path(tokenizer_path)
        try:
            self._tok = Tokenizer.from_file(str(self.path))
        except Exception as error:  # the library raises a bare Exception for bad JSON
            raise UserError(f"cannot read tokenizer {self.path}: {error}") from None
        path = self.path
        tok = self._tok
        no_timestamps = _require(tok, "<|notimestamps|>", path)
        no_speech = tok.token_to_id("<|nospeech|>")
        if no_speech is None:
            no_speech = _require(tok, "<|nocaptions|>", path)  # older name of the same token
        sot_lm = tok.token_to_id("<|startoflm|>")
        timestamp_begin = no_timestamps + 1
        self.special = SpecialTokens(
            eot=_require(tok, "<|endoftext|>", path),
            sot=_require(tok, "<|startoftranscript|>", path),
            sot_prev=_require(tok, "<|startofprev|>", path),
            sot_lm=None if sot_lm is None else int(sot_lm),
            transcribe=_require(tok, "<|transcribe|>", path),
            translate=_require(tok, "<|translate|>", path),
            no_timestamps=no_timestamps,
            no_speech=int(no_speech),
            timestamp_begin=timestamp_begin,
            timestamp_end=timestamp_begin + N_TIMESTAMP_TOKENS - 1,
        )
        self.n_vocab = int(n_vocab) if n_vocab is not None else max(
            tok.get_vocab_size(with_added_tokens=True), self.special.timestamp_end + 1
        )
        if self.n_vocab <= self.special.timestamp_end:
            raise UserError(
                f"{path}: the model has {self.n_vocab} outputs, too few for Whisper's timestamp tokens"
            )
        self.is_multilingual = self.n_vocab >= MULTILINGUAL_MIN_VOCAB

        self.config: dict = {}
        if config_path is not None and Path(config_path).exists():
            with open(config_path, encoding="utf-8") as f:
                self.config = json.load(f)

        # Language tokens: the config's list (in the model's order) where it has one, else every
        # "<|xx|>" between <|startoftranscript|> and <|translate|> in the vocabulary.
        self.language_ids: dict[str, int] = {}
        if self.is_multilingual:
            ids = self.config.get("lang_ids") or range(self.special.sot + 1, self.special.translate)
            for token_id in ids:
                token = tok.id_to_token(int(token_id))
                if token and token.startswith("<|") and token.endswith("|>"):
                    self.language_ids[token[2:-2]] = int(token_id)
        self.language_of_id = {v: k for k, v in self.language_ids.items()}

    # -- special sequences -------------------------------------------------------------------

    @property
    def eot(self) -> int:
        return self.special.eot

    @property
    def timestamp_begin(self) -> int:
        return self.special.timestamp_begin

    def language_token(self, language: str) -> int:
        try:
            return self.language_ids[language]
        except KeyError:
            if not self.is_multilingual:
                raise UserError("this model is English-only; use --language en (or a multilingual model)") from None
            raise UserError(
                f"unknown language {language!r}; use one of: {', '.join(sorted(self.language_ids))}"
            ) from None

    def sot_sequence(self, language: str | None = None, task: str = "transcribe") -> list[int]:
        """``<|startoftranscript|>`` then, for a multilingual model, the language and task
        tokens. English-only models take ``<|startoftranscript|>`` alone (and only English,
        transcribed)."""
        if task not in ("transcribe", "translate"):
            raise UserError(f"unknown task {task!r}; use transcribe or translate")
        if not self.is_multilingual:
            if language not in (None, "en"):
                raise UserError(f"this model is English-only and cannot take language {language!r}")
            if task != "transcribe":
                raise UserError("this model is English-only and cannot translate; use a multilingual model")
            return [self.special.sot]
        sequence = [self.special.sot]
        if language is not None:
            sequence.append(self.language_token(language))
        sequence.append(self.special.transcribe if task == "transcribe" else self.special.translate)
        return sequence

    def prompt(
        self,
        language: str | None = None,
        task: str = "transcribe",
        *,
        previous_tokens: list[int] | tuple[int, ...] = (),
        without_timestamps: bool = False,
        max_previous: int | None = None,
    ) -> list[int]:
        """The decoder's prompt: ``<|startofprev|>`` + the last committed text tokens (when
        given), then the start sequence, then ``<|notimestamps|>`` when timestamps are off.

        Previous tokens are filtered to text (timestamps and specials dropped) and cut to the
        last ``max_previous`` (default: half the text context, 223 tokens, as Whisper does).
        """
        prompt: list[int] = []
        previous = [int(t) for t in previous_tokens if int(t) < self.special.eot]
        limit = 223 if max_previous is None else max_previous
        if previous and limit > 0:
            prompt = [self.special.sot_prev, *previous[-limit:]]
        prompt += self.sot_sequence(language, task)
        if without_timestamps:
            prompt.append(self.special.no_timestamps)
        return prompt

    # -- suppression -------------------------------------------------------------------------

    @cached_property
    def non_speech_tokens(self) -> frozenset[int]:
        """Tokens that would spell symbols or stage directions rather than speech (Whisper's
        rule: the symbol alone, or after a space, in one token; music signs in any token)."""
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in [*_NON_SPEECH_SYMBOLS, *_MUSIC_SYMBOLS]:
            for ids in (self.encode(symbol), self.encode(" " + symbol)):
                if len(ids) == 1 or (symbol in _MUSIC_SYMBOLS and ids):
                    result.add(ids[0])
        return frozenset(result)

    @cached_property
    def suppress_ids(self) -> tuple[int, ...]:
        """Tokens never sampled: the config's ``suppress_ids`` (what CTranslate2 suppresses for
        ``suppress_tokens=[-1]``), else the non-speech set plus the task/start specials."""
        if "suppress_ids" in self.config:
            return tuple(sorted({int(t) for t in self.config["suppress_ids"]}))
        s = self.special
        specials = {s.transcribe, s.translate, s.sot, s.sot_prev, s.no_speech}
        if s.sot_lm is not None:
            specials.add(s.sot_lm)
        return tuple(sorted(self.non_speech_tokens | specials))

    @cached_property
    def suppress_ids_begin(self) -> tuple[int, ...]:
        """Tokens suppressed at the first sampled position (a blank, or ending at once)."""
        if "suppress_ids_begin" in self.config:
            return tuple(sorted({int(t) for t in self.config["suppress_ids_begin"]}))
        return tuple(sorted({*self.encode(" "), self.special.eot}))

    # -- text ------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Text tokens only (no start/end tokens); a leading space is part of the first word,
        as in Whisper (encode ``" " + text`` for text that follows other text)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        """The text of ``ids``; timestamps and other special tokens are left out."""
        eot = self.special.eot  # once: a few windows' worth of tokens per update, on the engine thread
        return self._tok.decode([t for t in map(int, ids) if t < eot], skip_special_tokens=False)

    def is_timestamp(self, token_id: int) -> bool:
        return self.special.timestamp_begin <= token_id <= self.special.timestamp_end

    def timestamp_s(self, token_id: int) -> float:
        return (int(token_id) - self.special.timestamp_begin) * TIME_PRECISION_S

    def timestamp_token(self, seconds: float) -> int:
        index = int(round(seconds / TIME_PRECISION_S))
        if not 0 <= index < N_TIMESTAMP_TOKENS:
            raise ValueError(f"timestamp {seconds} s is outside 0..30 s")
        return self.special.timestamp_begin + index

    def decode_with_timestamps(self, ids) -> str:
        """Text with timestamps written as ``<|1.08|>`` (other special tokens left out)."""
        parts: list[str] = []
        text_run: list[int] = []
        for token_id in (int(t) for t in ids):
            if token_id >= self.special.timestamp_begin:
                if text_run:
                    parts.append(self._tok.decode(text_run, skip_special_tokens=False))
                    text_run = []
                parts.append(f"<|{self.timestamp_s(token_id):.2f}|>")
            elif token_id < self.special.eot:
                text_run.append(token_id)
        if text_run:
            parts.append(self._tok.decode(text_run, skip_special_tokens=False))
        return "".join(parts)

    @cached_property
    def token_byte_lengths(self) -> list[int]:
        """Bytes of text each token id decodes to (0 for special tokens): the vocabulary is
        byte-level BPE, one character of a token's entry per byte, and decoding joins the bytes."""
        eot = self.special.eot
        lengths = [len(self._tok.id_to_token(i) or "") for i in range(eot)]
        return lengths + [0] * (self.n_vocab - eot)

    def token_text(self, token_id: int) -> str:
        """The vocabulary entry of one id (for debugging and tests)."""
        if token_id >= self.special.timestamp_begin:
            return f"<|{self.timestamp_s(token_id):.2f}|>"
        return self._tok.id_to_token(int(token_id)) or ""
