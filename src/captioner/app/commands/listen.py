"""`captioner listen` (being built)."""

from captioner.errors import UserError


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    raise UserError("'captioner listen' is not built yet")
