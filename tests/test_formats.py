"""Caption writers: every SRT/WebVTT file we write must parse with real parser libraries and
give back the text and times we wrote, including text that breaks naive writers."""

from __future__ import annotations

import errno
import html
import io
import json
import os
import re
import stat

import pytest
import srt
import webvtt

from captioner.events import CaptionUpdate
from captioner.formats import (
    FORMATS,
    Caption,
    CaptionStreamWriter,
    captions_from_updates,
    check_writable,
    cue_lines,
    format_timestamp,
    laid_out,
    render,
    render_jsonl,
    render_srt,
    render_txt,
    render_vtt,
    write_captions,
    write_file_atomically,
    write_srt,
    write_vtt,
)

NASTY = [
    Caption(0.0, 1.5, "Hello world.", "Me"),
    Caption(1.5, 3.25, "first line\nsecond line", "Meeting"),
    Caption(3.25, 4.0, "para one\n\n\npara two", "Me"),
    Caption(4.0, 5.0, "a --> b ---> c", "Me"),
    Caption(5.0, 6.0, "00:00:01,000 --> 00:00:02,000", "Me"),
    Caption(6.0, 7.0, "1\n\n00:00:09.000 --> 00:00:10.000\ninjected", "Me"),
    Caption(7.0, 8.0, "x < y & z > w <b>bold</b>", "Me"),
    Caption(8.0, 8.0, "zero length", "Me"),
    Caption(9.0, 10.0, "   ", "Me"),  # nothing to show: skipped in subtitles
    Caption(10.0, 11.0, "Grüße, 你好 — ok", "Me"),
    Caption(11.0, 12.0, "windows\r\nline ends\rold mac", "Me"),
]
SHOWN = [c for c in NASTY if c.text.strip()]


def _parse_srt(text: str) -> list[srt.Subtitle]:
    return list(srt.parse(text, ignore_errors=False))


def _parse_vtt(text: str):
    return list(webvtt.from_buffer(io.StringIO(text)))


def test_format_timestamp_basic_and_rounding():
    assert format_timestamp(0) == "00:00:00.000"
    assert format_timestamp(1.2346) == "00:00:01.235"
    assert format_timestamp(59.9996) == "00:01:00.000"
    assert format_timestamp(3661.5, decimal_marker=",") == "01:01:01,500"
    assert format_timestamp(125.0, always_include_hours=False) == "02:05.000"
    assert format_timestamp(3725.0, always_include_hours=False) == "01:02:05.000"
    assert format_timestamp(-3.0) == "00:00:00.000"
    assert format_timestamp(100 * 3600 + 1) == "100:00:01.000"
    with pytest.raises(ValueError):
        format_timestamp(float("nan"))


def test_cue_lines_make_text_safe():
    assert cue_lines("a\n\n b  c \n") == ["a", "b c"]
    assert cue_lines("a --> b ----> c -> d") == ["a -> b -> c -> d"]
    assert cue_lines("x\r\ny\rz") == ["x", "y", "z"]
    assert cue_lines(" \n\t\n") == []


def test_srt_parses_with_srt_library_and_round_trips():
    text = render_srt(NASTY)
    subs = _parse_srt(text)
    assert [s.index for s in subs] == list(range(1, len(SHOWN) + 1))
    for sub, caption in zip(subs, SHOWN):
        assert sub.start.total_seconds() == pytest.approx(caption.start_s, abs=1e-3)
        expected_end = max(caption.end_s, caption.start_s + 0.001)
        assert sub.end.total_seconds() == pytest.approx(expected_end, abs=1e-3)
        assert sub.end > sub.start
        lines = cue_lines(caption.text)
        assert sub.content.split("\n") == [f"{caption.stream}: {lines[0]}", *lines[1:]]
    # Several streams -> each cue names its stream; the injected fake cue stays text.
    assert subs[1].content == "Meeting: first line\nsecond line"
    assert subs[2].content == "Me: para one\npara two"
    assert "injected" in subs[5].content and len(subs) == len(SHOWN)
    assert "-->" not in "".join(s.content for s in subs)
    # The library's own writer reads back the same cues.
    assert _parse_srt(srt.compose(subs, reindex=False)) == subs


def test_vtt_parses_with_webvtt_and_round_trips():
    text = render_vtt(NASTY)
    assert text.startswith("WEBVTT\n\n")
    cues = _parse_vtt(text)
    assert len(cues) == len(SHOWN)
    for cue, caption in zip(cues, SHOWN):
        assert cue.start == format_timestamp(caption.start_s)
        assert cue.end == format_timestamp(max(caption.end_s, caption.start_s + 0.001))
        assert cue.voice == caption.stream
        assert html.unescape(cue.text).split("\n") == cue_lines(caption.text)
    assert html.unescape(cues[6].text) == "x < y & z > w <b>bold</b>"
    assert cues[8].text == "Grüße, 你好 — ok"


def test_vtt_times_parse_exactly():
    caps = [Caption(0.001, 0.5, "a"), Caption(61.25, 62.0, "b"), Caption(3599.999, 3600.5, "c")]
    cues = _parse_vtt(render_vtt(caps))
    assert [(c.start, c.end) for c in cues] == [
        ("00:00:00.001", "00:00:00.500"),
        ("00:01:01.250", "00:01:02.000"),
        ("00:59:59.999", "01:00:00.500"),
    ]
    # A single stream needs no voice spans.
    assert all(c.voice is None for c in cues)


def test_long_file_over_hours_both_formats():
    # 3 h of 7.3 s captions, crossing the 1 h, 2 h and 99:59 digit boundaries within reason.
    captions = [Caption(i * 7.3, i * 7.3 + 6.9, f"caption {i}") for i in range(1500)]
    subs = _parse_srt(render_srt(captions))
    cues = _parse_vtt(render_vtt(captions))
    assert len(subs) == len(cues) == 1500
    last = captions[-1]
    assert subs[-1].start.total_seconds() == pytest.approx(last.start_s, abs=1e-3)
    assert subs[-1].end.total_seconds() == pytest.approx(last.end_s, abs=1e-3)
    assert cues[-1].start == format_timestamp(last.start_s)
    assert cues[-1].start.startswith("03:")
    assert [s.content for s in subs] == [c.text for c in cues] == [c.text for c in captions]
    huge = [Caption(101 * 3600 + 2.5, 101 * 3600 + 4, "late")]
    assert _parse_srt(render_srt(huge))[0].start.total_seconds() == pytest.approx(101 * 3600 + 2.5)
    assert _parse_vtt(render_vtt(huge))[0].start == "101:00:02.500"


def test_write_to_path_and_file(tmp_path):
    path = tmp_path / "out.srt"
    write_srt(NASTY[:2], path)
    data = path.read_bytes()
    assert b"\r\n" not in data
    assert len(_parse_srt(data.decode("utf-8"))) == 2
    buffer = io.StringIO()
    write_vtt(NASTY[:2], buffer)
    assert len(_parse_vtt(buffer.getvalue())) == 2
    for fmt in FORMATS:
        target = tmp_path / f"all.{fmt}"
        write_captions(NASTY, target, fmt)
        assert target.read_text(encoding="utf-8") == render(NASTY, fmt)
    with pytest.raises(ValueError):
        render(NASTY, "docx")


class _DiskFills:
    """``os.write``: a few bytes of the first write to a file in ``folder`` land, then the disk
    is full (ENOSPC), as a real full disk tears a write."""

    def __init__(self, monkeypatch, folder) -> None:
        self.folder = os.path.realpath(folder)
        self._real_write = os.write
        self._torn = False
        monkeypatch.setattr(os, "write", self._write)

    def _write(self, fd, data):
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if os.path.dirname(name) != self.folder:
            return self._real_write(fd, data)
        if not self._torn and len(data) > 5:
            self._torn = True
            return self._real_write(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    new, old = tmp_path / "new.srt", tmp_path / "old.srt"
    old.write_text("the old cues\n", encoding="utf-8")
    with monkeypatch.context() as patch:
        _DiskFills(patch, tmp_path)
        for path in (new, old):
            with pytest.raises(OSError) as failed:
                write_file_atomically(path, render_srt(NASTY))
            assert failed.value.errno == errno.ENOSPC
    # Neither a 0-byte new.srt nor the temporary file; old.srt as it was.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.srt"]
    assert old.read_text(encoding="utf-8") == "the old cues\n"


def test_a_rewritten_file_keeps_its_mode_and_a_link_stays_a_link(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old\n", encoding="utf-8")
    target.chmod(0o640)
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    write_file_atomically(link, "new\n")
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.txt", "real.txt"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
def test_a_device_is_written_in_place():
    with pytest.raises(OSError) as failed:
        write_file_atomically("/dev/full", "hello\n")
    assert failed.value.errno == errno.ENOSPC
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)  # not replaced by a plain file
    write_file_atomically(os.devnull, "hello\n")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_check_writable_finds_a_full_disk_and_leaves_nothing(tmp_path, monkeypatch):
    check_writable(tmp_path / "out.txt")
    assert list(tmp_path.iterdir()) == []
    with monkeypatch.context() as patch:
        _DiskFills(patch, tmp_path)
        with pytest.raises(OSError, match="No space left on device"):
            check_writable(tmp_path / "out.txt")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError):
        check_writable(tmp_path / "no" / "folder.txt")


def test_txt_labels_and_skips_empty():
    assert render_txt([Caption(0, 1, "a\nb", "Me"), Caption(1, 2, "  ", "Me")]) == "a\nb\n"
    assert render_txt(NASTY[:2]) == "Me: Hello world.\nMeeting: first line\nsecond line\n"
    assert render_txt(NASTY[:2], label_streams=False) == "Hello world.\nfirst line\nsecond line\n"


def test_jsonl_captions_and_live_updates():
    update = CaptionUpdate("Me", "partial", "hel", 1.0, 1.5, 1.6, 1.7, segment=3, language="en")
    final = CaptionUpdate("Me", "final", "hello --> \n\n there", 1.0, 2.0, 2.2, 2.3, segment=3)
    lines = render_jsonl([NASTY[5], update, final]).splitlines()
    records = [json.loads(line) for line in lines]
    keys = {"stream", "kind", "text", "start_s", "end_s", "emitted_audio_s", "emitted_wall_s"}
    assert all(keys <= set(r) for r in records)
    assert records[0]["text"] == NASTY[5].text and records[0]["kind"] == "final"
    assert records[0]["emitted_wall_s"] is None
    assert records[1] == update.to_json_dict()
    assert records[2]["text"] == "hello --> \n\n there"
    assert "你好" in render_jsonl([NASTY[9]])


def test_captions_from_updates_keeps_finals():
    updates = [
        CaptionUpdate("Me", "partial", "hel", 1.0, 1.5, 1.6, 1.7),
        CaptionUpdate("Me", "final", "hello", 1.0, 2.0, 2.2, 2.3, language="en"),
    ]
    assert captions_from_updates(updates) == [Caption(1.0, 2.0, "hello", "Me", "en")]


class Flushes(io.StringIO):
    """A text file that counts its flushes."""

    flushes = 0

    def flush(self):
        self.flushes += 1
        super().flush()


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("label", [False, True])
def test_streamed_output_is_what_render_gives_at_once(fmt, label):
    # However the captions arrive (one by one, in batches, with empty batches between), the
    # stream written is exactly the whole file laid out at once: valid SRT/WebVTT, cues
    # numbered on (JSON Lines: every item as it came).
    for sizes in ([1] * len(NASTY), [3, 0, 2, 4, 1], [len(NASTY)]):
        out = Flushes()
        writer = CaptionStreamWriter(out, fmt, label_streams=label)
        at = 0
        for size in sizes:
            writer.write(NASTY[at:at + size])
            at += size
        writer.write(NASTY[at:])
        writer.finish()
        whole = NASTY if fmt == "jsonl" else laid_out(NASTY, 0.5, label_streams=label)
        assert out.getvalue() == render(whole, fmt, label_streams=label), (fmt, sizes)


def test_stream_writer_flushes_each_committed_caption_and_starts_vtt_with_its_header():
    out = Flushes()
    writer = CaptionStreamWriter(out, "vtt")
    assert out.getvalue() == "WEBVTT\n" and out.flushes == 1  # the header before any cue
    updates = [CaptionUpdate("Me", "partial", "hel", 0.0, 0.5, 0.5, 0.6),
               CaptionUpdate("Me", "final", "hello", 0.0, 0.6, 0.7, 0.8)]
    writer.write(updates[:1])
    assert out.getvalue() == "WEBVTT\n" and out.flushes == 1  # a partial is not a cue
    writer.write(updates[1:])
    assert out.getvalue() == "WEBVTT\n"  # the cue is open: words may still join it
    after = CaptionUpdate("Me", "final", "Then more.", 3.0, 3.6, 3.7, 3.8)  # after a long silence
    writer.write([after])
    # "hello" is shown for 5/6 s at least, into the silence after it.
    assert out.getvalue() == "WEBVTT\n\n00:00:00.000 --> 00:00:00.833\nhello\n" and out.flushes == 2
    writer.finish()
    assert out.getvalue().endswith("\n\n00:00:03.000 --> 00:00:03.833\nThen more.\n")
    # txt: the cues' lines; jsonl: every update, partials too.
    txt, jsonl = io.StringIO(), io.StringIO()
    text_writer = CaptionStreamWriter(txt, "txt")
    text_writer.write(updates)
    text_writer.finish()
    CaptionStreamWriter(jsonl, "jsonl").write(updates)
    assert txt.getvalue() == "hello\n"
    assert [json.loads(line)["kind"] for line in jsonl.getvalue().splitlines()] == ["partial", "final"]
    with pytest.raises(ValueError, match="unknown caption format"):
        CaptionStreamWriter(io.StringIO(), "docx")


# -- word-level times (issue 14) ------------------------------------------------------------------

TIMED = [
    Caption(1.0, 2.5, "And so, my fellow-Americans", "jfk",
            words=(("And", 1.02, 1.2), ("so,", 1.25, 1.5), ("my", 1.6, 1.8), ("fellow-", 1.9, 2.1),
                   ("Americans", 2.1, 2.44))),
    Caption(2.6, 3.3, "ask <not> & ...", "jfk", words=(("ask", 2.62, 2.8), ("<not>", 2.8, 3.0), ("&", 3.0, 3.1),
                                                       ("...", 3.1, 3.3))),
    Caption(5.0, 6.0, "no times here", "jfk"),
]


def test_vtt_cues_carry_each_word_time_and_parse():
    text = render_vtt(TIMED)
    cues = _parse_vtt(text)
    assert len(cues) == 3
    # The cue runs from its first word's start to its last word's end.
    assert (cues[0].start, cues[0].end) == ("00:00:01.020", "00:00:02.440")
    # Every word after the first has its start as a WebVTT timestamp tag, inside the cue, rising.
    tags = re.findall(r"<(\d\d:\d\d:\d\d\.\d\d\d)>", cues[0].raw_text)
    assert tags == ["00:00:01.250", "00:00:01.600", "00:00:01.900", "00:00:02.100"]
    # Without the tags the cue's text is the caption's, hyphenation and escaping kept.
    assert re.sub(r"<\d\d:\d\d:\d\d\.\d\d\d>", "", cues[0].raw_text) == "And so, my fellow-Americans"
    assert html.unescape(re.sub(r"<\d\d:\d\d:\d\d\.\d\d\d>", "", cues[1].raw_text)) == "ask <not> & ..."
    assert "<" not in cues[2].raw_text


def test_srt_cue_times_come_from_the_words():
    subs = _parse_srt(render_srt(TIMED))
    assert [(s.start.total_seconds(), s.end.total_seconds()) for s in subs] == [(1.02, 2.44), (2.62, 3.3), (5.0, 6.0)]
    assert subs[0].content == "And so, my fellow-Americans"


def test_jsonl_has_a_words_list_for_captions_and_live_updates():
    update = CaptionUpdate("jfk", "final", "ask not", 2.6, 3.0, 3.5, 3.6, words=(("ask", 2.6, 2.8), ("not", 2.8, 3.0)))
    rows = [json.loads(line) for line in render_jsonl([*TIMED, update]).splitlines()]
    assert rows[0]["words"][1] == ["so,", 1.25, 1.5]
    assert rows[2]["words"] == []
    assert rows[3]["words"] == [["ask", 2.6, 2.8], ["not", 2.8, 3.0]]
    # A live update's words reach the subtitle writers through captions_from_updates.
    assert captions_from_updates([update])[0].words == update.words
    # Every existing constructor keeps working: words default to none.
    assert CaptionUpdate("s", "partial", "x", 0, 1, 1, 1).words == ()


def test_words_that_do_not_spell_the_text_leave_the_cue_plain():
    odd = Caption(0.0, 1.0, "hello world", words=(("goodbye", 0.1, 0.5), ("world", 0.5, 0.9)))
    cue = _parse_vtt(render_vtt([odd]))[0]
    assert cue.raw_text == "hello world"
