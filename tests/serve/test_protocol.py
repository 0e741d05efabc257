"""The protocol's pure parts: parameters, messages, pace, tokens, close reasons, URLs."""

from __future__ import annotations

import pytest

from captioner.errors import UserError
from captioner.serve import protocol
from captioner.serve.client import stream_url
from captioner.serve.protocol import ProtocolError
from captioner.serve.server import close_reason, is_loopback


def test_parameters_parse_with_defaults():
    assert protocol.parse_path("/v1/listen") == protocol.StreamParams("Me", None, 16000)
    params = protocol.parse_path("/v1/listen?label=Anna%20B&language=DE&sample_rate=48000")
    assert params == protocol.StreamParams("Anna B", "de", 48000)
    assert protocol.parse_path("/v1/listen?language=auto").language is None
    assert protocol.parse_path(protocol.listen_path("Me", "en", 8000)) == protocol.StreamParams("Me", "en", 8000)


@pytest.mark.parametrize("path, words", [
    ("/v1/listen?rate=16000", "unknown parameter 'rate'"),
    ("/v1/listen?label=a&label=b", "given twice"),
    ("/v1/listen?sample_rate=7999", "outside 8000..48000"),
    ("/v1/listen?sample_rate=96000", "outside 8000..48000"),
    ("/v1/listen?sample_rate=16000.5", "whole number"),
    ("/v1/listen?sample_rate=nan", "whole number"),
    ("/v1/listen?label=", "label must be"),
    ("/v1/listen?label=" + "x" * 65, "label must be"),
    ("/v1/listen?language=en-US;", "language must be"),
    ("/v1/listen?language=xx", "unknown language 'xx'"),  # no model has it: refused before the engine
    ("/v2/listen", "unknown path"),
])
def test_bad_parameters_are_policy_closes(path, words):
    with pytest.raises(ProtocolError) as caught:
        protocol.parse_path(path)
    assert caught.value.code == protocol.CLOSE_POLICY
    assert words in caught.value.reason and "\n" not in caught.value.reason


def test_audio_and_end_messages():
    assert protocol.check_audio(b"\x00\x01" * 160) == 160
    assert protocol.check_audio(protocol.END_MESSAGE) == -1
    assert protocol.check_audio('{ "type" : "end" }') == -1
    with pytest.raises(ProtocolError) as caught:
        protocol.check_audio(b"\x00" * 3)
    assert caught.value.code == protocol.CLOSE_BAD_PAYLOAD
    for text in ("hello", '{"type": "start"}', '{"type": "end", "x": 1}', "[]"):
        with pytest.raises(ProtocolError) as caught:
            protocol.check_audio(text)
        assert caught.value.code == protocol.CLOSE_UNSUPPORTED


def test_pace_allows_real_time_and_a_burst_but_not_an_upload():
    pace = protocol.Pace(max_ahead_s=10.0)
    for i in range(600):  # 60 s at real time, 100 ms a message
        pace.add(0.1, now_s=i * 0.1)
    burst = protocol.Pace(max_ahead_s=10.0)
    burst.add(9.0, now_s=0.0)  # a reconnecting client's backlog
    fast = protocol.Pace(max_ahead_s=10.0)
    with pytest.raises(ProtocolError) as caught:
        for i in range(1000):
            fast.add(0.1, now_s=i * 0.01)  # ten times real time
    assert caught.value.code == protocol.CLOSE_POLICY and "faster than real time" in caught.value.reason
    assert 10.0 < fast.audio_s < 12.0


def test_one_message_carries_at_most_the_audio_a_client_may_run_ahead():
    """The bound docs/protocol.md gives: 10 s of audio in one message (320,000 bytes at 16 kHz)
    is taken, a sample more is refused as it arrives (1008), far below the 1 MiB frame limit."""
    taken = protocol.Pace(protocol.MAX_AHEAD_S)
    taken.add(320_000 // 2 / 16_000, now_s=100.0)
    with pytest.raises(ProtocolError) as caught:
        protocol.Pace(protocol.MAX_AHEAD_S).add(320_002 // 2 / 16_000, now_s=100.0)
    assert caught.value.code == protocol.CLOSE_POLICY
    assert 960_000 < protocol.MAX_MESSAGE_BYTES  # 10 s at 48 kHz fits a message too


def test_a_close_this_server_began_is_told_apart_from_the_clients():
    """A slow reader dropped by websockets' keepalive (the server sends 1011 and hangs up) is the
    server's close, logged with its code, not "closed by the client"."""
    from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK
    from websockets.frames import Close

    ping = protocol.closed_by_server(ConnectionClosedError(None, Close(1011, "keepalive ping timeout")))
    assert (ping.code, ping.reason) == (1011, "keepalive ping timeout")
    idle = protocol.closed_by_server(ConnectionClosedOK(Close(1001, "x"), Close(1001, "no audio"), False))
    assert (idle.code, idle.reason) == (1001, "no audio")
    assert protocol.closed_by_server(ConnectionClosedOK(Close(1000, ""), Close(1000, ""), True)) is None
    assert protocol.closed_by_server(ConnectionClosedError(None, None)) is None  # it broke: no close frame
    # A normal close (1000, 1001) ends websockets' iteration quietly: the connection's state says who began it.
    state = type("State", (), {"close_sent": Close(1001, "no audio"), "close_rcvd": Close(1001, ""),
                               "close_rcvd_then_sent": False})
    assert protocol.ended_by_server(type("Ws", (), {"protocol": state})()).reason == "no audio"
    state.close_rcvd_then_sent = True  # the client's close, echoed
    assert protocol.ended_by_server(type("Ws", (), {"protocol": state})()) is None
    assert protocol.ended_by_server(object()) is None


def test_tokens_match_only_exactly():
    token = "s3cret-token-0123456789"
    assert protocol.token_matches(f"Bearer {token}", token)
    assert protocol.token_matches(f"bearer  {token} ", token)
    for header in (None, "", token, f"Basic {token}", f"Bearer {token}x", f"Bearer {token[:-1]}", "Bearer "):
        assert not protocol.token_matches(header, token), header


def test_close_reasons_fit_the_frame():
    reason = close_reason("é" * 100 + "\nmore")
    assert len(reason.encode()) <= 123 and "\n" not in reason and reason.startswith("é")


def test_loopback_and_urls():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.org")
    assert stream_url("ws://h:8765", "Me", None) == "ws://h:8765/v1/listen?label=Me&sample_rate=16000"
    assert stream_url("wss://h/v1/listen", "A B", "de").startswith("wss://h/v1/listen?label=A+B&sample_rate=16000&language=de")
    for bad in ("http://h:1", "h:8765", "ws://", "ws://h:port"):
        with pytest.raises(UserError):
            stream_url(bad, "Me", None)


def test_a_caption_message_made_from_its_fields_is_the_update_as_jsonl_writes_it():
    """The hub hands a front-end an update's values; the message the front-end makes of them
    with the client's label is the update's ``transcribe --format jsonl`` record, relabelled,
    with ``type`` in front. Checked through pickle, as the values travel."""
    import json
    import pickle
    from dataclasses import replace

    from captioner.events import CaptionUpdate

    update = CaptionUpdate("engine-key-7", "partial", "ask not what your country", 1.23456, 3.9876543,
                           4.1, 1796489160.123456, segment=2, language="en",
                           words=(("ask", 1.23456, 1.5), ("not", 1.5, 1.7777777)))
    fields = pickle.loads(pickle.dumps(protocol.caption_fields(update), protocol=pickle.HIGHEST_PROTOCOL))
    message = protocol.caption_message("Me", fields)
    expected = {"type": "caption", **replace(update, stream="Me").to_json_dict()}
    assert json.loads(message) == expected
    assert message == json.dumps(expected)
    assert json.loads(message)["words"] == [["ask", 1.235, 1.5], ["not", 1.5, 1.778]]


def test_a_client_may_say_what_its_audio_is():
    """``source=microphone|meeting|file`` (any case, as ``language=``); without it, or empty, the
    stream is ``remote``. The client's URL carries it only when it knows."""
    assert protocol.parse_path("/v1/listen").source == protocol.DEFAULT_SOURCE == "remote"
    assert protocol.parse_path("/v1/listen?source=").source == "remote"
    for source in protocol.CLIENT_SOURCES:
        assert protocol.parse_path(f"/v1/listen?source={source.upper()}").source == source
        path = protocol.listen_path("Me", None, 16000, source)
        assert protocol.parse_path(path) == protocol.StreamParams("Me", None, 16000, source)
    assert "source" not in protocol.listen_path("Me")
    assert stream_url("ws://h:8765", "Me", None, source="meeting") == \
        "ws://h:8765/v1/listen?label=Me&sample_rate=16000&source=meeting"


@pytest.mark.parametrize("path", ["/v1/listen?source=radio", "/v1/listen?source=remote", "/v1/listen?source=mic",
                                  "/v1/listen?source=file&source=meeting", "/v1/listen?source=%0Ameeting%0Ax"])
def test_a_bad_source_is_a_policy_close_on_one_line(path):
    with pytest.raises(ProtocolError) as caught:
        protocol.parse_path(path)
    assert caught.value.code == protocol.CLOSE_POLICY
    reason = caught.value.reason
    assert ("source must be one of microphone, meeting, file" in reason or "given twice" in reason), reason
    assert "\n" not in reason and len(close_reason(reason).encode()) <= 123


def _update(speaker: str):
    from captioner.events import CaptionUpdate

    return CaptionUpdate("engine-key-3", "final", "we are at present concerned", 9.5, 11.25, 12.0, 12.4,
                         segment=3, language="en", words=(("we", 9.5, 9.7),), speaker=speaker)


def test_the_speaker_travels_in_the_caption_message_only_where_there_is_one():
    import json
    import pickle

    labelled = json.loads(protocol.caption_message("Me", pickle.loads(pickle.dumps(
        protocol.caption_fields(_update("Speaker 2"))))))
    assert labelled["speaker"] == "Speaker 2"
    assert list(labelled)[-1] == "speaker"  # after the fields a client that predates it knows
    plain = json.loads(protocol.caption_message("Me", protocol.caption_fields(_update(""))))
    assert "speaker" not in plain
    assert {k: v for k, v in labelled.items() if k != "speaker"} == plain


def test_a_client_that_predates_the_speaker_still_reads_the_message():
    """A reader written before the field (the project's client as it was: every known field by
    name, ``.get`` for the optional ones, nothing else looked at) gets the same caption from a
    labelled message as from an unlabelled one."""
    import json

    from captioner.events import CaptionUpdate

    def old_reader(text: str) -> CaptionUpdate:
        message = protocol.parse_server_message(text)
        assert message["type"] == "caption"
        return CaptionUpdate(
            stream="Me", kind=message["kind"], text=message["text"], start_s=message["start_s"],
            end_s=message["end_s"], emitted_audio_s=message["emitted_audio_s"],
            emitted_wall_s=message["emitted_wall_s"], segment=message.get("segment", 0),
            language=message.get("language", ""),
            words=tuple((str(w), float(a), float(b)) for w, a, b in message.get("words", ())))

    labelled = protocol.caption_message("Me", protocol.caption_fields(_update("Speaker 1")))
    plain = protocol.caption_message("Me", protocol.caption_fields(_update("")))
    assert old_reader(labelled) == old_reader(plain)
    assert old_reader(labelled).text == "we are at present concerned"
    assert json.loads(labelled)["speaker"] == "Speaker 1"


def test_the_project_client_keeps_the_speaker_and_says_what_its_sources_are(tmp_path):
    """`listen --server` and the app's remote mode: a caption's ``speaker`` reaches the update
    (an unlabelled message gives ""), and each source's ``origin`` becomes its ``source=``."""
    from captioner.audio.file_source import FileSource
    from captioner.serve.client import RemotePipeline, _Link, source_kind

    remote = RemotePipeline([], server="ws://127.0.0.1:9")
    link = _Link(remote, "Me")
    for speaker in ("Speaker 2", ""):
        text = protocol.caption_message("Me", protocol.caption_fields(_update(speaker)))
        link._caption(protocol.parse_server_message(text), offset_s=100.0)
    first, second = remote.drain_captions()
    assert (first.speaker, second.speaker) == ("Speaker 2", "")
    assert first.start_s == 109.5 and first.text == "we are at present concerned"

    import numpy as np
    import soundfile as sf

    wav = tmp_path / "a.wav"
    sf.write(str(wav), np.zeros(1600, np.int16), 16000, subtype="PCM_16")

    class Monitor:
        stream = "Meeting"
        origin = "meeting"

    class Microphone:
        stream = "Me"
        origin = "microphone"

    class Odd:
        stream = "Odd"
        origin = "remote"  # not one a client may give: not said

    class Silent:
        stream = "Synthetic"  # says nothing

    sources = [FileSource(wav, stream="File"), Monitor(), Microphone(), Odd(), Silent()]
    assert [source_kind(s) for s in sources] == ["file", "meeting", "microphone", None, None]
    remote = RemotePipeline(sources, server="ws://127.0.0.1:9")
    assert {label: link.source for label, link in remote._links.items()} == {
        "File": "file", "Meeting": "meeting", "Me": "microphone", "Odd": None, "Synthetic": None}


def test_the_clients_speakers_option_drops_the_labels_or_leaves_a_microphone_unsaid():
    """`listen --server --speakers off` drops the server's labels; `--speakers on` does not say a
    microphone is one (a server under ``auto`` labels it then); ``auto`` says what each source is."""
    import argparse

    from captioner.app.remote_listen import remote_pipeline
    from captioner.serve.client import _Link

    class Microphone:
        stream = "Me"
        origin = "microphone"

    class Monitor:
        stream = "Meeting"
        origin = "meeting"

    sources = [Microphone(), Monitor()]
    for speakers, said, kept in (("auto", {"Me": "microphone", "Meeting": "meeting"}, "Speaker 2"),
                                 ("on", {"Me": None, "Meeting": "meeting"}, "Speaker 2"),
                                 ("off", {"Me": "microphone", "Meeting": "meeting"}, "")):
        args = argparse.Namespace(server="ws://127.0.0.1:9", token=None, language=None, speakers=speakers)
        remote = remote_pipeline(sources, args, transcript=None)
        assert {label: link.source for label, link in remote._links.items()} == said, speakers
        _Link(remote, "Meeting")._caption(protocol.parse_server_message(
            protocol.caption_message("Meeting", protocol.caption_fields(_update("Speaker 2")))), 0.0)
        assert [u.speaker for u in remote.drain_captions()] == [kept], speakers
    with pytest.raises(UserError, match="speakers must be one of auto, on, off"):
        remote_pipeline(sources, argparse.Namespace(server="ws://127.0.0.1:9", language=None, speakers="yes"), None)
