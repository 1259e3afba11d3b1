"""The one error type for bad user input."""


class UserError(ValueError):
    """Bad user input: the CLI prints the one-line message and exits with code 2."""
