"""Speaker labels measured: how often a line is given the wrong speaker, on real voices taking
turns, live and offline; what the voice encoder costs; and where its threshold comes from.

Two sets of recordings from ``../shared/speech`` (its README has the sources and licences), kept
apart:

* **Tuning set** (``--tune``): the read recordings (LibriSpeech, LJ Speech, TIMIT, JFK, LibriVox
  in English, German and Spanish, AISHELL: 13 speakers) and, so that conversation is in it too,
  spontaneous recordings the measured set does not use: both sides of two HarperValleyBank calls
  (eb82, 3a20), the AMI ES2011a excerpt and the NOTSOFAR snippet (6 speakers). Each recording is
  heard as the engine hears a stream (the spontaneous ones from their loud stretches, as below);
  every 2 s stretch of it (about a committed line) is compared with the centroid of its own
  speaker's other stretches (of the speaker's other recordings where there are any) and with
  every other speaker's. The threshold is the middle of the range where the two kinds of
  comparison are told apart best (balanced accuracy within half a point of its best):
  ``captioner.engine.speaker_clusters.DEFAULT_THRESHOLD`` is that figure. Nothing of it is tuned
  on the conversations below.
* **Measured set**: conversations assembled from the other spontaneous recordings (three
  HarperValleyBank calls, one channel per side; AMI headset channels of one meeting), 2, 3 and 4
  speakers, seeded: turns of 1-15 s in a random order (never the same speaker twice in a row),
  pauses of 0.2-1.5 s between them (room noise at -65 dBFS). A speaker's turns are taken in
  order from the stretches where their channel is loud (within 20 dB of its 95th percentile
  level; AMI headsets hear the others 20-40 dB down), so no audio is used twice.

Each conversation is replayed through the live engine (``LiveCaptioner(speakers="on")``,
tiny.en on the CPU, a simulated clock charged with every model step's measured time) and
transcribed offline (``captioner.transcribe``, then
:func:`captioner.engine.offline_speakers.label_captions`). Scored per 10 ms frame of speech:

* ``confusion``: of the speech time that has a line (its words' times, or its span), the share
  whose label is not its speaker's, after the best one-to-one mapping of labels to speakers
  (a label left unmapped is wrong);
* ``missed_changes``: of the turns after the first, the share whose first second (labelled
  frames) is not mostly given the new speaker's label;
* ``speakers_found``; ``unlabelled_speech``: the speech time no line covers (Whisper's misses).

Cost, in CPU time (``time.thread_time``: the machine may be shared): the engine's speaker work
(gathering the bands, the encoder, the bookkeeping) per second of stream audio in the live
replays, and the encoder alone for 1, 2, 8 and 32 streams fed 100 ms at a time.

Run (here):  PYTHONPATH=src python3 benchmarks/bench_speakers.py --tune --out benchmarks/results/speakers/<date>-cpu-speakers.json
Results: benchmarks/results/speakers/; docs/speakers.md.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

RATE = 16000
FRAME = 160
SPEECH_DIR = Path(os.environ.get("CAPTIONER_SPEECH_DIR", HERE.parent.parent / "shared" / "speech"))

TUNING = {  # speaker -> recordings (read speech)
    "ls1089": ["en_ls_1089-134686-0000", "en_ls_1089-134686-0001", "en_ls_1089-134691-0000", "en_ls_1089-134691-0001"],
    "ls1995": ["en_ls_1995-1837-0001"], "ls61": ["en_ls_61-70968-0000"], "ls6930": ["en_ls_6930-75918-0000"],
    "ls7902": ["en_ls_7902-96591-0000"],
    "lj": ["en_ljspeech_LJ001-0001", "en_ljspeech_LJ001-0003", "en_ljspeech_LJ001-0005", "en_ljspeech_LJ001-0007"],
    "timit": ["en_timit_LDC93S1"], "jfk": ["en_jfk_inaugural_excerpt"], "sonnet": ["en_sonnet001_librivox"],
    "de": ["de_simplicissimus_librivox"], "es": ["es_capitan_veneno_librivox"],
    "zh0764": ["zh_BAC009S0764W0121"], "zh0724": ["zh_BAC009S0724W0121"],
    # Spontaneous, kept out of the measured conversations.
    "eb82 agent": ["en_spont_hvb_eb82ec7b5f0944ca_agent"], "eb82 caller": ["en_spont_hvb_eb82ec7b5f0944ca_caller"],
    "3a20 agent": ["en_spont_hvb_3a20358e1bfc4a17_agent"], "3a20 caller": ["en_spont_hvb_3a20358e1bfc4a17_caller"],
    "ami es2011a": ["en_ami_ES2011a_hs0_40-46s"], "notsofar": ["en_spont_notsofar_example"],
}
SPONTANEOUS_TUNING = {"en_spont_hvb_eb82ec7b5f0944ca_agent", "en_spont_hvb_eb82ec7b5f0944ca_caller",
                      "en_spont_hvb_3a20358e1bfc4a17_agent", "en_spont_hvb_3a20358e1bfc4a17_caller"}
AMI = ["en_spont_ami_seriously_A_src0", "en_spont_ami_seriously_B_src1", "en_spont_ami_seriously_D_src3"]


def _call(call_id: str) -> list[str]:
    return [f"en_spont_hvb_{call_id}_agent", f"en_spont_hvb_{call_id}_caller"]


CONVERSATIONS = [  # (name, speakers' recordings, seed)
    ("2 speakers: call 02e4", _call("02e41649e7c441fd"), 1),
    ("2 speakers: call 00d6", _call("00d676d7058c49bb"), 2),
    ("2 speakers: call 01ce", _call("01cefd6f5c044a6f"), 3),
    ("3 speakers: meeting", AMI, 4),
    ("3 speakers: meeting, other turns", AMI, 5),
    # One agent and three callers (the callers of different calls are different people; whether
    # two calls have the same agent is not known, so no conversation holds two agents).
    ("4 speakers: an agent, three callers", _call("02e41649e7c441fd") + ["en_spont_hvb_00d676d7058c49bb_caller",
                                                                         "en_spont_hvb_01cefd6f5c044a6f_caller"], 6),
    ("4 speakers: meeting and a caller", AMI + ["en_spont_hvb_01cefd6f5c044a6f_caller"], 7),
]
TURN_S = (1.0, 15.0)
PAUSE_S = (0.2, 1.5)
CONVERSATION_S = 90.0
SEGMENT_S = 2.0


def read(clip_id: str) -> np.ndarray:
    from captioner.audio.file_source import read_audio_16k

    with (SPEECH_DIR / "manifest.tsv").open(newline="", encoding="utf-8") as f:
        rows = {r["id"]: r for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)}
    return read_audio_16k(SPEECH_DIR / rows[clip_id]["wav"])


# -- the tuning set ---------------------------------------------------------------------------------
def tune(encoder) -> dict:
    from captioner.engine.offline_speakers import hear_recording

    stretches = []  # (speaker, recording, embedding)
    for speaker, clips in TUNING.items():
        for clip_id in clips:
            audio = read(clip_id)
            if clip_id in SPONTANEOUS_TUNING:  # a call's channel: its own speaker's stretches
                audio = loud_stretches(audio)
            track = hear_recording([audio], encoder=encoder)
            for start_s in np.arange(0.0, audio.shape[0] / RATE - SEGMENT_S + 1e-9, SEGMENT_S):
                embedding, _ = track.embedding_of(start_s, start_s + SEGMENT_S)
                if embedding is not None:
                    stretches.append((speaker, clip_id, embedding))
    same, other = [], []
    for i, (speaker, clip_id, embedding) in enumerate(stretches):
        own_others = [e for s, c, e in stretches if s == speaker and c != clip_id]
        if not own_others:  # a speaker with one recording: its other stretches
            own_others = [e for j, (s, _, e) in enumerate(stretches) if s == speaker and j != i]
        if own_others:
            same.append(float(embedding @ _unit(np.mean(own_others, axis=0))))
        for s in {s for s, _, _ in stretches} - {speaker}:
            other.append(float(embedding @ _unit(np.mean([e for t, _, e in stretches if t == s], axis=0))))
    same, other = np.array(same), np.array(other)
    grid = np.round(np.arange(0.40, 0.96, 0.01), 2)
    balanced = np.array([((same >= t).mean() + (other < t).mean()) / 2 for t in grid])
    plateau = grid[balanced >= balanced.max() - 0.005]  # where the two are told apart about as well
    best = float(np.round(np.median(plateau), 2))
    eer_at = float(grid[int(np.argmin([abs((same < t).mean() - (other >= t).mean()) for t in grid]))])
    return {
        "speakers": len(TUNING), "recordings": sum(map(len, TUNING.values())), "stretches": len(stretches),
        "stretch_s": SEGMENT_S, "same_speaker": _summary(same), "other_speaker": _summary(other),
        "threshold": best, "plateau": [float(plateau.min()), float(plateau.max())],
        "balanced_accuracy": float(balanced.max()),
        "threshold_equal_error": eer_at,
        "at_threshold": {"same_accepted": float((same >= best).mean()), "other_rejected": float((other < best).mean())},
    }


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def _summary(x: np.ndarray) -> dict:
    return {"n": int(x.size), "mean": float(x.mean()), "p05": float(np.percentile(x, 5)),
            "p50": float(np.percentile(x, 50)), "p95": float(np.percentile(x, 95))}


# -- the measured set -------------------------------------------------------------------------------
def loud_stretches(audio: np.ndarray) -> np.ndarray:
    """The audio of the stretches where the channel is loud (its own speaker), end to end."""
    n = audio.shape[0] // FRAME
    level = 10 * np.log10(np.maximum((audio[: n * FRAME].reshape(n, FRAME).astype(np.float64) ** 2).mean(axis=1), 1e-12))
    loud = level >= np.percentile(level, 95) - 20.0
    # Close gaps under 0.3 s, drop stretches under 0.4 s, keep 0.1 s either side.
    edges = np.diff(np.concatenate([[0], loud.astype(np.int8), [0]]))
    starts, stops = np.nonzero(edges == 1)[0], np.nonzero(edges == -1)[0]
    runs = []
    for a, b in zip(starts, stops):
        if runs and a - runs[-1][1] < 30:
            runs[-1][1] = b
        else:
            runs.append([a, b])
    keep = [(max(0, a - 10), min(n, b + 10)) for a, b in runs if b - a >= 40]
    return np.concatenate([audio[a * FRAME:b * FRAME] for a, b in keep]) if keep else np.zeros(0, np.float32)


def assemble(clips: list[str], seed: int) -> tuple[np.ndarray, list[tuple[float, float, int]]]:
    """A conversation of ``clips``' speakers and its turns ``(start_s, end_s, speaker)``."""
    rng = np.random.default_rng(seed)
    material = [loud_stretches(read(c)) for c in clips]
    used = [0] * len(clips)
    pieces, turns, at, previous = [], [], 0, None
    room = lambda n: (10 ** (-65 / 20) * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    pieces.append(room(RATE // 2))
    at = RATE // 2
    while at < CONVERSATION_S * RATE:
        left = [i for i in range(len(clips)) if i != previous and material[i].shape[0] - used[i] >= TURN_S[0] * RATE]
        if not left:
            break
        speaker = int(rng.choice(left))
        n = min(int(rng.uniform(*TURN_S) * RATE), material[speaker].shape[0] - used[speaker])
        pieces.append(material[speaker][used[speaker]:used[speaker] + n])
        used[speaker] += n
        turns.append((at / RATE, (at + n) / RATE, speaker))
        at += n
        gap = int(rng.uniform(*PAUSE_S) * RATE)
        pieces.append(room(gap))
        at += gap
        previous = speaker
    pieces.append(room(2 * RATE))
    return np.concatenate(pieces).astype(np.float32), turns


def frame_labels(lines, n_frames: int) -> np.ndarray:
    """Each 10 ms frame's label from committed lines (its words' times where measured)."""
    out = np.full(n_frames, "", dtype=object)
    for line in lines:
        spans = [(a, b) for _, a, b in line.words] if line.words else [(line.start_s, line.end_s)]
        for a, b in spans:
            out[int(round(a * 100)):max(int(round(b * 100)), int(round(a * 100)) + 1)] = line.speaker
    return out


def score(turns, lines, n_frames: int) -> dict:
    truth = np.full(n_frames, -1)
    for a, b, speaker in turns:
        truth[int(round(a * 100)):int(round(b * 100))] = speaker
    hyp = frame_labels(lines, n_frames)
    both = (truth >= 0) & (hyp != "")
    labels = sorted({h for h in hyp[both]})
    speakers = sorted({s for _, _, s in turns})
    best, mapping = -1, {}
    for assignment in itertools.product([None, *speakers], repeat=len(labels)):
        used = [s for s in assignment if s is not None]
        if len(used) != len(set(used)):
            continue
        m = dict(zip(labels, assignment))
        right = sum(int(np.sum((hyp[both] == label) & (truth[both] == s))) for label, s in m.items() if s is not None)
        if right > best:
            best, mapping = right, m
    wrong = int(both.sum()) - max(best, 0)
    missed = 0
    for a, b, speaker in turns[1:]:
        first = slice(int(round(a * 100)), int(round(min(b, a + 1.0) * 100)))
        said = [mapping.get(h) for h in hyp[first] if h != ""]
        if not said or max(set(said), key=said.count) != speaker:
            missed += 1
    speech = int((truth >= 0).sum())
    return {
        "confusion": wrong / max(1, int(both.sum())), "missed_changes": missed / max(1, len(turns) - 1),
        "turns": len(turns), "speakers": len(speakers), "speakers_found": len(labels),
        "speech_s": speech / 100, "labelled_speech_s": int(both.sum()) / 100,
        "unlabelled_speech": 1 - int(both.sum()) / max(1, speech), "mapping": {k: v for k, v in mapping.items()},
    }


def live(recognizer, backend, audio: np.ndarray) -> tuple[list, dict]:
    from captioner.engine.live import LiveCaptioner
    from captioner.engine.simulate import replay

    made = {}

    def make(clock, timer):
        made["live"] = LiveCaptioner(recognizer=recognizer, backend=backend, clock_ns=clock, timer_ns=timer,
                                     speakers="on")
        made["live"].engine.host_timer = time.thread_time  # CPU time: this machine is shared
        return made["live"]

    result = replay(make, {"conversation": audio}, compute="measured")
    engine = made["live"].engine
    audio_s = audio.shape[0] / RATE
    cost = {"speaker_host_s": engine.host_s["speakers"], "audio_s": audio_s,
            "speaker_host_s_per_stream_s": engine.host_s["speakers"] / audio_s,
            "model_steps_s_per_audio_s": sum(result.step_s) / audio_s}
    return [u for u in result.updates if u.kind == "final"], cost


def offline(audio: np.ndarray, encoder) -> tuple[list, dict]:
    import captioner
    from captioner.engine.offline_speakers import label_captions

    t0 = time.perf_counter()
    result = captioner.transcribe(audio, model="tiny.en", language="en", device="cpu")
    t1 = time.perf_counter()
    lines = label_captions([audio], result.captions("conversation"), encoder=encoder)
    t2 = time.perf_counter()
    return lines, {"transcribe_s": t1 - t0, "speaker_s": t2 - t1, "speaker_s_per_audio_s": (t2 - t1) / (audio.shape[0] / RATE)}


def encoder_cost(encoder, streams: int, seconds: float = 10.0) -> dict:
    """The encoder alone (gathers, runs, bookkeeping): ``streams`` streams of speech-like frames
    fed 100 ms at a time, every frame heard."""
    from captioner.engine.speakers import SpeakerBank, SpeakerConfig
    from captioner.gpu.backend import cpu_backend
    from captioner.gpu.features import FeaturePool

    backend = cpu_backend()
    pool = FeaturePool(backend, speaker_bands=True, ring_frames=400, block_streams=max(streams, 1))
    slots = [pool.acquire() for _ in range(streams)]
    bank = SpeakerBank(backend, pool, encoder, SpeakerConfig(mode="on"))
    tracks = [bank.open(f"s{i}", slot) for i, slot in enumerate(slots)]
    rng = np.random.default_rng(0)
    audio = (0.05 * rng.standard_normal((streams, int(seconds * RATE)))).astype(np.float32)
    busy = 0.0
    for k in range(int(seconds * 10)):
        chunk = audio[:, k * 1600:(k + 1) * 1600]
        before = [pool.frames_ready(s) for s in slots]
        pool.push_batch(slots, chunk)
        for t, s, b in zip(tracks, slots, before):
            t.add_frames(b, np.ones(pool.frames_ready(s) - b, bool), 0)
        t0 = time.thread_time()  # CPU time (ONNX Runtime's one thread is this one): the machine is shared
        bank.run()
        busy += time.thread_time() - t0
    return {"streams": streams, "seconds_per_stream": seconds, "busy_s": busy,
            "cpu_s_per_stream_s": busy / (streams * seconds), "runs": bank.runs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tune", action="store_true", help="measure the threshold on the tuning set")
    parser.add_argument("--only", type=int, nargs="*", help="conversation numbers to run (default: all)")
    parser.add_argument("--no-offline", action="store_true", help="skip the offline transcriptions")
    parser.add_argument("--out", type=Path, help="write the results (JSON) here")
    args = parser.parse_args(argv)
    if not (SPEECH_DIR / "manifest.tsv").exists():
        print(f"error: no speech recordings at {SPEECH_DIR} (set CAPTIONER_SPEECH_DIR)", file=sys.stderr)
        return 2
    from captioner.engine.live import load_recognizer
    from captioner.engine.speaker_clusters import DEFAULT_THRESHOLD
    from captioner.models.speaker.encoder import SpeakerEncoder

    encoder = SpeakerEncoder("cpu", intra_threads=1)
    results = {
        "date": dt.date.today().isoformat(), "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "cpus": os.cpu_count(), "model": "tiny.en", "device": "cpu", "threshold": DEFAULT_THRESHOLD,
        "command": "PYTHONPATH=src python3 benchmarks/bench_speakers.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    if args.tune:
        results["tuning"] = tune(encoder)
        print(f"tuning: {json.dumps(results['tuning'])}", flush=True)
    results["encoder_cost"] = [encoder_cost(encoder, n) for n in (1, 2, 8, 32)]
    for row in results["encoder_cost"]:
        print(f"encoder: {row['streams']} streams: {1000 * row['cpu_s_per_stream_s']:.2f} ms CPU per stream-second", flush=True)
    backend, recognizer = load_recognizer("tiny.en", "cpu")
    results["conversations"] = []
    for number, (name, clips, seed) in enumerate(CONVERSATIONS):
        if args.only and number not in args.only:
            continue
        audio, turns = assemble(clips, seed)
        n_frames = audio.shape[0] // FRAME
        row = {"name": name, "recordings": clips, "seed": seed, "audio_s": audio.shape[0] / RATE,
               "turns": [[round(a, 2), round(b, 2), s] for a, b, s in turns]}
        lines, cost = live(recognizer, backend, audio)
        row["live"] = {**score(turns, lines, n_frames), **cost}
        if not args.no_offline:
            lines, cost = offline(audio, encoder)
            row["offline"] = {**score(turns, lines, n_frames), **cost}
        results["conversations"].append(row)
        print(f"{name}: live confusion {row['live']['confusion']:.3f}, missed changes {row['live']['missed_changes']:.2f}, "
              f"{row['live']['speakers_found']} labels"
              + (f"; offline confusion {row['offline']['confusion']:.3f}, {row['offline']['speakers_found']} labels"
                 if "offline" in row else ""), flush=True)
    by_count: dict[int, dict] = {}
    for row in results["conversations"]:
        for mode in ("live", "offline"):
            if mode in row:
                entry = by_count.setdefault(row["live"]["speakers"], {}).setdefault(mode, [0.0, 0.0])
                entry[0] += row[mode]["confusion"] * row[mode]["labelled_speech_s"]
                entry[1] += row[mode]["labelled_speech_s"]
    results["confusion_by_speakers"] = {n: {mode: v[0] / max(v[1], 1e-9) for mode, v in modes.items()}
                                        for n, modes in sorted(by_count.items())}
    print(f"confusion by number of speakers (speech-time weighted): {json.dumps(results['confusion_by_speakers'])}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
