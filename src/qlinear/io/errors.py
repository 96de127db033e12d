"""The error the command reports as one line on stderr with exit status 2 (no traceback)."""


class UserError(Exception):
    """A problem with the user's input: a missing or corrupt file, an unknown format or type name, a
    tensor that cannot take the requested granularity, an output that already exists. The message
    names the file or tensor and the problem."""
