"""The streaming policy: turns a stream's run of window hypotheses into partial and committed captions.

:mod:`.words`: ``Word`` and ``Hypothesis`` (the recognizer's output) and the pure helpers on words;
:mod:`.config`: ``PolicyConfig``; :mod:`.local_agreement`: ``LocalAgreementPolicy`` (two agreeing
hypotheses commit), the base of :mod:`.alignatt`: ``AlignAttPolicy`` (the cross-attention says what
was heard whole); :mod:`.presets`: the policies by name, presets and ``make_policy``.
The names are re-exported here for users outside the engine; the engine imports the modules.
"""

from captioner.engine.policy.alignatt import AlignAttPolicy
from captioner.engine.policy.config import POLICIES, PolicyConfig
from captioner.engine.policy.local_agreement import TRIM_GAP_S, LocalAgreementPolicy
from captioner.engine.policy.presets import DEFAULT_BY_DEVICE, PRESETS, make_policy
from captioner.engine.policy.words import (
    CUT_NEAR_S,
    CUT_WORD_S,
    DICTATED_MIN_DIGITS,
    WORD_PIECES,
    Hypothesis,
    Word,
    ends_sentence,
    heard_before_cut,
    is_number,
    join_dictated_digits,
    join_words,
    normalize_word,
    whole_words,
    words_from_segments,
)

__all__ = [
    "CUT_NEAR_S",
    "CUT_WORD_S",
    "DEFAULT_BY_DEVICE",
    "DICTATED_MIN_DIGITS",
    "POLICIES",
    "PRESETS",
    "TRIM_GAP_S",
    "WORD_PIECES",
    "AlignAttPolicy",
    "Hypothesis",
    "LocalAgreementPolicy",
    "PolicyConfig",
    "Word",
    "ends_sentence",
    "heard_before_cut",
    "is_number",
    "join_dictated_digits",
    "join_words",
    "make_policy",
    "normalize_word",
    "whole_words",
    "words_from_segments",
]
