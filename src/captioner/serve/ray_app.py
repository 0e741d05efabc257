"""`captioner serve --ray`: the same protocol on a Ray Serve cluster, one replica per GPU.

Each replica (:class:`CaptionReplica`) holds an engine (an :class:`~captioner.serve.engine_link.EngineLink`
with one device: the GPU Ray gave it, or the CPU) and runs the very connection logic of
:class:`~captioner.serve.server.CaptionServer` behind Ray Serve's HTTP proxy, through a FastAPI
WebSocket route (Starlette's WebSocket adapted to the surface the server uses). The proxy spreads
connections over the replicas; a replica that dies is restarted by Ray, and its clients, whose
connections broke (1006/1011), connect again and are placed on a live one.

Needs the optional extra ``captioner[cluster]`` (``ray[serve]``); nothing else in the package
imports this module. docs/cluster.md says how to start a cluster, deploy, scale.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the route's ``WebSocket``
# annotation as a live class (imported inside build_app), not as a string it cannot resolve.

import os
import sys
import time
from urllib.parse import urlencode

from captioner.errors import UserError
from captioner.serve import protocol

APP_NAME = "captioner"


def _import_ray():
    try:
        import ray
        from ray import serve
    except ImportError:
        raise UserError("--ray needs Ray Serve: pip install 'captioner[cluster]'") from None
    return ray, serve


class StarletteConnection:
    """A Starlette WebSocket with the surface :meth:`CaptionServer.handle` uses (that of a
    websockets ``ServerConnection``): ``request.path``, ``remote_address``, async iteration
    over messages, ``send``, ``close``, ``close_code``."""

    class _Request:
        def __init__(self, path: str) -> None:
            self.path = path

    def __init__(self, websocket) -> None:
        self._ws = websocket
        query = urlencode(list(websocket.query_params.multi_items()))
        self.request = self._Request(websocket.url.path + (f"?{query}" if query else ""))
        client = websocket.client
        self.remote_address = (client.host, client.port) if client is not None else None
        self.close_code: int | None = None

    def __aiter__(self):
        return self._messages()

    async def _messages(self):
        from starlette.websockets import WebSocketDisconnect

        while True:
            try:
                message = await self._ws.receive()
            except (WebSocketDisconnect, RuntimeError):
                return
            if message["type"] == "websocket.disconnect":
                self.close_code = message.get("code")
                return
            data = message.get("bytes")
            if data is None:
                data = message.get("text")
            if data is None:
                continue
            if len(data) > protocol.MAX_MESSAGE_BYTES:
                raise protocol.ProtocolError(protocol.CLOSE_TOO_BIG, f"message of {len(data)} bytes is over "
                                                                     f"the {protocol.MAX_MESSAGE_BYTES}-byte limit")
            yield data

    async def send(self, text: str) -> None:
        from websockets.exceptions import ConnectionClosedError

        try:
            await self._ws.send_text(text)
        except Exception as error:  # the client went away: what the server expects from websockets
            raise ConnectionClosedError(None, None) from error

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.close_code is not None:
            return
        self.close_code = code
        try:
            await self._ws.close(code=code, reason=reason)
        except Exception:  # already closed by the client
            pass


def build_app(model: str = "tiny.en", language: str | None = None, token: str | None = None,
              use_gpu: bool = False, num_replicas: int = 1, max_streams: int | None = None,
              replica_cpus: float = 1.0, speakers: str = "auto", policy: str = "auto"):
    """The Ray Serve application (``serve.run(build_app(...))``): ``num_replicas`` replicas,
    each with one GPU when ``use_gpu``, each an engine with many streams (speaker labels and the
    streaming policy as ``serve --speakers`` and ``--policy`` say)."""
    ray, serve = _import_ray()
    from fastapi import FastAPI, WebSocket

    api = FastAPI()

    @serve.deployment(num_replicas=num_replicas, max_ongoing_requests=100_000,
                      ray_actor_options={"num_gpus": 1 if use_gpu else 0, "num_cpus": replica_cpus},
                      health_check_period_s=2, health_check_timeout_s=30)
    @serve.ingress(api)
    class CaptionReplica:
        """One replica: an engine on its device and the server's connection logic."""

        def __init__(self) -> None:
            from captioner.engine.pipeline import Pipeline, telemetry_gpu_index
            from captioner.gpu.telemetry import TelemetrySampler
            from captioner.heap import freeze_start_up
            from captioner.serve.engine_link import EngineLink, server_engine_config
            from captioner.serve.server import CaptionServer

            device = "cuda:0" if use_gpu else "cpu"  # Ray hides the other GPUs from this process
            # Inline, as `captioner serve` (SERVE_ISOLATION there says why).
            config = server_engine_config(speakers, policy=policy)
            self.link = EngineLink([device], lambda d: Pipeline([], model=model, language=language, device=d,
                                                                config=config, isolation="inline"),
                                   lambda d: TelemetrySampler(gpu_index=telemetry_gpu_index(d)),
                                   max_streams_per_device=max_streams)
            self.link.start()
            freeze_start_up()  # its model is loaded here (inline): later collections skip it
            # The proxy is the public face; the token is checked here, before the upgrade.
            self.server = CaptionServer(self.link, "127.0.0.1", 0, token=None,
                                        log=lambda line: print(f"captioner: {line}", file=sys.stderr, flush=True))
            self.pid = os.getpid()

        @api.websocket(protocol.PATH)
        async def listen(self, websocket: WebSocket) -> None:
            if token is not None and not protocol.token_matches(websocket.headers.get("authorization"), token):
                await websocket.close(code=protocol.CLOSE_POLICY, reason="missing or wrong bearer token")
                return
            await websocket.accept()
            await self.server.handle(StarletteConnection(websocket))

        @api.get("/v1/replica")
        async def replica(self) -> dict:
            """Which process answered and how busy it is (for operators and the tests)."""
            return {"pid": self.pid, "streams": self.link.streams(), "model": self.link.model}

        def check_health(self) -> None:
            worker = self.link.workers[0]
            if worker.pipeline.error is not None:
                raise RuntimeError(f"the engine failed: {worker.pipeline.error}")

    return CaptionReplica.bind()


def run_ray(args, token: str | None) -> int:
    """`captioner serve --ray`: joins the Ray cluster (``RAY_ADDRESS``, else a running local one,
    else starts one), deploys the application behind Serve's proxy on ``--host:--port``, and
    waits for Ctrl-C, which deletes it."""
    ray, serve = _import_ray()
    if args.certfile:
        raise UserError("--ray serves through Ray Serve's proxy: put TLS in front of it (docs/cluster.md)")
    if args.transcripts:
        raise UserError("--transcripts is not available with --ray (each replica would write on its own node)")
    # No address: RAY_ADDRESS, else the cluster `ray start` made on this machine, else a new local one.
    ray.init(include_dashboard=False, logging_level="WARNING")
    gpus = int(ray.cluster_resources().get("GPU", 0))
    use_gpu = gpus > 0 and args.device != "cpu"
    replicas = args.replicas or (gpus if use_gpu else 1)
    serve.start(http_options={"host": args.host, "port": args.port})
    started = time.monotonic()
    serve.run(build_app(args.model, args.language, token, use_gpu, replicas, args.max_streams,
                        speakers=getattr(args, "speakers", "auto"), policy=getattr(args, "policy", "auto")),
              name=APP_NAME, route_prefix="/")
    print(f"captioner: Ray Serve: {replicas} replica(s) of {args.model} on {'GPUs' if use_gpu else 'CPUs'} "
          f"up in {time.monotonic() - started:.0f} s; ws://{args.host}:{args.port}{protocol.PATH}; Ctrl-C stops",
          file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        serve.delete(APP_NAME)
    return 0

