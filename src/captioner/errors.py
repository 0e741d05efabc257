"""Errors meant for the person at the keyboard: the CLI prints their message on one line."""


class UserError(ValueError):
    """Bad input or an unusable device. The message is one line, says what is wrong and, where
    possible, what to do; the CLI prints it and exits non-zero, never with a traceback.

    A ``ValueError``, so a program calling the public API catches bad arguments the usual way."""

    exit_code = 2


def one_line(error: object) -> str:
    """An exception (or any text) folded onto one line, for messages that must stay one line;
    the exception's type name when it has no text."""
    text = " ".join(str(error).split())
    return text or (type(error).__name__ if isinstance(error, BaseException) else "")


class StreamRefused(UserError):
    """A new stream was refused because the engine is at capacity (GPU memory under its floor,
    or the step time would push existing streams past their update-interval limit). Streams
    already running are never degraded to make room; the server answers it with close code 1013."""
