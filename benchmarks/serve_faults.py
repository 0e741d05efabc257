"""The faults of issue 47 against a real `captioner serve` (tiny.en on the CPU, loopback), one after
another, as a hostile tester tried them; prints what each client was told and what the server's
log said, as JSON (docs/reliability.md, "A shared server one client cannot break").

    python benchmarks/serve_faults.py [--frontends 2] [--ping] [--json out.json]

Faults: a language no model has (then whether the next client is served), a language the model
lacks, connections that send no audio, more connections from one address than the limit, a
message of more audio than a client may run ahead, a message over 1 MiB, the transcript files
the refused and broken connections left, and SIGTERM right after a recording's last audio message
(last: it ends the server). With ``--ping``, instead: a client that answers no keepalive ping (50 s).
With ``--many SPEED``, instead: four clients stream a recording each at SPEED times real time, and
SIGTERM comes right after the last one's last audio message.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from captioner.serve import protocol  # noqa: E402

TOKEN = "fault-token-0123456789abcdef"
SPEECH = Path("/work/shared/speech/audio")
CLIP = SPEECH / "en_ls_1089-134691-0001.wav"
FOUR = ("en_ls_1089-134691-0001", "en_ls_1089-134686-0001", "en_ljspeech_LJ001-0001", "en_ami_ES2011a_hs0_40-46s")
IDLE_S = 3.0
PER_CLIENT = 4
SILENCE = np.zeros(1600, "<i2").tobytes()


def connect(port: int, **params):
    from websockets.sync.client import connect as ws_connect

    return ws_connect(f"ws://127.0.0.1:{port}{protocol.listen_path(**params)}", open_timeout=30, max_size=None,
                      additional_headers={"Authorization": f"Bearer {TOKEN}"}, compression=None).__enter__()


def outcome(ws, timeout_s: float = 60.0) -> dict:
    """Every message until the close: what the client was told."""
    from websockets.exceptions import ConnectionClosed

    finals, ready = [], False
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            ready = ready or message["type"] == "ready"
            if message["type"] == "caption" and message["kind"] == "final":
                finals.append(message["text"])
    except (ConnectionClosed, TimeoutError):
        pass
    return {"close": ws.close_code, "reason": ws.close_reason, "ready": ready, "finals": " ".join(finals).strip()}


def stream(port: int, path: Path, label: str, speed: float, got: dict, sent: threading.Barrier) -> None:
    """One recording at ``speed`` times real time, no ``end``; what came back goes into ``got``."""
    import soundfile as sf

    audio, rate = sf.read(str(path), dtype="int16")
    ws = connect(port, label=label, sample_rate_hz=rate)
    admitted(ws)
    receiver = threading.Thread(target=lambda: got.update({label: outcome(ws, 180)}), daemon=True)
    receiver.start()
    step, started = rate // 10, time.monotonic()
    for first in range(0, len(audio), step):
        ws.send(audio[first:first + step].tobytes())
        time.sleep(max(0.0, started + (first + step) / rate / speed - time.monotonic()))
    sent.wait()
    receiver.join(180)


def short_stream(port: int, label: str) -> dict:
    """A connection that sends 0.1 s of silence and ends (or is closed first)."""
    from websockets.exceptions import ConnectionClosed

    ws = connect(port, label=label)
    try:
        ws.send(SILENCE)
        ws.send(protocol.END_MESSAGE)
    except ConnectionClosed:
        pass
    return outcome(ws)


def readyz(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", protocol.READY_PATH)
    response = conn.getresponse()
    return f"{response.status} {response.read().decode().strip()}"


def keep_alive(sockets: list, stop: threading.Event) -> None:
    while not stop.wait(0.3):
        for ws in list(sockets):
            try:
                ws.send(SILENCE)
            except Exception:
                sockets.remove(ws)


def admitted(ws) -> bool:
    try:
        return '"ready"' in ws.recv(timeout=60)
    except Exception:
        return False


def unanswered_pings(port: int, hold_s: float = 50.0) -> None:
    """A client that completes the handshake, then never reads nor answers a ping, for ``hold_s``
    (the server pings every 20 s and gives up 20 s later)."""
    sock = socket.create_connection(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET {protocol.listen_path('Deaf')} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                  f"Authorization: Bearer {TOKEN}\r\n\r\n").encode())
    time.sleep(hold_s)
    sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frontends", type=int, default=1)
    parser.add_argument("--ping", action="store_true",
                        help="instead: only a client that answers no ping (50 s; no idle timeout, which would close it first)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--many", type=float, metavar="SPEED",
                        help="instead: SIGTERM right after four recordings streamed at once at SPEED x real time")
    parser.add_argument("--no-language", action="store_true",
                        help="skip the unknown language (on a server from before issue 47 it ends the engine)")
    parser.add_argument("--old", action="store_true",
                        help="a server from before issue 47 (PYTHONPATH): without the options it lacks")
    args = parser.parse_args()
    import soundfile as sf

    work = Path(tempfile.mkdtemp(prefix="serve-faults-"))
    (work / "token").write_text(TOKEN)
    command = [sys.executable, "-m", "captioner", "serve", "--port", "0", "--model", "tiny.en", "--device", "cpu",
               "--token-file", str(work / "token"), "--transcripts", str(work / "t"), "--frontends",
               str(args.frontends)]
    if (args.ping or args.many) and not args.old:
        command += ["--idle-timeout-s", "0", "--drain-s", "60"]
    elif not args.old:
        command += ["--idle-timeout-s", f"{IDLE_S:g}", "--max-connections-per-client", str(PER_CLIENT),
                    "--drain-s", "30"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", str(ROOT / "src"))))
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(server.stderr), daemon=True).start()
    port = int(server.stdout.readline())
    results: dict = {"command": " ".join(command[1:])}
    try:
        if args.ping:
            started = time.monotonic()
            unanswered_pings(port)
            results["a client that answers no ping, held 50 s"] = [
                line.strip() for line in log if "closed" in line or "open" in line]
            results["seconds"] = round(time.monotonic() - started, 1)
            return finish(results, log, args.json)
        if args.many:
            got: dict = {}
            sent = threading.Barrier(len(FOUR) + 1)
            clients = [threading.Thread(target=stream, args=(port, SPEECH / f"{clip}.wav", clip[:20], args.many, got, sent))
                       for clip in FOUR]
            for client in clients:
                client.start()
            sent.wait()
            stopped = time.monotonic()
            server.send_signal(signal.SIGTERM)
            for client in clients:
                client.join(180)
            results[f"SIGTERM after four recordings at {args.many:g}x real time"] = {
                "closed_after_s": round(time.monotonic() - stopped, 1), "exit": server.wait(60), **got}
            return finish(results, log, args.json)
        if not args.no_language:
            results["language xx"] = outcome(connect(port, label="XX", language="xx"))
            results["the next client after xx"] = short_stream(port, "After")
            time.sleep(5.0)  # as the tester did: long after
            results["a client 5 s later"] = short_stream(port, "Later")
            results["/readyz after xx"] = readyz(port)
            if args.old:  # its engine is gone: what follows would only be refused
                return finish(results, log, args.json)
        results["language de on tiny.en"] = outcome(connect(port, label="DE", language="de"))

        idle = [connect(port, label=f"Idle{i}") for i in range(3)]
        started = time.monotonic()
        told = [outcome(ws, IDLE_S + 30) for ws in idle]
        results["3 connections without audio"] = {"closed_after_s": round(time.monotonic() - started, 1),
                                                  "told": sorted({(t["close"], t["reason"]) for t in told}, key=str)}

        held, stop = [connect(port, label=f"Held{i}") for i in range(PER_CLIENT)], threading.Event()
        alive = threading.Thread(target=keep_alive, args=(held, stop), daemon=True)
        alive.start()
        results[f"{PER_CLIENT} held connections admitted"] = sum(admitted(ws) for ws in held)
        results[f"connection {PER_CLIENT + 1} from the same address"] = outcome(connect(port, label="Over"))
        stop.set()
        alive.join()
        for ws in held:
            ws.send(protocol.END_MESSAGE)
            outcome(ws)

        big = connect(port, label="Big")
        admitted(big)
        big.send(np.zeros(16_000 * 11, "<i2").tobytes())  # 11 s of audio, 352,000 bytes
        results["one message of 11 s of audio (352,000 bytes)"] = outcome(big)
        huge = connect(port, label="Huge")
        admitted(huge)
        try:
            huge.send(b"\x00" * (protocol.MAX_MESSAGE_BYTES + 2))
        except Exception:
            pass
        results["one message over 1 MiB"] = outcome(huge)
        text = connect(port, label="Text")
        admitted(text)
        text.send("hello")
        results["a text message"] = outcome(text)
        time.sleep(1.0)
        results["transcript files so far (no connection committed a line)"] = len(list((work / "t").glob("*")))

        audio, rate = sf.read(str(CLIP), dtype="int16")
        whole = connect(port, label="Whole", sample_rate_hz=rate)
        admitted(whole)
        got: dict = {}
        receiver = threading.Thread(target=lambda: got.update(outcome(whole, 120)), daemon=True)
        receiver.start()
        step, started = rate // 10, time.monotonic()
        for first in range(0, len(audio), step):  # twice real time: seconds of it not captioned at the stop
            whole.send(audio[first:first + step].tobytes())
            time.sleep(max(0.0, started + (first + step) / rate / 2 - time.monotonic()))
        stopped = time.monotonic()
        server.send_signal(signal.SIGTERM)
        receiver.join(120)
        results["SIGTERM right after the last audio message (2x real time)"] = {
            **got, "closed_after_s": round(time.monotonic() - stopped, 1), "exit": server.wait(60)}
        results["transcript files at the end"] = len(list((work / "t").glob("*")))
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    finish(results, log, args.json)


def finish(results: dict, log: list[str], out: Path | None) -> None:
    time.sleep(0.5)
    results["server log"] = [line.strip() for line in log]
    text = json.dumps(results, indent=1)
    print(text)
    if out:
        out.write_text(text + "\n")


if __name__ == "__main__":
    main()
