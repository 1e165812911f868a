"""The ray_ckpt service in one process, for unit tests without Ray: the real ``Registry`` and one
real ``ShardStore`` per node, behind the calls the ``Checkpointer`` (its save pipeline and its
restorer) and the ``Reader`` make (``RegistryClient``'s and ``StoreDirectory``'s methods), with
the registry actor's glue: discarded steps dropped from the stores, plan marks handed to them,
commits announced to every store (which evicts the steps not kept). ``checkpointer`` builds a
real ``Checkpointer`` on one of the nodes, with Ray stood in for in its constructor only.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any
from unittest import mock

import numpy as np

from ray_ckpt import checkpointer as checkpointer_module
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.core.placement import Node
from ray_ckpt.core.registry import Registry
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.store import ShardStore
from ray_ckpt.core.wire import FoundShard, PlanAnswer, PlanQuery, RankLocation, RankRecord, StageRequest, StageResult
from ray_ckpt.reader import Reader


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class Service:
    """A registry and ``nodes`` stores ("n0", "n1", ...), all alive; ``calls`` lists the
    registry calls made through ``registry`` (method names, in order)."""

    def __init__(self, nodes: int = 4) -> None:
        self.registry = Registry()
        self.stores = {f"n{i}": ShardStore(node_id=f"n{i}", budget_bytes=1 << 30) for i in range(nodes)}
        self.client = RegistryCalls(self)
        self.directory = StoreCalls(self)

    def glue(self) -> None:
        """What the registry actor does after a call: drop what the registry discarded from
        every store and hand them its new plan marks."""
        for gone in self.registry.take_discarded():
            for store in self.stores.values():
                store.drop(gone.job, list(gone.steps), gone.attempts, gone.writers)
        for job, mark in self.registry.take_plan_marks().items():
            for store in self.stores.values():
                store.note_plan(job, mark.to_wire())

    def checkpointer(
        self, *, job: str, rank: int, world_size: int, node: str, attempt: str | None = None, **config: Any
    ) -> Checkpointer:
        """A real Checkpointer of ``rank`` on ``node``; ``config``: ``CheckpointConfig`` fields
        (RS(2,1) and no backup unless given)."""
        context = types.SimpleNamespace(get_node_id=lambda: node)
        fake_ray = types.SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: context)
        with (
            mock.patch.object(checkpointer_module, "ray", fake_ray),
            mock.patch.object(checkpointer_module, "RegistryClient", lambda namespace: self.client),
            mock.patch.object(checkpointer_module, "StoreDirectory", lambda namespace: self.directory),
        ):
            return Checkpointer(
                job=job,
                rank=rank,
                world_size=world_size,
                attempt=attempt,
                config=CheckpointConfig(**{"data_shards": 2, "parity_shards": 1, **config}),
            )

    def reader(self, job: str) -> Reader:
        return Reader(job, registry=self.client, stores=self.directory, timeout_s=lambda: 5.0)


class RegistryCalls:
    """``RegistryClient``'s methods over the service's registry (and its glue)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.calls: list[str] = []
        self.events: list[dict[str, Any]] = []

    @property
    def registry(self) -> Registry:
        return self.service.registry

    def record(self, event: dict[str, Any]) -> None:
        self.events.append(event)

    def plan_for_rank(self, job: str, attempt: str | None, rank: int) -> PlanAnswer:
        self.calls.append("plan_for_rank")
        try:
            return self.registry.plan_ranks(PlanQuery(job, attempt, (rank,)), set(self.service.stores))
        finally:
            self.service.glue()

    def locate(self, job: str, step: int) -> dict[int, RankRecord]:
        self.calls.append("locate")
        return self.registry.locate(job, step)

    def locate_rank(self, job: str, step: int, rank: int) -> RankLocation:
        self.calls.append("locate_rank")
        return self.registry.locate_rank(job, step, rank)

    def latest_committed(self, job: str) -> int | None:
        self.calls.append("latest_committed")
        return self.registry.latest_committed(job)

    def note_reached(self, job: str, attempt: str | None, step: int) -> None:
        self.calls.append("note_reached")
        self.registry.note_reached(job, attempt, step)

    def steps_reached(self, job: str, attempt: str | None) -> tuple[int | None, int | None]:
        self.calls.append("steps_reached")
        return self.registry.steps_reached(job, attempt)

    def staged_ranks(self, job: str, step: int) -> list[int]:
        self.calls.append("staged_ranks")
        return self.registry.staged_ranks(job, step)

    def wait_settled(self, job: str, step: int, **kwargs: Any) -> str:
        self.calls.append("wait_settled")
        return self.registry.wait_settled(job, step, **kwargs)

    def settle_backup_step(self, job: str, attempt: str | None, step: int | None) -> int | None:
        self.calls.append("settle_backup_step")
        return self.registry.settle_backup_step(job, attempt, step)

    def mark_unrestorable(self, job: str, step: int) -> None:
        self.calls.append("mark_unrestorable")
        self.registry.mark_unrestorable(job, step)

    def rollback(self, job: str, step: int) -> list[int]:
        self.calls.append("rollback")
        try:
            return list(self.registry.rollback(job, step))
        finally:
            self.service.glue()

    def stage_batch(self, requests: list[StageRequest]) -> list[StageResult]:
        """As the registry actor: stage, glue, announce each commit to every store."""
        self.calls.append("stage_batch")
        outcomes = self.registry.stage_batch(requests)
        self.service.glue()
        results = []
        for request, outcome in zip(requests, outcomes):
            decision = outcome.decision
            if decision is not None and decision.committed:
                keep = decision.keep_steps
                by = self.registry.committed_by(request.metas[0].job, keep[-1])
                for store in self.service.stores.values():
                    store.mark_committed(request.metas[0].job, keep[-1], list(keep), by)
            results.append(StageResult(committed=bool(decision and decision.committed), error=outcome.error))
        return results


class StoreCalls:
    """``StoreDirectory``'s methods over the service's stores: plans and stages go to the
    registry directly (as when a rank's own store is gone)."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def storage_nodes(self, failure_domain_label: str | None) -> list[Node]:
        return [Node(node) for node in sorted(self.service.stores)]

    def live(self, node_ids: Iterable[str]) -> set[str]:
        return set(node_ids) & set(self.service.stores)

    def put(self, node_id: str, meta: ShardMeta, data: np.ndarray, local: bool = False) -> Future[None]:
        self.service.stores[node_id].put(meta, data, local=local)  # a copy: the caller reuses its buffer
        return _done(None)

    def get(self, node_id: str, address: ShardAddress, into: Any = None) -> Future[Any]:
        found = self.service.stores[node_id].get(address)  # a copy below: a store's memory is its own
        return _done(None if found is None else FoundShard(found[0], np.array(found[1], copy=True)))

    def get_ranges(self, *args: Any, **kwargs: Any) -> Future[Any]:
        raise NotImplementedError("the in-process service reads whole shards only")

    def plan(self, node_id: str, job: str, attempt: str | None, rank: int) -> Future[Any]:
        raise KeyError(node_id)  # the rank asks the registry itself

    def stage(self, node_id: str, request: StageRequest) -> Future[Any]:
        raise KeyError(node_id)  # the rank stages with the registry itself

    def forget(self, node_id: str) -> None:
        pass

    def clear(self) -> None:
        pass
