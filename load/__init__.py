"""The open-loop load generator, its metrics and command, and the fault and bad-input runs."""
