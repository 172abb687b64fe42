"""Errors that the command line turns into one clear message and exit code 2."""

from __future__ import annotations

__all__ = ["ConfigError", "DataError", "Interrupted", "ScaletrainError"]


class ScaletrainError(Exception):
    """A problem the user can fix; the message names the fix.

    The CLI prints ``error: <message>`` and exits with :attr:`exit_code` instead of a traceback.
    :attr:`details` (a traceback of the user's own code, say) go to a log, never to the terminal.
    """

    exit_code = 2
    details: str | None = None


class DataError(ScaletrainError):
    """A dataset is missing, truncated, corrupt or inconsistent."""


class ConfigError(ScaletrainError):
    """An impossible or unknown setting (flag, config file value, workload option)."""


class Interrupted(ScaletrainError):
    """The user stopped the run (Ctrl-C); every process of it has been stopped."""

    exit_code = 130
