"""The lines that say which language was heard, for the terminal commands.

Not a command itself: ``transcribe`` (offline and ``--realtime``) and ``listen`` print on stderr,
once, the language a multilingual model detected when the language was left to it, and the
engine's notice when an English-only model hears another language. A person sees at once when
speech was taken for the wrong language (and can name the right one, or the right model).
"""

from __future__ import annotations

# Whisper's languages by code, as its tokenizer lists them (code -> English name).
LANGUAGE_NAMES: dict[str, str] = {
    "en": "English", "zh": "Chinese", "de": "German", "es": "Spanish", "ru": "Russian",
    "ko": "Korean", "fr": "French", "ja": "Japanese", "pt": "Portuguese", "tr": "Turkish",
    "pl": "Polish", "ca": "Catalan", "nl": "Dutch", "ar": "Arabic", "sv": "Swedish",
    "it": "Italian", "id": "Indonesian", "hi": "Hindi", "fi": "Finnish", "vi": "Vietnamese",
    "he": "Hebrew", "uk": "Ukrainian", "el": "Greek", "ms": "Malay", "cs": "Czech",
    "ro": "Romanian", "da": "Danish", "hu": "Hungarian", "ta": "Tamil", "no": "Norwegian",
    "th": "Thai", "ur": "Urdu", "hr": "Croatian", "bg": "Bulgarian", "lt": "Lithuanian",
    "la": "Latin", "mi": "Maori", "ml": "Malayalam", "cy": "Welsh", "sk": "Slovak",
    "te": "Telugu", "fa": "Persian", "lv": "Latvian", "bn": "Bengali", "sr": "Serbian",
    "az": "Azerbaijani", "sl": "Slovenian", "kn": "Kannada", "et": "Estonian", "mk": "Macedonian",
    "br": "Breton", "eu": "Basque", "is": "Icelandic", "hy": "Armenian", "ne": "Nepali",
    "mn": "Mongolian", "bs": "Bosnian", "kk": "Kazakh", "sq": "Albanian", "sw": "Swahili",
    "gl": "Galician", "mr": "Marathi", "pa": "Punjabi", "si": "Sinhala", "km": "Khmer",
    "sn": "Shona", "yo": "Yoruba", "so": "Somali", "af": "Afrikaans", "oc": "Occitan",
    "ka": "Georgian", "be": "Belarusian", "tg": "Tajik", "sd": "Sindhi", "gu": "Gujarati",
    "am": "Amharic", "yi": "Yiddish", "lo": "Lao", "uz": "Uzbek", "fo": "Faroese",
    "ht": "Haitian Creole", "ps": "Pashto", "tk": "Turkmen", "nn": "Nynorsk", "mt": "Maltese",
    "sa": "Sanskrit", "lb": "Luxembourgish", "my": "Myanmar", "bo": "Tibetan", "tl": "Tagalog",
    "mg": "Malagasy", "as": "Assamese", "tt": "Tatar", "haw": "Hawaiian", "ln": "Lingala",
    "ha": "Hausa", "ba": "Bashkir", "jw": "Javanese", "su": "Sundanese", "yue": "Cantonese",
}


def is_auto(language: str | None) -> bool:
    """Whether the language was left to the model to detect."""
    return language in (None, "", "auto")


def detected_language_line(code: str, stream: str | None = None) -> str:
    """``captioner: detected language: German (de)`` (the stream named when there are several)."""
    name = LANGUAGE_NAMES.get(code)
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
