"""Module-level ``__getattr__`` that imports heavy submodules on first use."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_attributes"]


def lazy_attributes(module_name: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``module_name`` serving ``table[name]``'s attribute ``name``.

    The value is cached in the module's namespace, so later lookups are plain
    attribute reads; keeping the import out of module load keeps ``import
    toolservices`` free of torch, Ray and the MCP SDK.
    """

    def __getattr__(name: str) -> Any:
        source = table.get(name)
        if source is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(source), name)
        setattr(sys.modules[module_name], name, value)
        return value

    return __getattr__
