"""Argument checks shared by the factories, the config and the sources.

One place words the error, so every integer argument is reported the same
way: its name, the bad value and the valid range.
"""

from __future__ import annotations

import numbers
from typing import Any

from xlstm_data.errors import DataConfigError


def check_int(name: str, value: Any, minimum: int, *, optional: bool = False) -> int | None:
    """Returns `value` as an int if it is an integer >= `minimum` (or None if optional).

    Args:
      name: The argument or config key, as the error should name it.
      value: The value to check; bools are not integers here.
      minimum: Smallest valid value.
      optional: Whether None is valid (and returned as is).
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        valid = f"an integer >= {minimum}" + (" or None" if optional else "")
        raise DataConfigError(f"{name}={value!r} is invalid; expected {valid}")
    return int(value)
