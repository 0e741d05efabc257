"""One module per `captioner` subcommand: add_arguments(parser) and run(args).

Beside them, helpers that several commands share (not commands): ``device_option`` (the
compute ``--device`` and its check) and ``languages`` (the "detected language" line).
"""
