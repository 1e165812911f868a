"""ShardStoreActor: one per node, pinned there, holding that node's shards in its own memory."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_ckpt import _ray_compat, settings
from ray_ckpt.core.coordinator_relay import OPS, WAITING_OPS, CoordinatorRelay
from ray_ckpt.core.generations import POLL_S
from ray_ckpt.core.relay import Relay, reachable_part, subtrees
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.store import ShardStore
from ray_ckpt.core.wire import (
    FoundRanges,
    FoundShard,
    GroupResult,
    PlanAnswer,
    PlanQuery,
    StageGroup,
    StageRequest,
    StageResult,
    StoreHoldings,
    StoreStatus,
)
from ray_ckpt.errors import ConfigError, RayCkptError
from ray_ckpt.transport import metrics, naming, remote
from ray_ckpt.transport.direct_reads import DirectReadServer
from ray_ckpt.transport.registry_client import RegistryClient

logger = logging.getLogger(__name__)

LEARN_COMMITS_S = 5.0  # how long a put that found no room waits for the registry's committed steps
_STAGE_THREADS = 32  # ranks of this node that can wait on a stage at once
_RELAY_THREADS = 32  # child stores that can wait on a relayed stage at once (RAY_CKPT_RELAY_FANIN or more)
_RENDEZVOUS_THREADS = 64  # coordinator calls waiting at once: each op of this node's ranks and of each child


@ray.remote(  # type: ignore[call-overload]
    num_cpus=0,
    max_restarts=0,
    max_concurrency=16,
    concurrency_groups={"stage": _STAGE_THREADS, "relay": _RELAY_THREADS, "rendezvous": _RENDEZVOUS_THREADS},
)
class ShardStoreActor:
    """Threaded (max_concurrency) so a slow put never blocks a get; stages and relayed stages
    wait in their own threads (concurrency groups "stage" and "relay", and "rendezvous" for
    in-place runs' coordinator calls) so they never hold up a put. ``max_restarts=0``: a
    restarted store would be empty anyway, and its death is what callers must see. Each store
    is a node of the relay tree (``ray_ckpt.core.relay``, ``ray_ckpt.core.coordinator_relay``)."""

    def __init__(self, node_id: str, budget_bytes: int | None, budget_fraction: float, namespace: str) -> None:
        self._namespace = namespace  # of this deployment (its registry), not of the job that created it
        if budget_bytes is None:
            budget_bytes = int(psutil.virtual_memory().total * budget_fraction)
        self._store = ShardStore(
            node_id=node_id,
            budget_bytes=budget_bytes,
            memory_ceiling=settings.node_memory_ceiling(),
            node_memory=_node_memory,
            job_fraction=settings.store_job_fraction(),
            learn_commits=self._learn_commits,
        )
        metrics.observe_store(self._store.stats())
        self._relay = Relay(self._send_up, StageGroup.merged)
        self._plans = Relay(self._send_plans_up, PlanQuery.merged)
        self._coordinator_calls = CoordinatorRelay(self._coordinate_up, identify=_ray_compat.actor_id)
        self._registry: RegistryClient | None = None
        self._parent: str | None = None  # the store stages go up to; None: the registry
        self._members: list[str] = [node_id]  # this store's part of the relay tree, itself first
        self._handles: dict[str, Any] = {}  # other stores by node id
        self._kept: dict[str, tuple[int, ...]] = {}  # job -> the kept steps this store last applied
        self._relayed = 0  # relay calls taken from stores below
        self._coordinated = 0  # coordinator calls taken from this node's ranks and stores below
        self._pushes: dict[str, Any] = {}  # child node id -> its last commit push (an ObjectRef)
        self._direct = (
            None if not settings.direct_reads() else DirectReadServer(self._store, str(ray.util.get_node_ip_address()))
        )

    def ready(self) -> str:
        return self._store.node_id

    def _learn_commits(self, job: str) -> None:
        """A put of ``job`` found no room: mark the job's committed steps the registry keeps,
        which a commit announced a moment ago may not have brought here yet, so the steps they
        supersede are evicted before the put tries once more (``ShardStore``). A registry that
        does not answer within ``LEARN_COMMITS_S`` leaves the put to fail as it would have."""
        try:
            if self._registry is None:
                self._registry = RegistryClient(self._namespace)
            kept = self._registry.committed_steps(job, timeout_s=LEARN_COMMITS_S)
        except Exception as error:  # the put's own StoreFullError says what matters
            logger.info("ray_ckpt store: asking the registry for %r's commits: %s", job, error)
            return
        if kept:
            freed = self._store.mark_committed(job, kept[-1], kept)
            logger.info(
                "ray_ckpt store: a put of %r found no room; learned its commits up to step %d (%d bytes freed)",
                job,
                kept[-1],
                freed,
            )

    def put(self, meta: dict[str, Any], data: np.ndarray, local: bool = False) -> None:
        """Copy one shard (or a rank's local copy) into this store; ``data`` arrives as a
        read-only object-store view."""
        self._store.put(ShardMeta.from_dict(meta), data, local=local)
        metrics.observe_store(self._store.stats())

    def get(self, address: list[Any]) -> list[Any] | None:
        """The shard (or local copy) at ``address`` (a ``ShardAddress`` on the wire): a
        ``FoundShard`` on the wire, or None."""
        found = self._store.get(ShardAddress.from_wire(address))
        return None if found is None else FoundShard(*found).to_wire()

    def direct_endpoint(self, job: str) -> list[Any] | None:
        """Where this store serves direct reads of ``job`` and its token there (``Endpoint`` on
        the wire); None when off."""
        return None if self._direct is None else self._direct.endpoint(str(job)).to_wire()

    def get_ranges(self, address: list[Any], ranges: list[tuple[int, int]]) -> list[Any] | None:
        """Byte ranges of the shard (or local copy) at ``address`` (a ``ShardAddress`` on the
        wire): ``ShardStore.get_ranges`` as a ``FoundRanges`` on the wire, or None."""
        found = self._store.get_ranges(ShardAddress.from_wire(address), ranges)
        return None if found is None else FoundRanges(found[0], found[1], tuple(found[2])).to_wire()

    @ray.method(concurrency_group="stage")
    def stage(self, request: dict[str, Any]) -> dict[str, Any]:
        """Stage one rank of this node (a ``StageRequest`` on the wire, checked here); its
        ``StageResult`` on the wire. It goes up the relay tree with this node's other ranks'
        stages and the children's: sent at once when nothing is in flight, else in the next
        call (``Relay``)."""
        try:
            parsed = StageRequest.from_wire(request)
            parsed.check()
        except RayCkptError as error:
            return StageResult(error=error).to_wire()
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            malformed = ConfigError(f"malformed stage request ({type(error).__name__}: {error})")
            return StageResult(error=malformed).to_wire()
        (group,) = StageGroup.of([parsed])
        (result,) = self._relay.submit([group], self._linger_s())
        self._apply_kept(group, result)
        return result.result(parsed.metas[0].rank).to_wire()

    @ray.method(concurrency_group="relay")
    def relay(self, groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Stages of the stores below this one in the relay tree (``StageGroup``s on the wire),
        passed on up with this store's own; a ``GroupResult`` on the wire per group."""
        self._relayed += 1
        parsed = [StageGroup.from_wire(group) for group in groups]
        results = self._relay.submit(parsed, self._linger_s())
        for group, result in zip(parsed, results):
            self._apply_kept(group, result)
        return [result.to_wire() for result in results]

    @ray.method(concurrency_group="stage")
    def plan(self, job: str, attempt: str | None, rank: int) -> dict[str, Any]:
        """The restore plan of ``attempt`` and this node's rank's record of its step, a
        ``PlanAnswer`` on the wire: the queries of this node's ranks (and of the stores below)
        go up the relay tree together, so a restart of many ranks costs the registry few calls."""
        (answer,) = self._plans.submit([PlanQuery(job, attempt, (rank,))])
        return answer.to_wire()

    @ray.method(concurrency_group="relay")
    def relay_plans(self, queries: list[list[Any]]) -> list[dict[str, Any]]:
        """Plan queries of the stores below (``PlanQuery``s on the wire), passed on up with this
        store's own; a ``PlanAnswer`` on the wire per query."""
        answers = self._plans.submit([PlanQuery.from_wire(query) for query in queries])
        return [answer.to_wire() for answer in answers]

    @ray.method(concurrency_group="rendezvous")
    def coordinate(self, run: str, coordinator: Any, op: str, key: list[Any], entries: list[Any]) -> list[Any]:
        """A call to the generation coordinator ``coordinator`` of in-place run ``run`` (from a
        rank of this node, or relayed by a store below): merged with the concurrent calls of the
        same run, coordinator (by actor id), op and key, and passed up the relay tree
        (``ray_ckpt.core.coordinator_relay``). One result per entry."""
        self._coordinated += 1
        return self._coordinator_calls.submit(run, coordinator, op, tuple(key), entries)

    def _coordinate_up(
        self, run: str, coordinator: Any, op: str, key: tuple[Any, ...], entries: list[Any]
    ) -> list[Any]:
        """``coordinate`` on the parent in the relay tree, or the coordinator itself from the
        root, from a store not yet placed, or when the parent fails (the coordinator's own
        errors go back to the callers)."""
        timeout = settings.relay_timeout_s() + (POLL_S if op in WAITING_OPS else 0.0)
        parent = self._parent
        handle = None if parent is None else self._store_handle(parent)
        if handle is not None:
            try:
                call = handle.coordinate.remote(run, coordinator, op, list(key), entries)
                return list(remote.get(call, timeout=timeout))
            except Exception as error:  # dead, stopped or slow: the coordinator takes the call instead
                logger.info("ray_ckpt store: relaying a coordinator call to %s failed (%s)", parent, error)
        return list(remote.get(getattr(coordinator, OPS[op]).remote(*key, entries), timeout=timeout))

    def _linger_s(self) -> float:
        """The root of the tree gathers stages a little before each registry call."""
        return settings.relay_linger_s() if self._parent is None and len(self._members) > 1 else 0.0

    def _send_up(self, groups: list[StageGroup]) -> list[GroupResult]:
        answer = self._up("relay", "stage_groups", [group.to_wire() for group in groups])
        return [GroupResult.from_wire(result) for result in answer]

    def _send_plans_up(self, queries: list[PlanQuery]) -> list[PlanAnswer]:
        answer = self._up("relay_plans", "plan_ranks", [query.to_wire() for query in queries])
        return [PlanAnswer.from_wire(values) for values in answer]

    def _up(self, relay: str, registry: str, wire: list[Any]) -> list[Any]:
        """``relay(wire)`` on the parent in the relay tree; ``registry(wire)`` on the registry
        from the root, from a store not yet placed in the tree, or when the parent fails (until
        the next commit places this store again)."""
        parent = self._parent
        if parent is not None:
            handle = self._store_handle(parent)
            try:
                if handle is not None:
                    return list(remote.get(getattr(handle, relay).remote(wire), timeout=settings.relay_timeout_s()))
            except Exception as error:  # dead, stopped or failing: the registry takes the call instead
                logger.info("ray_ckpt store: relaying to %s failed (%s); calling the registry directly", parent, error)
            self._handles.pop(parent, None)
            if self._parent == parent:
                self._parent = None
        if self._registry is None:
            self._registry = RegistryClient(self._namespace)
        return list(self._registry.call(registry, wire))

    def _apply_kept(self, group: StageGroup, result: GroupResult) -> None:
        """Evict what a commit learned from a stage result supersedes (once per new commit), and
        keep the mark, with the committing attempt when it is this group's step: a store on
        the committing ranks' path holds it before they hear of the commit."""
        keep_steps = result.keep_steps
        if keep_steps and self._kept.get(group.job) != keep_steps:
            attempt = group.attempt if result.committed and keep_steps[-1] == group.step else None
            self.mark_committed(group.job, keep_steps[-1], list(keep_steps), attempt=attempt)

    def _forget_if_dead(self, node_id: str) -> None:
        """Drop the cached handle of a store whose last commit push failed (it died; a new store
        may run on its node by now), so the next push looks it up afresh."""
        previous = self._pushes.pop(node_id, None)
        if previous is None or not ray.wait([previous], timeout=0)[0]:
            return
        try:
            ray.get(previous, timeout=0)
        except Exception:
            self._handles.pop(node_id, None)

    def _store_handle(self, node_id: str) -> Any:
        if node_id not in self._handles:
            self._handles.update(naming.store_handles(self._namespace, [node_id]))
        return self._handles.get(node_id)

    def mark_committed(
        self,
        job: str,
        step: int,
        keep_steps: list[int],
        members: list[str] | None = None,
        parent: str | None = None,
        fanin: int = 1,
        attempt: str | None = None,
    ) -> int:
        """Record that ``step`` of ``job`` committed and evict the job's steps it supersedes
        (older, not in ``keep_steps``). ``members``: this store's part of the relay tree (itself
        first), handed down by ``parent`` (None: the registry); the commit goes on to at most
        ``fanin`` children (``relay.subtrees``), which learn their parts with it. Returns the
        bytes freed."""
        freed = self._store.mark_committed(job, step, keep_steps, attempt)
        self._kept[job] = tuple(keep_steps)
        metrics.observe_store(self._store.stats())
        if members and members[0] == self._store.node_id:
            self._parent, self._members = parent, list(members)
            for run in subtrees(members, fanin):
                self._hand_on(run, job, step, keep_steps, fanin, attempt)
        return freed

    def _hand_on(
        self, run: list[str], job: str, step: int, keep_steps: list[int], fanin: int, attempt: str | None
    ) -> None:
        """Push the commit to the first store of ``run`` that has an actor, with its part of the
        run (``relay.reachable_part``): a store killed, its successor not registered yet, is
        passed over, so the stores below it are placed again with this commit instead of
        staging with the registry until the registry's list of stores leaves it out."""

        def reachable(node_id: str) -> bool:
            self._forget_if_dead(node_id)
            return self._store_handle(node_id) is not None

        part = reachable_part(run, reachable)
        if part is not None:
            self._pushes[part[0]] = self._store_handle(part[0]).mark_committed.remote(
                job, step, keep_steps, part, self._store.node_id, fanin, attempt
            )

    def drop(
        self,
        job: str,
        steps: list[int] | None = None,
        attempts: list[str] | None = None,
        writers: list[str] | None = None,
    ) -> int:
        """``ShardStore.drop``."""
        if steps is None:
            self._kept.pop(job, None)
        freed = self._store.drop(job, steps, attempts, writers)
        metrics.observe_store(self._store.stats())
        return freed

    def holdings(self) -> dict[str, Any]:
        """What this store holds, a ``StoreHoldings`` on the wire (for rebuilding the registry)."""
        return {
            **StoreHoldings(
                self._store.node_id, tuple(self._store.inventory()), self._store.committed_marks()
            ).to_wire(),
            "plans": self._store.plan_marks(),
            "committed_by": self._store.committed_attempts(),
        }

    def note_plan(self, job: str, mark: list[Any]) -> None:
        """``ShardStore.note_plan``."""
        self._store.note_plan(job, mark)

    def stats(self) -> dict[str, Any]:
        """The store's usage (``ShardStore.stats``), its place in the relay tree and the direct
        reads and writes it served: a ``StoreStatus`` on the wire."""
        return StoreStatus(
            usage=self._store.stats(),
            parent=self._parent,
            relay_sends=self._relay.sends,
            relayed=self._relayed,
            coordinator_calls=self._coordinated,
            coordinator_sends=self._coordinator_calls.sends,
            direct_reads=0 if self._direct is None else self._direct.reads,
            direct_bytes=0 if self._direct is None else self._direct.bytes_sent,
            direct_writes=0 if self._direct is None else self._direct.writes,
            direct_bytes_received=0 if self._direct is None else self._direct.bytes_received,
        ).to_wire()

    def set_memory_ceiling(self, fraction: float) -> None:
        """Change the node-memory ceiling (see ShardStore) of this running store; ConfigError
        unless it is in (0, 1]."""
        self._store.memory_ceiling = fraction

    def set_job_fraction(self, fraction: float | None) -> None:
        """Change the share of this running store's budget one job may hold (see ShardStore):
        None for the fair share, else a fraction; ConfigError unless it is in (0, 1]."""
        self._store.job_fraction = fraction

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
