"""The "detected language" line of the terminal commands: said once per stream, only when the
language was left to a multilingual model."""

from captioner.app.commands.languages import LanguageReport, detected_language_line
from captioner.events import CaptionUpdate


def u(stream, language, kind="partial"):
    return CaptionUpdate(stream, kind, "text", 0.0, 1.0, 1.0, 1.0, language=language)


def test_the_line_names_the_language_and_its_code():
    assert detected_language_line("de") == "captioner: detected language: German (de)"
    assert detected_language_line("yue", "Meeting") == "captioner: detected language (Meeting): Cantonese (yue)"
    assert detected_language_line("xx") == "captioner: detected language: xx"  # a code we cannot name


def test_said_once_per_stream_when_the_model_detected_it():
    report = LanguageReport("auto", multilingual=True, name_streams=True)
    assert report.lines([u("Me", "")]) == []  # nothing detected yet
    assert report.lines([u("Me", "de"), u("Me", "de", "final"), u("Meeting", "fr")]) == [
        "captioner: detected language (Me): German (de)", "captioner: detected language (Meeting): French (fr)"]
    assert report.lines([u("Me", "en")]) == []


def test_quiet_when_nothing_was_detected():
    assert LanguageReport(None, multilingual=False).lines([u("Me", "en")]) == []  # English-only model
    assert LanguageReport("de", multilingual=True).lines([u("Me", "de")]) == []  # named by the user
