"""Errors that the command line turns into a one-line message and exit code 2."""


class UsageError(Exception):
    """Bad input from the user: unknown target, bad parameter, unreadable file.

    The message is a complete sentence shown as is, with no traceback.
    """


class TargetError(UsageError):
    """A normalizer target could not be resolved or is not usable."""
