"""The command line: one module per command that does more than call another."""
