"""Exceptions a user can cause, kept apart so callers can catch them precisely.

Every message names the config key or argument that is wrong, the bad value and
what would be valid, so a failed launch can be fixed without reading our code.
"""

from __future__ import annotations


class DataConfigError(ValueError):
    """A config value or argument is invalid; raised before any data is read."""


class DataReadError(ValueError):
    """A stored record could not be decoded; names the file and record index."""


class DataCheckpointError(DataConfigError):
    """A saved data position cannot be resumed by this run; says why and how to proceed."""
