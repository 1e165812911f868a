"""The flat layout's module paths, still importable after the move into wings.

``import ray_ckpt.chaos``, ``from ray_ckpt.timeline import recoveries`` and
``python -m ray_ckpt.cli`` keep working: each old name in ``MOVED`` is the same module object
as its new home (``ray_ckpt.tools.chaos``, ...), not a copy, so classes and module state are
shared. New code imports the new paths; this table only grows when a module moves.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import CodeType, ModuleType

MOVED = {
    **{
        name: f"ray_ckpt.core.{name}"
        for name in (
            "batcher",
            "blob",
            "checksum",
            "codec",
            "codec_torch",
            "dtensor",
            "events",
            "generations",
            "gf256",
            "hostmem",
            "placement",
            "protection",
            "recovery_budget",
            "registry",
            "relay",
            "shard",
            "snapshot",
            "store",
            "timeline",
            "wire",
            "workpool",
        )
    },
    **{
        name: f"ray_ckpt.transport.{name}"
        for name in ("direct_reads", "metrics", "naming", "registry_client", "remote")
    },
    "stores": "ray_ckpt.transport.store_directory",
    **{name: f"ray_ckpt.tools.{name}" for name in ("chaos", "cli", "faults", "quiet")},
    "inplace": "ray_ckpt.train.inplace",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module at its new path (and runs it for ``python -m``)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._spec = module.__spec__  # the import system is about to set the alias's
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec

    def get_code(self, fullname: str) -> CodeType | None:
        spec = importlib.util.find_spec(self.target)
        loader = spec.loader if spec is not None else None
        return loader.get_code(self.target) if isinstance(loader, importlib.abc.InspectLoader) else None


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != "ray_ckpt" or name not in MOVED:
            return None
        found = importlib.util.find_spec(MOVED[name])  # its file: python -m shows it as argv[0]
        return importlib.machinery.ModuleSpec(fullname, _Alias(MOVED[name]), origin=found.origin if found else None)


def install() -> None:
    """Make the old paths importable (idempotent); ``ray_ckpt/__init__`` calls it. First in
    line: it answers for the names in ``MOVED`` only, and a stale file at an old path (an old
    checkout's leftovers) must not shadow the module's one home."""
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
