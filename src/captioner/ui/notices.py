"""The words of the window's banner and of its language indicator (plain Python, no Qt).

Kept apart from the widgets so the wording can be read, and tested, in one place: what a new user
is told when there is no microphone, when a start fails, and when the engine has something to
say while captioning.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape

from captioner.languages import language_name


def demo_notice(title: str, devices_error: str | None = None) -> str:
    """The banner while the bundled sample plays because there is nothing else to caption."""
    why = f" ({escape(devices_error)})" if devices_error else ""
    return (
        f"<b>Demo:</b> no microphone was found{why}, so this is a recording that comes with captioner — "
        f"{escape(title)} — captioned live, at its real pace.<br>"
        "To caption your own audio: plug in a microphone and press <b>Refresh</b>; or tick a meeting's audio "
        "(an output's <i>monitor</i>, listed under “Meeting audio” in Sources) to caption what this computer plays; "
        "or <b>Add file…</b>. Then press <b>Start</b> (F5)."
    )


_NEXT_STEP = {
    "server": "Change the <b>Server</b> field (empty: caption on this computer), then press Start (F5).",
    "model": "Pick another model in the <b>Model</b> box, then press Start (F5).",
    "transcript": "Make room on the transcripts' disk (or point CAPTIONER_TRANSCRIPT_DIR at a folder that "
                  "can be written), then press Start (F5).",
}
_PICK_A_SOURCE = "Pick another source in Sources, then press Start (F5)."


def sentence_start(text: str) -> str:
    """``text`` with its first letter capitalised, unless its first word is a name that must
    stay as written (a URL, a path, a model or device name: "ws://…", "tiny.en", "hw:1")."""
    first = text.split(maxsplit=1)[0] if text.split() else ""
    if not first.isalpha() or not first.islower():
        return text
    return text[0].upper() + text[1:]


def failure_notice(message: str, hint: bool = True, setting: str = "") -> str:
    """The banner for a session that could not start or stopped on an error (``hint``: say what
    to do next, in the field ``setting`` names: "server", "model", "transcript" — also for a
    message about the transcript — or the sources by default), or for another failed request (a
    trace that would not open)."""
    text = message.strip() or "something went wrong"
    if not setting and "the transcript" in text:
        setting = "transcript"  # a session that stopped with lines unsaved: no other source helps
    html = f"<b>{escape(sentence_start(text))}</b>"
    return html + "<br>" + _NEXT_STEP.get(setting, _PICK_A_SOURCE) if hint else html


def fallback_notice(setting: str, saved: str, message: str, default_text: str) -> str:
    """The banner for a saved ``setting`` ("server", "model", "source"; its value ``saved``) that
    failed at launch with ``message``: this run uses ``default_text`` instead, and the saved value
    stays until the user changes it in the app or resets it."""
    field = {"server": "Server field", "model": "Model box", "source": "Sources"}.get(setting, setting)
    return (
        f"<b>The saved {escape(setting)} {escape(saved)} did not work</b> ({escape(message.strip())}).<br>"
        f"This run uses {escape(default_text)}. The saved {escape(setting)} is kept for the next launch "
        f"unless you change the {field} or reset it."
    )


def engine_notice(message: str) -> str:
    """The banner for a message of the engine while captioning (an input lost, a language notice)."""
    return escape(message.strip())


def language_text(languages: Mapping[str, str], detected: bool) -> str:
    """The status bar's language indicator: the language of each stream, as the captions say it
    (``detected``: the run asked for "auto", so these were recognised, not chosen)."""
    if not languages:
        return ""
    suffix = " (detected)" if detected else ""
    names = {stream: language_name(code) for stream, code in languages.items()}
    if len(set(names.values())) == 1:
        return f"Language: {next(iter(names.values()))}{suffix}"
    return "Languages: " + " · ".join(f"{stream} {name}" for stream, name in names.items()) + suffix
