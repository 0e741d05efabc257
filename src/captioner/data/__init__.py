"""Files shipped with the package.

``jfk_inaugural_1961.flac``: 11 s of J. F. Kennedy's inaugural address (20 January 1961), a work
of the US government and so in the public domain; 16 kHz mono, from the `shared/speech` set
(`en_jfk_inaugural_excerpt`). It lets a machine with no microphone and no display show what the
app does.
"""

from pathlib import Path


def sample_speech_path() -> Path:
    return Path(__file__).with_name("jfk_inaugural_1961.flac")
