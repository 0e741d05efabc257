"""Terminal rendering of live captions: in place on a TTY, plain committed lines otherwise."""

import errno
import io
import re

import pytest

from captioner.app.live_view import TerminalView
from captioner.errors import UserError
from captioner.events import CaptionUpdate


def u(stream, kind, text, segment=0, start_s=0.0, end_s=1.0):
    return CaptionUpdate(stream, kind, text, start_s, end_s, end_s, end_s, segment=segment)


def screen(raw: str) -> list[str]:
    """A tiny terminal: applies the codes TerminalView uses and returns the visible lines."""
    lines = [""]
    row = 0
    for token in re.split(r"(\x1b\[\d*[A-Za-z]|\r|\n)", raw):
        if not token:
            continue
        if token == "\n":
            row += 1
            if row == len(lines):
                lines.append("")
        elif token == "\r":
            pass
        elif token.startswith("\x1b["):
            code, n = token[-1], token[2:-1]
            if code == "A":
                row -= int(n or 1)
            elif code == "K":
                lines[row] = ""
            elif code == "J":
                del lines[row + 1:]
                lines[row] = ""
        else:
            lines[row] += token
    return lines


def test_plain_output_shows_committed_cues_only():
    out = io.StringIO()
    view = TerminalView(out, tty=False)
    view.show([u("Me", "partial", "hello wor"), u("Me", "final", "hello world."), u("Me", "partial", "how")])
    assert out.getvalue() == ""  # the cue is still open: words may join it
    view.show([u("Me", "final", "Next one.", start_s=3.0, end_s=3.6)])  # after a pause: it is done
    assert out.getvalue() == "[Me] hello world.\n"
    view.close()
    assert out.getvalue() == "[Me] hello world.\n[Me] Next one.\n"


def test_a_silence_ends_the_open_cue_without_waiting_for_more_words():
    # A pipe reader sees the last sentence before a silence once nothing can join it: the
    # stream's capture has gone on long enough after its last word, and no partial is shown.
    out, now = io.StringIO(), [100.0]
    view = TerminalView(out, tty=False, clock=lambda: now[0])
    view.show([u("Me", "final", "and so my fellow", end_s=1.0), u("Me", "partial", "Americans")])
    now[0] += 10.0
    view.show([])
    assert out.getvalue() == ""  # "Americans" is still to be committed
    view.show([u("Me", "final", "Americans", start_s=1.0, end_s=1.6)])
    now[0] += 1.0
    view.show([])
    assert out.getvalue() == ""  # 1 s after the update: the speaker may have gone on unheard
    now[0] += 2.5
    view.show([])
    assert out.getvalue() == "[Me] and so my fellow Americans\n"
    # The same cue as the next words would have closed; they begin a cue of their own.
    view.show([u("Me", "final", "ask not", start_s=6.0, end_s=6.5)])
    view.close()
    assert out.getvalue() == "[Me] and so my fellow Americans\n[Me] ask not\n"


def test_tty_rewrites_partial_in_place_and_scrolls_closed_cues():
    out = io.StringIO()
    view = TerminalView(out, tty=True)
    view.show([u("Me", "partial", "hello wor", end_s=0.5)])
    assert screen(out.getvalue()) == ["[Me] hello wor"]
    assert "\x1b[2mhello wor\x1b[0m" in out.getvalue()  # partial text is dim
    view.show([u("Me", "final", "hello world", end_s=0.8), u("Me", "partial", "how are", 0.9, 1.3)])
    view.show([u("Meeting", "partial", "good morning", 1.0, 1.5)])
    assert screen(out.getvalue()) == ["[Me] hello world how are", "[Meeting] good morning"]
    # A pause after a sentence's end ends Me's cue: it scrolls up as committed text, the live
    # area follows.
    view.show([u("Me", "final", "how are you.", 0.9, 1.6), u("Me", "final", "next", start_s=3.5, end_s=3.9)])
    assert screen(out.getvalue()) == ["[Me] hello world how are you.", "[Me] next", "[Meeting] good morning"]
    view.close()
    # Closing keeps committed text and drops partials.
    assert screen(out.getvalue()) == ["[Me] hello world how are you.", "[Me] next", ""]


def test_a_long_monologue_scrolls_in_cues_of_two_lines_of_42_characters():
    out = io.StringIO()
    view = TerminalView(out, tty=True)
    words = ("so the first thing I want to say is that we looked at the remote control and the buttons are "
             "far too small for most people to read").split()
    for i, word in enumerate(words):
        view.show([u("Me", "final", word, start_s=0.35 * i, end_s=0.35 * i + 0.3)])
    view.close()
    lines = [line for line in screen(out.getvalue()) if line]
    assert " ".join(lines).replace("[Me] ", "").split() == words
    assert all(len(line) <= 42 for line in lines)
    assert sum(line.startswith("[Me] ") for line in lines) == (len(lines) + 1) // 2  # a label per cue


def test_one_stream_can_go_without_its_label():
    out = io.StringIO()
    view = TerminalView(out, tty=True, label_streams=False)
    view.show([u("talk", "final", "hello"), u("talk", "partial", "world")])
    assert screen(out.getvalue()) == ["hello world"]
    plain = io.StringIO()
    view = TerminalView(plain, tty=False, label_streams=False)
    view.show([u("talk", "final", "hello")])
    view.close()
    assert plain.getvalue() == "hello\n"


def test_a_note_goes_above_the_live_area_which_is_drawn_again():
    out = io.StringIO()
    view = TerminalView(out, tty=True)
    view.show([u("Me", "final", "guten"), u("Me", "partial", "Tag")])
    # stdout and stderr share the terminal: the note must land on a line of its own, with the
    # live line erased first and drawn again below it.
    view.note("captioner: detected language: German (de)", err=out)
    assert screen(out.getvalue()) == ["captioner: detected language: German (de)", "[Me] guten Tag"]
    view.show([u("Me", "final", "Tag"), u("Me", "partial", "")])
    assert screen(out.getvalue()) == ["captioner: detected language: German (de)", "[Me] guten Tag"]


class _Refusing(io.StringIO):
    """A stdout that refuses every write with ``error`` (a full disk, a reader gone)."""

    def __init__(self, error: OSError) -> None:
        super().__init__()
        self.error = error
        self.writes = 0

    def write(self, text):
        self.writes += 1
        raise self.error


def test_an_output_that_refuses_a_write_is_one_line_and_then_left_alone():
    for tty in (False, True):
        out = _Refusing(OSError(errno.ENOSPC, "No space left on device"))
        view = TerminalView(out, tty=tty)
        with pytest.raises(UserError, match=r"^cannot write standard output: No space left on device$"):
            view.show([u("Me", "final", "hello")])
        view.show([u("Me", "final", "again")])  # a stop drains the last captions: nothing is tried
        view.close()
        assert out.writes == 1


def test_a_reader_that_went_away_is_left_to_the_cli():
    out = _Refusing(BrokenPipeError(32, "Broken pipe"))
    view = TerminalView(out, tty=False)
    with pytest.raises(BrokenPipeError):  # the CLI ends quietly with exit status 141
        view.show([u("Me", "final", "hello")])
    view.close()
    assert out.writes == 1


def spk(stream, text, speaker, start_s, end_s):
    return CaptionUpdate(stream, "final", text, start_s, end_s, end_s, end_s, speaker=speaker)


def test_a_speakers_turn_is_headed_by_their_name_on_a_line_of_its_own():
    out = io.StringIO()
    view = TerminalView(out, tty=False)
    view.show([spk("Meeting", "Shall we start?", "Speaker 1", 0.0, 1.2),
               spk("Meeting", "Yes, the budget first, then the new office in town.", "Speaker 2", 2.0, 5.5),
               spk("Meeting", "Agreed.", "Speaker 1", 7.0, 7.5)])
    view.show([u("Me", "final", "I agree too.", start_s=9.0, end_s=10.0),
               spk("Meeting", "Good.", "Speaker 1", 11.0, 11.5)])
    view.close()
    assert out.getvalue().splitlines() == [
        "[Meeting (Speaker 1)]", "Shall we start?",
        "[Meeting (Speaker 2)]", "Yes, the budget first,", "then the new office in town.",
        "[Meeting (Speaker 1)]", "Agreed.",
        "[Me] I agree too.",
        "[Meeting (Speaker 1)]", "Good.",
    ]


def test_without_stream_labels_the_speaker_heads_the_turn_and_the_lines_have_the_whole_width():
    out = io.StringIO()
    view = TerminalView(out, tty=False, label_streams=False)
    words = "and so we decided that the second quarter would be about the new office in town"
    view.show([spk("Meeting", words, "Speaker 12", 0.0, 6.0)])
    view.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == "Speaker 12:"
    assert max(len(line) for line in lines[1:]) > 30 and all(len(line) <= 42 for line in lines), lines
    assert " ".join(lines[1:]).split() == words.split()


def test_on_a_terminal_the_open_turn_is_headed_too():
    out = io.StringIO()
    view = TerminalView(out, tty=True)
    view.show([spk("Meeting", "Shall we", "Speaker 1", 0.0, 0.8)])
    assert screen(out.getvalue())[:2] == ["[Meeting (Speaker 1)]", "Shall we"]
