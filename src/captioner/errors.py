"""Errors meant for the person at the keyboard: the CLI prints their message on one line."""


class UserError(Exception):
    """Bad input or an unusable device. The message is one line, says what is wrong and, where
    possible, what to do; the CLI prints it and exits non-zero, never with a traceback."""

    exit_code = 2
