"""One rank's ``SavePipeline`` for unit tests: world size 1, writer ``"w"``, no registry, no
backup, events dropped; with ``stores``, every stage commits at once without a registry."""

from __future__ import annotations

from typing import Any

from ray_ckpt.config import CheckpointConfig
from ray_ckpt.core.identity import RankIdentity
from ray_ckpt.save import SavePipeline


def lone_pipeline(job: str, *, node_id: str = "a", stores: Any = None, **config: Any) -> SavePipeline:
    """``config``: ``CheckpointConfig``'s fields (data_shards, parity_shards, ...)."""
    saves = SavePipeline(
        identity=RankIdentity(job=job, rank=0, world_size=1, node_id=node_id),
        writer="w",
        config=CheckpointConfig(**config),
        registry=None,  # type: ignore[arg-type]
        stores=stores,
        backup=None,
        record=lambda *a, **k: None,
    )
    if stores is not None:
        saves._stage = lambda request: True  # type: ignore[method-assign]
    return saves
