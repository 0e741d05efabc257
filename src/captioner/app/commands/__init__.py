"""One module per `captioner` subcommand: add_arguments(parser) and run(args)."""
