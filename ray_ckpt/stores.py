"""StoreDirectory: one rank's view of the store actors: which are alive, and calls to them.

Handles are looked up once and cached (a save touches only the stores it uses, never every
node of the cluster); ``live`` asks Ray afresh, so a restore never counts on a dead store.
Calls return ``concurrent.futures.Future``s, which is what the save and restore paths (and
their fakes in unit tests) wait on.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import numpy as np
import ray

from ray_ckpt import naming
from ray_ckpt.placement import Node
from ray_ckpt.shard import ShardMeta
from ray_ckpt.wire import StageRequest


class StoreDirectory:
    """The stores of ``namespace``. Not thread-safe: one rank's save and restore paths, which
    never run at once, share it."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._handles: dict[str, Any] = {}

    def storage_nodes(self, failure_domain_label: str | None) -> list[Node]:
        """The alive nodes that run a store, with their failure domain from the node label (two
        GCS calls, whatever the cluster's size)."""
        stores = naming.store_node_ids(self.namespace)
        result = []
        for node in naming.alive_nodes():
            node_id = str(node["NodeID"])
            if node_id in stores:
                labels = node.get("Labels") or {}
                result.append(Node(node_id, labels.get(failure_domain_label) if failure_domain_label else None))
        return result

    def live(self, node_ids: Iterable[str]) -> set[str]:
        """Which of these nodes run a live store now (their handles are cached)."""
        found = naming.store_handles(self.namespace, sorted(set(node_ids)))
        self._handles.update(found)
        return set(found)

    def _handle(self, node_id: str) -> Any:
        if node_id not in self._handles:
            self._handles.update(naming.store_handles(self.namespace, [node_id]))
        return self._handles[node_id]  # KeyError: no live store there

    def put(self, node_id: str, meta: ShardMeta, data: np.ndarray, local: bool = False) -> Future[None]:
        """Copy ``data`` into that node's store (the store pulls it from this node's object store)."""
        return self._handle(node_id).put.remote(meta.to_dict(), ray.put(data), local).future()

    def get(self, node_id: str, job: str, step: int, rank: int, index: int, local: bool = False) -> Future[Any]:
        return self._handle(node_id).get.remote(job, step, rank, index, local).future()

    def get_ranges(
        self, node_id: str, job: str, step: int, rank: int, index: int, ranges: list[tuple[int, int]], local: bool
    ) -> Future[Any]:
        """Byte ranges of a shard (or local copy): ``(meta dict, intact, pieces)`` or None."""
        return self._handle(node_id).get_ranges.remote(job, step, rank, index, ranges, local).future()

    def stage(self, node_id: str, request: StageRequest) -> Future[dict[str, Any]]:
        """Stage through that node's store, which batches its ranks' stages into one registry
        call; the future's result is a ``StageResult`` on the wire (KeyError: no live store)."""
        return self._handle(node_id).stage.remote(request.to_wire()).future()

    def plan(self, node_id: str, job: str, attempt: str | None, rank: int) -> Future[dict[str, Any]]:
        """The restore plan of ``attempt`` and ``rank``'s record of its step, through that node's
        store and the relay tree; a ``PlanAnswer`` on the wire (KeyError: no live store)."""
        return self._handle(node_id).plan.remote(job, attempt, rank).future()

    def forget(self, node_id: str) -> None:
        """Drop a cached handle (its store failed; a new one may take its place)."""
        self._handles.pop(node_id, None)

    def clear(self) -> None:
        self._handles.clear()
