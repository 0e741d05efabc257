"""TLS handshakes that fail between the websockets sync client and a websockets TLS server on
loopback: the servers' context (``captioner.serve.tls``, no TLS 1.3 session tickets) beside the
same context with Python's default of two tickets, in one run.

Each of ``--threads`` client threads opens ``--connections`` connections one after the other
(open, read the server's first message, close), all to one server per context; a connection
that does not open or does not read its message counts as failed, and its error is tallied.
Why the tickets matter: ``src/captioner/serve/tls.py``.

    python benchmarks/bench_tls_handshakes.py                          # 6 threads x 500, both contexts
    python benchmarks/bench_tls_handshakes.py --connections 100 --json tls.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from captioner.serve.tls import server_tls_context  # noqa: E402

DEFAULT_TICKETS = 2
"""Python's own ``SSLContext.num_tickets`` for a TLS 1.3 server."""


def make_certificate(folder: Path) -> tuple[str, str]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


class GreetingServer:
    """A websockets TLS server on its own loop thread that sends every connection one message."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        from websockets.asyncio.server import serve

        async def greet(ws) -> None:
            await ws.send("ready")
            await ws.wait_closed()

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with serve(greet, "127.0.0.1", 0, ssl=self.context, compression=None) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> GreetingServer:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *_exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


def run_clients(port: int, cafile: str, threads: int, connections: int) -> dict:
    from websockets.sync.client import connect

    client_context = ssl.create_default_context(cafile=cafile)
    errors: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def one_thread() -> None:
        for _ in range(connections):
            try:
                with connect(f"wss://127.0.0.1:{port}/", ssl=client_context, open_timeout=30) as ws:
                    ws.recv(timeout=30)
            except Exception as error:  # noqa: BLE001 - every failure is counted, by its kind
                with lock:
                    errors[f"{type(error).__name__}: {error}"] += 1

    start_s = time.monotonic()
    workers = [threading.Thread(target=one_thread) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return {"connections": threads * connections, "failed": sum(errors.values()), "errors": dict(errors),
            "wall_s": round(time.monotonic() - start_s, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=6, help="client threads (default 6)")
    parser.add_argument("--connections", type=int, default=500, help="connections per thread (default 500)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.connections < 1:
        parser.error("--threads and --connections must be at least 1")
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        cert, key = make_certificate(Path(folder))
        for name, tickets in (("captioner (no tickets)", None), (f"{DEFAULT_TICKETS} tickets", DEFAULT_TICKETS)):
            context = server_tls_context(cert, key)
            if tickets is not None:
                context.num_tickets = tickets
            with GreetingServer(context) as server:
                results[name] = run_clients(server.port, cert, args.threads, args.connections)
            row = results[name]
            print(f"{name:>24}: {row['failed']} of {row['connections']} failed in {row['wall_s']} s"
                  + "".join(f"\n{'':>26}{count} x {error}" for error, count in row["errors"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                               "threads": args.threads, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
