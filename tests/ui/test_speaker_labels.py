"""Who said what in the app (issue 44): the caption view heads a line with its speaker where the
speaker changes ("Meeting · Speaker 2"), a click on the name renames that speaker in every line
of theirs (shown already or to come) and in the overlay, and the session's transcript hears of
it; `captioner gui --speakers` and the panel's choice reach the engine's ``EngineConfig``."""

from __future__ import annotations

import pytest
from fakes import TIMEOUT_S, ConfigTakingFactory, Factory, write_tone_wav
from PySide6.QtCore import Qt

from captioner.engine.core import EngineConfig
from captioner.events import CaptionUpdate
from captioner.ui.caption_view import CaptionView
from captioner.ui.controls import ControlPanel
from captioner.ui.run_config import SPEAKER_MODES
from captioner.ui.settings import load_settings, open_settings

WAIT_MS = int(TIMEOUT_S * 1000)


def final(stream, text, start_s, end_s, speaker=""):
    return CaptionUpdate(stream, "final", text, start_s, end_s, end_s + 0.5, end_s + 0.7, segment=1, speaker=speaker)


def partial(stream, text, start_s, end_s, speaker=""):
    return CaptionUpdate(stream, "partial", text, start_s, end_s, end_s + 0.3, end_s + 0.4, segment=1, speaker=speaker)


CONVERSATION = [
    final("Meeting", "Good morning, everyone.", 0.0, 1.5, "Speaker 1"),
    final("Meeting", "Morning! Shall we start?", 3.0, 4.5, "Speaker 2"),
    final("Meeting", "Yes, the budget first.", 6.0, 7.5, "Speaker 1"),
]


def lines(view: CaptionView) -> list[str]:
    return [line for line in view.toPlainText().replace("\u2028", "\n").split("\n") if line]


@pytest.fixture
def view(qtbot):
    widget = CaptionView()
    qtbot.addWidget(widget)
    widget.resize(700, 500)
    widget.show()
    qtbot.waitExposed(widget)
    return widget


def click_name(qtbot, view, stream, speaker):
    rect = view.name_rect(stream, speaker)
    assert rect is not None, f"no heading names {speaker} of {stream}"
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def test_a_change_of_speaker_heads_a_line_with_the_stream_and_the_speaker(view):
    view.apply_updates(CONVERSATION[:2])
    view.apply_updates([final("Meeting", "And the minutes.", 8.0, 9.0, "Speaker 2")])
    # An unlabelled stream (a microphone: "Me") is headed by its name alone.
    view.apply_updates([final("Me", "I have a question.", 10.0, 11.0)])
    assert lines(view) == ["Meeting · Speaker 1", "Good morning, everyone.",
                           "Meeting · Speaker 2", "Morning! Shall we start?", "And the minutes.",
                           "Me", "I have a question."]
    # The name is a link to its speaker (it can be clicked); each speaker's is their own.
    rect = view.name_rect("Meeting", "Speaker 2")
    assert view.anchorAt(rect.center()).startswith("speaker:")
    assert view.anchorAt(view.name_rect("Meeting", "Speaker 1").center()) != view.anchorAt(rect.center())
    assert view.committed_text().splitlines()[1:3] == ["Meeting (Speaker 2): Morning! Shall we start?",
                                                       "Meeting (Speaker 2): And the minutes."]


def test_the_open_line_and_its_partial_are_headed_by_their_speaker(view):
    # A partial carries the engine's guess (the stream's last speaker, "Speaker 1" at first).
    view.apply_updates([partial("Meeting", "Good morning", 0.0, 1.0, "Speaker 1")])
    assert lines(view) == ["Meeting · Speaker 1", "Good morning"]
    view.apply_updates(CONVERSATION[:1] + [partial("Meeting", "Morning shall we", 3.0, 4.0, "Speaker 1")])
    assert lines(view) == ["Meeting · Speaker 1", "Good morning, everyone. Morning shall we"]
    # Committed, the words are the second speaker's: a heading of their own.
    view.apply_updates([final("Meeting", "Morning! Shall we start?", 3.0, 4.5, "Speaker 2")])
    assert lines(view) == ["Meeting · Speaker 1", "Good morning, everyone.", "Meeting · Speaker 2",
                           "Morning! Shall we start?"]


def test_a_click_on_the_name_renames_the_speaker_in_every_line_shown_and_to_come(view, qtbot):
    view.apply_updates(CONVERSATION + [final("Clip", "Another stream.", 8.0, 9.0, "Speaker 2")])
    click_name(qtbot, view, "Meeting", "Speaker 2")
    editor = view.name_editor
    assert editor.isVisible() and editor.text() == "Speaker 2" and editor.selectedText() == "Speaker 2"
    assert view.renaming == (view.session, "Meeting", "Speaker 2")
    with qtbot.waitSignal(view.speaker_renamed, timeout=WAIT_MS) as renamed:
        qtbot.keyClicks(editor, "Anna")
        qtbot.keyClick(editor, Qt.Key.Key_Return)
    assert renamed.args == [view.session, "Meeting", "Speaker 2", "Anna"]
    assert not editor.isVisible() and view.renaming is None
    assert lines(view) == ["Meeting · Speaker 1", "Good morning, everyone.",
                           "Meeting · Anna", "Morning! Shall we start?",
                           "Meeting · Speaker 1", "Yes, the budget first.",
                           "Clip · Speaker 2", "Another stream."]  # another stream's Speaker 2 is someone else
    view.apply_updates([final("Meeting", "Done with the budget.", 12.0, 13.0, "Speaker 2")])
    assert lines(view)[-2:] == ["Meeting · Anna", "Done with the budget."]
    assert view.speaker_name("Meeting", "Speaker 2") == "Anna"
    # Renamed again, from its new name.
    click_name(qtbot, view, "Meeting", "Speaker 2")
    assert editor.text() == "Anna"
    editor.setText("Anna Berg")
    qtbot.keyClick(editor, Qt.Key.Key_Enter)
    assert lines(view).count("Meeting · Anna Berg") == 2 and "Meeting · Anna" not in lines(view)


def test_escape_cancels_and_an_empty_name_keeps_the_old_one(view, qtbot):
    view.apply_updates(CONVERSATION)
    before = lines(view)
    renames = []
    view.speaker_renamed.connect(lambda *args: renames.append(args))
    click_name(qtbot, view, "Meeting", "Speaker 1")
    qtbot.keyClicks(view.name_editor, "Bob")
    qtbot.keyClick(view.name_editor, Qt.Key.Key_Escape)
    assert not view.name_editor.isVisible() and view.renaming is None
    assert lines(view) == before
    click_name(qtbot, view, "Meeting", "Speaker 1")
    view.name_editor.clear()
    qtbot.keyClicks(view.name_editor, "   ")
    qtbot.keyClick(view.name_editor, Qt.Key.Key_Return)
    assert lines(view) == before and renames == []
    assert view.speaker_name("Meeting", "Speaker 1") == "Speaker 1"


def test_f2_renames_the_last_speaker_and_up_and_down_reach_the_others(view, qtbot):
    view.apply_updates(CONVERSATION + [final("Meeting", "Agreed.", 9.0, 10.0, "Speaker 3")])
    view.setFocus()
    qtbot.keyClick(view, Qt.Key.Key_F2)
    editor = view.name_editor
    assert editor.isVisible() and editor.hasFocus() and view.renaming == (view.session, "Meeting", "Speaker 3")
    qtbot.keyClick(editor, Qt.Key.Key_Up)  # the speakers in the order first heard: 1, 2, 3
    assert view.renaming[2] == "Speaker 2" and editor.text() == "Speaker 2" and editor.selectedText() == "Speaker 2"
    qtbot.keyClick(editor, Qt.Key.Key_Up)
    qtbot.keyClick(editor, Qt.Key.Key_Up)  # round from the first to the last
    assert view.renaming[2] == "Speaker 3"
    qtbot.keyClick(editor, Qt.Key.Key_Down)
    assert view.renaming[2] == "Speaker 1"
    with qtbot.waitSignal(view.speaker_renamed, timeout=WAIT_MS) as renamed:
        qtbot.keyClicks(editor, "Ada")
        qtbot.keyClick(editor, Qt.Key.Key_Return)
    assert renamed.args == [view.session, "Meeting", "Speaker 1", "Ada"]
    assert lines(view).count("Meeting · Ada") == 2 and not editor.isVisible()


def test_the_rename_action_finds_the_speaker_or_says_there_is_none(window, qtbot):
    window.rename_action.trigger()
    assert not window.caption_view.name_editor.isVisible()
    assert window.statusBar().currentMessage().startswith("No speaker to rename yet")
    assert window.rename_action.shortcut().toString() == "F2"
    window.apply_captions(CONVERSATION[:2])
    window.rename_action.trigger()
    assert window.caption_view.renaming == (window.caption_view.session, "Meeting", "Speaker 2")
    qtbot.keyClicks(window.caption_view.name_editor, "Anna")
    qtbot.keyClick(window.caption_view.name_editor, Qt.Key.Key_Return)
    assert window.caption_view.speaker_name("Meeting", "Speaker 2") == "Anna"


def test_a_name_belongs_to_its_session(window):
    view = window.caption_view
    forwarded = []
    window.speaker_renamed.connect(lambda *args: forwarded.append(args))
    window.apply_captions(CONVERSATION[:2])
    assert view.rename_speaker("Meeting", "Speaker 2", "Anna")
    window.show_session_starting("tiny.en")  # the engine starts again: its Speaker 2 is whoever speaks second now
    window.apply_captions([final("Meeting", "Hello again.", 0.0, 1.0, "Speaker 2")])
    assert lines(view) == ["Meeting · Speaker 1", "Good morning, everyone.", "Meeting · Anna",
                           "Morning! Shall we start?", "Meeting · Speaker 2", "Hello again."]
    view.set_font_pt(view.font_pt + 2)  # a re-render replays both sessions as they were
    assert lines(view)[2] == "Meeting · Anna" and lines(view)[-2] == "Meeting · Speaker 2"
    # A speaker of the session before is renamed in the view only: its transcript is closed.
    assert view.rename_speaker("Meeting", "Speaker 1", "Bo", session=view.session - 1)
    assert lines(view)[0] == "Meeting · Bo"
    view.rename_speaker("Meeting", "Speaker 2", "Cy")
    assert forwarded == [("Meeting", "Speaker 2", "Anna"), ("Meeting", "Speaker 2", "Cy")]


def test_the_overlay_names_the_speaker_compactly(window):
    window.set_overlay_visible(True)
    window.apply_captions(CONVERSATION[:2])
    shown = window.overlay.shown_text()
    assert "Speaker 1:</span> Good morning" in shown and "Speaker 2:</span> Morning!" in shown
    assert "Meeting" not in shown  # one stream: the speaker's name alone
    window.caption_view.rename_speaker("Meeting", "Speaker 2", "Anna")
    assert "Anna:</span> Morning!" in window.overlay.shown_text()
    window.apply_captions([final("Me", "A question.", 5.0, 6.0)])
    shown = window.overlay.shown_text()
    assert "Meeting · Anna:</span> Morning!" in shown and "Me:</span> A question." in shown


def test_the_history_and_its_exports_use_the_names(window, tmp_path):
    window.apply_captions(CONVERSATION)
    window.caption_view.rename_speaker("Meeting", "Speaker 2", "Anna")
    items = [window.history.results.item(i).text() for i in range(window.history.results.count())]
    assert items[1].endswith("Meeting (Anna): Morning! Shall we start?")
    assert items[0].endswith("Meeting (Speaker 1): Good morning, everyone.")
    window.history.search_edit.setText("anna")
    assert [u.text for u in window.history.matches()] == ["Morning! Shall we start?"]
    window.history.search_edit.clear()
    window.history.export(tmp_path / "captions.vtt", "vtt")
    text = (tmp_path / "captions.vtt").read_text()
    assert "<v Anna>Morning! Shall we start?" in text and "<v Speaker 1>Good morning" in text


def test_the_top_line_of_the_overlay_always_says_whose_it_is(window):
    window.set_overlay_visible(True)
    words = " ".join(f"word{i}" for i in range(60))
    window.apply_captions([final("Meeting", words, 0.0, 20.0, "Speaker 1")])
    shown = window.overlay.shown_text()
    assert "word0 " not in shown and shown.startswith('<span style="color:#9fd0ff">Speaker 1:</span>')
    assert shown.count("Speaker 1:") == 1


def test_the_panel_offers_the_speaker_modes(qtbot):
    panel = ControlPanel()
    qtbot.addWidget(panel)
    combo = panel.speakers_combo
    assert [combo.itemData(i) for i in range(combo.count())] == [code for code, _ in SPEAKER_MODES] == ["auto", "on", "off"]
    assert panel.speakers() == "auto" and panel.run_config().speakers == "auto"
    panel.set_speakers("off")
    assert panel.run_config().speakers == "off"
    panel.set_speakers("sometimes")  # a hand-edited settings file: back to auto
    assert panel.speakers() == "auto"
    panel.set_running(True)
    assert not combo.isEnabled()


def test_gui_speakers_reaches_the_engine_config_for_this_run_only(open_app, tmp_path, gui_args, qtbot):
    clip = write_tone_wav(tmp_path / "clip.wav")
    factory = ConfigTakingFactory()
    args = gui_args("--speakers", "on", "--file", str(clip), "--no-start")
    assert args.speakers == "on" and gui_args().speakers is None
    window, _ = open_app(args, factory)
    assert window.controls.speakers() == "on"
    window.controls.start_button.click()
    qtbot.waitUntil(lambda: bool(factory.configs), timeout=WAIT_MS)
    (config,) = factory.configs
    assert isinstance(config, EngineConfig) and config.speakers.mode == "on"
    window.save_settings()
    # Given on the command line: this run's, not saved; chosen in the app: saved.
    assert load_settings(open_settings(args.settings)).speakers == "auto"
    window.controls.set_speakers("off")
    window.save_settings()
    assert load_settings(open_settings(args.settings)).speakers == "off"


def test_the_saved_choice_is_the_next_launch_s(open_app, tmp_path, gui_args, qtbot):
    clip = write_tone_wav(tmp_path / "clip.wav")
    args = gui_args("--file", str(clip), "--no-start")
    first, _ = open_app(args, ConfigTakingFactory())
    first.controls.set_speakers("off")
    first.close()  # saves the settings
    factory = ConfigTakingFactory()
    second, _ = open_app(gui_args("--file", str(clip), "--no-start"), factory)
    assert second.controls.speakers() == "off"
    second.controls.start_button.click()
    qtbot.waitUntil(lambda: bool(factory.configs), timeout=WAIT_MS)
    assert factory.configs[0].speakers.mode == "off"


def test_the_demo_alone_is_not_labelled_under_auto():
    from captioner.app.gui_app import session_speakers
    from captioner.ui.run_config import RunConfig, SourceChoice

    demo = SourceChoice("file", "Demo", "Demo: JFK", path="jfk.wav", demo=True)
    meeting = SourceChoice("device", "Meeting", "Monitor of speakers", device="pulse:out.monitor")
    assert session_speakers(RunConfig((demo,), speakers="auto")) == "off"
    assert session_speakers(RunConfig((demo,), speakers="on")) == "on"
    assert session_speakers(RunConfig((demo, meeting), speakers="auto")) == "auto"
    assert session_speakers(RunConfig((meeting,), speakers="auto")) == "auto"


def test_the_gui_refuses_an_unknown_speakers_mode(gui_args):
    with pytest.raises(SystemExit):
        gui_args("--speakers", "sometimes")


def _one_line_of_speaker_1(open_app, gui_args, tmp_path, qtbot):
    """The app captioning a file on a fake pipeline, its view showing one line of Speaker 1."""
    clip = write_tone_wav(tmp_path / "clip.wav")
    factory = Factory()
    window, controller = open_app(gui_args("--file", str(clip), "--no-start"), factory)
    window.controls.start_button.click()
    qtbot.waitUntil(lambda: window.state_label.text() == "Captioning", timeout=WAIT_MS)
    factory.built[0].captions = [final("clip", "Hello there.", 0.0, 1.0, "Speaker 1")]
    qtbot.waitUntil(lambda: window.caption_view.name_rect("clip", "Speaker 1") is not None, timeout=WAIT_MS)
    return window, controller


def test_a_rename_reaches_the_session_s_transcript(open_app, tmp_path, gui_args, qtbot, monkeypatch):
    import captioner.app.transcript as transcript_module

    renamed = []

    class Writer(transcript_module.TranscriptWriter):
        def rename_speaker(self, stream, speaker, name):
            renamed.append((stream, speaker, name))
            super().rename_speaker(stream, speaker, name)

    monkeypatch.setattr(transcript_module, "TranscriptWriter", Writer)
    window, controller = _one_line_of_speaker_1(open_app, gui_args, tmp_path, qtbot)
    click_name(qtbot, window.caption_view, "clip", "Speaker 1")
    qtbot.keyClicks(window.caption_view.name_editor, "Ada")
    qtbot.keyClick(window.caption_view.name_editor, Qt.Key.Key_Return)
    assert renamed == [("clip", "Speaker 1", "Ada")]
    assert "Speaker 1 of clip is now Ada" in window.statusBar().currentMessage()
    assert "# clip (Speaker 1) is Ada\n" in controller._transcript.path.read_text()


def test_a_transcript_writer_without_renaming_is_left_alone(open_app, tmp_path, gui_args, qtbot, monkeypatch):
    import captioner.app.transcript as transcript_module

    class OldWriter:  # what the controller uses of a writer that predates renaming
        def __init__(self, title=""):
            self.path = None

        def write(self, update):
            pass

        def close(self):
            pass

    monkeypatch.setattr(transcript_module, "TranscriptWriter", OldWriter)
    window, controller = _one_line_of_speaker_1(open_app, gui_args, tmp_path, qtbot)
    assert window.caption_view.rename_speaker("clip", "Speaker 1", "Ada")
    assert window.caption_view.speaker_name("clip", "Speaker 1") == "Ada"
