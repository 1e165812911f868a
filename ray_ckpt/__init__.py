"""ray_ckpt: erasure-coded checkpoints in the host memory of peer nodes, for Ray Train.

Importing the package is cheap: only the errors and ``CheckpointConfig`` load with it. The
names that need Ray or torch (``Checkpointer``, ``start``, ``status``, ``train``, ``rng_state``,
...) and every submodule (``ray_ckpt.service``, ...) load on first attribute access, so the pure
modules (``ray_ckpt.core``: codec, snapshot, placement, registry, store, ...) and the
processes that need only them (store actors, the node crasher, the command line) never pay for
torch.distributed or Ray Train. ``from ray_ckpt import X`` works for every name in ``__all__``.
docs/design.md tells which wing (core, transport, train, tools) a module lives in.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ray_ckpt import _lazy
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.errors import (
    CommitTimeoutError,
    ConfigError,
    CorruptShardError,
    HandedOver,
    InPlaceRecoveryError,
    InsufficientShardsError,
    NoCheckpointError,
    PeerLost,
    PlacementError,
    RayCkptError,
    ShardsUnreachableError,
    SnapshotFormatError,
    StoreFullError,
    StoreUnavailableError,
    TornStepError,
    UnsupportedLeafError,
)

if TYPE_CHECKING:
    from ray_ckpt import train
    from ray_ckpt.checkpointer import Checkpointer, Restored, SaveHandle
    from ray_ckpt.core.codec import ReedSolomon
    from ray_ckpt.core.rng import rng_state, set_rng_state
    from ray_ckpt.reader import Reader, read
    from ray_ckpt.service import drop, shutdown, start, status

# name -> the module that defines it (loaded on first access)
_LAZY = {
    "Checkpointer": "ray_ckpt.checkpointer",
    "Restored": "ray_ckpt.checkpointer",
    "SaveHandle": "ray_ckpt.checkpointer",
    "ReedSolomon": "ray_ckpt.core.codec",
    "Reader": "ray_ckpt.reader",
    "drop": "ray_ckpt.service",
    "read": "ray_ckpt.reader",
    "rng_state": "ray_ckpt.core.rng",
    "set_rng_state": "ray_ckpt.core.rng",
    "shutdown": "ray_ckpt.service",
    "start": "ray_ckpt.service",
    "status": "ray_ckpt.service",
}


if not TYPE_CHECKING:  # for type checkers, the names are the imports above
    _submodule = _lazy.submodules(__name__)

    def __getattr__(name: str) -> Any:
        """Load a lazy name or a submodule on first access (PEP 562); cached in the package."""
        value = getattr(importlib.import_module(_LAZY[name]), name) if name in _LAZY else _submodule(name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "CheckpointConfig",
    "Checkpointer",
    "CommitTimeoutError",
    "ConfigError",
    "CorruptShardError",
    "HandedOver",
    "InPlaceRecoveryError",
    "InsufficientShardsError",
    "NoCheckpointError",
    "PeerLost",
    "PlacementError",
    "RayCkptError",
    "Reader",
    "ReedSolomon",
    "Restored",
    "SaveHandle",
    "ShardsUnreachableError",
    "SnapshotFormatError",
    "StoreFullError",
    "StoreUnavailableError",
    "TornStepError",
    "UnsupportedLeafError",
    "drop",
    "read",
    "rng_state",
    "set_rng_state",
    "shutdown",
    "start",
    "status",
    "train",
]
__version__ = "0.1.0"
