"""The forced prefix with the real tiny.en (CPU): three recordings as three streams of one live
captioner under LocalAgreement, replayed on a simulated clock, once with the committed words
fed to the decoder as a prefix (the default) and once without. Every prefix decodes to the
committed words it stands for, the decoder then decodes a third of the tokens, and the captions
lose nothing against the run without it."""

from __future__ import annotations

import pytest

from captioner.engine.core import EngineConfig
from captioner.engine.live import LiveCaptioner
from captioner.engine.policy import PolicyConfig, normalize_word
from captioner.engine.simulate import replay
from e2e_helpers import plain_wer

pytestmark = pytest.mark.slow

CLIPS = ("en_ljspeech_LJ001-0001", "en_ls_1089-134686-0000", "en_jfk_inaugural_excerpt")


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
    assert wer_on <= wer_off + 0.02, (with_prefix, without)
