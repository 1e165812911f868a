"""Submodules loaded on first attribute access (PEP 562), for the package and its wings."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType


def submodules(package: str) -> Callable[[str], ModuleType]:
    """A module ``__getattr__`` for ``package``: ``package.name`` imports ``package.name`` when
    it is a submodule, else AttributeError."""

    def __getattr__(name: str) -> ModuleType:
        if name.startswith("_") or importlib.util.find_spec(f"{package}.{name}") is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return importlib.import_module(f"{package}.{name}")

    return __getattr__
