"""The ``inferwire`` command: every subcommand's arguments, each calling its layer."""
