"""The caption view lays captions out as captions (captioner.layout): cues of at most two lines
of at most 42 characters, broken at a sentence's end and a pause first, the same lines wherever
the commits fell, the partial words laid out after the committed ones."""

from __future__ import annotations

from captioner import layout
from captioner.events import CaptionUpdate
from captioner.ui.caption_view import CaptionView

SPEECH = ("And so my fellow Americans, ask not what your country can do for you. "
          "Ask what you can do for your country.").split()


def _timed(words, start_s=0.0, word_s=0.3, gap_s=0.05, pause_after=None):
    out, t = [], start_s
    for i, w in enumerate(words):
        out.append((w, round(t, 3), round(t + word_s, 3)))
        t += word_s + gap_s + (0.8 if i == pause_after else 0.0)
    return out


def _finals(words, sizes, stream="Me"):
    out, at, k = [], 0, 0
    while at < len(words):
        piece = words[at:at + sizes[k % len(sizes)]]
        out.append(CaptionUpdate(stream, "final", " ".join(w for w, _, _ in piece), piece[0][1], piece[-1][2],
                                 piece[-1][2], piece[-1][2], words=tuple(piece)))
        at, k = at + len(piece), k + 1
    return out


def _lines(view: CaptionView) -> list[str]:
    return [line for line in view.toPlainText().replace("\u2028", "\n").split("\n") if line]


def test_the_same_words_give_the_same_lines_however_the_commits_fell(qtbot):
    words = _timed(SPEECH, pause_after=SPEECH.index("you."))
    views = []
    for sizes in ([3], [1, 5, 2], [len(words)]):
        view = CaptionView()
        qtbot.addWidget(view)
        view.apply_updates(_finals(words, sizes))
        views.append(_lines(view))
    assert views[0] == views[1] == views[2]
    lines = views[0]
    assert lines[0] == "Me" and all(len(line) <= layout.MAX_LINE_CHARS for line in lines[1:])
    assert " ".join(lines[1:]).split() == SPEECH
    # The pause after "you." ends a cue there.
    assert any(line.endswith("you.") for line in lines)


def test_the_partial_is_laid_out_after_the_committed_words(qtbot):
    view = CaptionView()
    qtbot.addWidget(view)
    words = _timed(SPEECH[:9])  # "And so my fellow Americans, ask not what your"
    view.apply_updates(_finals(words, [4]) + [CaptionUpdate("Me", "partial", "country can do for you.", 3.2, 4.8,
                                                            4.8, 4.9)])
    lines = _lines(view)
    assert lines[0] == "Me" and len(lines) <= 1 + layout.MAX_LINES
    assert " ".join(lines[1:]) == "And so my fellow Americans, ask not what your country can do for you."
    assert all(len(line) <= layout.MAX_LINE_CHARS for line in lines[1:])
    # Committed and then re-laid out (a re-render) the same way.
    view.apply_updates(_finals(_timed(SPEECH[9:14], 3.2), [5]))
    before = _lines(view)
    view.set_font_pt(view.font_pt + 2)
    assert _lines(view) == before
