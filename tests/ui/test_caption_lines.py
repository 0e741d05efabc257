"""The caption view's lines end at a sentence end or a pause (issue 14), whatever the policy and
wherever the commits fell: the same words give the same lines."""

from __future__ import annotations

from captioner.events import CaptionUpdate
from captioner.ui.caption_view import CaptionView


def _final(text, segment=0, stream="Me"):
    return CaptionUpdate(stream, "final", text, 0.0, 1.0, 1.5, 1.6, segment=segment)


def _lines(view: CaptionView) -> list[str]:
    return [line for line in view.toPlainText().split("\n") if line]


def test_lines_end_at_sentence_ends_and_pauses_however_the_commits_fell(qtbot):
    # One way: commits as LocalAgreement makes them, a sentence end inside a segment.
    one = CaptionView()
    qtbot.addWidget(one)
    one.apply_updates([_final("And so my"), _final("fellow Americans, ask not."), _final("What your country"),
                       _final("can do for you", segment=1)])
    # Another: the same words committed in other pieces.
    other = CaptionView()
    qtbot.addWidget(other)
    other.apply_updates([_final("And so my fellow"), _final("Americans, ask"), _final("not."), _final("What"),
                         _final("your country"), _final("can do for you", segment=1)])
    expected = ["Me", "And so my fellow Americans, ask not.", "What your country", "can do for you"]
    assert _lines(one) == _lines(other) == expected


def test_a_partial_after_a_sentence_end_starts_the_next_line(qtbot):
    view = CaptionView()
    qtbot.addWidget(view)
    view.apply_updates([_final("Ask not."), CaptionUpdate("Me", "partial", "what your", 1.0, 1.5, 1.6, 1.7)])
    assert _lines(view) == ["Me", "Ask not.", "what your"]
    view.apply_updates([_final("What your country")])  # the partial committed: the same line
    assert _lines(view) == ["Me", "Ask not.", "What your country"]
    view.set_font_pt(view.font_pt + 2)  # a re-render keeps the lines
    assert _lines(view) == ["Me", "Ask not.", "What your country"]
