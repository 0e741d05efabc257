"""Shared fixtures: the real speech recordings, and skips for hardware this machine lacks."""

from __future__ import annotations

import contextlib
import csv
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# The full set of 34 recordings lives outside the repository (its README has the licences); a
# fresh clone has only the subset shipped in tests/data/speech (tests/data/speech/README.md).
SHARED_SPEECH_DIR = REPO_ROOT.parent / "shared" / "speech"
SHIPPED_SPEECH_DIR = Path(__file__).resolve().parent / "data" / "speech"
SPEECH_DIR_HINT = "../shared/speech (or CAPTIONER_SPEECH_DIR)"

# Every id of the full set. Kept here, not read from the full set's manifest, so that a run with
# only the subset can tell "a recording this set lacks" (the test skips) from a misspelt id (the
# test fails with KeyError).
FULL_SPEECH_SET_IDS = frozenset({
    "en_ls_1089-134686-0000", "en_ls_1089-134686-0001", "en_ls_1089-134691-0000",
    "en_ls_1089-134691-0001", "en_ls_1995-1837-0001", "en_ls_61-70968-0000",
    "en_ls_6930-75918-0000", "en_ls_7902-96591-0000",
    "en_ljspeech_LJ001-0001", "en_ljspeech_LJ001-0003", "en_ljspeech_LJ001-0005",
    "en_ljspeech_LJ001-0007",
    "en_timit_LDC93S1", "en_jfk_inaugural_excerpt", "en_ami_ES2011a_hs0_40-46s",
    "en_sonnet001_librivox", "de_simplicissimus_librivox", "es_capitan_veneno_librivox",
    "zh_BAC009S0764W0121", "zh_BAC009S0724W0121",
    # Spontaneous English (shared/speech/README.md, "Spontaneous English"): three headset channels
    # of one AMI meeting, a far-field meeting snippet, both sides of five phone calls.
    "en_spont_ami_seriously_A_src0", "en_spont_ami_seriously_B_src1", "en_spont_ami_seriously_D_src3",
    "en_spont_notsofar_example",
    *(f"en_spont_hvb_{call}_{side}" for call in ("02e41649e7c441fd", "00d676d7058c49bb", "01cefd6f5c044a6f",
                                                 "eb82ec7b5f0944ca", "3a20358e1bfc4a17")
      for side in ("agent", "caller")),
})

# Tests whose assertions are about the whole full set (a pooled figure or a count measured on
# it), so on a smaller set they would fail or prove something else: they skip unless every
# recording of the full set is present. Node ids without parameters, each with why. Listed here
# rather than marked in the test files so the rule for "full set only" stays in one place.
NEEDS_FULL_SPEECH_SET = {
    "tests/models/test_transcribe.py::test_golden_transcripts_tiny_en":
        "its word counts and pooled WER bounds are measured over the English recordings of the full set",
    # tiny.en compares 17 inputs and 414 tokens on the full set, 11 and 287 on the shipped subset.
    "tests/models/test_oracle.py::test_greedy_tokens_equal_ctranslate2":
        "its floor of 10 inputs and 300 tokens compared is set for the full set",
}


def speech_dir() -> Path:
    """Where the recordings are: ``CAPTIONER_SPEECH_DIR`` if set; else the full set in
    ``shared/speech`` beside the checkout (CI lays a copy there too) if it is there; else the
    subset shipped in ``tests/data/speech``."""
    override = os.environ.get("CAPTIONER_SPEECH_DIR")
    if override:
        return Path(override)
    if (SHARED_SPEECH_DIR / "manifest.tsv").exists():
        return SHARED_SPEECH_DIR
    return SHIPPED_SPEECH_DIR


@dataclass(frozen=True)
class SpeechClip:
    id: str
    wav: Path  # the audio file: WAV, or FLAC for the subset's long readings
    language: str
    duration_s: float
    reference: str


def load_speech_manifest() -> list[SpeechClip]:
    root = speech_dir()
    manifest = root / "manifest.tsv"
    if not manifest.exists():
        return []
    with manifest.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [
        SpeechClip(r["id"], root / r["wav"], r["language"], float(r["duration_s"]), r["reference"])
        for r in rows
    ]


class SpeechSet(dict):
    """Clip id -> value (a :class:`SpeechClip`, or what :meth:`map` made of it) for the recordings
    at hand. Looking up a recording of the full set that this set lacks skips the calling test,
    naming the recording; an id that is not in the full set either still raises ``KeyError``."""

    def __init__(self, values, root: Path):
        super().__init__(values)
        self.root = root

    def __missing__(self, clip_id):
        if clip_id in FULL_SPEECH_SET_IDS:
            pytest.skip(f"needs the recording {clip_id}, which only the full set of "
                        f"{len(FULL_SPEECH_SET_IDS)} has at {SPEECH_DIR_HINT}; "
                        f"this run has the {len(self)} at {self.root}")
        raise KeyError(clip_id)

    def map(self, fn) -> SpeechSet:
        """The same ids with ``fn(value)``, skipping the same way for a recording it lacks."""
        return SpeechSet({clip_id: fn(value) for clip_id, value in self.items()}, self.root)

    @property
    def is_full(self) -> bool:
        return FULL_SPEECH_SET_IDS <= self.keys()


@pytest.fixture(scope="session")
def speech_clips() -> SpeechSet:
    clips = load_speech_manifest()
    if not clips:
        pytest.skip(f"no speech recordings at {speech_dir()}")
    return SpeechSet({c.id: c for c in clips}, speech_dir())


@pytest.fixture(scope="session")
def offline_tiny_en():
    """``offline_tiny_en(clip)``: ``captioner.transcribe(clip.wav, model="tiny.en",
    language="en", device="cpu")``, the public offline API on the CPU, run once a session per
    recording. The tests that compare live captions with the offline transcription, and the
    golden transcripts, ask for the same call on the same recordings: it is decoded once."""
    import captioner

    done = {}

    def transcribe(clip: SpeechClip):
        if clip.wav not in done:
            done[clip.wav] = captioner.transcribe(clip.wav, model="tiny.en", language="en", device="cpu")
        return done[clip.wav]

    return transcribe


@pytest.fixture(scope="session")
def onnx_cache_dir(tmp_path_factory):
    """A private ONNX model cache for the whole session (each model converted once a run): the
    same folder as tests/models/graph_fixtures' fixture of that name."""
    from onnx_cache import session_cache_dir

    return session_cache_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_en_cpu():
    """``load_recognizer("tiny.en", "cpu")``, the (back-end, recognizer) pair a live captioner
    runs on, loaded once a session: the engine tests that replay recordings through
    ``LiveCaptioner(recognizer=..., backend=...)`` or a pipeline's ``recognizer_factory`` share
    it (a recognizer keeps no stream's state: each captioner keeps its own)."""
    from captioner.engine.live import load_recognizer

    return load_recognizer("tiny.en", "cpu")


@pytest.fixture(scope="session")
def alignatt_replay(speech_clips):
    """``alignatt_replay(model, clip_id, run=0)``: the updates of recording ``clip_id`` replayed
    through AlignAtt (``PolicyConfig(kind="alignatt")``, the default scheduler) with ``model``
    (a (back-end, recognizer) pair such as ``tiny_en_cpu``) on a simulated clock charged 0.3 s a
    model step. Made once a session per (model, clip, run): the AlignAtt and word-time tests read
    the same replays instead of making their own, and ``run=1`` is a second replay made apart
    from the first, for the checks that two replays of the same audio give the same lines."""
    from captioner.audio.file_source import read_audio_16k
    from captioner.engine.core import EngineConfig
    from captioner.engine.live import LiveCaptioner
    from captioner.engine.policy.config import PolicyConfig
    from captioner.engine.simulate import replay

    done = {}

    def updates(model, clip_id: str, run: int = 0):
        key = (id(model[1]), clip_id, run)
        if key not in done:
            backend, recognizer = model
            config = EngineConfig(policy=PolicyConfig(kind="alignatt"))
            result = replay(lambda clock, timer: LiveCaptioner(recognizer=recognizer, backend=backend, config=config,
                                                               clock_ns=clock, timer_ns=timer),
                            {"s": read_audio_16k(speech_clips[clip_id].wav)}, compute=0.3)
            done[key] = (model, result.updates)  # the model kept too: its id is never reused meanwhile
        return done[key][1]

    return updates


def cuda_available() -> bool:
    from captioner.gpu import (
        backend,  # imported lazily: the back-end decides what "usable" means
    )

    return backend.cuda_usable()


def pytest_collection_modifyitems(config, items):
    _skip_without_gpu(items)
    _skip_without_full_speech_set(items)


def _skip_without_gpu(items):
    # get_closest_marker, not `"gpu" in item.keywords`: keywords also hold directory names,
    # so every test under tests/gpu/ would count as marked.
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    try:
        usable = cuda_available()
    except Exception:  # the back-end module not yet importable counts as "no GPU"
        usable = False
    if not usable:
        skip = pytest.mark.skip(reason="no usable CUDA device")
        for item in gpu_items:
            item.add_marker(skip)


def _test_key(item) -> str:
    """``tests/dir/test_file.py::test_name`` whatever directory pytest was started from."""
    try:
        path = Path(item.path).resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        path = item.nodeid.split("::")[0]
    return f"{path}::{getattr(item, 'originalname', item.name)}"


def _skip_without_full_speech_set(items):
    wanting = [item for item in items if _test_key(item) in NEEDS_FULL_SPEECH_SET]
    if not wanting:
        return
    present = SpeechSet({c.id: c for c in load_speech_manifest()}, speech_dir())
    if present.is_full:
        return
    for item in wanting:
        why = NEEDS_FULL_SPEECH_SET[_test_key(item)]
        item.add_marker(pytest.mark.skip(
            reason=f"needs the full set of {len(FULL_SPEECH_SET_IDS)} recordings at {SPEECH_DIR_HINT}: "
                   f"{why}; this run has the {len(present)} at {present.root}"))


def load_pulse_helper():
    """tests/pulse.py, loaded by path so it works under any pytest import mode."""
    import importlib.util
    import sys

    module = sys.modules.get("captioner_tests_pulse")
    if module is None:
        spec = importlib.util.spec_from_file_location("captioner_tests_pulse", Path(__file__).with_name("pulse.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def pulse_helper():
    """The tests/pulse.py module (start further servers with ``start_pulse_server()``);
    skips when the PulseAudio binaries are absent."""
    helper = load_pulse_helper()
    reason = helper.pulseaudio_missing()
    if reason:
        pytest.skip(reason)
    return helper


@pytest.fixture(scope="module")
def pulse_server(pulse_helper):
    """A private PulseAudio server (tests/pulse.py) with null sinks ``captioner_test`` (48 kHz,
    its monitor the default source) and ``captioner_test_44k`` (44.1 kHz). ``PULSE_SERVER``
    points at it while the fixture lives, so PortAudio's ALSA ``pulse``/``default`` devices
    reach it. Skips only when the PulseAudio binaries are absent; the daemon is killed on
    teardown whatever happened."""
    with _private_pulse_server(pulse_helper) as server:
        yield server


@pytest.fixture()
def own_server(pulse_helper):
    """Like ``pulse_server``, but a server for one test alone (the test breaks it: unloads its
    sink, kills or freezes it)."""
    with _private_pulse_server(pulse_helper) as server:
        yield server


@contextlib.contextmanager
def _private_pulse_server(pulse_helper):
    """A fresh server with ``PULSE_SERVER`` pointing at it (and no stray source, sink or stream
    properties from the environment) while it lives; killed afterwards whatever happened."""
    server = pulse_helper.start_pulse_server()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("PULSE_SERVER", server.server)
            for name in ("PULSE_SOURCE", "PULSE_SINK", "PULSE_PROP"):
                env.delenv(name, raising=False)
            yield server
    finally:
        server.stop()
