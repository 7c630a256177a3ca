"""One error type for every user-facing failure: the CLI prints it as one line and exits non-zero."""


class XmrError(Exception):
    """A problem with the user's input (config, file, argument); the message says what and how to fix it."""
