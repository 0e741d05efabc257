"""`captioner transcribe` (being built)."""

from captioner.errors import UserError


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    raise UserError("'captioner transcribe' is not built yet")
