"""Load test of `captioner serve`: N concurrent clients on loopback, each streaming a real
recording at real-time pace, against a server process of its own.

Reports connections held and refused, caption latency p50/p99 as the clients see it (an update
received, against when the audio it ends with was sent) beside the same engine in-process
(the same recordings as streams of one `Pipeline` in this process, each started as long after
the first as the server let its client in, fed 100 ms messages at real-time pace through the
server's own ``NetworkSource`` and measured the same way,
``--baseline``), the server process's CPU per connection, and the committed WER (pooled, the
normalisation of benchmarks/wer.py; per client too, with the worst three, so a stream that got
nothing shows). ``--py-spy FILE`` profiles the server and its children (the model's process, the
front-ends) and, into FILE-baseline, this process during the baseline. ``--gc-log`` reports every
process's garbage-collection pauses (``gc_pauses``: the server, its front-ends and model
processes, the client processes; the baseline's in ``latency_in_process``).

Bounded: at most ``--clients`` connections (``MAX_CLIENTS``), opened at ``--ramp`` per second,
each streaming ``--seconds`` of audio (its recording looped), and the whole run ends by
``--timeout`` whatever happens.

``--frontends 1,2`` runs the server once per value of ``serve --frontends``, one after the
other with the same clients, and reports them side by side, the server's CPU split into the hub
(the serve process and its model processes) and the front-end processes.

    python benchmarks/bench_serve.py --clients 4 --device cpu            # here, 2 cores
    python benchmarks/bench_serve.py --silence --clients 150 --seconds 30 --ramp 50 --no-baseline \
        --frontends 1,2,2,1                                             # the network side's cost
    python benchmarks/bench_serve.py --clients 150 --speakers 4 --seconds 40 --ramp 50 --frontends 2 \
        --isolation process                                             # 4 captioned among 146 silent
    python benchmarks/bench_serve.py --clients 1000 --device cuda:0 --seconds 60 --ramp 50 \
        --client-processes 8 --frontends 1,4 --json serve-h200.json      # an H200
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gc_pauses  # noqa: E402
from captioner.serve.loop_lag import LoopLag, lateness_quantiles_ms  # noqa: E402
from wer import DEFAULT_SPEECH, _normalisers, load_clips, score, word_edits  # noqa: E402

MAX_CLIENTS = 4096
SILENT = -1
"""The clip of a client that sends silence (``--silence``, or not one of the ``--speakers``)."""
CHUNK_S = 0.1
GAP_S = 1.0  # silence between loops of a recording: a pause closes the segment


def english_clips(root: Path, max_s: float = 35.0):
    clips = [c for c in load_clips(root) if c.language == "en" and c.duration_s <= max_s]
    if not clips:
        raise SystemExit(f"no English recordings under {max_s:g} s in {root}")
    return sorted(clips, key=lambda c: c.id)


def pcm16k(path: Path) -> np.ndarray:
    from captioner.audio.file_source import read_audio_16k

    audio = read_audio_16k(path)
    return np.clip(np.rint(audio * 32767), -32768, 32767).astype("<i2")


def looped(pcm: np.ndarray, seconds: float) -> tuple[np.ndarray, int]:
    """The recording repeated (with a pause between) to about ``seconds``: (audio, repeats)."""
    gap = np.zeros(int(GAP_S * 16000), "<i2")
    piece = np.concatenate([pcm, gap])
    repeats = max(1, int(round(seconds / (len(piece) / 16000))))
    return np.concatenate([piece] * repeats), repeats


def plain_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word errors, reference words) with case and punctuation dropped."""
    import re

    r = re.sub(r"[^\w' ]+", " ", reference.lower()).split()
    h = re.sub(r"[^\w' ]+", " ", hypothesis.lower()).split()
    return word_edits(r, h), len(r)


def percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


# -- the clients ---------------------------------------------------------------------------------

TIMELINE_FIELDS = ("streams", "batch_size", "step_latency_ms", "lag_s", "real_time_factor", "queue_depth",
                   "caption_latency_s")
"""The fields of the server's status kept per second of the run (``server_timeline``)."""
TIMELINE_GPU_FIELDS = ("vram_used_bytes", "vram_process_bytes")
"""And from its ``gpu`` part: whether memory, not time, is what stops admission."""
TIMELINE_EVERY = 50
"""Every this many clients records the status messages it gets (one would stop when it ends)."""


def timeline_line(message: dict) -> list:
    """One status message as a ``server_timeline`` line (before its clock is made relative)."""
    gpu = message.get("gpu") or {}
    return [message["time_s"], *(message.get(k) for k in TIMELINE_FIELDS), *(gpu.get(k) for k in TIMELINE_GPU_FIELDS)]


def after_engine_s(latency_s: float, end_s: float, emitted_wall_s: float | None) -> float | None:
    """Of an update's latency (``latency_s``: from when its last audio was due, real-time pace,
    to when the client had it), the part after the engine made it: what the way back (the hub,
    a front-end, the socket; in-process, the pipeline's drain) adds. The engine's side is
    ``emitted_wall_s - end_s`` on the stream's own clock, which starts a chunk's length before its
    first chunk reached the engine's source (the way in of that first chunk stays in the rest,
    the way in of later chunks in the engine's side). Unlike served against in-process latency,
    it does not move with how far behind the engine happened to be in each run (two runs of the
    same thousand on an H200 differed by 1.5 s at p99, docs/serve.md). ``None`` without the
    emission time."""
    if emitted_wall_s is None:
        return None
    return latency_s - (emitted_wall_s - end_s) + CHUNK_S


def _late_dict(quantiles: tuple[float, float, float] | None) -> dict | None:
    return dict(zip(("p50", "p99", "max"), quantiles)) if quantiles else None


def silent_samples(clips, seconds: float) -> int:
    """A silent client's audio: ``seconds``, or as long as the longest recording."""
    return int(16000 * (seconds or max(clip.duration_s for clip in clips)))


def speaker_clips(clients: int, n_clips: int, speakers: int | None) -> list[int]:
    """Each client's clip: the recordings in turn, or, with ``speakers``, that many clients spread
    evenly over the ramp speak (the recordings in turn) and the others send silence."""
    if speakers is None:
        return [i % n_clips for i in range(clients)]
    speaking = {min(clients - 1, (j * clients) // speakers): j for j in range(speakers)}
    return [speaking[i] % n_clips if i in speaking else SILENT for i in range(clients)]


def ms_quantiles(values: list[float]) -> dict:
    """p50 / p99 of seconds, in milliseconds, and how many."""
    p50, p99 = (round(1000 * float(q), 1) for q in np.percentile(values, [50, 99])) if values else (None, None)
    return {"p50": p50, "p99": p99, "n": len(values)}


def refusal_kind(reason: str) -> str:
    """A refusal's reason without its stream's name and numbers: refusals counted by cause."""
    text = re.sub(r"'[^']*'", "S", str(reason))
    return re.sub(r"\d+(\.\d+)?", "N", text)[:100]


def server_timeline(records) -> list[list]:
    """One status per second of the run (the latest any recording client got in that second),
    as ``[seconds since the first, *TIMELINE_FIELDS]``."""
    by_second: dict[int, list] = {}
    lines = [line for r in records for line in r.get("timeline", [])]
    if not lines:
        return []
    first = min(line[0] for line in lines)
    for line in sorted(lines):
        by_second[int(line[0] - first)] = [int(line[0] - first), *line[1:]]
    return [by_second[k] for k in sorted(by_second)]


async def one_client(index: int, url: str, token: str | None, pcm: np.ndarray, start_at: float, out: dict,
                     retry_s: float = 0.0) -> None:
    """Connects at ``start_at`` (loop clock), streams ``pcm`` at real-time pace, sends end,
    collects every message until the close. A refusal at capacity (1013) is tried again with
    backoff, as the app's client does, until ``retry_s`` after ``start_at``."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start_at - loop.time()))
    record = {"index": index, "captions": [], "ready": False, "close": None, "reason": "", "latency": [],
              "after_engine": [],
              "statuses": 0, "refusals": 0, "refusal_reasons": []}
    out[index] = record
    backoff_s = 0.5
    rng = np.random.default_rng(index)
    while True:
        await _one_connection(index, url, token, pcm, record)
        refused = record["close"] == 1013 and not record["ready"]
        if not refused or loop.time() + backoff_s > start_at + retry_s:
            return
        record["refusals"] += 1
        record["refusal_reasons"].append(refusal_kind(record["reason"]))
        await asyncio.sleep(backoff_s * (0.5 + rng.random()))
        backoff_s = min(8.0, backoff_s * 1.6)
        record.update(close=None, reason="")


async def _one_connection(index: int, url: str, token: str | None, pcm: np.ndarray, record: dict) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from captioner.serve import protocol

    loop = asyncio.get_running_loop()
    record["connected_at"] = loop.time()
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        async with connect(url + protocol.listen_path(f"c{index}", None, 16000), additional_headers=headers,
                           max_size=None, compression=None, open_timeout=60, close_timeout=10) as ws:
            first = await ws.recv()
            if json.loads(first).get("type") != "ready":
                record["close"] = "no ready"
                return
            record["ready"] = True
            record["ready_mono_s"] = time.monotonic()  # one clock for every process of this host
            t0 = loop.time()
            wall0 = time.time()

            async def receive() -> None:
                async for text in ws:
                    message = json.loads(text)
                    if message["type"] == "status":
                        record["statuses"] += 1
                        # From the server making it (its clock: this machine's) to here: the way
                        # out through the loop (or the hub and a front-end), no model in it.
                        record.setdefault("status_delay_s", []).append(time.time() - message["time_s"])
                        record["dropped_frames"] = message.get("dropped_frames")
                        record["queue_depth_max"] = max(record.get("queue_depth_max", 0), message.get("queue_depth") or 0)
                        now = loop.time()
                        if record.get("last_status") is not None:
                            record.setdefault("status_gaps", []).append(now - record["last_status"])
                        record["last_status"] = now
                        # The server's state as it moves: one line per second, from a few clients.
                        if index % TIMELINE_EVERY == 0:
                            record.setdefault("timeline", []).append(timeline_line(message))
                        continue
                    if message["type"] != "caption" or not message["text"].strip():
                        continue
                    now = loop.time()
                    record["captions"].append(message)
                    # The audio this update ends with was sent at t0 + end_s (paced sending).
                    latency_s = now - (t0 + message["end_s"])
                    record["latency"].append((message["kind"], latency_s))
                    after_s = after_engine_s(latency_s, message["end_s"], message.get("emitted_wall_s"))
                    if after_s is not None:
                        record["after_engine"].append(after_s)

            receiver = asyncio.create_task(receive())
            step = int(CHUNK_S * 16000)
            for first_sample in range(0, len(pcm), step):
                await ws.send(pcm[first_sample:first_sample + step].tobytes())
                await asyncio.sleep(max(0.0, t0 + (first_sample + step) / 16000 - loop.time()))
            await ws.send(protocol.END_MESSAGE)
            try:
                await receiver
            except ConnectionClosed:
                pass
            record["wall_s"] = time.time() - wall0
    except ConnectionClosed:
        pass
    except asyncio.CancelledError:  # the run's time is up: the stream did not end by then
        record["reason"] = "did not finish before --timeout"
        raise
    except Exception as error:  # a refused handshake, a reset: counted, the run goes on
        record["reason"] = f"{type(error).__name__}: {error}"
    finally:
        try:
            record["close"] = ws.close_code  # noqa: F821 - set when the connection opened
            record["reason"] = record["reason"] or (ws.close_reason or "")
        except NameError:
            pass


async def run_clients(indices: list[int], url: str, token: str | None, audio: dict[int, np.ndarray],
                      ramp_per_s: float, timeout_s: float, retry_s: float = 0.0, lag: LoopLag | None = None) -> dict:
    """The clients ``indices``, each from its start time to its close, or until ``timeout_s``.
    ``lag``: notes how late this loop ran meanwhile (a late client loop dates its captions late,
    and that would count as the server's way back)."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.5
    out: dict = {}
    watcher = asyncio.create_task(lag.watch()) if lag is not None else None
    tasks = [asyncio.create_task(one_client(i, url, token, audio[i], start + i / ramp_per_s, out, retry_s))
             for i in indices]
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for task in pending:
        task.cancel()
    if watcher is not None:
        watcher.cancel()
    return out


def _client_process(args: tuple) -> tuple[dict, float, list[float]]:
    """One client process's records, the CPU seconds it used (the clients share the server's
    host: what they take is not the server's) and how late its loop ran (ms, every 10 ms)."""
    import websockets.asyncio.client  # noqa: F401 - imported before the freeze below

    from captioner.heap import freeze_start_up

    indices, url, token, clip_audio, assign, ramp, timeout_s, retry_s = args
    audio = {i: clip_audio[assign[i]] for i in indices}
    # The load generator's own full collections (20-30 ms each on the H100 run, walking its
    # imports) would stop ~170 clients' loops and land on the server's way back: frozen first.
    freeze_start_up()
    cpu0 = time.process_time()
    lag = LoopLag()
    records = asyncio.run(run_clients(indices, url, token, audio, ramp, timeout_s, retry_s, lag))
    return records, time.process_time() - cpu0, list(lag.late_ms)


# -- the server process ------------------------------------------------------------------------

class ServerProcess:
    def __init__(self, model: str, device: str, token_file: Path, max_streams: int | None,
                 isolation: str | None = None, frontends: int = 1, engines_per_device: int = 1,
                 flush_ms: float | None = None, switch_ms: float | None = None) -> None:
        import psutil

        command = [sys.executable, "-m", "captioner", "serve", "--port", "0", "--model", model, "--device", device,
                   "--token-file", str(token_file), "--quiet", "--frontends", str(frontends),
                   "--engines-per-device", str(engines_per_device),
                   "--max-connections-per-client", "0"]  # every client is on this machine's address
        if isolation:
            command += ["--isolation", isolation]
        if flush_ms is not None:
            command += ["--frontend-flush-ms", f"{flush_ms:g}"]
        if switch_ms is not None:
            command += ["--gil-switch-ms", f"{switch_ms:g}"]
        if max_streams:
            command += ["--max-streams", str(max_streams)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.err: list[str] = []
        threading.Thread(target=lambda: self.err.extend(self.process.stderr), daemon=True).start()
        line = self.process.stdout.readline()
        if not line.strip().isdigit():
            self.process.kill()
            raise SystemExit("the server did not start:\n" + "".join(self.err[-20:]))
        self.port = int(line)
        self.ps = psutil.Process(self.process.pid)
        self._kinds: dict[int, bool] = {}  # child pid -> whether it is a front-end

    def cpu_s(self) -> float:
        return sum(self.cpu_split())

    def cpu_split(self) -> tuple[float, float]:
        """CPU seconds so far: (the hub: the serve process and its model process(es), the
        front-end processes). A process that ended since the last call is no longer counted, so
        a front-end must live through the run (it does unless killed)."""
        import psutil

        times = self.ps.cpu_times()
        hub, fronts = times.user + times.system, 0.0
        for child in self.ps.children(recursive=True):
            try:
                if child.pid not in self._kinds:
                    self._kinds[child.pid] = "captioner.serve.frontend" in " ".join(child.cmdline())
                t = child.cpu_times()
            except psutil.Error:
                continue
            if self._kinds[child.pid]:
                fronts += t.user + t.system
            else:
                hub += t.user + t.system
        return hub, fronts

    def own_cpu_s(self) -> float:
        """CPU seconds so far of the serve process alone (its loop, the engines' workers and
        their reader threads: everything that shares its interpreter lock). Near one core, the
        lock is the limit, whatever the cores left."""
        times = self.ps.cpu_times()
        return times.user + times.system

    def rss_bytes(self) -> int:
        return self.ps.memory_info().rss

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


# -- the in-process baseline ---------------------------------------------------------------------

def baseline(clips, assign: list[int], held: dict[int, float], seconds: float, model: str, device: str,
             timeout_s: float, isolation: str, engines: int = 1) -> dict:
    """The recordings of the clients the server held (``held``: client -> when the server said
    ``ready``, monotonic seconds) as streams of ``engines`` in-process pipelines on ``device`` (the
    server's ``--engines-per-device``; each new stream to the one with the fewest, as the server's
    link chooses), fed the way the clients
    feed the server: each started as long after the first as its client was let in (the
    server's growth limit and the clients' retries decided those times; admitting them all at
    the clients' ramp instead overloads any engine), each a
    :class:`~captioner.serve.engine_link.NetworkSource` (the server's own source) given its
    audio in ``CHUNK_S`` messages at real-time pace by one thread, and ended (committed) when
    its audio is all sent, as a client's ``end`` does. The latency is measured the way the
    clients measure it: when an update is drained, against when the audio it ends with was sent.
    (One pacing thread, not a replay thread per stream: a thousand replay threads handing over
    20 ms chunks were themselves the load, and the baseline never finished.)"""
    from captioner.engine.messages import Refused
    from captioner.engine.pipeline import Pipeline
    from captioner.errors import UserError
    from captioner.events import CaptionUpdate
    from captioner.serve.engine_link import (
        NetworkSource,
        server_engine_config,
        server_standby,
    )

    audio = {k: looped(pcm16k(clip.wav), seconds or clip.duration_s)[0].astype(np.float32) / 32768.0
             for k, clip in enumerate(clips)}
    audio[SILENT] = np.zeros(silent_samples(clips, seconds), np.float32)
    # The server's engine (its update interval, warmed up), with the streams the server held
    # admitted as they come: the engine's time budget (and its growth limit) already chose
    # them on the server, so it is off here.
    config = server_engine_config()
    config.admission.time_budget = "off"
    pipelines = [Pipeline([], model=model, device=device, isolation=isolation, config=config,
                          standby=server_standby(engines)) for _ in range(engines)]
    for pipeline in pipelines:
        pipeline.start()
    owner: dict[str, object] = {}  # stream -> its pipeline
    latency: dict[str, list[float]] = {"partial": [], "final": []}
    after_engine: list[float] = []
    step = int(CHUNK_S * 16000)
    first_ready_s = min(held.values(), default=0.0)
    waiting = sorted(held, key=held.__getitem__)  # not started yet, in the order they were let in
    sending: dict[str, tuple[NetworkSource, np.ndarray, float, int]] = {}  # label -> (source, audio, t0, next)
    started: dict[str, float] = {}
    ended: set[str] = set()
    refused = 0
    first_s = time.monotonic()
    deadline = first_s + timeout_s

    engine_refused: set[str] = set()

    def drain() -> None:
        now = time.monotonic()
        for pipeline in pipelines:
            for u in pipeline.drain():
                if type(u) is Refused:  # the engine's admission said no after the open
                    engine_refused.add(u.label)
                if type(u) is not CaptionUpdate:
                    continue
                if u.text.strip():
                    latency_s = now - (started[u.stream] + u.end_s)
                    latency[u.kind].append(latency_s)
                    after_s = after_engine_s(latency_s, u.end_s, u.emitted_wall_s)
                    if after_s is not None:
                        after_engine.append(after_s)

    while (waiting or sending) and time.monotonic() < deadline:
        now = time.monotonic()
        while waiting and now >= first_s + held[waiting[0]] - first_ready_s:
            i = waiting.pop(0)
            source = NetworkSource(f"c{i}", 16000)  # live, as a network client is
            pipeline = min(pipelines, key=lambda p: sum(1 for q in owner.values() if q is p))
            try:
                pipeline.add_source(source)
            except UserError:  # at capacity, as the server would refuse it
                refused += 1
                continue
            owner[source.stream] = pipeline
            started[source.stream] = now
            sending[source.stream] = (source, audio[assign[i]], now, 0)
        for label, (source, samples, t0, first) in list(sending.items()):
            while first < samples.shape[0] and now >= t0 + first / 16000:
                source.push_samples(samples[first:first + step], time.monotonic_ns())
                first += step
            if first >= samples.shape[0]:
                del sending[label]
                owner.pop(label).remove_source(label)  # the client's end: commit and close
                ended.add(label)
            else:
                sending[label] = (source, samples, t0, first)
        drain()
        time.sleep(0.005)
    # Every ended stream's finals, until the engine lists none of them.
    while time.monotonic() < deadline:
        drain()
        statuses = [pipeline.latest_status() for pipeline in pipelines]
        if all(s is not None and not ended.intersection(s.streams) for s in statuses):
            break
        time.sleep(0.02)
    drain()
    for pipeline in pipelines:
        pipeline.stop()
    drain()
    result = {kind: {"p50_s": percentile(v, 50), "p99_s": percentile(v, 99), "n": len(v)}
              for kind, v in latency.items()}
    result["after_engine_ms"] = ms_quantiles(after_engine)
    result["refused"] = refused + len(engine_refused)
    result["engines"] = engines
    result["wall_s"] = round(time.monotonic() - first_s, 1)
    result["from_unix_s"] = round(time.time() - (time.monotonic() - first_s), 3)  # the engines loaded
    result["feeding"] = f"one thread, {CHUNK_S * 1000:.0f} ms messages at real-time pace, NetworkSource"
    return result


def _py_spy(pid: int, out: Path) -> subprocess.Popen:
    """``py-spy record`` of ``pid`` and its children (a server's model process and front-ends),
    speedscope format, every thread, idle included; SIGINT makes it write ``out``."""
    spy = Path(sys.executable).parent / "py-spy"
    spy = str(spy) if spy.exists() else (shutil.which("py-spy") or "py-spy")
    return subprocess.Popen([spy, "record", "--nonblocking", "--subprocesses", "--pid", str(pid), "--format",
                             "speedscope", "--threads", "--idle", "--rate", "50", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def steady_cpu(samples: list[tuple[float, float]], start_s: float, ramp_s: float, audio_s: float,
               connections: int) -> dict:
    """The server's CPU while every connection streams: from 2 s after the last one opened to 2 s
    before the first one's audio ends (the ramp and the ends left out), as cores and per connection."""
    window = [(t, c) for t, c in samples if start_s + ramp_s + 2.0 <= t <= start_s + audio_s - 2.0]
    if len(window) < 2:
        return {}
    (t0, c0), (t1, c1) = window[0], window[-1]
    cores = (c1 - c0) / (t1 - t0)
    return {"cores_steady": round(cores, 3), "cores_steady_per_connection": round(cores / max(1, connections), 5),
            "steady_window_s": round(t1 - t0, 1)}


# -- main ------------------------------------------------------------------------------------------

def _value_list(flag: str, text: str, kind: type, low: float, high: float) -> list:
    """A comma-separated list of ``kind`` values, each from ``low`` to ``high``; otherwise the
    benchmark ends with one line naming ``flag``."""
    try:
        values = [kind(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not low <= v <= high for v in values):
        raise SystemExit(f"{flag} must be a comma-separated list of {low:g}..{high:g}, not {text!r}")
    return values


def _ms_list(flag: str, text: str | None, low_high: tuple[float, float]) -> list[float | None]:
    """A ``serve`` millisecond option's values: the server's default (``[None]``) or a list in its range."""
    return [None] if text is None else _value_list(flag, text, float, *low_high)


def _frontends_list(text: str) -> list[int]:
    from captioner.app.commands.serve import MAX_FRONTENDS

    return _value_list("--frontends", text, int, 1, MAX_FRONTENDS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=0.0,
                        help="audio per client, its recording looped (default: each recording once)")
    parser.add_argument("--ramp", type=float, default=20.0, help="new connections per second")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--max-streams", type=int, default=None, help="the server's --max-streams")
    parser.add_argument("--speech", type=Path, default=Path(os.environ.get("CAPTIONER_SPEECH_DIR", DEFAULT_SPEECH)))
    parser.add_argument("--client-processes", type=int, default=1, help="processes the clients are spread over")
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the same streams in-process (default: yes)")
    parser.add_argument("--timeout", type=float, default=900.0, help="each server run ends by then (s)")
    parser.add_argument("--silence", action="store_true",
                        help="clients send silence (the model never runs): what the front end and the "
                             "per-stream feature work cost per connection")
    parser.add_argument("--speakers", type=int, default=None, metavar="N",
                        help="only N of the clients, spread over the ramp, send speech; the others send "
                             "silence: the way back of a few captions under the network load of many")
    parser.add_argument("--isolation", choices=("inline", "process", "auto"), default=None,
                        help="where the server's model runs (serve --isolation; default: serve's own)")
    parser.add_argument("--engines-per-device", type=int, default=1, metavar="N",
                        help="serve --engines-per-device; the in-process baseline runs as many pipelines")
    parser.add_argument("--frontends", default="1", metavar="K[,K...]",
                        help="serve --frontends; several (e.g. 1,2): one server run each, one after the "
                             "other with the same clients, reported side by side (default 1)")
    parser.add_argument("--flush-ms", default=None, metavar="MS[,MS...]",
                        help="serve --frontend-flush-ms; several (e.g. 25,10): one server run each for every "
                             "--frontends value, reported side by side (default: the server's own)")
    parser.add_argument("--switch-ms", default=None, metavar="MS[,MS...]",
                        help="serve --gil-switch-ms; several (e.g. 5,1): one server run each, side by side, "
                             "against one baseline")
    parser.add_argument("--retry-s", type=float, default=0.0,
                        help="a client refused at capacity (1013) tries again with backoff for this long "
                             "after its first attempt, as the app's client does (default 0: no retry)")
    parser.add_argument("--py-spy", type=Path, default=None, metavar="FILE",
                        help="profile the server process and its children (the model's process, the "
                             "front-ends) while the clients run (py-spy record --pid --subprocesses, "
                             "speedscope format, all threads, idle included) into FILE")
    parser.add_argument("--gc-log", action="store_true",
                        help="log every process's garbage-collection pauses (the server, its front-ends and model "
                             "processes, the clients, the baseline) and report them per process (gc_pauses)")
    parser.add_argument("--gc-count-s", type=float, default=0.0, metavar="S",
                        help="with --gc-log: every S seconds each process also counts the objects its next full "
                             "collection would walk (objects_max / _median / _last in gc_pauses; a diagnosis: "
                             "the count holds each interpreter ~1 ms per 30,000 objects)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if not 1 <= args.clients <= MAX_CLIENTS:
        raise SystemExit(f"--clients must be 1..{MAX_CLIENTS}")
    if args.speakers is not None and not 1 <= args.speakers <= args.clients:
        raise SystemExit("--speakers must be 1..--clients")
    if args.gc_count_s and not args.gc_log:
        raise SystemExit("--gc-count-s needs --gc-log")
    if args.gc_count_s:
        os.environ[gc_pauses.COUNT_ENV] = f"{args.gc_count_s:g}"
    frontends = _frontends_list(args.frontends)
    from captioner.app.commands.serve import (
        FRONTEND_FLUSH_MS_RANGE,
        GIL_SWITCH_MS_RANGE,
    )

    flushes = _ms_list("--flush-ms", args.flush_ms, FRONTEND_FLUSH_MS_RANGE)
    switches = _ms_list("--switch-ms", args.switch_ms, GIL_SWITCH_MS_RANGE)
    speech = args.speech if (args.speech / "manifest.tsv").exists() else HERE.parent / "tests" / "data" / "speech"
    clips = english_clips(speech)
    clip_audio = {}
    repeats = {}
    for k, clip in enumerate(clips):
        clip_audio[k], repeats[k] = looped(pcm16k(clip.wav), args.seconds or clip.duration_s)
    clip_audio[SILENT], repeats[SILENT] = np.zeros(silent_samples(clips, args.seconds), "<i2"), 0
    if args.silence:
        args.baseline = False
    assign = [SILENT] * args.clients if args.silence else speaker_clips(args.clients, len(clips), args.speakers)
    audio_s = max(len(clip_audio[k]) for k in set(assign)) / 16000
    client_timeout_s = min(args.timeout, args.clients / args.ramp + args.retry_s + audio_s + 180.0)

    import tempfile

    token = "bench-" + os.urandom(16).hex()
    token_file = Path(tempfile.mkdtemp(prefix="bench-serve-")) / "token"
    token_file.write_text(token)
    runs, held_any = [], {}
    gc_folder = Path(tempfile.mkdtemp(prefix="bench-serve-gc-")) if args.gc_log else None
    variants = [(count, flush_ms, switch_ms) for count in frontends for flush_ms in flushes for switch_ms in switches]
    for k, (count, flush_ms, switch_ms) in enumerate(variants):
        if gc_folder is not None:
            gc_pauses.enable(gc_folder / f"served-{k}")
        result, held_indices = serve_run(args, count, clips, clip_audio, repeats, assign, audio_s, client_timeout_s,
                                         token, token_file, flush_ms, switch_ms)
        if gc_folder is not None:
            result["gc_pauses"] = gc_pauses.summary(gc_folder / f"served-{k}", result["from_unix_s"])
        runs.append(result)
        held_any.update(held_indices)
        if args.json is not None:  # what was served is kept even if a later run runs out of time
            args.json.write_text(json.dumps(_combined(runs), indent=2) + "\n")
    if args.baseline:
        print("in-process baseline …", file=sys.stderr, flush=True)
        from captioner.app.commands.serve import SERVE_ISOLATION

        profiler = None
        if args.py_spy is not None:  # this process (the baseline's pipeline) and its model's process
            profiler = _py_spy(os.getpid(), args.py_spy.with_name(f"{args.py_spy.stem}-baseline{args.py_spy.suffix}"))
        try:
            if gc_folder is not None:
                gc_pauses.enable(gc_folder / "baseline")
            local = baseline(clips, assign, held_any, args.seconds, args.model, args.device, client_timeout_s,
                             args.isolation or SERVE_ISOLATION, args.engines_per_device)
        finally:
            if profiler is not None:
                profiler.send_signal(2)
                profiler.wait(60)
        if gc_folder is not None:
            local["gc_pauses"] = gc_pauses.summary(gc_folder / "baseline", local["from_unix_s"])
        for result in runs:
            result["latency_in_process"] = local
            for kind in ("partial", "final"):
                served_p99 = result["latency_served"][kind]["p99_s"]
                local_p99 = local[kind]["p99_s"]
                if served_p99 is not None and local_p99 is not None:
                    result.setdefault("p99_over_in_process_ms", {})[kind] = round(1000 * (served_p99 - local_p99), 1)
            result["serving_added_p99_ms"] = serving_added_p99_ms(result, local)
            result["serving_added_p99_parts_ms"] = serving_added_p99_parts(result, local)
    combined = _combined(runs)
    text = json.dumps(combined, indent=2)
    print(text)
    if len(runs) > 1:
        print(_side_by_side(runs), file=sys.stderr)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0 if not any(r["failed"] for r in runs) else 1


def serving_added_p99_parts(served: dict, local: dict) -> dict | None:
    """The p99s that :func:`serving_added_p99_ms` is made of, and their signed sum: the audio's
    way in (front-end to the engine's inbox, the hub's count; 0 with one process, where the
    WebSocket loop hands audio straight to the source), the served way back after the engine,
    and the in-process pipeline's own way back, taken off. ``None`` without both ways back.

    Each p99 is of its own sample (audio messages; the served run's captions; the baseline's,
    another run whose captions are not the same ones), so the sum is a difference of
    percentiles, not the percentile of any caption's added time, and it goes below zero
    whenever the baseline's way back has the longer tail (its own drain loop, a collection in
    this process), even though serving cannot take time away."""
    back, local_back = served.get("after_engine_ms", {}).get("p99"), local.get("after_engine_ms", {}).get("p99")
    if back is None or local_back is None:
        return None
    inbound = served.get("frontend_to_engine_ms", {}).get("p99") or 0.0
    return {"way_in_p99": inbound, "way_back_served_p99": back, "way_back_in_process_p99": local_back,
            "difference_of_p99s": round(back + inbound - local_back, 1)}


def serving_added_p99_ms(served: dict, local: dict) -> float | None:
    """What the server adds to an update's latency at p99, apart from the engine: the way in
    plus the way back, less the in-process pipeline's own way back (p99s added: a bound, not a
    quantile of sums; :func:`serving_added_p99_parts`). Never below 0: a negative difference of
    p99s says the baseline's tail was the longer one, i.e. nothing the server added was seen
    above the two runs' noise, and it is reported as 0 with the signed figure kept in
    ``serving_added_p99_parts_ms``. (Pairing each caption with its twin in the baseline would
    not help: the two engines step at other times, so their partials end elsewhere and their
    commits need not match, and a pair's difference is as signed as the p99s'.)"""
    parts = serving_added_p99_parts(served, local)
    return None if parts is None else max(0.0, parts["difference_of_p99s"])


def _combined(runs: list[dict]) -> dict:
    """One run as before; several as ``{"runs": [...]}``."""
    return runs[0] if len(runs) == 1 else {"runs": runs}


def _side_by_side(runs: list[dict]) -> str:
    rows = [("frontends", lambda r: r["frontends"]), ("front-end flush ms", lambda r: r.get("frontend_flush_ms") or "default"),
            ("GIL switch ms", lambda r: r.get("gil_switch_ms") or "default"),
            ("held / refused / failed",
            lambda r: f"{r['held']} / {r['refused']} / {r['failed']}"),
            ("CPU ms per conn per audio-s: hub", lambda r: r["server_cpu"].get("hub_ms_per_connection_audio_s")),
            ("  front-ends", lambda r: r["server_cpu"].get("frontends_ms_per_connection_audio_s")),
            ("  together", lambda r: r["server_cpu"].get("ms_per_connection_audio_s")),
            ("cores steady: hub / front-ends", lambda r: f"{r['server_cpu'].get('hub_cores_steady')} / "
                                                         f"{r['server_cpu'].get('frontends_cores_steady')}"),
            ("final latency p50 / p99 s", lambda r: f"{r['latency_served']['final']['p50_s']} / "
                                                    f"{r['latency_served']['final']['p99_s']}"),
            ("partial latency p50 / p99 s", lambda r: f"{r['latency_served']['partial']['p50_s']} / "
                                                      f"{r['latency_served']['partial']['p99_s']}"),
            ("engine dropped frames", lambda r: r["engine_dropped_frames"]),
            ("engine inbox deepest", lambda r: r["engine_queue_depth_max"]),
            ("status gap p99 s", lambda r: r["status_gap_p99_s"]),
            ("front-end -> engine p50 / p99 ms", lambda r: "{p50} / {p99}".format(
                **r.get("frontend_to_engine_ms", {"p50": "-", "p99": "-"}))),
            ("status delay p50 / p99 ms", lambda r: f"{r['status_delay_ms']['p50']} / {r['status_delay_ms']['p99']}"),
            ("serving loop late p50 / p99 / max ms", lambda r: " / ".join(
                str(v) for v in (r.get("server_loop_late_ms") or {"-": "-"}).values())),
            ("outbox -> front-end p50 / p99 / max ms", lambda r: " / ".join(
                str(v) for v in (r.get("outbox_to_frontend_ms") or {"-": "-"}).values())),
            ("serving_added_p99_ms", lambda r: r.get("serving_added_p99_ms", "-")),
            ("committed WER", lambda r: r["committed_wer"])]
    return "\n".join(f"{name:34s}" + "".join(f"{str(get(r)):>22s}" for r in runs) for name, get in rows)


def serve_run(args, frontends: int, clips, clip_audio, repeats, assign, audio_s: float, client_timeout_s: float,
              token: str, token_file: Path, flush_ms: float | None = None,
              switch_ms: float | None = None) -> tuple[dict, set[int]]:
    """One server (``--frontends frontends``, ``--frontend-flush-ms flush_ms``, ``--gil-switch-ms
    switch_ms``), the clients against it, what they saw and what it cost."""
    started = time.monotonic()
    server = ServerProcess(args.model, args.device, token_file, args.max_streams, args.isolation, frontends,
                           args.engines_per_device, flush_ms, switch_ms)
    up_unix_s = time.time()  # its engines loaded, its start-up frozen: what gc_pauses counts from
    print(f"server (--frontends {frontends}{f', flush {flush_ms:g} ms' if flush_ms else ''}"
          f"{f', GIL switch {switch_ms:g} ms' if switch_ms else ''}) up in {time.monotonic() - started:.1f} s on port {server.port}; "
          f"{args.clients} clients, {audio_s:.0f} s of audio each, {args.ramp:g}/s", file=sys.stderr, flush=True)
    url = f"ws://127.0.0.1:{server.port}"
    profiler = None
    if args.py_spy is not None:  # its own process, not the server's child: its CPU is not counted
        out = args.py_spy
        if "," in args.frontends or any(a and "," in a for a in (args.flush_ms, args.switch_ms)):  # one per run
            out = out.with_name(f"{out.stem}-fe{frontends}-{time.strftime('%H%M%S')}{out.suffix}")
        profiler = _py_spy(server.process.pid, out)
    (hub0, fronts0), wall0 = server.cpu_split(), time.monotonic()
    peak_rss = server.rss_bytes()
    sampling = threading.Event()
    # (wall, hub CPU s, front-ends CPU s, the serve process's own CPU s), once a second
    cpu_samples: list[tuple[float, float, float, float]] = []

    import psutil

    host_busy_pct: list[float] = []  # the whole host's CPU, once a second (clients and server share it)
    psutil.cpu_percent(interval=None)

    def sample_rss() -> None:
        nonlocal peak_rss
        while not sampling.wait(1.0):
            peak_rss = max(peak_rss, server.rss_bytes())
            cpu_samples.append((time.monotonic(), *server.cpu_split(), server.own_cpu_s()))
            host_busy_pct.append(psutil.cpu_percent(interval=None))

    threading.Thread(target=sample_rss, daemon=True).start()
    try:
        if args.client_processes > 1:
            shares = [list(range(args.clients))[p::args.client_processes] for p in range(args.client_processes)]
            with multiprocessing.get_context("spawn").Pool(args.client_processes) as pool:
                parts = pool.map(_client_process, [(s, url, token, clip_audio, assign, args.ramp, client_timeout_s,
                                                    args.retry_s) for s in shares])
            records = {k: v for part, _, _ in parts for k, v in part.items()}
            clients_cpu_s = sum(cpu_s for _, cpu_s, _ in parts)
            clients_late_ms = [ms for _, _, late_ms in parts for ms in late_ms]
        else:
            audio = {i: clip_audio[assign[i]] for i in range(args.clients)}
            lag = LoopLag()
            records = asyncio.run(run_clients(list(range(args.clients)), url, token, audio, args.ramp,
                                              client_timeout_s, args.retry_s, lag))
            clients_cpu_s = None  # in this process, beside the sampler: not told apart
            clients_late_ms = list(lag.late_ms)
        hub1, fronts1 = server.cpu_split()
        wall_s = time.monotonic() - wall0
    finally:
        sampling.set()
        if profiler is not None:
            profiler.send_signal(2)  # SIGINT: py-spy writes its file
            try:
                profiler.wait(60)
            except subprocess.TimeoutExpired:
                profiler.kill()
        server.stop()
    hub_s, fronts_s = hub1 - hub0, fronts1 - fronts0
    cpu_s = hub_s + fronts_s

    held = [r for r in records.values() if r["ready"] and r["close"] == 1000]
    refused = [r for r in records.values() if r["close"] == 1013 or "1013" in str(r["reason"])]
    refused_ids = {id(r) for r in refused}
    held_ids = {id(r) for r in held}
    failed = [r for r in records.values() if id(r) not in held_ids and id(r) not in refused_ids]
    latency = {"partial": [], "final": []}
    for r in held:
        for kind, value in r["latency"]:
            latency[kind].append(value)
    try:
        normalisers = _normalisers()
        import jiwer  # noqa: F401 - score() needs it
    except ImportError:  # a GPU box without them: a plain word error rate instead
        normalisers = None
    errors = units = 0
    per_client: list[tuple[float, str, str, object]] = []  # (WER, reference, committed, close code)
    for r in held:
        k = assign[r["index"]]
        if k == SILENT:
            continue
        committed = " ".join(c["text"] for c in r["captions"] if c["kind"] == "final")
        reference = " ".join([clips[k].reference] * repeats[k])
        e, n = score(reference, committed, "en", normalisers)[:2] if normalisers else plain_errors(reference, committed)
        errors, units = errors + e, units + n
        per_client.append((e / max(1, n), reference, committed, r.get("close")))
    close_codes: dict[str, int] = {}
    for r in held:
        close_codes[str(r.get("close"))] = close_codes.get(str(r.get("close")), 0) + 1
    connection_audio_s = max(1.0, audio_s * max(1, len(held)))
    connections = len(held) + len(failed)
    ramp_s = args.clients / args.ramp
    steady = steady_cpu([(t, h + f) for t, h, f, _ in cpu_samples], wall0, ramp_s, audio_s, connections)
    steady_hub = steady_cpu([(t, h) for t, h, _, _ in cpu_samples], wall0, ramp_s, audio_s, connections)
    steady_fronts = steady_cpu([(t, f) for t, _, f, _ in cpu_samples], wall0, ramp_s, audio_s, connections)
    steady_own = steady_cpu([(t, o) for t, _, _, o in cpu_samples], wall0, ramp_s, audio_s, connections)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "frontends": frontends, "frontend_flush_ms": flush_ms,
        "gil_switch_ms": switch_ms,
        "engines_per_device": args.engines_per_device,
        "model": args.model, "device": args.device, "clients": args.clients, "audio_s_per_client": round(audio_s, 1),
        "held": len(held), "refused": len(refused), "failed": len(failed),
        "held_after_refusals": sum(1 for r in held if r["refusals"]),
        "refusals_retried": sum(r["refusals"] for r in records.values()),
        "refusal_reasons": dict(collections.Counter(
            k for r in records.values()
            for k in r["refusal_reasons"] + ([refusal_kind(r["reason"])] if id(r) in refused_ids else []))
            .most_common(8)),
        "failures": sorted({f"{r['close']}: {r['reason']}"[:120] for r in failed})[:5],
        "latency_served": {kind: {"p50_s": percentile(v, 50), "p99_s": percentile(v, 99), "n": len(v)}
                           for kind, v in latency.items()},
        # The served updates' way back after the engine made them (see after_engine_s).
        "after_engine_ms": ms_quantiles([v for r in held for v in r["after_engine"]]),
        # Of which the clients' own loops may account for this much (they date what they receive).
        "client_loop_late_ms": _late_dict(lateness_quantiles_ms(clients_late_ms)),
        "server_cpu": {"cores_total": round(cpu_s / wall_s, 3),
                       "cores_per_connection": round(cpu_s / wall_s / max(1, connections), 4),
                       # CPU seconds per second of audio taken in, per connection: comparable
                       # across runs where the server kept pace and where it fell behind.
                       "core_s_per_connection_audio_s": round(cpu_s / connection_audio_s, 5),
                       "ms_per_connection_audio_s": round(1000 * cpu_s / connection_audio_s, 2),
                       "hub_ms_per_connection_audio_s": round(1000 * hub_s / connection_audio_s, 2),
                       "frontends_ms_per_connection_audio_s": round(1000 * fronts_s / connection_audio_s, 2),
                       "hub_cores_total": round(hub_s / wall_s, 3), "frontends_cores_total": round(fronts_s / wall_s, 3),
                       **steady,
                       "hub_cores_steady": steady_hub.get("cores_steady"),
                       "frontends_cores_steady": steady_fronts.get("cores_steady"),
                       # The serve process alone, its threads under one interpreter lock: near 1.0 the lock
                       # is the likely limit (native code running without it can take this past 1).
                       "serve_process_cores_steady": steady_own.get("cores_steady"),
                       "peak_rss_mib": round(peak_rss / 2**20)},
        "committed_wer": round(errors / units, 4) if units else None,
        # Where the errors are: each held client's own WER, how its connection closed, and the
        # worst three (a stream refused after its "ready", or one whose text never came, shows here).
        "client_wer": {"p50": percentile([w for w, *_ in per_client], 50),
                       "p90": percentile([w for w, *_ in per_client], 90),
                       "no_finals": sum(1 for _, _, text, _ in per_client if not text.strip())},
        "held_close_codes": close_codes,
        "worst_clients": [{"wer": round(w, 3), "close": code, "reference": ref[:240], "committed": text[:240]}
                          for w, ref, text, code in sorted(per_client, key=lambda c: -c[0])[:3]],
        "wer_normaliser": "whisper english" if normalisers else "plain",
        "engine_dropped_frames": max((r.get("dropped_frames") or 0 for r in held), default=None),
        "engine_queue_depth_max": max((r.get("queue_depth_max", 0) for r in held), default=None),
        "status_gap_p99_s": percentile([g for r in held for g in r.get("status_gaps", [])], 99),
        "status_delay_ms": {q: round(1000 * v, 1) if v is not None else None for q, v in
                            (("p50", percentile([d for r in held for d in r.get("status_delay_s", [])], 50)),
                             ("p99", percentile([d for r in held for d in r.get("status_delay_s", [])], 99)))},
        "statuses_per_client_s": round(np.mean([r["statuses"] / max(1.0, r.get("wall_s", 1.0)) for r in held]), 2)
        if held else None,
    }
    time.sleep(0.5)  # the server's last lines on their way to server.err
    for line in server.err[-5:]:
        found = re.search(r"audio waited p50 ([\d.]+) / p99 ([\d.]+) ms", line)
        if found:  # --frontends > 1: front-end -> the engine's inbox, the hub's own count
            result["frontend_to_engine_ms"] = {"p50": float(found[1]), "p99": float(found[2])}
        # How late the server's (hub's) own loop ran and, with --frontends > 1, each front-end's,
        # and each caption's way from its engine's outbox to its front-end: the served way back's
        # part inside the server (the in-process one ends at the outbox).
        for said, key in (("the serving loop ran late", "server_loop_late_ms"),
                          ("the front-ends' loops", "frontend_loop_late_ms"),
                          ("captions from the engine's outbox to the front-ends", "outbox_to_frontend_ms")):
            found = re.search(re.escape(said) + r" p50 ([\d.]+) / p99 ([\d.]+) / max ([\d.]+) ms", line)
            if found:
                result[key] = _late_dict(tuple(float(v) for v in found.groups()))
    if failed:
        result["server_log_tail"] = [line.rstrip() for line in server.err[-30:]]
    if args.isolation:
        result["isolation"] = args.isolation
    result["served_wall_s"] = round(wall_s, 1)
    result["host_cpu"] = {"cores": psutil.cpu_count(), "busy_pct_p50": percentile(host_busy_pct, 50),
                          "busy_pct_max": max(host_busy_pct, default=None),
                          "clients_cores": round(clients_cpu_s / wall_s, 2) if clients_cpu_s is not None else None}
    result["server_timeline_fields"] = ["s", *TIMELINE_FIELDS, *TIMELINE_GPU_FIELDS]
    result["server_timeline"] = server_timeline(records.values())
    result["from_unix_s"] = round(up_unix_s, 3)
    return result, {r["index"]: r["ready_mono_s"] for r in held}


if __name__ == "__main__":
    sys.exit(main())
