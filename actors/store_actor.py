"""ShardStoreActor: one per node, pinned there, holding that node's shards in its own memory."""

from __future__ import annotations

from typing import Any

import numpy as np
import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_ckpt import metrics, naming, settings
from ray_ckpt.batcher import Batcher
from ray_ckpt.registry_client import RegistryClient
from ray_ckpt.shard import ShardMeta
from ray_ckpt.store import ShardStore
from ray_ckpt.wire import StoreHoldings

_STAGE_THREADS = 32  # ranks of this node that can wait on a stage at once


@ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_restarts=0, max_concurrency=16, concurrency_groups={"stage": _STAGE_THREADS}
)
class ShardStoreActor:
    """Threaded (max_concurrency) so a slow put never blocks a get; stages wait in their own
    threads (concurrency group "stage") so they never hold up a put. ``max_restarts=0``: a
    restarted store would be empty anyway, and its death is what callers must see."""

    def __init__(self, node_id: str, budget_bytes: int | None, budget_fraction: float, namespace: str) -> None:
        self._namespace = namespace  # of this deployment (its registry), not of the job that created it
        if budget_bytes is None:
            budget_bytes = int(psutil.virtual_memory().total * budget_fraction)
        self._store = ShardStore(
            node_id=node_id,
            budget_bytes=budget_bytes,
            memory_ceiling=settings.node_memory_ceiling(),
            node_memory=_node_memory,
        )
        metrics.observe_store(self._store.stats())
        self._stages: Batcher[dict[str, Any], dict[str, Any]] = Batcher(self._send_stages)
        self._registry: RegistryClient | None = None

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

    def get_ranges(
        self, job: str, step: int, rank: int, index: int, ranges: list[tuple[int, int]], local: bool = False
    ) -> tuple[dict[str, Any], bool, list[np.ndarray]] | None:
        found = self._store.get_ranges(job, step, rank, index, ranges, local=local)
        return None if found is None else (found[0].to_dict(), found[1], found[2])

    @ray.method(concurrency_group="stage")
    def stage(self, request: dict[str, Any]) -> dict[str, Any]:
        """Stage one rank of this node (a ``StageRequest`` on the wire) with the registry; its
        ``StageResult`` on the wire. The stages of this node's ranks are coalesced: sent at once
        when none is in flight, else together in the next ``stage_batch`` call (``Batcher``)."""
        return self._stages.submit(request)

    def _send_stages(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self._registry is None:
            self._registry = RegistryClient(self._namespace)
        return list(self._registry.call("stage_batch", requests))

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
    ).remote(node_id, budget_bytes, budget_fraction, namespace)


def _node_memory() -> tuple[int, int]:
    """(bytes in use, total bytes) of this node, as Ray's memory monitor counts them."""
    memory = psutil.virtual_memory()
    return memory.total - memory.available, memory.total
