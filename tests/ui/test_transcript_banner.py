"""The desktop app on a transcript disk that is full or fills (issue 47, item 2): a full disk
fails the start as the transcript's fault; one that fills while captioning is in the banner at
once; a session that ends with lines unsaved says how many. The fake pipeline of fakes.py, the
real transcript writer, on a real 64 KiB tmpfs where one can be mounted (tests/small_disk.py)."""

from __future__ import annotations

import pytest
from fakes import Factory, RecordingView, final, write_tone_wav

from captioner.ui.notices import failure_notice
from small_disk import SmallDisk


@pytest.fixture
def disk(tmp_path, monkeypatch):
    small = SmallDisk(tmp_path / "disk", monkeypatch)
    monkeypatch.setenv("CAPTIONER_TRANSCRIPT_DIR", str(small.folder / "transcripts"))
    yield small
    small.close()


@pytest.fixture
def clip_path(tmp_path):
    return write_tone_wav(tmp_path / "clip.wav")


@pytest.fixture
def controllers():
    from captioner.app.gui_app import LiveController

    made = []

    def make(view, factory):
        made.append(LiveController(view, device="cpu", pipeline_factory=factory))
        return made[-1]

    yield make
    for controller in made:
        controller.shutdown(timeout_s=10)


def test_a_start_on_a_full_disk_fails_as_the_transcript_before_any_pipeline(disk, clip_path, controllers):
    from captioner.ui.run_config import RunConfig, SourceChoice

    view, factory = RecordingView(), Factory()
    controller = controllers(view, factory)
    disk.fill()
    controller.start(RunConfig(sources=(SourceChoice("file", "Clip", clip_path.name, path=str(clip_path)),)))
    _, message = view.wait_for("session_failed")
    assert message.startswith("cannot write the transcript ") and message.endswith(": disk full")
    assert view.failed_settings == ["transcript"] and factory.built == []
    assert "Make room on the transcripts' disk" in failure_notice(message, setting="transcript")


def test_the_banner_says_captions_are_not_saved_and_the_end_says_how_many(window, qtbot, disk, clip_path,
                                                                         controllers):
    from captioner.app.gui_main import connect_window

    factory = Factory()
    controller = controllers(window.session, factory)
    connect_window(window, controller)
    window.controls.add_file(str(clip_path))
    window.controls.select_only([f"file:{clip_path}"])
    window.controls.start_button.click()
    qtbot.waitUntil(lambda: window.state_label.text() == "Captioning", timeout=5000)
    pipeline = factory.built[0]

    def commit(text: str) -> None:  # as the engine does: on disk (or held), then shown
        update = final("clip", text)
        pipeline.transcript.write(update)
        pipeline.captions.append(update)

    commit("Saved.")
    disk.fill()
    for n in range(10):  # the file's last page takes lines until it is used
        commit(f"Line {n} " + "word " * 299 + "end.")
        if pipeline.transcript.paused:
            break
    assert pipeline.transcript.paused == "disk full"
    qtbot.waitUntil(lambda: window.banner.isVisible() and "captions are not being saved (disk full)"
                    in window.banner.text(), timeout=5000)
    assert window.banner.level == "warning"

    window.controls.start_button.click()  # "Stop", with the disk still full
    qtbot.waitUntil(lambda: window.state_label.text().startswith("Stopped: cannot write the transcript"),
                    timeout=5000)
    assert window.banner.level == "error"
    text = window.banner.text()
    assert "disk full; the last 1 committed line shown was not saved" in text
    assert "Make room on the transcripts' disk" in text
