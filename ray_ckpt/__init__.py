"""ray_ckpt: erasure-coded checkpoints in the host memory of peer nodes, for Ray Train."""

from ray_ckpt.checkpointer import Checkpointer, Restored, SaveHandle
from ray_ckpt.codec import ReedSolomon
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.errors import (
    CommitTimeoutError,
    ConfigError,
    CorruptShardError,
    InsufficientShardsError,
    NoCheckpointError,
    PlacementError,
    RayCkptError,
    SnapshotFormatError,
    StoreFullError,
    StoreUnavailableError,
    UnsupportedLeafError,
)
from ray_ckpt.service import shutdown, start, status

from ray_ckpt import train  # isort: skip  (imports ray.train; ray_ckpt.train.Checkpointer)


__all__ = [
    "CheckpointConfig",
    "Checkpointer",
    "CommitTimeoutError",
    "ConfigError",
    "CorruptShardError",
    "InsufficientShardsError",
    "NoCheckpointError",
    "PlacementError",
    "RayCkptError",
    "ReedSolomon",
    "Restored",
    "SaveHandle",
    "SnapshotFormatError",
    "StoreFullError",
    "StoreUnavailableError",
    "UnsupportedLeafError",
    "shutdown",
    "start",
    "status",
    "train",
]
__version__ = "0.1.0"
