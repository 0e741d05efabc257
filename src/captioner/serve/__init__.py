"""Captions over the network: ``captioner serve`` (an asyncio WebSocket server in front of the
engine's workers), its clients, and a Ray Serve application for more than one machine.

One protocol, :mod:`captioner.serve.protocol` (docs/protocol.md). Nothing here is imported by
the engine or the ui; the app wires the server and the clients in.
"""
