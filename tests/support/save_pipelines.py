"""One rank's ``SavePipeline`` for unit tests: world size 1, writer ``"w"``, no registry, no
backup, events dropped, its own ``OwnCopies`` unless one is given; with ``stores``, every stage
commits at once without a registry."""

from __future__ import annotations

from typing import Any

from ray_ckpt.config import CheckpointConfig
from ray_ckpt.core.identity import RankIdentity
from ray_ckpt.own_copies import OwnCopies
from ray_ckpt.save import SavePipeline


def lone_pipeline(
    job: str, *, node_id: str = "a", stores: Any = None, own_copies: OwnCopies | None = None, **config: Any
) -> SavePipeline:
    """``config``: ``CheckpointConfig``'s fields (data_shards, parity_shards, ...)."""
    saves = SavePipeline(
        identity=RankIdentity(job=job, rank=0, world_size=1, node_id=node_id),
        writer="w",
        config=CheckpointConfig(**config),
        registry=None,  # type: ignore[arg-type]
        stores=stores,
        backup=None,
        own_copies=OwnCopies() if own_copies is None else own_copies,
        record=lambda *a, **k: None,
    )
    if stores is not None:
        saves._stage = lambda request: True  # type: ignore[method-assign]
    return saves
