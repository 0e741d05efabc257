"""The speech sample shipped in the package (what scripts/run-app.sh captions on a machine with
no display and no microphone) is installed and readable."""

from captioner.audio.file_source import read_audio_16k
from captioner.data import sample_speech_path


def test_bundled_sample_is_eleven_seconds_of_speech():
    audio = read_audio_16k(sample_speech_path())
    assert 10.5 < audio.shape[0] / 16_000 < 11.5
    assert float(abs(audio).max()) > 0.1  # speech, not silence
