"""A scripted recognizer with scripted attention, for AlignAtt tests without a model.

:class:`AttentiveScriptedRecognizer` is :class:`~scripted.ScriptedRecognizer` (a perfect listener
of a script of timed words) that, for requests whose policy reads attention
(``WindowRequest.alignment``), also says where each word "looked": its own end plus
``attend_lag_s``. Two of Whisper's habits can be scripted:

- ``guess_s``: the listener also "hears" the next scripted word up to this long before it
  ends in the audio (a guess from its first part), and its attention then lies past what the
  window holds;
- ``mishear``: word index -> (wrong text, context in seconds): while the window holds less than
  that much audio after the word, the listener hears the wrong text (JFK's "my" as "am I").
"""

from __future__ import annotations

from dataclasses import replace

from scripted import ScriptedRecognizer

from captioner.engine.policy.words import Hypothesis, Word


class AttentiveScriptedRecognizer(ScriptedRecognizer):
    def __init__(self, script, *, attend_lag_s: float = 0.0, guess_s: float = 0.0,
                 mishear: dict[int, tuple[str, float]] | None = None, **options) -> None:
        super().__init__(script, **options)
        self.attend_lag_s = attend_lag_s
        self.guess_s = guess_s
        self.mishear = mishear or {}
        self.alignment_asked: list[bool] = []  # per request: did the engine ask for attention

    def _hypothesis(self, r, request, log_mel) -> Hypothesis:
        hyp = super()._hypothesis(r, request, log_mel)
        self.alignment_asked.append(r.alignment)
        script = self.script.get(r.stream, [])
        words = list(hyp.words)
        if self.guess_s > 0 and not hyp.rejected:
            heard_ends = {w.end_s for w in words}
            following = [w for w in script if w.end_s >= request.end_s and w.start_s < request.end_s]
            for w in following[:1]:
                if w.end_s - request.end_s <= self.guess_s and w.end_s not in heard_ends:
                    segment = words[-1].segment if words else 0
                    words.append(Word(" " + w.text, w.start_s, w.end_s, segment))
        out = []
        for w in words:
            index = next((i for i, s in enumerate(script) if s.end_s == w.end_s), None)
            if index in self.mishear:
                wrong, context_s = self.mishear[index]
                if request.end_s - w.end_s < context_s:
                    w = w._replace(text=" " + wrong)
            if r.alignment:
                w = w._replace(attend_s=w.end_s + self.attend_lag_s)
            out.append(w)
        return replace(hyp, words=tuple(out))
