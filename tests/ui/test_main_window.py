"""The main window with real engine events: captions, auto-scroll, overlay, export, settings."""

from __future__ import annotations

import time

import srt
import webvtt
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont, QTextCursor

from captioner.events import CaptionUpdate, PipelineStatus, TelemetrySample
from captioner.ui.caption_view import MAX_FONT_PT, MIN_FONT_PT
from captioner.ui.main_window import MainWindow


def final(stream, text, start_s, end_s, segment=0):
    return CaptionUpdate(stream, "final", text, start_s, end_s, end_s + 0.6, end_s + 0.8, segment=segment)


def partial(stream, text, start_s, end_s, segment=0):
    return CaptionUpdate(stream, "partial", text, start_s, end_s, end_s + 0.3, end_s + 0.4, segment=segment)


def format_of(view, text):
    """The character format in the middle of the first occurrence of ``text`` in the view."""
    doc = view.document()
    cursor = doc.find(text)
    assert not cursor.isNull(), f"{text!r} not shown"
    probe = QTextCursor(doc)
    probe.setPosition((cursor.selectionStart() + cursor.selectionEnd()) // 2)
    return probe.charFormat()


def test_window_builds_with_all_parts(window):
    assert window.centralWidget().isAncestorOf(window.caption_view)
    assert window.centralWidget().isAncestorOf(window.banner) and not window.banner.isVisible()
    assert window.dashboard.isVisible()
    assert window.controls.start_button.text() == "Start"
    assert window.provider_label.text().startswith("Provider")
    titles = [a.text() for a in window.menuBar().actions()]
    assert titles == ["&File", "&Captions", "&View"]


def test_partial_then_committed(window):
    view = window.caption_view
    window.apply_captions([partial("Me", "the quick brown", 0.0, 1.0, segment=1)])
    assert view.partial_text("Me") == "the quick brown"
    assert view.committed_text() == ""
    fmt = format_of(view, "quick")
    assert fmt.fontItalic()
    assert fmt.foreground().color().name() == window.theme.dim_text

    window.apply_captions([partial("Me", "the quick brown fox jumps", 0.0, 1.6, segment=1)])
    assert view.toPlainText().count("quick") == 1  # a partial replaces the previous one

    window.apply_captions([final("Me", "The quick brown fox", 0.0, 1.4, segment=1),
                           partial("Me", "jumps over", 1.4, 2.0, segment=1)])
    assert view.committed_text() == "Me: The quick brown fox"
    committed = format_of(view, "fox")
    assert not committed.fontItalic()
    assert committed.foreground().color().name() == window.theme.text
    assert format_of(view, "over").fontItalic()
    # stream label in the stream's colour
    assert format_of(view, "Me").foreground().color().name() == view.stream_color("Me")

    window.apply_captions([final("Me", "jumps over.", 1.4, 2.1, segment=1)])
    assert view.partial_text("Me") == ""
    assert view.toPlainText().splitlines() == ["Me", "The quick brown fox jumps over."]
    assert [u.text for u in window.history.finals] == ["The quick brown fox", "jumps over."]


def test_two_streams_are_labelled(window):
    window.apply_captions([
        final("Me", "Can you hear me?", 0.0, 1.0, segment=1),
        final("Meeting", "Yes, loud and clear.", 1.2, 2.5, segment=1),
        partial("Me", "Great, let's", 2.8, 3.5, segment=2),
    ])
    text = window.caption_view.toPlainText().splitlines()
    assert text == ["Me", "Can you hear me?", "Meeting", "Yes, loud and clear.", "Me", "Great, let's"]
    view = window.caption_view
    assert view.stream_color("Me") != view.stream_color("Meeting")


def test_auto_scroll_stops_when_user_scrolls_back(window, qtbot):
    view = window.caption_view
    bar = view.verticalScrollBar()
    for i in range(40):
        window.apply_captions([final("Me", f"Sentence number {i} of a long meeting.", i, i + 1, segment=i)])
    assert bar.maximum() > 0
    assert view.following and bar.value() == bar.maximum()

    bar.setValue(0)  # the user scrolls back to read
    assert not view.following
    for i in range(40, 50):
        window.apply_captions([final("Me", f"Sentence number {i}.", i, i + 1, segment=i),
                               partial("Me", "and more", i + 1, i + 2, segment=i + 1)])
    assert bar.value() == 0 and not view.following
    assert "auto-scroll paused" in window.statusBar().currentMessage()

    view.scroll_to_live()
    window.apply_captions([final("Me", "Back to live.", 60, 61, segment=60)])
    assert view.following and bar.value() == bar.maximum()


def test_overlay_toggles_and_shows_last_lines(window, qtbot):
    overlay = window.overlay
    assert not overlay.isVisible()
    assert window.overlay_action.shortcut().toString() == "Ctrl+Shift+O"
    assert window.overlay_action.shortcutContext() == Qt.ShortcutContext.ApplicationShortcut
    window.overlay_action.trigger()
    assert not overlay.isVisible()  # on, but nothing to show yet: no empty box over the screen
    flags = overlay.windowFlags()
    assert flags & Qt.WindowType.FramelessWindowHint and flags & Qt.WindowType.WindowStaysOnTopHint
    assert overlay.testAttribute(Qt.WidgetAttribute.WA_TranslucentBackground)

    words = " ".join(f"word{i}" for i in range(200))
    window.apply_captions([final("Me", words, 0, 30), partial("Me", "provisional tail", 30, 31)])
    assert overlay.isVisible()
    shown = overlay.shown_text()
    assert shown.count("<br>") <= overlay.n_lines - 1  # two or three lines, not the whole session
    assert "word199" in shown and "word0 " not in shown
    assert "<i>" in shown and "provisional" in shown

    overlay.resize(500, 140)
    assert overlay.width() == 500
    window.overlay_action.trigger()
    assert not overlay.isVisible()


def test_font_size_is_adjustable_and_clamped(window):
    view = window.caption_view
    start = view.font_pt
    window.change_font(+4)
    assert view.font_pt == start + 4
    assert view.document().defaultFont().pointSize() == start + 4
    window.set_font_pt(1000)
    assert view.font_pt == MAX_FONT_PT
    window.set_font_pt(1)
    assert view.font_pt == MIN_FONT_PT


def test_theme_switch_recolours_text(window):
    window.apply_captions([final("Me", "Colour check.", 0, 1)])
    window.dark_action.trigger()  # dark -> light (default is dark)
    assert window.theme.name == "light"
    assert format_of(window.caption_view, "Colour").foreground().color().name() == window.theme.text
    assert window.caption_view.committed_text() == "Me: Colour check."


def test_export_writes_srt_and_vtt_that_parse(window, tmp_path):
    window.apply_captions([
        final("Me", "First line & more.", 0.5, 2.25, segment=1),
        partial("Me", "not committed", 2.3, 3.0, segment=2),
        final("Meeting", "Second --> line.", 2.5, 4.0, segment=1),
    ])
    srt_path, vtt_path, txt_path = tmp_path / "c.srt", tmp_path / "c.vtt", tmp_path / "c.txt"
    assert window.history.export(srt_path, "srt") == 2
    window.history.export(vtt_path, "vtt")
    window.history.export(txt_path, "txt")
    subs = list(srt.parse(srt_path.read_text()))
    assert len(subs) == 2
    assert subs[0].start.total_seconds() == 0.5 and subs[0].end.total_seconds() == 2.25
    assert "First line & more." in subs[0].content and "not committed" not in srt_path.read_text()
    cues = webvtt.read(str(vtt_path))
    assert len(cues) == 2 and cues[1].start == "00:00:02.500"
    assert "Second" in cues[1].text
    assert "First line & more." in txt_path.read_text()


def test_history_search(window):
    window.apply_captions([final("Me", "Budget review tomorrow.", 0, 1), final("Meeting", "The budget is fine.", 1, 2),
                           final("Me", "Lunch at noon.", 2, 3)])
    window.history.search_edit.setText("budget")
    assert [u.text for u in window.history.matches()] == ["Budget review tomorrow.", "The budget is fine."]
    assert window.history.count_label.text() == "2 of 3 captions match"
    window.apply_captions([final("Me", "More budget talk.", 3, 4), final("Me", "Unrelated.", 4, 5)])
    assert len(window.history.matches()) == 3
    window.history.search_edit.clear()
    assert len(window.history.matches()) == 5


def test_clear(window):
    window.apply_captions([final("Me", "Something.", 0, 1), partial("Me", "more", 1, 2)])
    window.clear_captions()
    assert window.caption_view.toPlainText() == ""
    assert window.history.finals == []


def test_status_bar_shows_provider_model_streams(window):
    window.apply_status(PipelineStatus(time_s=time.monotonic(), provider="CUDAExecutionProvider", model="base",
                                       device_name="NVIDIA H200", streams=("Me", "Meeting")))
    assert window.provider_label.text() == "Provider: GPU NVIDIA H200"
    assert window.model_label.text() == "Model: base"
    assert window.streams_label.text() == "Streams: 2"
    window.apply_status(PipelineStatus(time_s=time.monotonic(), provider="CPUExecutionProvider", model="tiny.en",
                                       device_name="cpu", streams=("Me",)))
    assert window.provider_label.text() == "Provider: CPU"


def test_settings_round_trip(qtbot, settings_store, tmp_path):
    first = MainWindow(settings_store)
    qtbot.addWidget(first)
    qtbot.addWidget(first.overlay)
    first.set_theme("light")
    first.set_font_pt(31)
    first.controls.set_model("base")
    first.controls.set_language("de")
    first.controls.translate_check.setChecked(True)
    clip = tmp_path / "talk.wav"
    clip.write_bytes(b"")  # a remembered file is offered again only while it exists
    choice = first.controls.add_file(str(clip))
    first.controls.select_only([choice.key()])
    first.overlay.resize(640, 120)
    first.save_settings()

    second = MainWindow(settings_store)
    qtbot.addWidget(second)
    qtbot.addWidget(second.overlay)
    second.show_devices([], None)  # what the app's device listing does (none here)
    s = second.settings
    assert (s.theme, s.font_pt, s.model, s.language, s.translate) == ("light", 31, "base", "de", True)
    assert s.sources == [choice.key()]
    assert second.caption_view.font_pt == 31
    assert second.controls.model() == "base" and second.controls.language() == "de" and second.controls.translate()
    assert [c.key() for c in second.controls.selected_sources()] == [choice.key()]
    assert second.overlay.width() == 640


def test_feed_is_drained_by_the_timer(window, qtbot):
    """The window pulls from any object with the pipeline's outbox methods (here a finished run's
    record played back); the real pipeline is driven in test_app.py."""

    class RecordedRun:
        def __init__(self):
            self.captions = [partial("Me", "hello", 0, 0.5, 1), final("Me", "Hello there.", 0, 0.9, 1)]
            self.status = PipelineStatus(time_s=time.monotonic(), provider="CPUExecutionProvider", model="tiny.en",
                                         device_name="cpu", streams=("Me",), step_latency_ms=120.0)
            self.sample = TelemetrySample(time_s=time.monotonic(), cpu_pct=12.0, process_cpu_pct=3.0)

        def drain_captions(self):
            out, self.captions = self.captions, []
            return out

        def latest_status(self):
            return self.status

        def latest_telemetry(self):
            return self.sample

    window.set_feed(RecordedRun())
    qtbot.waitUntil(lambda: window.caption_view.committed_text() == "Me: Hello there.", timeout=3000)
    qtbot.waitUntil(lambda: window.dashboard.title_text("step") == "120.0 ms", timeout=3000)
    assert window.streams_label.text() == "Streams: 1"
    kinds = [e.kind for e in window.record if isinstance(e, CaptionUpdate)]
    assert kinds == ["partial", "final"]


def test_overlay_names_speakers_only_where_the_stream_changes(window):
    window.set_overlay_visible(True)
    window.apply_captions([
        final("Me", "Hello team.", 0, 1, segment=1),
        final("Meeting", "Hi there.", 0.5, 1.5, segment=1),
        final("Meeting", "Shall we start?", 1.5, 2.5, segment=1),
        partial("Meeting", "first item is", 2.5, 3.0, segment=1),
    ])
    shown = window.overlay.shown_text()
    assert shown.count("Meeting:") == 1 and "Me:" in shown
    window.apply_captions([final("Me", "Only me now.", 5, 6, segment=2)])
    window.clear_captions()
    window.apply_captions([final("Me", "Just one stream.", 0, 1, segment=1)])
    assert "Me:" not in window.overlay.shown_text()  # one stream: no labels needed


class Microphone:
    name, is_monitor, open_as = "USB headset", False, "3"


def test_one_off_sources_are_not_remembered(qtbot, settings_store, tmp_path):
    first = MainWindow(settings_store)
    qtbot.addWidget(first)
    qtbot.addWidget(first.overlay)
    first.show_devices([Microphone()], None)
    first.save_settings()
    assert first.settings.sources == ["device:"]
    choice = first.controls.add_file(str(tmp_path / "once.wav"))
    first.controls.select_only([choice.key()])
    first.remember_sources = False  # what `captioner gui --file` sets
    first.save_settings()
    second = MainWindow(settings_store)
    qtbot.addWidget(second)
    qtbot.addWidget(second.overlay)
    assert second.settings.sources == ["device:"]


def test_overlay_moves_when_dragged(window, qtbot):
    from PySide6.QtCore import QEvent, QPoint, QPointF
    from PySide6.QtGui import QMouseEvent
    from PySide6.QtWidgets import QApplication

    overlay = window.overlay
    window.set_overlay_visible(True)
    overlay.move(100, 100)
    start = overlay.pos()

    def send(kind, local, buttons):
        local_f = QPointF(local)
        global_f = QPointF(overlay.mapToGlobal(local))
        event = QMouseEvent(kind, local_f, local_f, global_f, Qt.MouseButton.LeftButton, buttons,
                            Qt.KeyboardModifier.NoModifier)
        QApplication.sendEvent(overlay, event)

    send(QEvent.Type.MouseButtonPress, QPoint(50, 30), Qt.MouseButton.LeftButton)
    send(QEvent.Type.MouseMove, QPoint(90, 50), Qt.MouseButton.LeftButton)
    send(QEvent.Type.MouseButtonRelease, QPoint(90, 50), Qt.MouseButton.NoButton)
    assert overlay.pos() == start + QPoint(40, 20)


def test_a_stream_is_named_once_per_run_of_its_lines(window):
    """Like a chat: the stream's name heads a run of its lines, and comes back only after another
    stream spoke."""
    view = window.caption_view
    window.apply_captions([
        final("Me", "First thought.", 0, 1, segment=1),
        final("Me", "Second thought.", 2, 3, segment=2),
        final("Me", "Third thought.", 4, 5, segment=3),
        final("Meeting", "A reply.", 5, 6, segment=1),
        final("Meeting", "And more.", 7, 8, segment=2),
        final("Me", "Back to me.", 9, 10, segment=4),
        partial("Me", "still talking", 10, 11, segment=5),
    ])
    assert view.toPlainText().splitlines() == [
        "Me", "First thought.", "Second thought.", "Third thought.",
        "Meeting", "A reply.", "And more.",
        "Me", "Back to me. still talking",  # no pause after the sentence: the same cue
    ]
    # the name is its own line, bold and in the stream's colour, smaller than the captions
    doc = view.document()
    label_block = doc.findBlockByNumber(0)
    assert label_block.text() == "Me"
    fmt = format_of(view, "Meeting")
    assert fmt.fontWeight() == QFont.Weight.Bold and fmt.foreground().color().name() == view.stream_color("Meeting")
    assert fmt.fontPointSize() < view.font_pt
    # a partial of another stream opens its own run, labelled; committing it keeps one label
    window.apply_captions([partial("Meeting", "wait", 11, 12, segment=3)])
    assert view.toPlainText().splitlines()[-2:] == ["Meeting", "wait"]
    window.apply_captions([final("Meeting", "Wait.", 11, 12, segment=3)])
    assert view.toPlainText().count("Meeting") == 2


def test_a_long_file_name_wraps_in_the_caption_view(window, qtbot):
    view = window.caption_view
    name = "en_ami_ES2011a_hs0_40-46s_a_very_long_recording_name_that_does_not_fit_on_one_line" * 3
    window.apply_captions([final(name, "Hello there.", 0, 1, segment=1)])
    qtbot.wait(20)
    assert view.horizontalScrollBar().maximum() == 0 and not view.horizontalScrollBar().isVisible()
    assert view.toPlainText().splitlines() == [name, "Hello there."]  # once, in full
    layout = view.document().firstBlock().layout()
    assert layout.lineCount() > 1  # wrapped, not cut off


def test_the_detected_language_is_shown(window):
    from captioner.ui.run_config import RunConfig

    window.start_requested.emit(RunConfig(sources=(), model="base", language="auto"))
    window.apply_captions([CaptionUpdate("Me", "partial", "Guten", 0, 1, 1, 1, segment=1, language="de")])
    assert window.language_label.text() == "Language: German (detected)"
    window.apply_captions([CaptionUpdate("Meeting", "final", "Hello.", 0, 1, 1, 1, segment=1, language="en")])
    assert window.language_label.text() == "Languages: Me German · Meeting English (detected)"
    window.start_requested.emit(RunConfig(sources=(), model="tiny.en", language="en"))
    window.show_session_starting("tiny.en")  # a new run starts with no language known
    assert window.language_label.text() == ""
    window.apply_captions([CaptionUpdate("Me", "final", "Hi.", 0, 1, 1, 1, segment=1, language="en")])
    assert window.language_label.text() == "Language: English"  # chosen, not detected


def test_an_engine_message_appears_in_the_banner(window):
    def with_message(message):
        return PipelineStatus(time_s=time.monotonic(), provider="CPUExecutionProvider", model="tiny.en",
                              device_name="cpu", streams=("Me",), message=message)

    lost = "input 'Me' lost (device unplugged)"
    window.apply_status(with_message(lost))
    assert window.banner.isVisible() and window.banner.level == "warning"
    assert window.banner.text() == lost
    window.banner.close_button.click()  # dismissed: the same message repeated does not bring it back
    window.apply_status(with_message(lost))
    assert not window.banner.isVisible()
    window.apply_status(with_message("detected language: German"))  # a new one does
    assert window.banner.text() == "detected language: German"
    window.apply_status(with_message(""))
    assert not window.banner.isVisible()
