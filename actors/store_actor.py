"""ShardStoreActor: one per node, pinned there, holding that node's shards in its own memory."""

from __future__ import annotations

from typing import Any

import numpy as np
import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_ckpt import metrics, naming, settings
from ray_ckpt.shard import ShardMeta
from ray_ckpt.store import ShardStore
from ray_ckpt.wire import StoreHoldings


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=16)  # type: ignore[call-overload]
class ShardStoreActor:
    """Threaded (max_concurrency) so a slow put never blocks a get. ``max_restarts=0``: a
    restarted store would be empty anyway, and its death is what callers must see."""

    def __init__(self, node_id: str, budget_bytes: int | None, budget_fraction: float) -> None:
        if budget_bytes is None:
            budget_bytes = int(psutil.virtual_memory().total * budget_fraction)
        self._store = ShardStore(
            node_id=node_id,
            budget_bytes=budget_bytes,
            memory_ceiling=settings.node_memory_ceiling(),
            node_memory=_node_memory,
        )
        metrics.observe_store(self._store.stats())

    def ready(self) -> str:
        return self._store.node_id

    def put(self, meta: dict[str, Any], data: np.ndarray, local: bool = False) -> None:
        """Copy one shard (or a rank's local copy) into this store; ``data`` arrives as a
        read-only object-store view."""
        self._store.put(ShardMeta.from_dict(meta), data, local=local)
        metrics.observe_store(self._store.stats())

    def get(
        self, job: str, step: int, rank: int, index: int, local: bool = False
    ) -> tuple[dict[str, Any], np.ndarray] | None:
        found = self._store.get(job, step, rank, index, local=local)
        return None if found is None else (found[0].to_dict(), found[1])

    def mark_committed(self, job: str, step: int, keep_steps: list[int]) -> int:
        freed = self._store.mark_committed(job, step, keep_steps)
        metrics.observe_store(self._store.stats())
        return freed

    def drop(self, job: str, steps: list[int] | None = None) -> int:
        freed = self._store.drop(job, steps)
        metrics.observe_store(self._store.stats())
        return freed

    def holdings(self) -> dict[str, Any]:
        """What this store holds, a ``StoreHoldings`` on the wire (for rebuilding the registry)."""
        return StoreHoldings(
            self._store.node_id, tuple(self._store.inventory()), self._store.committed_marks()
        ).to_wire()

    def stats(self) -> dict[str, Any]:
        return self._store.stats()

    def set_memory_ceiling(self, fraction: float) -> None:
        """Change the node-memory ceiling (see ShardStore) of this running store."""
        self._store.memory_ceiling = float(fraction)

    def set_budget(self, budget_bytes: int) -> None:
        self._store.budget_bytes = int(budget_bytes)
        metrics.observe_store(self._store.stats())


def deploy(namespace: str, node_id: str, budget_bytes: int | None, budget_fraction: float) -> Any:
    """The store of ``node_id`` in ``namespace``, started there (detached, pinned) unless it
    already runs; returns its handle without waiting for it to be ready."""
    return ShardStoreActor.options(  # type: ignore[attr-defined]
        name=naming.store_name(node_id),
        namespace=namespace,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
    ).remote(node_id, budget_bytes, budget_fraction)


def _node_memory() -> tuple[int, int]:
    """(bytes in use, total bytes) of this node, as Ray's memory monitor counts them."""
    memory = psutil.virtual_memory()
    return memory.total - memory.available, memory.total
