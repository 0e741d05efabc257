"""The servers' TLS context: a certificate that cannot be loaded is one line, the context sends
no session tickets, and the handshake benchmark (no tickets beside Python's two) runs."""

import json
import os
import ssl
import subprocess
import sys

from bench_loader import load_benchmark


def test_serve_refuses_a_certificate_it_cannot_load_on_one_line(tmp_path):
    not_a_certificate = tmp_path / "cert.pem"
    not_a_certificate.write_text("not a certificate\n")
    for files in (["--certfile", str(not_a_certificate)], ["--certfile", str(tmp_path / "missing.pem")]):
        done = subprocess.run([sys.executable, "-m", "captioner", "serve", "--port", "0", *files],
                              capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
        assert done.returncode != 0
        assert "cannot load the TLS certificate" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_handshake_benchmark_runs_both_contexts(tmp_path):
    out = tmp_path / "tls.json"
    assert load_benchmark("bench_tls_handshakes").main(["--threads", "2", "--connections", "5", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"captioner (no tickets)", "2 tickets"}
    ours = results["captioner (no tickets)"]
    assert ours["connections"] == 10 and ours["failed"] == 0, ours


def test_the_server_context_sends_no_session_tickets(tls_certificate):
    from websockets.sync.client import connect

    from captioner.serve.tls import server_tls_context

    greeting_server = load_benchmark("bench_tls_handshakes").GreetingServer
    cert, key = tls_certificate
    for tickets, expected in ((None, False), (2, True)):  # the check tells the two apart
        context = server_tls_context(cert, key)
        if tickets is not None:
            context.num_tickets = tickets
        with greeting_server(context) as server, \
                connect(f"wss://127.0.0.1:{server.port}/", ssl=ssl.create_default_context(cafile=cert)) as ws:
            assert ws.recv(timeout=30) == "ready"
            assert ws.socket.session.has_ticket is expected
