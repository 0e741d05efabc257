"""Caption latency and accuracy of the live engine, on real recordings replayed in real time.

For every word of the reference transcripts (word end times from a forced alignment, see
``benchmarks/word_times.py``): when it was first shown (in a partial or a committed update) and
when it was committed, minus when it ends in the audio. Times are the stream's wall clock
(``emitted_wall_s``), which in a real-time replay starts with the audio. A word of the
reference counts as shown/committed when the shown/committed word sequence holds it, matched in
order (difflib over normalised words); words the model never got right have no latency and are
counted apart.

Policies: ``--policies localagreement,alignatt`` (both by default) replays every clip under each
commit policy, side by side in one run (``--first-context`` adds AlignAtt variants with other
amounts of context before the first words of a segment are committed; ``--variants`` adds any
policy with any :class:`~captioner.engine.policy.config.PolicyConfig` fields set, e.g.
``alignatt:first_context_s=1,attend_margin_s=0.2;alignatt-gpu``). *Revised*: words shown
(committed + partial) that a later update took back or replaced; committed words never are.

Speakers: ``--speakers off,on`` replays every configuration with speaker labels off and on,
side by side (the voice encoder and clustering run in the engine's step; captions' text and
latency should not move). ``auto``, the default, labels the live mode's file streams only.

No speech: ``--no-speech`` (on by default) also replays 60 s of digital silence, of generated
room noise and of two synthesised pieces of music (``music``: chords of pure tones;
``music-drums``: a melody of harmonic notes with bass, kick, and noise-burst snare and hi-hat)
under each policy; every word captioned there is counted (it should be none).

Accuracy: WER of the committed streaming text and of the same model's offline transcription
(``captioner.engine.offline``), both against the references, Whisper's English normaliser on
both sides (``whisper-normalizer``; a plain lower-case/no-punctuation one where it is missing).

Replay modes:
- ``simulated`` (default): one thread, a simulated clock; audio arrives as the clock advances and
  every model step advances it by its measured duration — exactly what a live worker sees,
  without waiting through the idle time (so a fast GPU finishes quickly);
- ``live``: the real threads of ``captioner.engine.pipeline.Pipeline`` with a real-time file source.

``--step-cost-ms 40`` (simulated replay only) charges the clock a fixed 40 ms per model step
instead of the step's measured duration: the engine's scheduler, VAD and policy then see the
timing of a device whose steps take 40 ms (an H200 with tiny.en), whatever this machine's steps
really take, so a slow CPU can stand in for a GPU's timing. The numerics are this machine's
(fp32 on the CPU, fp16 on CUDA), and a step's cost does not grow with its batch.
With a fixed cost the clock, and so every window, no longer depends on the machine: a window
decoded once (the same log-mel frames, start, prompt and attention request) gives the same
hypothesis again, so ``--decode-cache DIR`` keeps every step's hypotheses on disk and replays
them for the same window in any later configuration or run (a parameter search re-decodes only
the windows a setting changes).

Each clip gets 0.5 s of quiet room noise before and 2 s after, so the engine sees the pause that
closes the last segment, as in conversation.

Run (here):   PYTHONPATH=src python3 benchmarks/bench_latency.py --device cpu --set all --long --out /tmp/latency-cpu.json
Run (a GPU):  PYTHONPATH=src python3 benchmarks/bench_latency.py --device cuda:0 --set all --long --out $OUT/latency-gpu.json
Results: benchmarks/results/latency/ (the current figures in docs/latency.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import difflib
import json
import platform
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import speech_kinds  # noqa: E402
from no_speech import NO_SPEECH, no_speech_audio  # noqa: E402
from wer import word_edits  # noqa: E402
from word_times import load_manifest, word_times  # noqa: E402

SR = 16_000
LEAD_S = 0.5
TAIL_S = 2.0


def norm_word(text: str) -> str:
    from captioner.engine.policy.words import normalize_word

    return normalize_word(text)


def split_words(text: str) -> list[str]:
    return [w for w in (norm_word(p) for p in text.replace("-", " ").split()) if w]


def _normalizer():
    """Whisper's English normaliser when installed (``whisper-normalizer``), else a plain one
    (lower case, punctuation out); the report names the one used. Both sides of every
    comparison go through the same one."""
    try:
        from whisper_normalizer.english import EnglishTextNormalizer

        return "whisper-english", EnglishTextNormalizer()
    except ImportError:
        return "basic", lambda text: " ".join(split_words(text))


NORMALIZER_NAME, NORMALIZE = _normalizer()


def wer_counts(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word errors, reference words) after normalising both sides; word-level Levenshtein."""
    ref, hyp = NORMALIZE(reference).split(), NORMALIZE(hypothesis).split()
    return word_edits(ref, hyp), len(ref)


def missed_counts(reference: str, hypothesis: str) -> tuple[int, int]:
    """(reference words missed: substituted or deleted, reference words): the score of a
    recording whose reference leaves out speech it holds (crosstalk), where an inserted word may
    be a right one. The alignment that costs least with insertions free."""
    ref, hyp = NORMALIZE(reference).split(), NORMALIZE(hypothesis).split()
    row = [0] * (len(hyp) + 1)
    for i, word in enumerate(ref, 1):
        prev, row = row, [i] + [0] * len(hyp)
        for j in range(1, len(hyp) + 1):
            row[j] = min(prev[j] + 1, row[j - 1], prev[j - 1] + (word != hyp[j - 1]))
    return row[-1], len(ref)


def layout_problems(captions) -> list[str]:
    """What the caption files made of ``captions`` (committed updates or offline captions) break
    of the caption layout rules (captioner.layout: line length and count, cue duration,
    overlaps), one line each."""
    from captioner import layout
    from captioner.engine.core import EngineConfig

    return layout.check(layout.cues(captions, EngineConfig().pause_s))


def commit_problems(finals) -> list[str]:
    """What a stream's committed updates break of "time only moves forward" and "whole words
    only": a final that starts before the one before it ended, a word time out of order, and a
    commit boundary inside a word (a final ending in a hyphen before another, or a digit run
    continued by the next final's digits)."""
    out = []
    for a, b in zip(finals, finals[1:]):
        if b.start_s < a.end_s - 1e-6:
            out.append(f"{b.start_s:.3f}: {b.text!r} starts before {a.text!r} ends ({a.end_s:.3f})")
        if a.text.rstrip().endswith("-") or (a.text.rstrip()[-1:].isdigit() and b.text.lstrip()[:1].isdigit()):
            out.append(f"{b.start_s:.3f}: {a.text!r} | {b.text!r} split a word")
    for u in finals:
        times = [t for w in u.words for t in w[1:]]
        if times != sorted(times) or (times and (times[0] < u.start_s - 1e-6 or times[-1] > u.end_s + 1e-6)):
            out.append(f"{u.start_s:.3f}: word times of {u.text!r} out of order or outside it")
    return out


def padded_clip(path: str, tmp: Path) -> Path:
    import soundfile as sf

    audio, rate = sf.read(path, dtype="float32")
    assert rate == SR
    rng = np.random.default_rng(0)
    room = lambda s: (rng.standard_normal(int(s * SR)) * 10 ** (-70 / 20)).astype(np.float32)
    out = tmp / Path(path).name
    sf.write(out, np.concatenate([room(LEAD_S), audio, room(TAIL_S)]), SR)
    return out


def match(reference: list[str], shown: list[str]) -> list[int]:
    """Indices of reference words that ``shown`` holds, matched in order."""
    sm = difflib.SequenceMatcher(a=reference, b=shown, autojunk=False)
    hits = []
    for block in sm.get_matching_blocks():
        hits += range(block.a, block.a + block.size)
    return hits


def revised_words(updates) -> int:
    """Words shown (committed + partial) that a later update of the stream took back or replaced.
    What is shown is compared after each model step, not after each update of a step: a commit
    and the partial that follows it (two updates of one step, the same time) take nothing back."""
    shown: list[str] = []
    committed: list[str] = []
    partial: list[str] = []
    revised = 0
    for k, u in enumerate(updates):
        if u.kind == "final":
            committed += split_words(u.text)
            partial = []
        else:
            partial = split_words(u.text)
        if k + 1 < len(updates) and updates[k + 1].emitted_wall_s == u.emitted_wall_s:
            continue
        now = committed + partial
        common = 0
        for a, b in zip(shown, now):
            if a != b:
                break
            common += 1
        revised += len(shown) - common
        shown = now
    return revised


def word_latencies(updates, ref_words: list[dict]) -> list[dict]:
    """Per reference word: end time, first shown time, commit time (None when never)."""
    keys = [norm_word(w["word"]) for w in ref_words]
    first_shown: dict[int, float] = {}
    committed_at: dict[int, float] = {}
    committed: list[str] = []
    partial: list[str] = []
    for u in updates:
        if u.kind == "final":
            committed += split_words(u.text)
            partial = []
            for i in match(keys, committed):
                committed_at.setdefault(i, u.emitted_wall_s)
        else:
            partial = split_words(u.text)
        for i in match(keys, committed + partial):
            first_shown.setdefault(i, u.emitted_wall_s)
    out = []
    for i, w in enumerate(ref_words):
        end_s = w["end_s"] + LEAD_S
        out.append({
            "word": w["word"], "end_s": round(end_s, 3),
            "shown_s": None if i not in first_shown else round(first_shown[i] - end_s, 3),
            "committed_s": None if i not in committed_at else round(committed_at[i] - end_s, 3),
        })
    return out


Policy = tuple[str, tuple[tuple[str, float], ...]]
"""A policy to replay: its kind (or preset name) and the PolicyConfig fields set on top."""
ENGINE_FIELDS = ("lead_in_s",)
"""EngineConfig fields a variant may set beside the policy's: where a window starts matters as
much to what is heard as when the policy commits."""


def parse_variants(spec: str) -> list[Policy]:
    """``kind[:field=value,field=value][;...]`` -> policies (one-line error on a bad field). A field
    is PolicyConfig's, or one of :data:`ENGINE_FIELDS` (EngineConfig's, set on the replay's engine)."""
    from dataclasses import fields

    from captioner.engine.core import EngineConfig
    from captioner.engine.policy.config import PolicyConfig

    known = {f.name: f.type for f in fields(PolicyConfig)}
    known.update({f.name: f.type for f in fields(EngineConfig) if f.name in ENGINE_FIELDS})
    out: list[Policy] = []
    for item in filter(None, (x.strip() for x in spec.split(";"))):
        kind, _, rest = item.partition(":")
        params = []
        for pair in filter(None, (x.strip() for x in rest.split(","))):
            name, eq, value = pair.partition("=")
            if not eq or name not in known or name == "kind":
                raise SystemExit(f"bench_latency: --variants: {pair!r} is not FIELD=VALUE of a PolicyConfig field or {ENGINE_FIELDS} "
                                 f"({', '.join(n for n in known if n != 'kind')})")
            params.append((name, _field_value(known[name], value)))
        out.append((kind.strip(), tuple(params)))
    return out


def _field_value(kind: str, value: str):
    if "bool" in str(kind):
        if value.lower() not in ("true", "false", "1", "0"):
            raise SystemExit(f"bench_latency: --variants: {value!r} is not a boolean")
        return value.lower() in ("true", "1")
    try:
        return int(value) if "int" in str(kind) else float(value)
    except ValueError:
        raise SystemExit(f"bench_latency: --variants: {value!r} is not a number") from None


def policy_config(policy: Policy):
    from captioner.engine.policy.presets import preset

    kind, params = policy
    try:
        return preset(kind, **{k: v for k, v in params if k not in ENGINE_FIELDS})
    except ValueError as exc:
        raise SystemExit(f"bench_latency: {exc}") from None


def _config(interval_s: float, target_busy: float, pause_s: float | None, policy: Policy = ("localagreement", ()),
            speakers: str = "auto"):
    from captioner.engine.core import EngineConfig
    from captioner.engine.scheduler import SchedulerConfig
    from captioner.engine.speakers import SpeakerConfig

    policy_config_ = policy_config(policy)
    config = EngineConfig(scheduler=SchedulerConfig(base_interval_s=interval_s, target_busy=target_busy),
                          policy=policy_config_, speakers=SpeakerConfig(mode=speakers),
                          **{k: v for k, v in policy[1] if k in ENGINE_FIELDS})
    if pause_s is not None:
        config.pause_s = pause_s
    return config


class MemoRecognizer:
    """The recognizer, with each batch's hypotheses kept under a hash of exactly what it decodes
    (log-mel bytes and shape, start, prompt, language, attention asked, forced prefix), in memory and, given a
    directory, on disk. Only for replays whose clock does not read the step's duration
    (``--step-cost-ms``). Called by the engine's thread."""

    def __init__(self, inner, cache_dir: Path | None) -> None:
        self._inner = inner
        self._dir = cache_dir
        self._memory: dict[str, list] = {}
        self.hits = self.misses = 0
        if cache_dir is not None:
            cache_dir.mkdir(parents=True, exist_ok=True)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def _key(self, requests) -> str:
        import hashlib

        h = hashlib.sha256(f"{self._inner.name}|{self._inner.provider}".encode())
        for r in requests:
            mel = np.ascontiguousarray(np.asarray(r.log_mel, dtype=np.float32))
            h.update(repr((mel.shape, round(float(r.start_s), 6), r.prompt, r.language, bool(r.alignment),
                           tuple(getattr(r, "prefix", ())))).encode())
            h.update(mel.tobytes())
        return h.hexdigest()

    def decode(self, requests):
        import pickle

        key = self._key(requests)
        path = None if self._dir is None else self._dir / f"{key}.pkl"
        if key not in self._memory and path is not None and path.exists():
            self._memory[key] = pickle.loads(path.read_bytes())
        if key in self._memory:
            self.hits += 1
            return list(self._memory[key])
        self.misses += 1
        out = self._inner.decode(requests)
        self._memory[key] = list(out)
        if path is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(pickle.dumps(list(out)))
            tmp.replace(path)
        return out


def run_simulated(recognizer, backend, paths: list, interval_s: float, target_busy: float, pause_s=None,
                  policy: Policy = ("localagreement", ()), step_cost_s: float | None = None, speakers: str = "auto"):
    from captioner.engine.live import LiveCaptioner
    from captioner.engine.simulate import replay

    config = _config(interval_s, target_busy, pause_s, policy, speakers)
    result = replay(
        lambda clock, timer: LiveCaptioner(recognizer=recognizer, backend=backend, config=config,
                                           clock_ns=clock, timer_ns=timer),
        {f"s{i}": path for i, path in enumerate(paths)},
        compute="measured" if step_cost_s is None else step_cost_s,
    )
    return result.updates, result.step_s, result.statuses


def run_live(recognizer, backend, paths: list[Path], interval_s: float, target_busy: float, pause_s=None,
             policy: Policy = ("localagreement", ()), step_cost_s: float | None = None, speakers: str = "auto"):
    from captioner.audio.file_source import FileSource
    from captioner.engine.pipeline import Pipeline

    config = _config(interval_s, target_busy, pause_s, policy, speakers)
    pipeline = Pipeline([FileSource(path, stream=f"s{i}", realtime=True) for i, path in enumerate(paths)], config=config,
                        recognizer_factory=lambda: (backend, recognizer))
    statuses = []
    pipeline.start()
    try:
        while not pipeline.wait_exhausted(0.05):
            status = pipeline.latest_status()
            if status is not None:
                statuses.append(status)
    finally:
        pipeline.stop()
    statuses.append(pipeline.latest_status())
    extra = dict(statuses[-1].extra)
    # The engine's own counters: every step, however short (polling would miss GPU steps).
    n_steps = int(extra["steps"])
    steps = [extra["step_s_total"] / n_steps] * n_steps if n_steps else []
    return pipeline.drain_captions(), steps, statuses


def _policy_name(policy: Policy) -> str:
    kind, params = policy
    return kind if not params else f"{kind} ({', '.join(f'{k}={v:g}' for k, v in params)})"


def summarize(per_clip: list[dict], kind: str, policy: str, mode: str, interval_s: float, busy: float, n: int,
              pause_s, step_cost_ms, speakers: str = "auto") -> dict:
    """One configuration's figures over ``per_clip`` (one kind of speech). WER against the
    references leaves out the crosstalk clips (their references hold one speaker of several);
    those are scored by the reference words missed, and every clip by its agreement with the
    same model offline."""
    words = [w for p in per_clip for w in p["words"]]
    shown = [w["shown_s"] for w in words]
    commit = [w["committed_s"] for w in words]
    scored = [p for p in per_clip if not p["crosstalk"]]
    crosstalk = [p for p in per_clip if p["crosstalk"]]

    def pct(clips, key):
        errors, n_ref = sum(p[key][0] for p in clips), sum(p[key][1] for p in clips)
        return round(100 * errors / max(1, n_ref), 2)

    def points(p):  # how much worse than offline, in WER points (missed words for crosstalk clips)
        key = "missed" if p["crosstalk"] else "wer"
        return 100 * (p[f"{key}_streaming"][0] - p[f"{key}_offline"][0]) / max(1, p[f"{key}_streaming"][1])

    worst = max(per_clip, key=points)
    audio_total = sum(p["audio_s"] for p in per_clip)
    step_means = [p["step_ms_mean"] for p in per_clip if p["step_ms_mean"]]
    return {
        "speech": kind, "policy": policy, "speakers": speakers,
        "mode": mode, "interval_s": interval_s, "target_busy": busy, "streams": n, "pause_s": pause_s,
        "clips": len(per_clip), "audio_s": round(audio_total, 1),
        "words": len(words),
        "words_shown": sum(v is not None for v in shown), "words_committed": sum(v is not None for v in commit),
        "partial_p50_s": percentile(shown, 50), "partial_p90_s": percentile(shown, 90),
        "commit_p50_s": percentile(commit, 50), "commit_p90_s": percentile(commit, 90),
        "wer_streaming_pct": pct(scored, "wer_streaming"), "wer_offline_pct": pct(scored, "wer_offline"),
        "crosstalk_clips": len(crosstalk),
        "crosstalk_missed_streaming_pct": pct(crosstalk, "missed_streaming"),
        "crosstalk_missed_offline_pct": pct(crosstalk, "missed_offline"),
        "streaming_vs_offline_pct": pct(per_clip, "streaming_vs_offline"),
        "worst_clip": worst["id"], "worst_clip_points": round(points(worst), 1),
        "worst_clip_streaming_text": worst["streaming_text"], "worst_clip_offline_text": worst["offline_text"],
        "layout_problems_live": sum(len(p["layout_live"]) for p in per_clip),
        "layout_problems_offline": sum(len(p["layout_offline"]) for p in per_clip),
        "commit_problems": sum(len(p["commits"]) for p in per_clip),
        "compute_over_audio": round(sum(p["compute_over_audio"] * p["audio_s"] for p in per_clip) / audio_total, 3),
        "step_ms_mean": round(float(np.mean(step_means)), 1) if step_means else None,
        "step_ms_charged": step_cost_ms,  # what the clock was charged per step (None: measured)
        "max_last_commit_after_audio_end_s": max((p["last_commit_after_audio_end_s"] or 0) for p in per_clip),
        "words_revised": sum(p["revised_words"] for p in per_clip),
    }


def percentile(values, q):
    values = [v for v in values if v is not None]
    return None if not values else round(float(np.percentile(values, q)), 3)


def main() -> int:
    parser = argparse.ArgumentParser(description="caption latency and streaming WER of the live engine")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N (where the model and features run)")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--mode", choices=("simulated", "live", "both"), default="simulated",
                        help="both: each clip replayed in each mode, one after the other (a check of the simulation)")
    parser.add_argument("--intervals", default="0.25,0.5,1.0", help="base update intervals to compare, seconds, comma separated")
    parser.add_argument("--set", choices=("read", "spontaneous", "all"), default="all",
                        help="read speech (the English clips ≤ 30 s with reference word times; --long adds the "
                             "longer ones), spontaneous speech (every en_spont_* clip), or both, reported apart")
    parser.add_argument("--clips", default="", help="clip ids (comma separated), overriding --set")
    parser.add_argument("--long", action="store_true", help="also replay the read English clips over 30 s")
    parser.add_argument("--target-busy", default=None,
                        help="shares of wall time model steps may take before the interval stretches, comma "
                             "separated (default: the engine's)")
    parser.add_argument("--streams", default="1",
                        help="concurrent streams per engine, comma separated (e.g. 1,2: alone, and as Me + Meeting)")
    parser.add_argument("--pause-s", default=None,
                        help="silences that close a segment, seconds, comma separated (default: the engine's, 0.5 s)")
    parser.add_argument("--times-model", default="tiny.en",
                        help="whose cached forced alignment gives the reference word end times (the oracle is "
                             "the audio's, whatever model is measured; tiny.en's is the one cached)")
    parser.add_argument("--policies", default="localagreement,alignatt",
                        help="commit policies to compare, comma separated (localagreement, alignatt)")
    parser.add_argument("--first-context", default="",
                        help="AlignAtt variants: seconds of audio the first words of a segment wait for, comma "
                             "separated (default: the policy's own)")
    parser.add_argument("--variants", default="",
                        help="more policies, ';' separated: KIND[:FIELD=VALUE,...] with PolicyConfig fields, e.g. "
                             "'alignatt:first_context_s=1,attend_margin_s=0.2;alignatt-gpu'")
    parser.add_argument("--step-cost-ms", type=float, default=None,
                        help="simulated replay: charge the clock this many ms per model step instead of the "
                             "step's measured duration (another device's timing on this machine)")
    parser.add_argument("--decode-cache", default=None,
                        help="with --step-cost-ms: keep every step's hypotheses in this directory and reuse "
                             "them for the same window (log-mel, start, prompt) in later configurations and runs")
    parser.add_argument("--no-speech", default=",".join(NO_SPEECH),
                        help=f"60 s recordings without speech replayed under each policy (comma separated, of "
                             f"{', '.join(NO_SPEECH)}; 'none' to skip)")
    parser.add_argument("--speakers", default="auto",
                        help="speaker labels, comma separated to compare: auto (the default: labels the live mode's "
                             "file streams, not the simulated replay's), on, off")
    parser.add_argument("--out", default=None, help="write the full results (JSON) here")
    args = parser.parse_args()
    from captioner.engine.scheduler import SchedulerConfig

    n_streams = [int(x) for x in args.streams.split(",")]
    policies: list[Policy] = []
    for kind in filter(None, args.policies.split(",")):
        if kind == "alignatt" and args.first_context:
            policies += [(kind, (("first_context_s", float(x)),)) for x in args.first_context.split(",")]
        else:
            policies.append((kind, ()))
    policies += parse_variants(args.variants)
    for policy in policies:
        policy_config(policy)  # a bad name is a one-line error before the model loads
    no_speech = [k for k in args.no_speech.split(",") if k and k != "none"]
    unknown = [k for k in no_speech if k not in NO_SPEECH]
    if unknown:
        parser.error(f"--no-speech: unknown {', '.join(unknown)} (choose from {', '.join(NO_SPEECH)}, or none)")
    step_cost_s = None if args.step_cost_ms is None else args.step_cost_ms / 1e3
    if step_cost_s is not None and (args.mode != "simulated" or step_cost_s < 0):
        parser.error("--step-cost-ms needs --mode simulated and a cost of 0 or more")
    if args.decode_cache and step_cost_s is None:
        parser.error("--decode-cache needs --step-cost-ms (a measured step's duration is not replayed)")
    pauses = [float(x) for x in args.pause_s.split(",")] if args.pause_s else [None]
    speaker_modes = args.speakers.split(",")
    if any(m not in ("auto", "on", "off") for m in speaker_modes):
        parser.error(f"--speakers: choose from auto, on, off (got {args.speakers})")
    busies = [float(x) for x in args.target_busy.split(",")] if args.target_busy else [SchedulerConfig().target_busy]

    from captioner.engine.live import load_recognizer
    from captioner.engine.offline import (
        TranscribeOptions,
        load_decoder,
        transcribe_file,
    )

    times = word_times(args.times_model)
    kinds = ("read", "spontaneous") if args.set == "all" else (args.set,)
    english = [c for c in load_manifest() if c["language"] == "en"]
    clips = [c for c in english if speech_kinds.kind(c["id"]) in kinds
             and (c["id"] in times or args.long or speech_kinds.kind(c["id"]) == "spontaneous")]
    if args.clips:
        wanted = set(args.clips.split(","))
        clips = [c for c in english if c["id"] in wanted]
    intervals = [float(x) for x in args.intervals.split(",")]

    t0 = time.perf_counter()
    backend, recognizer = load_recognizer(args.model, args.device)
    load_s = time.perf_counter() - t0
    print(f"model {recognizer.name} on {recognizer.provider} ({recognizer.device_name}), "
          f"features on {backend.name}; loaded in {load_s:.1f} s", file=sys.stderr)
    if step_cost_s is not None:
        recognizer = MemoRecognizer(recognizer, Path(args.decode_cache) if args.decode_cache else None)

    # Offline reference: the same model, the offline path.
    decoder = load_decoder(args.model, args.device)
    offline = {}
    # The offline texts are kept with the decode cache too (per model, device and recording).
    offline_cache = Path(args.decode_cache) / f"offline-{args.model}-{args.device}.json" if args.decode_cache else None
    kept = json.loads(offline_cache.read_text(encoding="utf-8")) if offline_cache and offline_cache.exists() else {}
    for c in clips:
        t = time.perf_counter()
        if isinstance(kept.get(c["path"]), dict):
            offline[c["id"]] = {**kept[c["path"]], "seconds": None}
            continue
        result = transcribe_file(c["path"], TranscribeOptions(model=args.model, device=args.device), decoder=decoder)
        words = [w for s in result.segments for w in s.words]
        offline[c["id"]] = {"text": result.text, "words": words, "seconds": time.perf_counter() - t,
                            "captions": [dataclasses.asdict(x) for x in result.captions(c["id"])]}
        kept[c["path"]] = {k: v for k, v in offline[c["id"]].items() if k != "seconds"}
    # Word end times for the latency of a clip without the reference's forced alignment (the
    # spontaneous clips: longer than a window, with references that leave out crosstalk): the
    # offline transcription's own words, timed by the same DTW over the alignment heads, fitted
    # to the VAD's speech. A live word then counts from where the model offline heard it end.
    for c in clips:
        if c["id"] not in times and offline[c["id"]].get("words"):
            times[c["id"]] = [{"word": w, "start_s": a, "end_s": b} for w, a, b in offline[c["id"]]["words"]]
    if offline_cache is not None:
        offline_cache.parent.mkdir(parents=True, exist_ok=True)
        offline_cache.write_text(json.dumps(kept), encoding="utf-8")

    report = {
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "python": platform.python_version(),
        "device": args.device, "provider": recognizer.provider, "device_name": recognizer.device_name,
        "features_backend": backend.name, "model": recognizer.name, "mode": args.mode,
        "command": " ".join(sys.argv), "pause_s": args.pause_s, "step_cost_ms": args.step_cost_ms,
        "decode_cache": args.decode_cache, "normalizer": NORMALIZER_NAME, "set": args.set,
        "latency_oracle": "reference forced alignment (read clips in benchmarks/data); the offline "
                          "transcription's DTW word times fitted to the VAD (others)", "runs": [],
    }
    # Every configuration replays each clip right after the others, so that a machine whose
    # load changes over the run (a shared CPU) weighs on all of them alike. With --streams N,
    # N clips are replayed at once as N streams of one engine (batched steps); the last group
    # is filled up with clips from the start, which are not counted twice.
    modes = ["simulated", "live"] if args.mode == "both" else [args.mode]
    configs = [(m, i, b, n, p, pol, spk) for m in modes for i in intervals for b in busies for n in n_streams
               for p in pauses for pol in policies for spk in speaker_modes]
    groups = {n: [list(range(g, g + n)) for g in range(0, len(clips), n)] for n in n_streams}
    per_config: dict[tuple, list] = {cfg: [] for cfg in configs}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        paths = [padded_clip(c["path"], tmp) for c in clips]
        for g in range(max(len(v) for v in groups.values())):
            for cfg in configs:
                mode, interval_s, busy, n, pause_s, policy, speakers = cfg
                if g >= len(groups[n]):
                    continue
                members = [i % len(clips) for i in groups[n][g]]
                measured = [i for i in groups[n][g] if i < len(clips)]
                run = run_simulated if mode == "simulated" else run_live
                wall0 = time.perf_counter()
                updates, steps, statuses = run(recognizer, backend, [paths[i] for i in members], interval_s, busy, pause_s,
                                               policy, step_cost_s, speakers)
                wall_s = time.perf_counter() - wall0
                group_audio_s = max(clips[i]["duration_s"] for i in members) + LEAD_S + TAIL_S
                for k, i in enumerate(members):
                    if i not in measured:
                        continue
                    c = clips[i]
                    mine = [u for u in updates if u.stream == f"s{k}"]
                    streaming_text = " ".join(u.text for u in mine if u.kind == "final")
                    lat = word_latencies(mine, times[c["id"]]) if c["id"] in times else []
                    audio_s = c["duration_s"] + LEAD_S + TAIL_S
                    last = [u for u in mine if u.kind == "final"]
                    per_config[cfg].append({
                        "id": c["id"], "streams": len(members), "audio_s": round(audio_s, 3),
                        "replay_wall_s": round(wall_s, 2),
                        "steps": len(steps), "step_ms_mean": round(1e3 * float(np.mean(steps)), 1) if steps else None,
                        "compute_over_audio": round(float(np.sum(steps)) / group_audio_s, 3),
                        "final_interval_s": round(dict(statuses[-1].extra)["update_interval_s"], 3) if statuses else None,
                        "last_commit_after_audio_end_s": round(last[-1].emitted_wall_s - audio_s, 3) if last else None,
                        "streaming_text": streaming_text, "offline_text": offline[c["id"]]["text"],
                        "kind": speech_kinds.kind(c["id"]), "crosstalk": speech_kinds.crosstalk(c["id"]),
                        "wer_streaming": wer_counts(c["reference"], streaming_text),
                        "wer_offline": wer_counts(c["reference"], offline[c["id"]]["text"]),
                        "missed_streaming": missed_counts(c["reference"], streaming_text),
                        "missed_offline": missed_counts(c["reference"], offline[c["id"]]["text"]),
                        "streaming_vs_offline": wer_counts(offline[c["id"]]["text"], streaming_text),
                        "revised_words": revised_words(mine),
                        "layout_live": layout_problems([u for u in mine if u.kind == "final"]),
                        "layout_offline": layout_problems(
                            [types.SimpleNamespace(**x) for x in offline[c["id"]].get("captions", [])]),
                        "commits": commit_problems([u for u in mine if u.kind == "final"]),
                        "words": lat,
                    })
                    p = per_config[cfg][-1]
                    print(f"[{_policy_name(policy)}, speakers {speakers}, {mode}, {interval_s:.2f} s, busy {busy}, {n} streams, pause {pause_s}] {c['id']}: {p['steps']} steps, "
                          f"{p['step_ms_mean']} ms/step, WER {p['wer_streaming']} vs offline {p['wer_offline']}",
                          file=sys.stderr)
    for (mode, interval_s, busy, n, pause_s, policy, speakers), all_clips in per_config.items():
        for kind in ("read", "spontaneous"):
            per_clip = [p for p in all_clips if p["kind"] == kind]
            if per_clip:
                summary = summarize(per_clip, kind, _policy_name(policy), mode, interval_s, busy, n, pause_s,
                                    args.step_cost_ms, speakers)
                report["runs"].append({"summary": summary, "clips": per_clip})
                print(json.dumps(summary), file=sys.stderr)

    if isinstance(recognizer, MemoRecognizer):
        report["decode_cache_hits"], report["decode_cache_misses"] = recognizer.hits, recognizer.misses
        print(f"decode cache: {recognizer.hits} steps replayed, {recognizer.misses} decoded", file=sys.stderr)
    report["no_speech"] = []
    for kind in no_speech:
        for policy in policies:
            updates, steps, _ = run_simulated(recognizer, backend, [no_speech_audio(kind)], 1.0,
                                              busies[0], None, policy, step_cost_s)
            words = sum(len(split_words(u.text)) for u in updates if u.kind == "final")
            shown = sum(len(split_words(u.text)) for u in updates if u.kind == "partial")
            report["no_speech"].append({"audio": kind, "seconds": 60, "policy": _policy_name(policy), "steps": len(steps),
                                        "words_committed": words, "words_shown_in_partials": shown,
                                        "text": " ".join(u.text for u in updates if u.kind == "final")})
            print(json.dumps(report["no_speech"][-1]), file=sys.stderr)

    print("\n| speech | policy | speakers | replay | streams | update interval | partial p50 / p90 | committed p50 / p90 | WER streaming "
          "| WER offline | worst clip (streaming - offline) | words revised | layout problems (live / offline) "
          "| commit problems | compute / audio | ms per step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in report["runs"]:
        s = run["summary"]
        print(f"| {s['speech']} | {s['policy']} | {s['speakers']} | {s['mode']} | {s['streams']} | {s['interval_s']:.2f} s "
              f"| {s['partial_p50_s']} / {s['partial_p90_s']} s | {s['commit_p50_s']} / {s['commit_p90_s']} s "
              f"| {s['wer_streaming_pct']} % | {s['wer_offline_pct']} % | {s['worst_clip']} {s['worst_clip_points']:+.1f} "
              f"| {s['words_revised']} of {s['words_shown']} | {s['layout_problems_live']} / {s['layout_problems_offline']} "
              f"| {s['commit_problems']} | {s['compute_over_audio']} | {s['step_ms_mean']} |")
        if s.get("crosstalk_clips"):
            print(f"|  | (crosstalk: {s['crosstalk_clips']} clips, reference words missed) |  |  |  |  |  |  "
                  f"| {s['crosstalk_missed_streaming_pct']} % | {s['crosstalk_missed_offline_pct']} % "
                  f"| agreement with offline {s['streaming_vs_offline_pct']} % WER |  |  |  |  |  |")
    if report["no_speech"]:
        print("\n| 60 s of | policy | model steps | words committed | words in partials |")
        print("|---|---|---|---|---|")
        for r in report["no_speech"]:
            print(f"| {r['audio']} | {r['policy']} | {r['steps']} | {r['words_committed']} | {r['words_shown_in_partials']} |")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"results: {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
