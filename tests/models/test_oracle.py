"""The oracle: our ONNX Runtime graphs and CTranslate2 run the same model.bin on the same
features and must produce exactly the same greedy token ids.

Both sides get the same prompt (<|startoftranscript|> [language, <|transcribe|>] <|notimestamps|>),
the model's own suppression lists (config.json ``suppress_ids`` always, ``suppress_ids_begin`` on
the first sampled token — what CTranslate2's ``suppress_tokens=[-1]``/``suppress_blank`` do), and
no timestamps, no temperature fallback, no length penalty: plain argmax until <|endoftext|>.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from graph_fixtures import greedy_continue, onnx_cache_dir, private_cache  # noqa: F401 - fixtures
from mel_helper import load_audio_16k, whisper_features

from captioner.models.ct2_oracle import load_ct2_whisper
from captioner.models.runtime import load_runtime

# Both runtimes encode and decode ~20 clips per model on the CPU: minutes on a small machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ESPEAK_TEXTS = {
    "en": "The quick brown fox jumps over the lazy dog. Captions appear on the screen while people speak.",
    "de": "Guten Morgen. Heute sprechen wir über das Wetter und die Bahn.",
}


def greedy_ours(rt, mel: np.ndarray, prompt: list[int]) -> list[int]:
    logits, state = rt.start(rt.encode(mel[None]), np.array([prompt], dtype=np.int64))
    return greedy_continue(rt, logits, state, limit=rt.n_text_ctx - len(prompt))


def greedy_ct2(model, mel: np.ndarray, prompt: list[int]) -> list[int]:
    import ctranslate2

    result = model.generate(
        ctranslate2.StorageView.from_array(np.ascontiguousarray(mel[None])),
        [prompt], beam_size=1, suppress_blank=True, suppress_tokens=[-1], max_length=448,
    )
    return list(result[0].sequences_ids[0])


def _prompt(rt, language: str) -> list[int]:
    s = rt.special
    if rt.is_multilingual:
        return [s.sot, s.lang_ids[language], s.transcribe, s.no_timestamps]
    return [s.sot, s.no_timestamps]


def _espeak(text: str, voice: str, tmp_path) -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    wav = tmp_path / f"espeak_{voice}.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", "150", "-w", str(wav), text], check=True, capture_output=True)
    return load_audio_16k(wav)


def _corpus(clip_id: str) -> str:
    """The collection a clip is from: ``en_spont_hvb`` of ``en_spont_hvb_02e4..._agent``, ``en_ls``
    of ``en_ls_1089-134686-0000``."""
    return "_".join(clip_id.split("_")[:3 if clip_id.startswith("en_spont_") else 2])


def _inputs(speech_clips, tmp_path, multilingual: bool):
    """(label, language, audio) for every read recording the model can transcribe, the first
    spontaneous one of each collection (AMI, NOTSOFAR, the phone calls: the same graphs on more
    conversation added minutes and no new path), plus espeak-ng speech. The multilingual model
    (base, four times tiny.en's work a token) takes the first recording of each language: its
    graphs are exported as tiny.en's are, its languages are what it adds."""
    seen = set()
    for clip in sorted(speech_clips.values(), key=lambda c: c.id):
        group = clip.language if multilingual else _corpus(clip.id)
        if clip.id.startswith("en_spont_") or multilingual:
            if group in seen:
                continue
            seen.add(group)
        if multilingual or clip.language == "en":
            yield clip.id, clip.language, load_audio_16k(clip.wav)
    for language, text in ESPEAK_TEXTS.items():
        if multilingual or language == "en":
            yield f"espeak_{language}", language, _espeak(text, language, tmp_path)


@pytest.mark.parametrize("model_name", ["tiny.en", "base"])
def test_greedy_tokens_equal_ctranslate2(model_name, private_cache, speech_clips, tmp_path):
    rt = load_runtime(model_name, device="cpu")
    # One thread: CTranslate2's OpenMP threads spin at every barrier, and on two shared cores a
    # second one made each decode several times slower (see test_transcribe.CT2_THREADS).
    reference = load_ct2_whisper(rt.files, compute_type="float32", intra_threads=1)
    compared, total_tokens, mismatches = 0, 0, []
    for label, language, audio in _inputs(speech_clips, tmp_path, rt.is_multilingual):
        mel = whisper_features(audio, rt.n_mels)
        prompt = _prompt(rt, language)
        ours, theirs = greedy_ours(rt, mel, prompt), greedy_ct2(reference, mel, prompt)
        compared += 1
        total_tokens += len(theirs)
        if ours != theirs:
            first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
            mismatches.append(f"{label}: first difference at token {first} of {len(theirs)}")
    least_inputs, least_tokens = (6, 150) if rt.is_multilingual else (10, 300)
    assert compared >= least_inputs and total_tokens > least_tokens, (compared, total_tokens)
    assert not mismatches, f"{len(mismatches)}/{compared} inputs differ: " + "; ".join(mismatches)
