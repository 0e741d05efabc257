"""The servers' TLS context (``captioner serve --certfile/--keyfile``, each front-end process).

One setting matters beyond the certificate: the server sends no TLS 1.3 session tickets
(``num_tickets = 0``). A TLS 1.3 server sends its tickets after the handshake, so they reach a
client just as it writes its HTTP upgrade request. The websockets sync client (``captioner
listen --server``, the desktop app, the tests) reads on its own thread from the moment the
socket is open, and Python's SSL socket is not safe for a read and a write at the same time:
now and then the request went out garbled, the server dropped the connection, and the client
read "did not receive a valid HTTP response"; without tickets none failed (docs/serve.md,
"Security"; ``benchmarks/bench_tls_handshakes.py``). A caption connection lasts a meeting, so
resumption tickets save nothing worth that.
"""

from __future__ import annotations

import ssl


def server_tls_context(certfile: str, keyfile: str | None) -> ssl.SSLContext:
    """A TLS server context for the certificate chain in ``certfile`` (its key in ``keyfile``,
    or in ``certfile`` when ``None``). Raises ``OSError`` or ``ssl.SSLError`` for files that
    cannot be read or do not hold a certificate and its key."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile, keyfile)
    context.num_tickets = 0  # see the module's docstring: tickets race the client's upgrade request
    return context
