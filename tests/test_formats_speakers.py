"""Speaker labels in every caption file format, in the layout, and in the values that carry a
caption (JSON, traces): a reader that does not know the field still reads the rest."""

from __future__ import annotations

import io
import json

from captioner.events import CaptionUpdate
from captioner.formats import Caption, CaptionStreamWriter, laid_out, render
from captioner.layout import MAX_LINE_CHARS, check, cues
from captioner.trace import event_from_dict, event_to_dict


def _timed(text: str, start_s: float, step_s: float = 0.4) -> tuple[tuple[str, float, float], ...]:
    return tuple((w, round(start_s + i * step_s, 3), round(start_s + i * step_s + 0.3, 3))
                 for i, w in enumerate(text.split()))


LINES = [
    CaptionUpdate("call", "final", "Good morning, how can I help?", 0.0, 2.2, 2.5, 2.6,
                  words=_timed("Good morning, how can I help?", 0.0), speaker="Speaker 1"),
    CaptionUpdate("call", "final", "I lost my card.", 2.5, 3.7, 4.0, 4.1,
                  words=_timed("I lost my card.", 2.5), speaker="Speaker 2"),
    CaptionUpdate("call", "final", "Let me look.", 4.3, 5.3, 5.6, 5.7, words=_timed("Let me look.", 4.3),
                  speaker="Speaker 1"),
]


def test_text_srt_and_vtt_say_who_speaks():
    captions = laid_out(LINES, 0.5)
    assert [c.speaker for c in captions] == ["Speaker 1", "Speaker 2", "Speaker 1"]  # a new speaker, a new cue
    assert render(captions, "txt") == ("Speaker 1: Good morning, how can I help?\n"
                                       "Speaker 2: I lost my card.\nSpeaker 1: Let me look.\n")
    srt = render(captions, "srt")
    assert "\nSpeaker 2: I lost my card.\n" in srt and srt.startswith("1\n00:00:00,000 --> ")
    vtt = render(captions, "vtt")
    assert "\n<v Speaker 2>I <00:00:02.900>lost" in vtt and vtt.count("<v Speaker 1>") == 2
    # With streams labelled too, both are said ("call (Speaker 2)").
    both = render(laid_out(LINES, 0.5, label_streams=True), "txt", label_streams=True)
    assert "call (Speaker 2): I lost my card." in both.splitlines()


def test_jsonl_has_the_speaker_only_where_there_is_one():
    record = json.loads(render([LINES[1]], "jsonl"))
    assert record["speaker"] == "Speaker 2" and record["text"] == "I lost my card."
    plain = CaptionUpdate("call", "final", "hello", 0.0, 1.0, 1.0, 1.0)
    assert "speaker" not in plain.to_json_dict()  # readers that predate speakers see what they saw
    assert "speaker" not in Caption(0.0, 1.0, "hello").to_json_dict()
    assert Caption(0.0, 1.0, "hi", speaker="Speaker 3").to_json_dict()["speaker"] == "Speaker 3"


def test_a_long_line_keeps_room_for_its_label():
    text = "and then we went over every single figure in the quarterly report again"
    line = CaptionUpdate("call", "final", text, 0.0, 6.0, 6.0, 6.0, words=_timed(text, 0.0, 0.45),
                         speaker="Speaker 12")
    laid = cues([line])
    assert check(laid) == []
    for cue in laid:
        first = f"{cue.speaker}: {cue.lines[0]}"
        assert len(first) <= MAX_LINE_CHARS and all(len(line) <= MAX_LINE_CHARS for line in cue.lines), cue.lines


def test_the_live_writer_labels_cues_as_the_whole_file_does():
    out = io.StringIO()
    writer = CaptionStreamWriter(out, "txt")
    for line in LINES:
        writer.write([line])
    writer.finish()
    assert out.getvalue() == render(laid_out(LINES, 0.5), "txt")


def test_a_trace_keeps_the_speaker_and_an_old_trace_reads_without_it():
    record = event_to_dict(LINES[1])
    assert record["speaker"] == "Speaker 2"
    assert event_from_dict(record) == LINES[1]
    del record["speaker"]  # a trace written before speakers
    assert event_from_dict(record).speaker == ""
    # Made by position, as the server's protocol makes it from its fields: the speaker is last.
    assert CaptionUpdate("s", "final", "x", 0.0, 1.0, 1.0, 1.0, 0, "en", ()).speaker == ""
