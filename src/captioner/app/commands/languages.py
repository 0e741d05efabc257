"""The lines that say which language was heard, for the terminal commands.

Not a command itself: ``transcribe`` (offline and ``--realtime``) and ``listen`` print on stderr,
once, the language a multilingual model detected when the language was left to it, and the
engine's notice when an English-only model hears another language. A person sees at once when
speech was taken for the wrong language (and can name the right one, or the right model).
"""

from __future__ import annotations

from captioner.languages import WHISPER_LANGUAGES, language_code


def is_auto(language: str | None) -> bool:
    """Whether the language was left to the model to detect."""
    return language_code(language) is None


def detected_language_line(code: str, stream: str | None = None) -> str:
    """``captioner: detected language: German (de)`` (the stream named when there are several)."""
    name = WHISPER_LANGUAGES.get(code)
    what = f"{name} ({code})" if name else code
    where = f" ({stream})" if stream else ""
    return f"captioner: detected language{where}: {what}"


class LanguageReport:
    """Says, once per stream, which language the model detected in live updates.

    Quiet unless the language was left to the model and the model is multilingual (an
    English-only model detects nothing: its updates all say "en"). Called from one thread."""

    def __init__(self, language: str | None, multilingual: bool, name_streams: bool = False) -> None:
        self.active = is_auto(language) and multilingual
        self.name_streams = name_streams
        self._said: set[str] = set()

    def lines(self, updates) -> list[str]:
        """The lines to print for ``updates`` (``CaptionUpdate``s): one per stream, the first
        time it carries a language."""
        if not self.active:
            return []
        out = []
        for update in updates:
            if update.language and update.stream not in self._said:
                self._said.add(update.stream)
                out.append(detected_language_line(update.language, update.stream if self.name_streams else None))
        return out


def notice_line(notice, name_stream: bool = False) -> str:
    """The engine's language notice (:class:`~captioner.engine.language_check.LanguageNotice`)
    as one line: ``captioner: this sounds like German; tiny.en is English-only — try --model base``."""
    where = f"{notice.stream}: " if name_stream and notice.stream else ""
    return f"captioner: {where}{notice.message}"
