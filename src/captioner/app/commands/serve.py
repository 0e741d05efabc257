"""`captioner serve`: caption many clients' audio on this machine's GPU(s) over WebSockets.

The protocol is docs/protocol.md; running it, its security and what was measured, docs/serve.md.
Checks that need no model (the bind address against the token, the token and TLS files, the
port) are made before the model loads; each refusal is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from captioner.app.commands.policy_option import POLICY_CHOICES, add_speakers_argument
from captioner.app.interrupts import sigterm_as_interrupt, stop_requests
from captioner.errors import UserError
from captioner.serve import protocol
from captioner.serve.channel import FLUSH_S

DEFAULT_PORT = 8765
SERVE_ISOLATION = "auto"
"""Where each device's model runs: on a GPU a child process (a CUDA fault restarts it with the
streams' recent audio re-fed, docs/reliability.md, and the model's work has a core of its own
beside the network loop), on the CPU the worker thread. A stream the child's engine refuses at
capacity is reported as refused (1013) like one refused in-process, as a thousand-client run
showed (docs/serve.md, "Measured")."""


SERVE_SPEAKERS_HELP = ("label who speaks (Speaker 1, Speaker 2, ...) in each stream's captions: auto (the default) "
                       "every stream but one whose client says it is a microphone (source=microphone); on every "
                       "stream, off none (docs/speakers.md)")
SERVE_POLICY_HELP = ("when a word is final: auto (the default) localagreement, the policy a server's capacity is "
                     "measured with; alignatt-gpu or alignatt commit sooner and do better on conversation, for "
                     "fewer streams (each word is timed on the engine's thread; docs/serve.md)")

MAX_FRONTENDS = 64
FRONTENDS_AUTO_DOC = "half the CPU cores, 1 to 8"
FRONTEND_FLUSH_MS = 1000.0 * FLUSH_S
FRONTEND_FLUSH_MS_RANGE = (1.0, 100.0)
GIL_SWITCH_MS = 5.0
"""How long one thread of the serving process may keep the interpreter lock while another waits
for it (``sys.setswitchinterval``; CPython's own default). The serving loop, every engine's worker
and the threads that talk to the model processes share that one lock: each time the loop comes
back from a socket call it may wait this long per thread ahead of it (docs/serve.md)."""
GIL_SWITCH_MS_RANGE = (0.1, 50.0)

DRAIN_S_RANGE = (0.0, 3600.0)
IDLE_TIMEOUT_S_RANGE = (1.0, 86400.0)

MAX_ENGINES_PER_DEVICE = 8
"""``--engines-per-device`` at most: each engine is a process with its own model copy, CUDA
context, buffers and pools (tens of GiB on a GPU once warmed up, docs/serve.md, "Running it"),
and one Python thread of host work."""


def frontends_count(text: str, cpus: int | None = None) -> int:
    """``--frontends``: a whole number 1..MAX_FRONTENDS, or ``auto`` (half the cores, at most 8:
    the other half is for the engine's own Python, the model's process and the clients' TLS)."""
    if text == "auto":
        return max(1, min(8, (cpus if cpus is not None else (os.cpu_count() or 1)) // 2))
    try:
        count = int(text)
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_FRONTENDS:
        raise UserError(f"--frontends must be auto or a whole number 1..{MAX_FRONTENDS}, not {text!r}")
    return count


def _milliseconds(flag: str, text: str, low: float, high: float) -> float:
    """``flag``'s value: a number of milliseconds from ``low`` to ``high``, else a one-line refusal."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise UserError(f"{flag} must be a number of milliseconds from {low:g} to {high:g}, not {text!r}")
    return value


def frontend_flush_ms(text: str) -> float:
    """``--frontend-flush-ms``: milliseconds within FRONTEND_FLUSH_MS_RANGE."""
    return _milliseconds("--frontend-flush-ms", text, *FRONTEND_FLUSH_MS_RANGE)


def gil_switch_ms(text: str) -> float:
    """``--gil-switch-ms``: milliseconds within GIL_SWITCH_MS_RANGE."""
    return _milliseconds("--gil-switch-ms", text, *GIL_SWITCH_MS_RANGE)


def _seconds(flag: str, text: str, low: float, high: float, off: str = "") -> float:
    """``flag``'s value: seconds from ``low`` to ``high`` (or 0 where ``off`` says what 0 means)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (low <= value <= high or (off and value == 0)):
        raise UserError(f"{flag} must be a number of seconds from {low:g} to {high:g}{off}, not {text!r}")
    return value


def drain_s(text: str) -> float:
    return _seconds("--drain-s", text, *DRAIN_S_RANGE)


def idle_timeout_s(text: str) -> float | None:
    """``--idle-timeout-s``: seconds, or 0 for never (``None``)."""
    return _seconds("--idle-timeout-s", text, *IDLE_TIMEOUT_S_RANGE, off=", or 0 (never)") or None


def connections_per_client(text: str) -> int | None:
    """``--max-connections-per-client``: a whole number, or 0 for no limit (``None``)."""
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise UserError(f"--max-connections-per-client must be a whole number, 0 for no limit, not {text!r}")
    return count or None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1; any other address needs --token-file)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    parser.add_argument("--model", "-m", default="tiny.en", help="tiny.en, base, or a CTranslate2 Whisper folder")
    parser.add_argument("--language", "-l", default=None,
                        help="default language of the streams (a client may ask for its own)")
    parser.add_argument("--device", default=None, metavar="cpu|cuda|cuda:N|all",
                        help="where the model runs; all: one worker per GPU, new connections to the least loaded")
    parser.add_argument("--engines-per-device", type=int, default=1, metavar="N",
                        help="engines (each a process with its own model and worker thread) on each device, "
                             "new connections to the least loaded (default 1: one engine's thread is the bound "
                             "of a served GPU, not the GPU; several on a GPU need NVIDIA MPS running "
                             "(nvidia-cuda-mps-control -d) and go without standby processes; docs/serve.md)")
    parser.add_argument("--token-file", metavar="PATH",
                        help="file holding the bearer token clients must send (its first line)")
    parser.add_argument("--certfile", metavar="PEM", help="TLS certificate chain (serve wss://)")
    parser.add_argument("--keyfile", metavar="PEM", help="TLS private key (with --certfile)")
    parser.add_argument("--transcripts", metavar="DIR",
                        help="write each connection's committed lines here (default: nothing is written)")
    parser.add_argument("--metrics-port", type=int, metavar="N", help="serve Prometheus metrics on 127.0.0.1:N")
    add_speakers_argument(parser, SERVE_SPEAKERS_HELP)
    parser.add_argument("--policy", choices=POLICY_CHOICES, default="auto", help=SERVE_POLICY_HELP)
    parser.add_argument("--gpu-memory", metavar="GIB", default=None,
                        help="GPU memory each engine process may use, in GiB: ONNX Runtime's arena is capped there "
                             "and new streams are refused (1013) while under 15%% of it would be left; default: "
                             "the card's, with the same floor (docs/gpu-memory.md)")
    parser.add_argument("--max-streams", type=int, metavar="N",
                        help="streams per engine at most (default: as many as the engine admits by "
                             "measured GPU memory and step time)")
    parser.add_argument("--isolation", choices=("inline", "process", "auto"), default=SERVE_ISOLATION,
                        help="where each device's model runs (Pipeline isolation; default auto: a process "
                             "per GPU, restarted after a CUDA fault; the worker thread on the CPU)")
    parser.add_argument("--frontends", default="1", metavar="K|auto",
                        help="processes doing the network work (WebSocket, checks, audio conversion), all on "
                             "--port, feeding this process's engines in batches (default 1: the network loop "
                             f"in this process; auto: {FRONTENDS_AUTO_DOC}; docs/serve.md)")
    parser.add_argument("--frontend-flush-ms", type=str, default=str(FRONTEND_FLUSH_MS), metavar="MS",
                        help="with --frontends K > 1: how often each front-end sends its connections' audio "
                             f"to the engines in one batch (default {FRONTEND_FLUSH_MS:g}; shorter: less latency, "
                             "more frames for this process)")
    parser.add_argument("--gil-switch-ms", type=str, default=str(GIL_SWITCH_MS), metavar="MS",
                        help="how long a thread of this process may hold the interpreter lock while another "
                             f"waits (default {GIL_SWITCH_MS:g}; shorter: the network loop waits less behind the "
                             "engines' threads, at the cost of more switches)")
    parser.add_argument("--drain-s", default=str(protocol.DRAIN_S), metavar="S",
                        help="at Ctrl-C or SIGTERM: no new connection, and each open stream's audio is captioned to "
                             f"its end and sent before its connection closes (1001), within S seconds (default {protocol.DRAIN_S:g}; "
                             "then the rest are closed anyway and a line says how many were cut)")
    parser.add_argument("--idle-timeout-s", default=str(protocol.IDLE_TIMEOUT_S), metavar="S",
                        help="close a connection that sends no audio for S seconds (1001; default "
                             f"{protocol.IDLE_TIMEOUT_S:g}; 0: never)")
    parser.add_argument("--max-connections-per-client", default=str(protocol.MAX_CONNECTIONS_PER_CLIENT), metavar="N",
                        help="connections one client address may hold at once; more are closed with 1013 "
                             f"(default {protocol.MAX_CONNECTIONS_PER_CLIENT}; 0: no limit; behind a proxy every "
                             "client has its address)")
    parser.add_argument("--ray", action="store_true",
                        help="run as a Ray Serve application instead (needs captioner[cluster]; docs/cluster.md)")
    parser.add_argument("--replicas", type=int, default=None, metavar="N",
                        help="with --ray: replicas (default: one per GPU in the cluster, else 1)")
    parser.add_argument("--quiet", action="store_true", help="no line per connection on stderr")


def read_token(path: str) -> str:
    """The token in ``path`` (its first line, stripped); refuses an empty or unreadable file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read the token file {path}: {getattr(error, 'strerror', None) or error}") from None
    lines = text.strip().splitlines()
    token = lines[0].strip() if lines else ""
    if len(token) < 16:
        raise UserError(f"the token in {path} is {'empty' if not token else 'under 16 characters'}: "
                        "make one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
    return token


def tls_context(certfile: str | None, keyfile: str | None):
    if certfile is None and keyfile is None:
        return None
    if certfile is None:
        raise UserError("--keyfile needs --certfile")
    from captioner.serve.tls import server_tls_context

    try:
        return server_tls_context(certfile, keyfile)
    except OSError as error:  # ssl.SSLError is an OSError
        raise UserError(f"cannot load the TLS certificate {certfile}: {getattr(error, 'strerror', None) or error}") from None


def serve_devices(device: str | None, engines_per_device: int = 1) -> list[str | None]:
    """``--device`` as the list of devices to run a worker on: ``all`` is every GPU NVML sees
    (the CPU when there is none); anything else is one device, checked like in every command.
    With ``engines_per_device`` N, each device N times, round by round (cuda:0, cuda:1, cuda:0,
    cuda:1): the link's least-loaded choice then fills the devices evenly before it doubles up."""
    if not 1 <= engines_per_device <= MAX_ENGINES_PER_DEVICE:
        raise UserError(f"--engines-per-device must be 1..{MAX_ENGINES_PER_DEVICE}, not {engines_per_device}")
    if device == "all":
        from captioner.gpu.telemetry import nvml_gpu_names

        names = nvml_gpu_names()
        devices = [f"cuda:{i}" for i in range(len(names))] if names else ["cpu"]
    else:
        from captioner.app.commands.device_option import engine_device

        devices = [engine_device(device)]
    return devices * engines_per_device


def shared_gpu_warning(devices: list[str | None]) -> str:
    """A line for an operator who put several engines on a GPU without MPS ("" when none is due):
    the engines' processes then take turns on the GPU, and each step is slower."""
    from captioner.gpu.mps import mps_pipe_directory, mps_running

    shared = sorted({d for d in devices if d and d.startswith("cuda") and devices.count(d) > 1})
    if not shared or mps_running():
        return ""
    return (f"{', '.join(shared)} will run {devices.count(shared[0])} engines without NVIDIA MPS (no control pipe "
            f"in {mps_pipe_directory()}): they take turns on the GPU and each step is slower; start "
            "`nvidia-cuda-mps-control -d` first (docs/serve.md)")


def speakers_mode(mode: str) -> tuple[str, str]:
    """``--speakers`` as the engines take it, and a line for the log ("" when none is due). The
    voice encoder's weights (the resemblyzer package) are looked up before any model loads:
    without them every labelled stream would fail at its open, so ``on`` is refused on one line
    and ``auto`` serves without labels and says so."""
    if mode == "off":
        return mode, ""
    from captioner.models.speaker.weights import checkpoint_path

    try:
        checkpoint_path()
    except UserError as error:
        if mode == "on":
            raise UserError(f"--speakers on: {error}") from None
        return "off", f"speaker labels are off: {error}"
    return mode, ""


def check_arguments(args) -> tuple[str | None, object]:
    from captioner.serve.server import is_loopback

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be 0..65535, not {args.port}")
    if args.metrics_port is not None and not 0 <= args.metrics_port <= 65535:
        raise UserError(f"--metrics-port must be 0..65535, not {args.metrics_port}")
    if args.max_streams is not None and args.max_streams < 1:
        raise UserError(f"--max-streams must be at least 1, not {args.max_streams}")
    token = read_token(args.token_file) if args.token_file else None
    if token is None and not is_loopback(args.host):
        raise UserError(f"refusing to serve on {args.host} without a token: anyone who can reach it could use "
                        "the GPU; give --token-file, or bind 127.0.0.1")
    context = tls_context(args.certfile, args.keyfile)
    args.frontends = frontends_count(str(args.frontends))
    if args.ray and args.frontends > 1:
        raise UserError("--frontends is for the plain server: with --ray, Ray Serve's proxy spreads the connections")
    args.frontend_flush_ms = frontend_flush_ms(str(args.frontend_flush_ms))
    args.gil_switch_ms = gil_switch_ms(str(args.gil_switch_ms))
    if args.ray and args.gil_switch_ms != GIL_SWITCH_MS:
        raise UserError("--gil-switch-ms is for the plain server: with --ray, each replica is Ray's process")
    args.drain_s = drain_s(str(args.drain_s))
    args.idle_timeout_s = idle_timeout_s(str(args.idle_timeout_s))
    args.max_connections_per_client = connections_per_client(str(args.max_connections_per_client))
    if args.ray and (args.drain_s, args.idle_timeout_s, args.max_connections_per_client) != (
            protocol.DRAIN_S, protocol.IDLE_TIMEOUT_S, protocol.MAX_CONNECTIONS_PER_CLIENT):
        raise UserError("--drain-s, --idle-timeout-s and --max-connections-per-client are for the plain server: "
                        "with --ray, Ray Serve's proxy holds the connections")
    if args.ray and args.engines_per_device != 1:
        raise UserError("--engines-per-device is for the plain server: with --ray, give more --replicas")
    args.speakers, args.speakers_notice = speakers_mode(getattr(args, "speakers", "auto"))
    args.gpu_memory_bytes = None
    if getattr(args, "gpu_memory", None) is not None:
        if args.ray:
            raise UserError("--gpu-memory is for the plain server: with --ray, give each replica's GPUs to Ray")
        from captioner.models.gpu_memory import use_budget

        args.gpu_memory_bytes = use_budget(str(args.gpu_memory))
    return token, context


def run(args) -> int:
    # Before NumPy is loaded (here and in a model process, which inherits it): OpenBLAS's own
    # threads spin between the CPU feature path's matrix products, which a server makes for
    # many streams at once; one thread did the same work in much less of the worker's time and
    # CPU (benchmarks/results/serve/HISTORY.md, "The server's own cost per connection"). An operator's
    # setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    token, context = check_arguments(args)
    if args.speakers_notice:
        print(f"captioner: {args.speakers_notice}", file=sys.stderr, flush=True)
    sigterm_as_interrupt()
    if args.ray:
        from captioner.serve.ray_app import run_ray

        return run_ray(args, token)
    devices = serve_devices(args.device, args.engines_per_device)
    sys.setswitchinterval(args.gil_switch_ms / 1000.0)  # this process only: the model's own are apart
    warning = shared_gpu_warning(devices)
    if warning:
        print(f"captioner: {warning}", file=sys.stderr, flush=True)
    if args.transcripts is not None:
        # Only once the device is known to exist: a refused device leaves nothing behind.
        Path(args.transcripts).mkdir(parents=True, exist_ok=True)

    from captioner.engine.pipeline import Pipeline, telemetry_gpu_index
    from captioner.gpu.telemetry import TelemetrySampler
    from captioner.heap import freeze_start_up
    from captioner.serve.engine_link import (
        EngineLink,
        server_engine_config,
        server_standby,
    )
    from captioner.serve.hub import FrontendHub
    from captioner.serve.loop_lag import lateness_quantiles_ms
    from captioner.serve.server import CaptionServer, ServerThread

    def make_pipeline(device):
        return Pipeline([], model=args.model, language=args.language, device=device,
                        config=server_engine_config(args.speakers, args.gpu_memory_bytes, args.policy),
                        isolation=args.isolation, standby=server_standby(args.engines_per_device))

    samplers: dict = {}  # one per device, shared by the engines on it (a sampler started twice is a no-op)

    def make_sampler(device):
        if device not in samplers:
            samplers[device] = TelemetrySampler(gpu_index=telemetry_gpu_index(device))
        return samplers[device]

    link = EngineLink(devices, make_pipeline, make_sampler, max_streams_per_device=args.max_streams)
    transcripts = None
    if args.transcripts is not None:
        from captioner.app.transcript import TranscriptWriter

        folder = Path(args.transcripts)
        transcripts = lambda title: TranscriptWriter(directory=folder, title=title)
    metrics = None
    if args.metrics_port is not None:
        from captioner.app.metrics import MetricsExporter

        metrics = MetricsExporter(args.metrics_port)
    def notice(line: str) -> None:  # the server's own events (an engine failed, the drain): even with --quiet
        print(f"captioner: {line}", file=sys.stderr, flush=True)

    log = (lambda line: None) if args.quiet else notice
    bounds = {"drain_s": args.drain_s, "idle_timeout_s": args.idle_timeout_s,
              "max_connections_per_client": args.max_connections_per_client}
    if args.frontends > 1:
        server = FrontendHub(link, args.host, args.port, frontends=args.frontends, token=token,
                             tls_files=(args.certfile, args.keyfile) if context is not None else None,
                             transcripts=transcripts, metrics=metrics, flush_s=args.frontend_flush_ms / 1000.0,
                             log=log, notice=notice, **bounds)
    else:
        server = CaptionServer(link, args.host, args.port, token=token, ssl_context=context, transcripts=transcripts,
                               metrics=metrics, log=log, notice=notice, **bounds)
    print(f"captioner: loading {args.model} on {', '.join(d or 'auto' for d in devices)} …", file=sys.stderr, flush=True)
    thread = None
    try:
        link.start()
        freeze_start_up()  # the engines are up: later collections walk only what serving makes
        if metrics is not None:
            print(f"captioner: Prometheus metrics on http://127.0.0.1:{metrics.start()}/metrics",
                  file=sys.stderr, flush=True)
        thread = ServerThread(server)
        try:
            port = thread.start()
        except OSError as error:
            raise UserError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}") from None
        print(f"captioner: serving {args.model} on {thread.url}/v1/listen"
              + (" (token required)" if token else "")
              + (f", {args.frontends} front-end processes (audio to the engines every {args.frontend_flush_ms:g} ms)"
                 if args.frontends > 1 else "")
              + (f", interpreter lock switched every {sys.getswitchinterval() * 1000:g} ms"
                 if args.gil_switch_ms != GIL_SWITCH_MS else "")
              + "; Ctrl-C stops", file=sys.stderr, flush=True)
        if args.port == 0:
            print(port, flush=True)  # for scripts that asked for a free port
        with stop_requests() as stop:  # Ctrl-C or SIGTERM: stop taking connections, drain
            while not stop.is_set() and not thread.wait(0.5):
                pass
        if thread.error is not None:
            raise UserError(f"the server stopped: {thread.error}")
    except KeyboardInterrupt:
        pass
    finally:
        if thread is not None:
            thread.stop()
        link.stop()
        if metrics is not None:
            metrics.stop()
    c = server.counts
    inbound = server.inbound_delay_ms() if args.frontends > 1 else None
    lateness = [("the serving loop ran late", server.loop_lag.quantiles_ms())]
    if args.frontends > 1:
        lateness.append(("the front-ends' loops", server.frontends_lag.quantiles_ms()))
        lateness.append(("captions from the engine's outbox to the front-ends",
                         lateness_quantiles_ms(list(server.outbox_to_frontends_ms))))
    print(f"captioner: served {c['accepted']} connection(s), refused {c['refused']}"
          + (f"; audio waited p50 {inbound[0]} / p99 {inbound[1]} ms between the front-ends and the engine"
             if inbound else "")
          + "".join(f"; {said} p50 {q[0]} / p99 {q[1]} / max {q[2]} ms" for said, q in lateness if q),
          file=sys.stderr, flush=True)
    return 0
