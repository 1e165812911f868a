"""ray_ckpt: erasure-coded checkpoints in the host memory of peer nodes, for Ray Train."""

from ray_ckpt.codec import ReedSolomon
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.errors import (
    ConfigError,
    CorruptShardError,
    InsufficientShardsError,
    NoCheckpointError,
    PlacementError,
    RayCkptError,
    SnapshotFormatError,
    StoreFullError,
    UnsupportedLeafError,
)

__all__ = [
    "CheckpointConfig",
    "ConfigError",
    "CorruptShardError",
    "InsufficientShardsError",
    "NoCheckpointError",
    "PlacementError",
    "RayCkptError",
    "ReedSolomon",
    "SnapshotFormatError",
    "StoreFullError",
    "UnsupportedLeafError",
]
__version__ = "0.1.0"
