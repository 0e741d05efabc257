"""The forced prefix with the real tiny.en (CPU): two recordings as two streams of one live
captioner under LocalAgreement, replayed on a simulated clock, once with the committed words
fed to the decoder as a prefix (the default) and once without. Every prefix decodes to the
committed words it stands for, the decoder then decodes half the tokens or fewer, and the
captions lose no more than a reworded word against the run without it (seen here, 2026-12-01:
189 tokens decoded against 427, "flower- fat and sauce" against "flower-fatened sauce")."""

from __future__ import annotations

import pytest

from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.policy.config import PolicyConfig
from captioner.engine.policy.words import normalize_word
from captioner.engine.simulate import replay
from e2e_helpers import plain_wer

pytestmark = pytest.mark.slow

CLIPS = ("en_ls_1089-134686-0000", "en_jfk_inaugural_excerpt")


class Spy:
    """The recognizer, seeing each request's prefix beside the committed words it should hold."""

    def __init__(self, inner, live_of):
        self.inner, self.live_of = inner, live_of
        self.seen: list[tuple[tuple[int, ...], str]] = []
        self.decoded = self.forced = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def decode(self, requests):
        engine = self.live_of().engine
        for r in requests:
            committed = engine._streams[r.stream].policy._s.committed
            self.seen.append((r.prefix, "".join(w.text for w in committed)))
        out = self.inner.decode(requests)
        for r, h in zip(requests, out):
            self.forced += len(r.prefix)
            self.decoded += max(0, len(h.tokens) - len(r.prefix))
        return out


def _run(tiny_en_cpu, speech_clips, forced: bool):
    backend, recognizer = tiny_en_cpu
    made = {}

    def make(clock, timer):
        spy = Spy(recognizer, lambda: made["live"])
        live = made["live"] = LiveCaptioner(
            recognizer=spy, backend=backend, clock_ns=clock, timer_ns=timer,
            config=EngineConfig(policy=PolicyConfig(kind="localagreement", forced_prefix=forced)))
        made["spy"] = spy
        return live

    result = replay(make, {c: str(speech_clips[c].wav) for c in CLIPS}, compute=0.04)
    text = {c: " ".join(u.text for u in result.updates if u.kind == "final" and u.stream == c) for c in CLIPS}
    return made["spy"], text


def test_committed_words_are_decoded_once(tiny_en_cpu, speech_clips):
    tok = tiny_en_cpu[1].tokenizer
    on, with_prefix = _run(tiny_en_cpu, speech_clips, True)
    off, without = _run(tiny_en_cpu, speech_clips, False)
    prefixed = [(p, committed) for p, committed in on.seen if p]
    assert len(prefixed) >= len(on.seen) / 3
    for prefix, committed in prefixed:
        assert tok.is_timestamp(prefix[0])
        said = [normalize_word(w) for w in tok.decode(prefix).split()]
        held = [normalize_word(w) for w in committed.split()]
        assert said == held[:len(said)] and len(said) >= len(held) - 1, (said, held)
    assert not any(p for p, _ in off.seen)
    # The decoder's own steps: a third or less of those without the prefix.
    assert on.decoded <= 0.5 * off.decoded, (on.decoded, off.decoded)
    references = [speech_clips[c].reference for c in CLIPS]
    wer_on = plain_wer(references, [with_prefix[c] for c in CLIPS])
    wer_off = plain_wer(references, [without[c] for c in CLIPS])
    print(f"decoded tokens {on.decoded} with the prefix ({on.forced} forced), {off.decoded} without; "
          f"WER {wer_on:.3f} with, {wer_off:.3f} without")
    # Two recordings, about fifty words: a word reworded at a sentence's end is two points.
    words = sum(len(r.split()) for r in references)
    assert wer_on * words <= wer_off * words + 2, (with_prefix, without)
