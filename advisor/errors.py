"""Errors that reach the user as one sentence, never as a traceback."""


class AdvisorError(Exception):
    """An expected failure with a message fit for the user; `exit_code` follows DESIGN.md."""

    exit_code = 1


class BadInput(AdvisorError):
    """The user's file, flag or field is wrong (exit code 2)."""

    exit_code = 2


class DatabaseBusy(AdvisorError):
    """Another process holds the database's write lock."""

    exit_code = 1
