"""`captioner gui` (being built)."""

from captioner.errors import UserError


def add_arguments(parser) -> None:
    pass


def run(args) -> int:
    raise UserError("'captioner gui' is not built yet")
