"""The streaming policy's settings: which commit rule, and the times and counts it works with.

Named settings (presets) and the default per device class are in
:mod:`captioner.engine.policy.presets`.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("auto", "localagreement", "alignatt")


@dataclass(slots=True)
class PolicyConfig:
    kind: str = "auto"
    """Which commit rule: ``"localagreement"`` (two agreeing hypotheses), ``"alignatt"`` (the
    cross-attention says the words were heard; falls back to agreement for a hypothesis
    without attention), or ``"auto"`` (the default, as on the command line): the one measured
    better on the engine's device class
    (:data:`captioner.engine.policy.presets.DEFAULT_BY_DEVICE`); or the name of a preset, a policy with
    some of these fields set (:data:`captioner.engine.policy.presets.PRESETS`, e.g. ``"alignatt-gpu"``),
    which the engine resolves with ``"auto"``."""
    trim_after_s: float = 12.0
    """Trim the buffer at a committed segment end that ends a sentence once it holds this much
    audio (at any committed segment end from halfway to ``max_buffer_s`` on)."""
    hold_s: float = 1.5
    """A silence this long commits the words still shown (:meth:`LocalAgreementPolicy.settle`)."""
    hold_min_p: float | None = 0.5
    """At ``hold_s``, shown words at the end that attended past the audio their hypothesis held
    and were chosen with less than this probability are not committed: the model may have
    guessed them in the pause; they wait for the speech after it or for ``long_pause_s``
    (``None``: every shown word is committed at ``hold_s``)."""
    long_pause_s: float = 4.0
    """A silence this long closes the open segment: the audio before it leaves the window and
    its words become the prompt (:meth:`LocalAgreementPolicy.settle`)."""
    max_buffer_s: float = 24.0
    """Past this, commit what is there and restart: a Whisper window holds 30 s."""
    prompt_words: int = 40
    """How many committed words (before the buffer) prompt the next window."""
    match_words: int = 5
    """How far back in the committed text a new hypothesis is matched against it."""
    match_tolerance_s: float = 1.5
    """Word times are spread over segments; a match further than this from where it should be is
    not trusted."""
    attend_margin_s: float = 0.4
    """AlignAtt: a word whose tokens attended within this much of the end of the audio heard so
    far is not committed yet (it may be cut off, or guessed)."""
    first_context_s: float = 2.5
    """AlignAtt: the first ``first_words`` of a segment are committed only once the window holds
    this much audio after them (Whisper hears "my fellow" as "am I" with nothing after it)."""
    first_words: int = 3
    sentence_context_s: float | None = 1.5
    """AlignAtt: the context the first words of a sentence that follows a committed sentence of
    the same segment wait for: its speech is in the window, or in the prompt after a trim (never
    more than ``first_context_s``; ``None``: ``first_context_s``). In conversation most words are
    among the first three of a short sentence (docs/latency.md)."""
    sure_p: float | None = None
    """AlignAtt: a first word (``first_words``) the decoder chose with at least this probability
    for each of its tokens needs no more context (``None``: every first word waits for it)."""
    first_words_per_sentence: bool = True
    """AlignAtt: the first-words rule applies after every committed sentence end too, not only
    at a segment's start (after a pause or the stream's start)."""
    commit_on_agreement: bool = False
    """AlignAtt: also commit what two consecutive hypotheses agree on (LocalAgreement's rule),
    whichever of the two rules commits more; the first-words rule holds for both."""
    close_overlap_s: float = 3.0
    """A closing window that starts at the committed text (see
    :meth:`LocalAgreementPolicy.start_after_committed`) starts this much earlier: the committed
    words that begin within it stay in the window (matched, not committed again), so a cut at a
    word end the attention placed a little early falls inside a committed word, not on the first
    word still to be heard (tiny.en, a window cut at "the|tents" heard "entrance"). 0: at the
    committed text's end. 3 s (the default) measured best (benchmarks/results/latency/HISTORY.md,
    "The closing window's overlap, fixed"). Only windows whose committed words carry measured
    times (AlignAtt's attention) are cut at all, so LocalAgreement is not affected.
    The closing hypothesis hears the kept words again, reworded, in part or alone: they are
    aligned to it as a whole (:meth:`LocalAgreementPolicy._match_kept`), so none is committed
    twice, and the words shown after them that it stops short of are committed
    (tests/engine/test_alignatt_close.py)."""
    forced_prefix: bool = True
    """LocalAgreement: the committed words still in the buffer are fed to the next window's
    decoder as a forced prefix (their tokens, as decoded), so an update decodes only what follows
    them instead of the whole buffer again (:meth:`LocalAgreementPolicy.forced_prefix`). AlignAtt
    reads the attention of every token and decodes the whole buffer."""
    prefix_tokens: int = 64
    """The longest forced prefix: the committed words up to this many tokens (a buffer is
    trimmed at 12 s, 30-45 tokens of speech; the bound keeps the decoder's prompt prefill within
    the widths a server warms up, see ``WhisperRecognizer.warm_up``)."""
