"""`captioner devices` (being built)."""

from captioner.errors import UserError


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    raise UserError("'captioner devices' is not built yet")
