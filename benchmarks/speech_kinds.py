"""Which recordings of the shared set are read speech and which spontaneous, and how each is scored.

Read and spontaneous speech are reported apart (conversation loses more in streaming, and the two
must not hide each other in one pooled figure). The AMI headset channels also carry the other
speakers of the meeting 20-37 dB down: Whisper transcribes that crosstalk and their references
(the wearer's words only) do not hold it, so against the references they are scored by the
reference words missed, and streaming is compared with offline on them by agreement
(shared/speech/README.md, "Scoring notes").
"""

from __future__ import annotations

SPONTANEOUS_PREFIX = "en_spont_"

CROSSTALK_IDS = frozenset({"en_spont_ami_seriously_A_src0", "en_spont_ami_seriously_B_src1",
                           "en_spont_ami_seriously_D_src3"})


def kind(clip_id: str) -> str:
    """``"read"`` or ``"spontaneous"``."""
    return "spontaneous" if clip_id.startswith(SPONTANEOUS_PREFIX) else "read"


def crosstalk(clip_id: str) -> bool:
    """Whether the recording's reference leaves out speech it holds (insertions not errors)."""
    return clip_id in CROSSTALK_IDS
