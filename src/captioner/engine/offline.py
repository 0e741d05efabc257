"""Offline transcription of a whole recording, long ones included.

Whisper's way: a window of up to 30 s starting at ``seek``; the window's timestamp tokens cut
its text into segments; the next window starts where the last complete segment ended (or after
the window, when its text ended cleanly), and is prompted with the text so far. Silence and
looping windows are dropped by the decoder's guards and reported in the result.

Runs on the caller's thread (the CLI's main thread, a benchmark); the decoder is either ours
(:class:`~captioner.models.decoding.RuntimeDecoder`) or the reference runtime's.

An English-only model's first window is also checked for another language
(:mod:`~captioner.engine.language_check`, ``base`` on the CPU); the result's
``info.language_notice`` carries what to tell the user.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from captioner.engine.language_check import (
    DetectorLoader,
    LanguageNotice,
    check_features,
    load_detector,
)
from captioner.engine.offline_audio import AudioWindows
from captioner.errors import UserError
from captioner.events import FRAMES_PER_S, SAMPLE_RATE_HZ
from captioner.formats import Caption
from captioner.languages import language_code
from captioner.models.decoding import WINDOW_S, DecodedWindow, DecodingOptions
from captioner.models.tokenizer import WhisperTokenizer

WINDOW_FRAMES = int(WINDOW_S * FRAMES_PER_S)
MIN_WINDOW_FRAMES = 10
"""A tail shorter than this (0.1 s) is not decoded: it holds no word, only room to invent one."""
VAD_LEAD_FRAMES = 50
"""A window starts this long (0.5 s) before the first frame the VAD calls speech: onsets are
soft, and the model hears a little silence before a word anyway."""


class WindowDecoder(Protocol):
    tokenizer: WhisperTokenizer
    n_mels: int
    is_multilingual: bool
    name: str

    def decode(self, mel, options: DecodingOptions = ..., **kwargs) -> list[DecodedWindow]: ...


@dataclass(frozen=True)
class TranscribeOptions:
    model: str = "tiny.en"
    """``tiny.en``, ``base`` or a CTranslate2 Whisper folder."""
    language: str = "auto"
    """``auto`` (detect on the first window; English-only models: English) or a code."""
    task: str = "transcribe"
    device: str | None = None
    """``cpu``, ``cuda:N`` or ``None`` (the runtime's choice)."""
    condition_on_previous_text: bool = True
    vad_filter: bool = True
    """Audio without voice activity (the engine's VAD on the same log-mel frames) is not
    decoded: Whisper invents text on silence and steady noise ("you", "Thanks for watching")
    with likely enough tokens to pass its own no-speech check. Windows start just before the
    next speech."""
    prompt_reset_on_temperature: float = 0.5
    """After a window needed a sampling temperature above this, the prompt starts afresh."""
    word_timestamps: bool = True
    """Each segment's words with their times, from the alignment heads' cross-attention (DTW,
    Whisper's word-timestamp method), where the model's graphs output it: caption files then
    show each cue while its words are spoken, not over a whole segment's span."""
    language_check: bool = True
    """English-only models: ask ``base`` (when installed) what language the first window is in,
    and report another one in ``info.language_notice``. Costs one window of ``base`` on the CPU
    once per file, plus loading ``base`` once per process (docs/decisions/004-language-check.md)."""
    decoding: DecodingOptions = field(default_factory=DecodingOptions)


@dataclass(frozen=True)
class Segment:
    id: int
    start_s: float
    end_s: float
    text: str
    tokens: tuple[int, ...]
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    temperature: float
    words: tuple[tuple[str, float, float], ...] = ()
    """``(word, start_s, end_s)`` per word of ``text`` where they were measured
    (``TranscribeOptions.word_timestamps``); empty otherwise."""


@dataclass(frozen=True)
class SkippedWindow:
    """A window whose text was not kept: ``reason`` is ``no_voice_activity`` (not decoded),
    ``no_speech``, ``repetition`` or ``compression``."""

    start_s: float
    end_s: float
    reason: str


@dataclass(frozen=True)
class TranscriptionInfo:
    language: str
    language_probability: float | None
    duration_s: float
    model: str
    n_windows: int
    skipped: tuple[SkippedWindow, ...] = ()
    language_notice: LanguageNotice | None = None
    """Set when an English-only model heard another language in the first window: its
    ``message`` is for the user, as it is ("this sounds like German; tiny.en is English-only —
    try --model base")."""


@dataclass(frozen=True)
class Transcription:
    segments: tuple[Segment, ...]
    info: TranscriptionInfo

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments).strip()

    def captions(self, stream: str = "") -> list[Caption]:
        return [Caption(s.start_s, s.end_s, s.text.strip(), stream, self.info.language, s.words) for s in self.segments]


ProgressFn = Callable[[float, float], None]
"""Called with (seconds of audio done, total seconds) after every window."""


def _window_features(audio: np.ndarray, n_mels: int) -> np.ndarray:
    from captioner.gpu.features_ref import (
        whisper_input_features,  # NumPy spec; heavy module kept lazy
    )

    return whisper_input_features(audio, n_mels)[None].astype(np.float32, copy=False)




def transcribe_audio(
    decoder: WindowDecoder,
    audio_16k: np.ndarray,
    options: TranscribeOptions = TranscribeOptions(),
    *,
    progress: ProgressFn | None = None,
    detector_loader: DetectorLoader = load_detector,
) -> Transcription:
    """Transcribe mono 16 kHz float32 audio, window by window (see the module docstring).
    ``detector_loader`` gives the language check's model (see ``options.language_check``)."""
    audio = np.asarray(audio_16k, dtype=np.float32)
    if audio.ndim != 1:
        raise UserError(f"transcription needs mono audio, got shape {audio.shape}")
    windows = AudioWindows([audio], decoder.n_mels, vad=options.vad_filter)
    return transcribe_windows(decoder, windows, len(audio) / SAMPLE_RATE_HZ, options, progress=progress,
                              detector_loader=detector_loader)


def transcribe_windows(
    decoder: WindowDecoder,
    windows: AudioWindows,
    duration_hint_s: float,
    options: TranscribeOptions = TranscribeOptions(),
    *,
    progress: ProgressFn | None = None,
    detector_loader: DetectorLoader = load_detector,
) -> Transcription:
    """Transcribe a recording read as it goes (:class:`AudioWindows`), window by window;
    ``duration_hint_s`` (the header's length) dates the progress reports."""
    tok = decoder.tokenizer
    check_request(tok, options.language, options.task)  # UserError now rather than mid-file
    language = language_code(options.language)
    if language is None and not decoder.is_multilingual:
        language = "en"
    dec_options = replace(options.decoding, task=options.task)

    duration_s = duration_hint_s
    seek = 0
    all_tokens: list[int] = []
    prompt_from = 0
    segments: list[Segment] = []
    skipped: list[SkippedWindow] = []
    language_probability: float | None = None
    n_windows = 0
    # An explicit "en" is checked too: for an English-only model it is the only choice, and it
    # does not make German come out right.
    check_language = options.language_check and not decoder.is_multilingual and language == "en"
    language_notice: LanguageNotice | None = None
    while (window_frames := windows.frames_from(seek, WINDOW_FRAMES)) >= MIN_WINDOW_FRAMES:
        offset_s = seek / FRAMES_PER_S
        window_s = window_frames / FRAMES_PER_S
        if options.vad_filter:
            # Start the window shortly before the next speech: Whisper's first timestamp may
            # be at most 1 s into a window, so speech after a long pause would otherwise be
            # dated to the start of the window.
            speech_at = windows.next_speech(seek, keep_frames=2 * VAD_LEAD_FRAMES)
            start = windows.frames_read if speech_at is None else max(seek, speech_at - VAD_LEAD_FRAMES)
            if start > seek:
                skipped.append(SkippedWindow(offset_s, start / FRAMES_PER_S, "no_voice_activity"))
                seek = start
                if progress is not None:
                    progress(min(seek / FRAMES_PER_S, duration_s), duration_s)
                continue
        chunk = windows.samples(seek, window_frames)
        mel = _window_features(chunk, decoder.n_mels)
        if check_language:
            check_language = False  # the first window with speech only
            language_notice = check_features(detector_loader(), mel, chunk, decoder.name)
        previous = all_tokens[prompt_from:] if options.condition_on_previous_text else []
        recorder = _recorder(decoder) if options.word_timestamps else None
        result = _with_recorder(decoder, recorder).decode(mel, dec_options, previous_tokens=[previous],
                                                          languages=[language], window_s=window_s)[0]
        words = _window_words(recorder, result, tok, window_s, offset_s, windows.speech_flags(seek, window_frames)) \
            if recorder is not None else {}
        n_windows += 1
        if language is None:
            language = result.language
            if result.language_probs:
                language_probability = result.language_probs.get(language)
        advance = window_frames
        if result.dropped:
            skipped.append(SkippedWindow(offset_s, offset_s + window_s, result.dropped))
        else:
            for index, piece in enumerate(result.segments):
                start_s = offset_s + piece.start_s
                end_s = min(offset_s + piece.end_s, offset_s + window_s)
                if end_s <= start_s:  # zero-length segments carry no time to show text in
                    continue
                segments.append(
                    Segment(
                        id=len(segments),
                        start_s=round(start_s, 3),
                        end_s=round(end_s, 3),
                        text=piece.text,
                        tokens=piece.tokens,
                        avg_logprob=result.avg_logprob,
                        no_speech_prob=result.no_speech_prob,
                        compression_ratio=result.compression_ratio,
                        temperature=result.temperature,
                        words=words.get(index, ()),
                    )
                )
            if result.consumed_s is not None:
                consumed = int(round(result.consumed_s * FRAMES_PER_S))
                if 0 < consumed <= window_frames:
                    advance = consumed
            all_tokens.extend(_kept_tokens(result, tok))
            if result.temperature > options.prompt_reset_on_temperature:
                prompt_from = len(all_tokens)
        seek += advance
        if progress is not None:
            progress(min(seek / FRAMES_PER_S, duration_s), duration_s)
    info = TranscriptionInfo(
        language=language or ("" if decoder.is_multilingual else "en"),
        language_probability=language_probability,
        duration_s=windows.frames_read / FRAMES_PER_S if windows.ended else duration_s,
        model=decoder.name,
        n_windows=n_windows,
        skipped=tuple(skipped),
        language_notice=language_notice,
    )
    return Transcription(tuple(segments), info)


def _recorder(decoder):
    """An attention recorder for ``decoder``'s runtime, where its graphs output the alignment
    heads' attention (our ONNX graphs do; the CTranslate2 oracle has none): ``None`` otherwise."""
    runtime = getattr(decoder, "runtime", None)
    if runtime is None or not getattr(runtime, "has_alignment", False):
        return None
    from captioner.models.alignment import AttentionRecorder

    return AttentionRecorder(runtime)


def _with_recorder(decoder, recorder):
    """``decoder`` decoding through ``recorder`` (the same tokens; the attention kept)."""
    if recorder is None:
        return decoder
    from captioner.models.decoding import RuntimeDecoder

    return RuntimeDecoder(recorder, decoder.tokenizer, getattr(decoder, "xp", None), getattr(decoder, "chooser", None))


def _window_words(recorder, result: DecodedWindow, tok: WhisperTokenizer, window_s: float, offset_s: float,
                  voiced) -> dict[int, tuple[tuple[str, float, float], ...]]:
    """Per segment index of ``result``, its words with times on the recording's clock (DTW over
    the recorded attention, fitted to the VAD's ``voiced`` frames where there are any); empty
    where the recording does not line up (a fallback pass)."""
    from captioner.engine.wordtiming import words_with_times

    if result.dropped or not result.segments:
        return {}
    ended = not result.hit_length_limit
    try:
        rows = recorder.token_rows(0, len(result.tokens), ended, len(result.tokens) + ended)
    except ValueError:
        return {}
    timed = words_with_times(result.tokens, rows, ended, result.segments, tok.decode, tok.eot, window_s, offset_s,
                             voiced)
    if timed is None:
        return {}
    out: dict[int, list] = {}
    for w in timed[0]:
        text = w.text.strip()
        if text:
            out.setdefault(w.segment, []).append((text, round(w.start_s, 3), round(max(w.end_s, w.start_s), 3)))
    return {k: tuple(v) for k, v in out.items()}


def _kept_tokens(result: DecodedWindow, tok: WhisperTokenizer) -> list[int]:
    """The tokens of the window's complete segments (what the next window is prompted with)."""
    if result.consumed_s is None:
        return list(result.tokens)
    # Tokens up to the last pair of adjacent timestamps (where the last complete segment
    # ends); the unfinished tail after it is decoded again in the next window.
    tokens = list(result.tokens)
    ts = tok.timestamp_begin
    for i in range(len(tokens) - 1, 0, -1):
        if tokens[i] >= ts and tokens[i - 1] >= ts:
            return tokens[:i]
    return tokens


def check_request(tokenizer: WhisperTokenizer, language: str | None, task: str) -> None:
    """Raise UserError when the model cannot do ``task`` in ``language`` (``auto``/None: any)."""
    tokenizer.sot_sequence(language_code(language), task)


def load_decoder(model: str, device: str | None = None, progress: Callable | None = None, *,
                 language: str | None = None, task: str = "transcribe"):
    """Our decoder for a model name or folder: GRAPH's ONNX Runtime model + the tokenizer.
    The language and task are checked against the model before anything is converted."""
    from captioner.models.decoding import RuntimeDecoder
    from captioner.models.registry import resolve_model
    from captioner.models.runtime import load_runtime

    files = resolve_model(model)
    tokenizer = WhisperTokenizer(files.tokenizer_path, files.config_path, n_vocab=int(files.dims.n_vocab))
    check_request(tokenizer, language, task)
    runtime = load_runtime(model, device=device, progress=progress)
    return RuntimeDecoder(runtime, tokenizer)


def transcribe_file(
    path: str | os.PathLike,
    options: TranscribeOptions = TranscribeOptions(),
    *,
    decoder: WindowDecoder | None = None,
    model_progress: Callable | None = None,
    progress: ProgressFn | None = None,
) -> Transcription:
    """Read an audio file (any format libsndfile reads; resampled to 16 kHz mono) and
    transcribe it. ``decoder`` reuses a loaded model; otherwise ``options.model`` is loaded
    (converted on first use, reporting to ``model_progress``)."""
    from captioner.audio.file_source import audio_16k_blocks

    info, blocks = audio_16k_blocks(Path(path))  # the header now; the audio as it is decoded
    if decoder is None:
        decoder = load_decoder(options.model, options.device, model_progress, language=options.language, task=options.task)
    windows = AudioWindows(blocks, decoder.n_mels, vad=options.vad_filter)
    return transcribe_windows(decoder, windows, info.duration_s, options, progress=progress)


def transcribe(audio, model: str = "tiny.en", language: str | None = "auto", task: str = "transcribe",
               device: str | None = None) -> Transcription:
    """The public offline API: a whole recording (a file path, or 16 kHz mono float32 samples)
    transcribed window by window. The result has ``.text``, ``.segments`` (times in seconds)
    and ``.info`` (language, duration, skipped windows). Bad arguments raise ``ValueError``
    (:class:`~captioner.errors.UserError`) with a one-line message."""
    options = TranscribeOptions(model=model, language=language or "auto", task=task, device=device)
    if isinstance(audio, (str, os.PathLike)):
        return transcribe_file(audio, options)
    samples = np.asarray(audio)
    if samples.ndim != 1 or samples.dtype not in (np.float32, np.float64):
        raise UserError(f"audio must be a file path or 1-D 16 kHz float samples, got {samples.dtype} {samples.shape}")
    if not np.isfinite(samples).all():
        raise UserError("audio contains NaN or infinite samples")
    decoder = load_decoder(model, device, language=options.language, task=task)
    return transcribe_audio(decoder, samples.astype(np.float32, copy=False), options)
