"""Broken files, really written: every one is a one-line UserError, never a traceback or a hang."""

import os

import numpy as np
import pytest
import soundfile as sf

from captioner.audio.file_source import (
    FileSource,
    check_audio_samples,
    open_audio_file,
    read_audio_16k,
)
from captioner.errors import UserError

READERS = {
    "open_audio_file": open_audio_file,
    "read_audio_16k": read_audio_16k,
    "FileSource": FileSource,
    "check_audio_samples": check_audio_samples,
}


def good_wav_bytes(tmp_path, seconds=1.0, rate_hz=16_000) -> bytes:
    path = tmp_path / "good.wav"
    sf.write(str(path), np.random.default_rng(0).uniform(-0.5, 0.5, int(seconds * rate_hz)), rate_hz, subtype="PCM_16")
    return path.read_bytes()


def make_bad(kind: str, tmp_path) -> os.PathLike:
    path = tmp_path / f"{kind}.wav"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated_header":
        path.write_bytes(good_wav_bytes(tmp_path)[:30])
    elif kind == "truncated_data":
        path.write_bytes(good_wav_bytes(tmp_path)[:44 + 3_000])
    elif kind == "random_bytes":
        path.write_bytes(np.random.default_rng(1).integers(0, 256, 8_000, dtype=np.uint8).tobytes())
    elif kind == "text":
        path = tmp_path / "notes.txt"
        path.write_text("this is not audio\n" * 50)
    elif kind == "4khz":
        sf.write(str(path), np.zeros(4_000), 4_000)
    elif kind == "no_samples":
        sf.write(str(path), np.zeros(0), 16_000)
    elif kind == "nan":
        x = np.zeros(16_000, np.float32)
        x[12_345] = np.nan
        sf.write(str(path), x, 16_000, subtype="FLOAT")
    elif kind == "inf_late":  # beyond the first decoded blocks
        x = np.zeros((96_000, 2), np.float32)
        x[90_000, 1] = np.inf
        sf.write(str(path), x, 48_000, subtype="FLOAT")
    elif kind == "truncated_flac":
        path = tmp_path / "cut.flac"
        sf.write(str(path), np.random.default_rng(2).uniform(-0.5, 0.5, 160_000), 16_000, format="FLAC")
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
    elif kind == "missing":
        path = tmp_path / "nowhere" / "missing.wav"
    elif kind == "folder":
        path = tmp_path
    else:
        raise ValueError(kind)
    return path


BAD_KINDS = ["empty", "truncated_header", "truncated_data", "random_bytes", "text", "4khz", "no_samples",
             "nan", "inf_late", "truncated_flac", "missing", "folder"]
EXPECTED = {
    "empty": "empty", "truncated_header": "not an audio file", "truncated_data": "truncated",
    "random_bytes": "not an audio file", "text": "not an audio file", "4khz": "at least 8000 Hz",
    "no_samples": "no audio samples", "nan": "NaN or infinite", "inf_late": "NaN or infinite",
    "truncated_flac": "truncated|damaged", "missing": "not found", "folder": "folder",
}
HEADER_ONLY_OK = {"nan", "inf_late", "truncated_flac"}  # only decoding the samples finds these


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_file_is_a_one_line_user_error(tmp_path, capfd, kind, reader):
    path = make_bad(kind, tmp_path)
    capfd.readouterr()
    if reader == "open_audio_file" and kind in HEADER_ONLY_OK:
        open_audio_file(path)  # the header is fine
        return
    with pytest.raises(UserError, match=EXPECTED[kind]) as caught:
        READERS[reader](path)
    message = str(caught.value)
    assert "\n" not in message and 0 < len(message) < 300
    assert caught.value.__cause__ is None  # no library exception chained into the report
    assert capfd.readouterr().err == ""  # no decoder chatter on the terminal either


def test_nan_found_while_replaying_ends_the_stream_with_the_error(tmp_path, sinks):
    source = FileSource(make_bad("inf_late", tmp_path), check_samples=False)  # not decoded up front
    sink = sinks.run_to_end(source)
    (end,) = sink.ends
    assert end.stream == source.stream
    assert "NaN or infinite samples (first at 1.875 s)" in end.error and "\n" not in end.error
    assert source.exhausted
    # What was decoded before the bad block still came, gapless, before the end.
    chunks = sink.chunks
    assert isinstance(sink.items[-1], type(end))
    assert all(a.end_sample == b.first_sample for a, b in zip(chunks, chunks[1:]))
    assert 1.5 <= chunks[-1].end_sample / source.rate_hz < 1.875


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_unreadable_file(tmp_path):
    path = tmp_path / "locked.wav"
    path.write_bytes(good_wav_bytes(tmp_path))
    path.chmod(0)
    with pytest.raises(UserError, match="cannot read"):
        open_audio_file(path)


def test_streaming_writers_zero_data_size_is_accepted(tmp_path):
    data = bytearray(good_wav_bytes(tmp_path))
    assert data[36:40] == b"data"
    data[40:44] = b"\xff\xff\xff\xff"  # a recorder that never went back to fill in the size
    path = tmp_path / "streamed.wav"
    path.write_bytes(bytes(data))
    assert len(read_audio_16k(path)) == 16_000


@pytest.mark.parametrize("fmt", ["OGG", "MP3"])
def test_a_compressed_file_cut_in_half_is_truncated_and_quiet(tmp_path, capfd, fmt):
    """An Ogg or MP3 recording cut off half-way is reported like a cut-off WAV, in one line, and
    the decoder's own complaints never reach the terminal."""
    import soundfile as sf

    from captioner.audio.file_source import check_audio_samples
    from captioner.audio.synthetic import tone

    whole = tmp_path / f"whole.{fmt.lower()}"
    sf.write(whole, tone(440.0, 6.0, rate_hz=16_000), 16_000, format=fmt)
    check_audio_samples(whole)  # the complete file is fine
    data = whole.read_bytes()
    half = tmp_path / f"half.{fmt.lower()}"
    half.write_bytes(data[: len(data) // 2])
    capfd.readouterr()
    with pytest.raises(UserError, match="truncated") as info:
        check_audio_samples(half)
    assert "\n" not in str(info.value)
    out, err = capfd.readouterr()
    assert err == "" and out == ""
