"""Imports of the frameworks that integrations need but the core never does.

Each framework is an extra of the package (``pip install "ray_ckpt[transformers]"``);
:func:`require` imports one, or raises ImportError that names the extra to install.
"""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = ("transformers", "lightning", "torchdata")
"""The extras named in pyproject.toml's ``[project.optional-dependencies]`` for integrations."""


def require(module: str, extra: str) -> ModuleType:
    """``module`` imported (``"transformers"``, ``"torchdata.stateful_dataloader"``, ...).

    When ``module`` or a package above it is not installed: ImportError (``name`` is the
    missing module) saying ``pip install "ray_ckpt[<extra>]"``. A module that is installed but
    fails to import raises its own error unchanged. ValueError when ``extra`` is none of
    :data:`EXTRAS`."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}: ray_ckpt's extras for integrations are {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if not missing or not (module == missing or module.startswith(missing + ".")):
            raise  # the framework is there, but something it imports is not: its own error says what
        raise ImportError(
            f"{module} is needed here but {missing} is not installed: "
            f'pip install "ray_ckpt[{extra}]" (or pip install {extra})',
            name=missing,
        ) from None
