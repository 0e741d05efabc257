"""A private PulseAudio server for tests: null sinks to play into, their monitors to capture.

The daemon runs in the foreground as our own child process (so teardown can always kill it),
with its runtime directory, state and socket in a fresh temporary folder, anonymous access,
no D-Bus and no default modules: nothing of a desktop's own sound server is touched. It works
as root (PulseAudio warns, but runs) and as a normal user.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

START_TIMEOUT_S = 20.0
COMMAND_TIMEOUT_S = 10.0


def pulseaudio_missing() -> str | None:
    """Why a PulseAudio test cannot run here, or ``None``."""
    missing = [exe for exe in ("pulseaudio", "pactl", "paplay") if shutil.which(exe) is None]
    if missing:
        return f"PulseAudio binaries missing: {', '.join(missing)} (apt-get install pulseaudio pulseaudio-utils)"
    return None


@dataclass
class NullSink:
    name: str
    rate_hz: int

    @property
    def monitor(self) -> str:
        return f"{self.name}.monitor"

    @property
    def device(self) -> str:
        """What ``MicrophoneSource(device=...)`` takes to capture this sink's monitor."""
        return f"pulse:{self.monitor}"


@dataclass
class PulseServer:
    """A running private server. ``server`` is its ``PULSE_SERVER`` address; ``env`` has it."""

    root: Path
    sinks: list[NullSink]
    process: subprocess.Popen | None = None
    players: list[subprocess.Popen] = field(default_factory=list)

    @property
    def socket(self) -> Path:
        return self.root / "native"

    @property
    def server(self) -> str:
        return f"unix:{self.socket}"

    @property
    def sink(self) -> NullSink:
        """The default sink (its monitor is the default source)."""
        return self.sinks[0]

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(PULSE_SERVER=self.server, PULSE_RUNTIME_PATH=str(self.root / "runtime"))
        env.pop("PULSE_SOURCE", None)
        env.pop("PULSE_SINK", None)
        return env

    def log_tail(self, n_lines: int = 15) -> str:
        try:
            lines = (self.root / "daemon.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n_lines:])

    def pactl(self, *args: str) -> str:
        done = subprocess.run(
            ["pactl", *args], env=self.env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            raise RuntimeError(f"pactl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def start(self) -> None:
        runtime = self.root / "runtime"
        runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.root / "home").mkdir(exist_ok=True)
        env = self.env
        env.update(
            XDG_RUNTIME_DIR=str(self.root),
            PULSE_STATE_PATH=str(self.root / "state"),
            HOME=str(self.root / "home"),
        )
        env.pop("DBUS_SESSION_BUS_ADDRESS", None)  # never register on a desktop's session bus
        args = [
            "pulseaudio", "-n", "--daemonize=no", "--system=false", "--exit-idle-time=-1",
            "--disallow-exit", "--disallow-module-loading=no", "--use-pid-file=no",
            "--log-target=stderr", "--log-level=info",
        ]
        for sink in self.sinks:
            args.append(f"--load=module-null-sink sink_name={sink.name} rate={sink.rate_hz} channels=2")
        args.append(f"--load=module-native-protocol-unix auth-anonymous=1 socket={self.socket}")
        log = (self.root / "daemon.log").open("wb")
        self.process = subprocess.Popen(
            args, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"pulseaudio exited with {self.process.returncode}:\n{self.log_tail()}")
            if self.socket.exists():
                try:
                    self.pactl("info")
                    break
                except (RuntimeError, subprocess.TimeoutExpired):
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"pulseaudio did not answer within {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")
            time.sleep(0.1)
        self.pactl("set-default-sink", self.sink.name)
        self.pactl("set-default-source", self.sink.monitor)

    # -- faults: a sink unplugged and plugged back, the server killed, frozen, started again -------
    def unload_sink(self, sink: NullSink) -> None:
        """Unloads ``sink``'s module, as unplugging a device does: its monitor source leaves."""
        for line in self.pactl("list", "short", "modules").splitlines():
            fields = line.split("\t")
            if len(fields) >= 3 and fields[1] == "module-null-sink" and f"sink_name={sink.name} " in f"{fields[2]} ":
                self.pactl("unload-module", fields[0])
                return
        raise RuntimeError(f"no module-null-sink named {sink.name} is loaded")

    def load_sink(self, sink: NullSink) -> None:
        """Loads ``sink`` again (same name, rate and channels), as plugging the device back does."""
        self.pactl("load-module", "module-null-sink", f"sink_name={sink.name}", f"rate={sink.rate_hz}", "channels=2")

    def kill(self) -> None:
        """SIGKILL of the daemon (``kill -9``): every client's connection breaks at once."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=10)

    def freeze(self) -> None:
        """SIGSTOP: the daemon stays, connected, and answers nothing (a hung sound server)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def restart(self) -> None:
        """Starts the daemon again, on the same socket with the same sinks, after :meth:`kill`."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("the daemon still runs")
        self.start()

    def play(self, wav_path: str | os.PathLike, sink: NullSink | None = None) -> subprocess.Popen:
        """Starts ``paplay`` of ``wav_path`` into ``sink`` (default: the default sink)."""
        target = sink or self.sink
        player = subprocess.Popen(
            ["paplay", f"--device={target.name}", str(wav_path)], env=self.env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        self.players.append(player)
        return player

    def stop(self) -> None:
        for process in [*self.players, self.process]:
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGCONT)  # a frozen daemon cannot act on SIGTERM
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        self.players.clear()
        shutil.rmtree(self.root, ignore_errors=True)


def start_pulse_server(sinks: list[NullSink] | None = None) -> PulseServer:
    """Starts a server (in a short /tmp folder: socket paths are limited to 108 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="capt-pa-"))
    server = PulseServer(root, sinks or [NullSink("captioner_test", 48_000), NullSink("captioner_test_44k", 44_100)])
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return server
