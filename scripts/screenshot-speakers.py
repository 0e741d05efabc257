"""The app captioning a two-voice conversation from a meeting's audio, one speaker renamed:
docs/screenshots/speaker-labels.png.

Everything is real and private to this run: an X server (Xvfb), a PulseAudio server with a null
sink whose monitor the app captions as "Meeting audio", and `paplay` playing a conversation built
from two real voices of ../shared/speech (a LibriSpeech reader, then the LJ Speech reader, a
second's pause between turns, twice). The app is the one `captioner gui` opens (its window, its
controller, the engine on this machine), driven in-process only where a person would act: the
monitor ticked and Start, then a click on the name of the speaker who read the LJ Speech lines,
"Linda" typed (Linda Johnson reads LJ Speech) and Enter. When the audio has played and the last
words are committed, the whole screen (window and overlay) is saved.

    .venv/bin/python scripts/screenshot-speakers.py [--out docs/screenshots/speaker-labels.png]

Needs Xvfb, pulseaudio and paplay (tests/pulse.py says how the server is made), and the voice
encoder (resemblyzer's weights, scripts/setup.sh).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SPEECH = ROOT.parent / "shared" / "speech" / "audio"
TURNS = [  # (clip, who): a man reading LibriSpeech, a woman reading LJ Speech, twice
    ("en_ls_1089-134686-0000.wav", "LibriSpeech 1089"),
    ("en_ljspeech_LJ001-0001.wav", "LJ Speech"),
    ("en_ls_1089-134691-0001.wav", "LibriSpeech 1089"),
    ("en_ljspeech_LJ001-0005.wav", "LJ Speech"),
]
PAUSE_S = 1.0
RATE_HZ = 16_000
NEW_NAME = "Linda"
RENAMED_WORD = "printing"  # in the LJ Speech reader's first line: whose line it is
SCREEN = (1600, 1000)
WINDOW = (1600, 820)


def conversation_wav(path: Path) -> float:
    """The turns one after another, ``PAUSE_S`` of silence after each; returns its length (s)."""
    pieces = []
    for name, _ in TURNS:
        with wave.open(str(SPEECH / name)) as clip:
            assert clip.getframerate() == RATE_HZ and clip.getnchannels() == 1 and clip.getsampwidth() == 2
            pieces.append(np.frombuffer(clip.readframes(clip.getnframes()), dtype=np.int16))
        pieces.append(np.zeros(int(PAUSE_S * RATE_HZ), dtype=np.int16))
    samples = np.concatenate(pieces)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE_HZ)
        out.writeframes(samples.tobytes())
    return len(samples) / RATE_HZ


def start_xvfb() -> tuple[subprocess.Popen, str]:
    """A private X server; returns it and its DISPLAY."""
    read, write = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", f"{SCREEN[0]}x{SCREEN[1]}x24",
                             "-nolisten", "tcp"], pass_fds=(write,), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    os.close(write)
    with os.fdopen(read) as answer:
        number = answer.readline().strip()
    if not number:
        raise RuntimeError("Xvfb did not start")
    return xvfb, f":{number}"


def load_pulse_helper():
    spec = importlib.util.spec_from_file_location("captioner_tests_pulse", ROOT / "tests" / "pulse.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "screenshots" / "speaker-labels.png"))
    parser.add_argument("--model", default="tiny.en")
    options = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="capt-speakers-"))
    wav = work / "conversation.wav"
    audio_s = conversation_wav(wav)
    pulse_helper = load_pulse_helper()
    pulse = pulse_helper.start_pulse_server([pulse_helper.NullSink("meeting_call", 48_000)])
    xvfb, display = start_xvfb()
    try:
        os.environ.update(DISPLAY=display, PULSE_SERVER=pulse.server, CAPTIONER_TRANSCRIPT_DIR=str(work / "transcripts"))
        os.environ.pop("QT_QPA_PLATFORM", None)  # the real xcb platform, on the Xvfb server
        os.environ.pop("WAYLAND_DISPLAY", None)
        return run(options, pulse, wav, audio_s, work)
    finally:
        pulse.stop()
        xvfb.terminate()
        xvfb.wait(timeout=10)


def run(options, pulse, wav: Path, audio_s: float, work: Path) -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from PySide6.QtCore import QCoreApplication, QEvent, QPoint, Qt, QTimer
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication

    from captioner.app.commands import gui
    from captioner.app.gui_main import open_window
    from captioner.ui.settings import APPLICATION, ORGANIZATION

    cli = argparse.ArgumentParser()
    gui.add_arguments(cli)
    args = cli.parse_args(["--settings", str(work / "settings.ini"), "--model", options.model,
                           "--speakers", "auto", "--overlay", "--no-start"])
    app = QApplication([sys.argv[0]])
    app.setOrganizationName(ORGANIZATION)
    app.setApplicationName(APPLICATION)
    window, controller = open_window(args)
    window.dashboard_dock.hide()  # the captions are the subject here
    window.setGeometry(0, 0, *WINDOW)
    view = window.caption_view
    state = {"player": None, "renamed": False, "played_at": None, "t0": time.monotonic(), "shot": False}

    meeting = [c for c in window.controls.source_list.choices() if c.stream == "Meeting"]
    if not meeting:
        print("no meeting audio listed: is PulseAudio reachable?", file=sys.stderr)
        return 1
    window.controls.select_only([meeting[0].key()])
    print(f"captioning {meeting[0].label} (device {meeting[0].device})", flush=True)
    window.start_requested.emit(window.controls.run_config())

    def speaker_of(word: str):
        for cue in view.cues():
            if word in " ".join(cue.lines).lower() and cue.speaker:
                return cue.stream, cue.speaker
        return None

    def tick() -> None:
        elapsed_s = time.monotonic() - state["t0"]
        if elapsed_s > 240:
            print("gave up waiting", file=sys.stderr)
            app.quit()
            return
        if state["player"] is None:
            if window.state_label.text() == "Captioning":
                state["player"] = pulse.play(wav, pulse.sink)
                state["played_at"] = time.monotonic()
                print(f"playing {audio_s:.1f} s of conversation into {pulse.sink.monitor}", flush=True)
            return
        found = speaker_of(RENAMED_WORD)
        if not state["renamed"] and found is not None:
            stream, speaker = found
            rect = view.name_rect(stream, speaker)
            if rect is not None:
                view.scroll_to_live()
                rect = view.name_rect(stream, speaker)
                QTest.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                                 QPoint(rect.center()))
                if view.renaming is not None:
                    view.name_editor.selectAll()
                    QTest.keyClicks(view.name_editor, NEW_NAME)
                    QTest.keyClick(view.name_editor, Qt.Key.Key_Return)
                    state["renamed"] = view.speaker_name(stream, speaker) == NEW_NAME
                    print(f"renamed {speaker} of {stream}: {state['renamed']}", flush=True)
        done_playing = state["player"].poll() is not None
        if done_playing and time.monotonic() - state["played_at"] > audio_s + 5 and not state["shot"]:
            state["shot"] = True
            window.overlay.raise_()
            QTimer.singleShot(500, shoot)

    def shoot() -> None:
        out = Path(options.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        QApplication.processEvents()
        shot = window.screen().grabWindow(0)
        ok = shot.save(str(out))
        print(f"screenshot {out}: {ok} ({shot.width()}x{shot.height()})", flush=True)
        print("caption view:\n" + view.toPlainText().replace("\u2028", "\n"), flush=True)
        print("overlay:\n" + window.overlay.shown_text(), flush=True)
        window.close()
        app.quit()

    timer = QTimer()
    timer.timeout.connect(tick)
    timer.start(200)
    app.exec()
    controller.shutdown()
    for path in sorted((work / "transcripts").glob("*.txt")):
        print(f"transcript {path.name}:\n{path.read_text()}", flush=True)
    window.overlay.deleteLater()
    window.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    QCoreApplication.processEvents()
    return 0 if state["renamed"] and state["shot"] else 1


if __name__ == "__main__":
    sys.exit(main())
