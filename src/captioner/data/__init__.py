"""Files shipped with the package.

``jfk_inaugural_1961.flac``: 11 s of J. F. Kennedy's inaugural address (20 January 1961), a work
of the US government and so in the public domain; 16 kHz mono, from the `shared/speech` set
(`en_jfk_inaugural_excerpt`). It lets a machine with no microphone and no display show what the
app does: the desktop app captions it as a demo when there is nothing else to caption.
"""

from pathlib import Path

SAMPLE_SPEECH_TITLE = "J. F. Kennedy's inaugural address, 1961"
"""What the sample is, in words, for a user who hears it captioned."""


def sample_speech_path() -> Path:
    return Path(__file__).with_name("jfk_inaugural_1961.flac")
