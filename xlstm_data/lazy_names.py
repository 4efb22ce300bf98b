"""A package's public names, imported on first use (PEP 562).

`import xlstm_data` would otherwise load JAX, grain and orbax (~2.5 s of CPU)
before a command line could refuse a mistyped flag, and a multi-process run's
launcher, which only watches its child, would load them for nothing.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package` for its lazily imported names.

    Args:
      package: The package's `__name__`.
      exports: Each public name and the module it comes from. A name that is
        the module's own last component (`"sources": "xlstm_data.sources"`)
        stands for the module itself.

    Returns:
      `(__getattr__, __dir__)`, to assign at the package's top level.
    """

    def getattr_(name: str) -> Any:
        module_name = exports.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_name)
        value = module if module_name.rpartition(".")[2] == name else getattr(module, name)
        vars(sys.modules[package])[name] = value  # later lookups skip this function
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return getattr_, dir_
