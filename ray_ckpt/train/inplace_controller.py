"""In-place recovery, the controller side: what runs in the Ray Train controller's process.

``_backend_class`` builds the backend ``InPlaceRecovery.backend_cls`` names: a TorchConfig
backend that says ``has_replica_groups`` (Ray's replica-group path, fenced in ``_ray_compat``), so
the controller replaces only the failed workers. Its ``on_start`` makes the run's
``GenerationCoordinator`` (once, on the controller's node), begins a new epoch at a full start,
and gives every started worker its ``_Role`` (``inplace_worker._become``) with a
``CoordinatorClient``; it never blocks on the workers' rendezvous. ``_WarmSpares`` keeps warm
spare worker processes on free nodes, from what each worker tells of itself (``WorkerFacts``)
and the cluster's nodes (``naming.alive_nodes``). The worker side is
``ray_ckpt.train.inplace_worker``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ray
import ray.train

from ray_ckpt import _ray_compat
from ray_ckpt.actors.generation_coordinator import GenerationCoordinator
from ray_ckpt.core.generations import BEATS_PER_S, hang_bound_s
from ray_ckpt.core.record_dict import fields_dict
from ray_ckpt.train.inplace_worker import WARM_HOOK, _become, _become_replacement, _Role
from ray_ckpt.transport import naming
from ray_ckpt.transport.coordinator_client import CoordinatorClient

if TYPE_CHECKING:
    from ray_ckpt.train.inplace import InPlaceRecovery

logger = logging.getLogger(__name__)

AWAIT_POLL_S = 0.2  # how often a start waiting for its spares looks
SPARE_START_S = 60.0  # a spare noted as started this recently may still be starting: it counts
WATCH_RETRY_S = 1.0  # after a failed call, how long the watch on the run's recoveries waits to ask again


@functools.cache
def _backend_class() -> type:
    path = _ray_compat.replica_groups()
    base = _ray_compat.torch_backend_base()
    if path.missing is None and not _ray_compat.tested():
        logger.warning(
            "in-place recovery was verified on Ray %s up to (not including) %s; this is Ray %s: run "
            "tests/unit/test_ray_compat.py and the in-place cluster tests before relying on it",
            *(".".join(map(str, v)) for v in (*_ray_compat.TESTED_RAY, _ray_compat.ray_version())),
        )

    if path.missing is None:  # here in the controller, before it starts any worker
        _ray_compat.warm_worker_processes(WARM_HOOK)
        _ray_compat.no_dataset_manager_without_datasets()

    class _InPlaceBackend(base):  # type: ignore[misc, valid-type]
        has_replica_groups = path.missing is None

        def __init__(self) -> None:
            super().__init__()
            self._coordinator: Any = None  # the actor's handle
            self._run = uuid.uuid4().hex  # names the coordinator's calls where stores merge them
            self._world_size = 0  # of the last full start: a replacement's group is one worker
            self._epoch: int | None = None  # the coordinator's, as its last begin() said (only begin() moves it)
            self._spares: _WarmSpares | None = None  # made in the controller (it holds a lock)
            self._watching = False  # whether the thread that makes the controller poll promptly runs

        def _coordinator_for(self, config: InPlaceRecovery, world_size: int) -> CoordinatorClient:
            if self._coordinator is None:  # lives as long as the run's controller
                node = ray.get_runtime_context().get_node_id()
                strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node, soft=False)
                self._coordinator = GenerationCoordinator.options(scheduling_strategy=strategy).remote(
                    config.settings.hang_timeout_s, fence_silent_nodes=config.settings.fence_silent_nodes
                )
            return CoordinatorClient(self._coordinator, world_size, run=self._run)

        def _warm_spares(self, group: Any, config: InPlaceRecovery, *, full_start: bool) -> None:
            if self._spares is None:
                self._spares = _WarmSpares()
            self._spares.refresh(
                group, config.settings.warm_spares, config.settings.warm_keep_alive_s, full_start=full_start
            )

        def on_start(self, group: Any, config: InPlaceRecovery) -> None:
            if path.missing is not None:
                logger.warning(
                    "ray_ckpt in-place recovery is off (%s): failures restart the worker group", path.missing
                )
                super().on_start(group, config)
                return
            _ray_compat.restart_when_a_replacement_fails()  # here: the controller's class exists by now
            _ray_compat.fence_nodes_without_raylet(config.settings.fence_silent_nodes)
            if _ray_compat.is_replica_group(group):  # a replacement: it rendezvouses in the train function
                coordinator = self._coordinator_for(config, self._world_size)
                epoch = coordinator.epoch() if self._epoch is None else self._epoch
                group.execute(_become_replacement, _Role(coordinator, epoch, None, None, config.settings))
                self._warm_spares(group, config, full_start=False)
                return
            self._world_size = len(group)
            coordinator = self._coordinator_for(config, self._world_size)
            self._warm_spares(group, config, full_start=True)  # first: they warm while the group sets up
            super().on_start(group, config)
            bound = hang_bound_s(config.settings.hang_timeout_s, len(group))
            if bound > config.settings.hang_timeout_s:
                logger.warning(
                    "ray_ckpt: %d workers beat one coordinator: hung workers are detected after %.0f s, not "
                    "hang_timeout_s=%.0f s, to keep its heartbeats under %d a second",
                    len(group),
                    bound,
                    config.settings.hang_timeout_s,
                    BEATS_PER_S,
                )
            begun = coordinator.begin(len(group))
            self._epoch = begun.epoch
            role = _Role(coordinator, begun.epoch, begun.generation, begun.attempt, config.settings)
            group.execute(_become, role)
            if self._spares is not None:
                self._spares.await_warm(config.settings.await_spares_s)
            if not self._watching:
                self._watching = True
                threading.Thread(
                    target=_poll_promptly_in_recoveries, args=(coordinator,), name="ray_ckpt-recoveries", daemon=True
                ).start()

        def on_shutdown(self, group: Any, config: InPlaceRecovery) -> None:
            if path.missing is None and _ray_compat.is_replica_group(group):
                # A failed worker on its way out (its node dead, or its process ending with the
                # group): Ray's shutdown would call into it and wait for the call to fail (0.8 s
                # here) before its replacement may start. Its process groups are the wrapper's.
                return
            super().on_shutdown(group, config)

    return _InPlaceBackend


def _poll_promptly_in_recoveries(coordinator: CoordinatorClient) -> None:
    """A daemon of the controller: while the coordinator says the run recovers in place, the
    controller polls its workers every ``_ray_compat.PROMPT_POLL_S`` (``poll_promptly``), so
    it replaces a lost worker as soon as Ray knows it is dead rather than up to a health-check
    interval later. Never raises: an unanswered call only leaves the polls at their interval."""
    recovering = False
    while True:
        try:
            recovering = coordinator.await_recovery(recovering)
        except Exception as error:  # the run is ending, or its coordinator is busy
            logger.debug("ray_ckpt: asking the coordinator whether the run recovers: %s", error)
            recovering = False
            time.sleep(WATCH_RETRY_S)
        _ray_compat.poll_promptly(recovering)


class _WarmSpares:
    """The run's warm spares, kept by its backend in the controller: after every start of
    workers, and every ``keep_alive_s / 2`` while the run lives, warm worker processes (Ray's
    prestarted workers with the workers' runtime env and job, so they have run ``warm_up``) on
    each node that has room for a worker and runs none of the run's, up to the number of nodes
    asked for: as many per node as the run has ranks on one node (a lost node's ranks are
    replaced together), as many as fit. Which nodes have them, how many, started when, is kept
    in the GCS (``_ray_compat.mark_warm_spare``): spares belong to the job and outlive one run,
    so a later run of the same job counts them and starts none twice; a worker starting on a
    node clears its mark (``_Worker``). A renewal starts only the spares a node is short of
    (``_spares_waiting``)."""

    def __init__(self) -> None:
        self.workers: dict[int, str] = {}  # world rank -> node id
        self._facts: WorkerFacts | None = None  # a worker's, for its runtime env, job and resources
        self._wanted = 0
        self._keep_alive_s = 600.0
        self._lock = threading.Lock()  # the fields above
        self._starting = threading.Lock()  # one _start_spares at a time
        self._renewing = False
        self._started: threading.Event | None = None  # set once a full start's spares were asked for
        self._awaited: dict[str, tuple[str, int]] = {}  # node id -> (its raylet's address, spares it keeps)

    def refresh(self, group: Any, wanted: int, keep_alive_s: float, *, full_start: bool) -> None:
        """Start the spares on a thread (the workers' training functions need not wait for it);
        never raises: warm spares only make replacements start sooner."""
        if wanted <= 0:
            return
        try:
            pending = group.execute_async(_worker_facts)
        except Exception as error:
            logger.info("ray_ckpt: no warm spares: %s", error)
            return
        if full_start:
            self._started = threading.Event()
        threading.Thread(
            target=self._refresh,
            args=(pending, wanted, keep_alive_s, full_start),
            name="ray_ckpt-warm-spares",
            daemon=True,
        ).start()

    def _refresh(self, pending: list[Any], wanted: int, keep_alive_s: float, full_start: bool) -> None:
        try:
            facts = [WorkerFacts.from_wire(wire) for wire in ray.get(pending)]
            with self._lock:
                if full_start:
                    self.workers.clear()
                self.workers.update({f.rank: f.node_id for f in facts})
                self._facts, self._wanted, self._keep_alive_s = facts[0], wanted, keep_alive_s
                renew, self._renewing = not self._renewing, True
            self._start_spares()
            if renew:
                threading.Thread(target=self._renew, name="ray_ckpt-warm-spares-renew", daemon=True).start()
        except Exception as error:
            logger.info("ray_ckpt: could not start warm spares: %s", error)
        finally:
            started = self._started
            if full_start and started is not None:
                started.set()

    def await_warm(self, timeout_s: float) -> None:
        """Wait, up to ``timeout_s`` in all, until the spares of the last full start were asked
        for and every node chosen for them has as many warm idle ones as it keeps (``warm_up``
        done): a run's training then begins with its first failure covered, and the spares'
        imports take no CPU from its steps. Returns at once after a renewal or where no spares
        were wanted; never raises."""
        started, deadline = self._started, time.monotonic() + timeout_s
        if started is None or timeout_s <= 0:
            return
        try:
            if not started.wait(timeout_s):
                return
            with self._lock:
                awaited, facts = dict(self._awaited), self._facts
            if facts is None or not awaited:
                return
            began = time.monotonic()
            while True:
                short = [n for n, (address, keep) in awaited.items() if _warm_idle(facts.job_id, n, address) < keep]
                if not short:
                    logger.info("ray_ckpt: warm spares ready after %.1f s", time.monotonic() - began)
                    return
                if time.monotonic() >= deadline:
                    logger.warning(
                        "ray_ckpt: training begins with %d node(s) whose warm spares are not warm after %.0f s "
                        "(InPlaceRecovery(await_spares_s=...)); a failure there starts a new process",
                        len(short),
                        timeout_s,
                    )
                    return
                time.sleep(AWAIT_POLL_S)
        except Exception as error:  # warm spares only make replacements start sooner
            logger.info("ray_ckpt: could not wait for the warm spares: %s", error)

    def _renew(self) -> None:
        while True:  # a daemon of the controller: it ends with the run
            time.sleep(self._keep_alive_s / 2)
            try:
                self._start_spares()
            except Exception as error:
                logger.info("ray_ckpt: could not renew warm spares: %s", error)

    def _start_spares(self) -> None:
        """Keep ``per_node`` spares (``_spares_per_node``) on each node with room for a worker
        and none of the run's workers, on as many nodes as wanted: nodes short of spares are
        topped up first (``_spares_waiting`` counts them), then nodes without one get theirs.
        Calls to start spares go one at a time; the data lock is held only to read what they need."""
        with self._starting:
            with self._lock:
                facts, wanted, keep_alive_s = self._facts, self._wanted, self._keep_alive_s
                workers = dict(self.workers)
            if facts is None:
                return
            env, job, needs = facts.runtime_env, facts.job_id, facts.resources
            busy = set(workers.values())
            per_node = _spares_per_node(workers)
            room: dict[str, tuple[str, int]] = {}  # node id -> (its raylet's address, how many spares it keeps)
            for alive in naming.alive_nodes():
                if alive.node_id not in busy and alive.raylet_address is not None:
                    room[alive.node_id] = (alive.raylet_address, min(per_node, _fits(alive.resources, needs)))
            room = {node: (address, keep) for node, (address, keep) in room.items() if keep > 0}
            waiting = {
                node: _spares_waiting(job, env, node, address, keep_alive_s) for node, (address, _) in room.items()
            }
            kept = sorted((node for node in room if waiting[node]), key=lambda node: waiting[node] >= room[node][1])
            fresh = [node for node in room if not waiting[node]]
            chosen = (kept + fresh)[: max(0, wanted)]
            with self._lock:
                self._awaited = {node: room[node] for node in chosen}
            started = 0
            for node in chosen:  # every node's at once: the first failure may come seconds after the start
                address, keep = room[node]
                missing = keep - min(keep, waiting[node])
                if missing and _ray_compat.prestart_worker(address, env, job, math.ceil(keep_alive_s), count=missing):
                    _ray_compat.mark_warm_spare(job, env, node, time.time(), count=keep)
                    started += missing
        if started:
            logger.info(
                "ray_ckpt: %d more warm spare worker process(es); %d per node on %d node(s)",
                started,
                per_node,
                len(chosen),
            )


def _spares_per_node(workers: dict[int, str]) -> int:
    """How many spares a free node keeps: as many as the run has ranks on one node (a lost
    node's ranks are replaced together), at least one."""
    return max(collections.Counter(workers.values()).values(), default=1)


def _fits(resources: Mapping[str, float], needs: Mapping[str, float]) -> int:
    """How many workers needing ``needs`` fit in a node's ``resources``."""
    counts = [int(resources.get(name, 0) // need) for name, need in needs.items() if need > 0]
    return min(counts, default=1)


def _spares_waiting(job: str, env: str, node: str, raylet_address: str, keep_alive_s: float) -> int:
    """How many spares of ``job`` wait on ``node``: as many as were noted as started less than
    ``SPARE_START_S`` ago (their processes may not be up yet), else its idle processes of the
    job that ran the warm-up hook (``warm_up`` notes each one; the node's raylet says which are
    idle). Ray keeps an idle worker past its keep-alive while
    its node has no more idle workers than CPUs, so starting spares per renewal without
    counting would pile them up. Where the raylet cannot be asked: the count noted less than
    ``keep_alive_s / 2`` ago. Notes of processes that are gone are dropped here."""
    noted = _ray_compat.warm_spare_started(job, env, node)
    started, count = noted if noted is not None else (0.0, 0)
    if started > time.time() - SPARE_START_S:
        return count
    workers = _ray_compat.job_workers(raylet_address, job)
    if workers is None:
        return count if started > time.time() - keep_alive_s / 2 else 0
    warmed = _ray_compat.warm_processes(job, node)
    _ray_compat.forget_warm_processes(job, node, warmed - set(workers))
    return sum(1 for pid in warmed & set(workers) if workers[pid])


def _warm_idle(job: str, node: str, raylet_address: str) -> int:
    """How many idle processes of ``job`` on ``node`` ran the warm-up hook; a large number where
    the raylet cannot be asked (nothing to wait for)."""
    workers = _ray_compat.job_workers(raylet_address, job)
    if workers is None:
        return 1 << 30
    return sum(1 for pid in _ray_compat.warm_processes(job, node) & set(workers) if workers[pid])


@dataclasses.dataclass(frozen=True)
class WorkerFacts:
    """What ``_WarmSpares`` needs of one worker, as the worker tells it (``_worker_facts``): its
    world ``rank``, its ``node_id``, its ``runtime_env`` (Ray's serialized string), its Ray
    ``job_id`` (hex) and the ``resources`` it was given (name -> amount; placement-group
    bundles left out), which a spare must find on a node. On the wire a dict of these fields."""

    rank: int
    node_id: str
    runtime_env: str
    job_id: str
    resources: Mapping[str, float]

    def to_wire(self) -> dict[str, Any]:
        return fields_dict(self)

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> WorkerFacts:
        return cls(
            rank=int(values["rank"]),
            node_id=str(values["node_id"]),
            runtime_env=str(values["runtime_env"]),
            job_id=str(values["job_id"]),
            resources={str(name): float(amount) for name, amount in values["resources"].items()},
        )


def _worker_facts() -> dict[str, Any]:
    """This worker's ``WorkerFacts`` on the wire (run in the worker by the controller)."""
    runtime = ray.get_runtime_context()
    return WorkerFacts(
        rank=ray.train.get_context().get_world_rank(),
        node_id=runtime.get_node_id(),
        runtime_env=runtime.get_runtime_env_string(),
        job_id=runtime.get_job_id(),
        resources={k: v for k, v in runtime.get_assigned_resources().items() if "_group_" not in k},
    ).to_wire()
