"""In-place recovery for Ray Train: survivors keep their processes, only lost workers are replaced.

Opt in with one object used twice::

    recovery = ray_ckpt.train.InPlaceRecovery()
    trainer = TorchTrainer(recovery.wrap(train_loop), torch_config=recovery, ...)

``InPlaceRecovery`` is a ``TorchConfig`` whose backend tells Ray Train's controller to replace
only the failed workers (Ray's replica-group path, fenced in ``_ray_compat``). ``wrap`` runs the
training function and, when it fails because a peer is gone (a collective error, or a commit
that timed out), turns that into a recovery in the same process: the function's checkpointers
are abandoned, the process group is destroyed, the survivors and the replacement meet in a new
generation (``actors.generation_coordinator.GenerationCoordinator``) with a fresh TCP store, and the function runs
again from the top. There it restores as it always does: survivors from their local copy,
the replacement from peers. The contract on the training function: it must be safe to re-run
in the same process (build the model and optimizer, ``prepare_model``, create its Checkpointer,
restore), which is what a function written for Ray Train's restarts already does.

When in-place recovery cannot go on (no replacement within ``timeout_s``, a full restart of the
worker group overtook it, or this Ray lacks the path), the function raises
``InPlaceRecoveryError`` or runs as without ray_ckpt, and Ray Train restarts the worker group,
which restores from peers as before. A worker also stops recovering in place, and raises the
error for Ray Train to count, after ``RAY_CKPT_INPLACE_MAX_RECOVERIES`` recoveries or when the
error recurs at the same step after a recovery that lost no peer
(``recovery_budget.RecoveryBudget``): a deterministic error that reads like a collective's is
the job's own.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import gc
import logging
import math
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import psutil
import ray
import ray.train
import torch.distributed as dist
from ray.train.torch import TorchConfig

from actors.generation_coordinator import GenerationCoordinator
from ray_ckpt import _ray_compat, settings
from ray_ckpt.core.generations import BEATS_PER_S, JoinStatus, Member, hang_bound_s
from ray_ckpt.core.recovery_budget import RecoveryBudget
from ray_ckpt.errors import CommitTimeoutError, ConfigError, CoordinatorTimeoutError, InPlaceRecoveryError
from ray_ckpt.train.gloo_connections import GlooConnections
from ray_ckpt.transport.coordinator_client import CoordinatorClient

logger = logging.getLogger(__name__)

_PEER_LOST_MARKERS = ("gloo", "nccl", "connection closed", "connection reset", "read error", "broken pipe", "timed out")


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` says a collective (or a commit) failed because a peer is gone. By its
    type or its text only: the wrapper's ``RecoveryBudget`` stops a job's own error that reads
    like one from being recovered from again and again."""
    if isinstance(error, (dist.DistError, CommitTimeoutError)):
        return True
    if isinstance(error, RuntimeError):
        text = str(error).lower()
        return any(marker in text for marker in _PEER_LOST_MARKERS)
    return False


@dataclasses.dataclass(frozen=True)
class _Settings:
    timeout_s: float
    hang_timeout_s: float
    collective_timeout_s: float
    backend: str | None
    warm_spares: int = 0
    warm_keep_alive_s: float = 600.0


WARM_HOOK = "ray_ckpt.train.inplace.warm_up"  # what a Ray Train worker process runs when it starts
WARM_STAGGER_S = 1.0  # between two spares' starts
WARM_MODULES = (
    _ray_compat.train_worker_module(),
    "torch.distributed.fsdp",  # FSDP2 (0.7 s to import here)
    "torch._dynamo",  # loaded by torch calls on first use: use_deterministic_algorithms, compile (0.7 s)
)


WARM_NICENESS = 10  # added to a process's niceness while it warms up, where it can be taken back


def warm_up() -> None:
    """The setup hook of this run's Ray Train worker processes: import what a worker needs as
    the process starts (this module imports torch.distributed and Ray Train's torch support;
    then ``WARM_MODULES``), so that a warm spare has done it before a replacement lands in it.
    Workers that are not spares import them anyway, or soon would. Where the process may lower
    its niceness again (root, or RLIMIT_NICE allows it), it warms up at ``WARM_NICENESS`` more,
    so that spares starting beside training on shared cores yield to it; a worker takes its
    priority back when it becomes one (``_become``)."""
    import importlib

    global _warmed_at, _niceness_before, _gloo
    _gloo = GlooConnections()  # before any process group: what listens later is gloo's
    if _may_renice():
        _niceness_before = os.nice(0)
        os.nice(WARM_NICENESS)
    for module in WARM_MODULES:
        importlib.import_module(module)
    _warmed_at = time.time()


def _may_renice() -> bool:
    """Whether this process could raise its niceness by ``WARM_NICENESS`` and lower it back."""
    if not hasattr(os, "nice"):
        return False
    if os.geteuid() == 0:
        return True
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)  # the least niceness allowed is 20 - soft
    return soft == resource.RLIM_INFINITY or 20 - soft <= os.nice(0)


def _take_priority_back() -> None:
    global _niceness_before
    if _niceness_before is not None:
        try:
            os.nice(_niceness_before - os.nice(0))
        except OSError as error:  # the limit changed since: the worker keeps the lower priority
            logger.warning("ray_ckpt: could not restore this worker's CPU priority: %s", error)
        _niceness_before = None


@dataclasses.dataclass
class _Role:
    """What ``on_start`` told this worker process: its run's coordinator, epoch, and for a full
    start the generation Ray's process group carries (None for a replacement)."""

    coordinator: CoordinatorClient
    epoch: int
    generation: int | None
    attempt: str | None
    settings: _Settings


_role: _Role | None = None
_warmed_at: float | None = None  # when ``warm_up`` finished in this process
_gloo: GlooConnections | None = None  # this process's gloo connections (see gloo_connections)
_niceness_before: int | None = None  # this process's niceness before ``warm_up`` raised it
_attempt: str | None = None  # the ray_ckpt attempt of the generation this process is in
_rejoin: dict[str, Any] | None = None  # how this process entered that generation, for its event
_open: weakref.WeakSet[Any] = weakref.WeakSet()


def _become(role: _Role) -> None:
    global _role
    _take_priority_back()  # this process is a worker now, no longer a spare
    _role = role


def current_attempt() -> str | None:
    """The attempt id of this worker's generation, or None outside an in-place run."""
    return _attempt if _role is not None else None


def take_rejoin() -> dict[str, Any] | None:
    """How this process entered its generation (once; the first Checkpointer records it)."""
    global _rejoin
    rejoin, _rejoin = _rejoin, None
    return rejoin


def track(checkpointer: Any) -> None:
    """Abandon ``checkpointer`` if this generation fails (its in-flight save is left to finish)."""
    _open.add(checkpointer)


def _newest_saved_step() -> int | None:
    """The newest step this generation's checkpointers saved (None: none saved one), which
    says how far the failed generation got."""
    steps = [c._last_step for c in list(_open) if getattr(c, "_last_step", None) is not None]
    return max(steps, default=None)


class InPlaceRecovery(TorchConfig):
    """TorchConfig for in-place recovery; see the module docstring.

    timeout_s: how long a survivor waits for every rank to join the next generation before it
    gives up (``InPlaceRecoveryError``; Ray Train then restarts workers). hang_timeout_s: a
    worker whose heartbeat is silent this long (its process stopped) is killed and replaced.
    collective_timeout_s: the process groups' timeout, the bound on a collective that waits
    for a peer that vanished without closing its connections. warm_spares: how many nodes
    without a worker of the run keep one warm spare process waiting (started, with torch and
    Ray Train imported), so that a replacement Ray schedules there starts in it instead of in a
    new process; 0 turns them off. warm_keep_alive_s: how long Ray keeps a spare waiting; the
    run starts a new one on each free node at half of it.
    ``backend`` and the remaining keyword arguments are TorchConfig's.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 120.0,
        hang_timeout_s: float = 10.0,
        collective_timeout_s: float = 300.0,
        warm_spares: int = 8,
        warm_keep_alive_s: float = 600.0,
        backend: str | None = None,
        **torch_config: Any,
    ) -> None:
        for name, value in (
            ("timeout_s", timeout_s),
            ("hang_timeout_s", hang_timeout_s),
            ("collective_timeout_s", collective_timeout_s),
            ("warm_keep_alive_s", warm_keep_alive_s),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"InPlaceRecovery {name} must be a number of seconds > 0, got {value!r}")
        if not isinstance(warm_spares, int) or isinstance(warm_spares, bool) or warm_spares < 0:
            raise ConfigError(f"InPlaceRecovery warm_spares must be an int >= 0 (0: none), got {warm_spares!r}")
        super().__init__(backend=backend, timeout_s=int(collective_timeout_s), **torch_config)
        self.settings = _Settings(
            float(timeout_s),
            float(hang_timeout_s),
            float(collective_timeout_s),
            backend,
            warm_spares,
            float(warm_keep_alive_s),
        )

    @property
    def backend_cls(self) -> type:
        return _backend_class()

    def wrap(self, train_loop: Callable[..., Any]) -> Callable[..., Any]:
        """``train_loop`` (taking ``config`` or nothing) made to recover in place."""
        if not callable(train_loop):
            raise ConfigError(f"wrap() takes the training function, got {type(train_loop).__name__}")

        @functools.wraps(train_loop)
        def run(*args: Any) -> Any:
            return _Worker().run(train_loop, args)

        return run


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

    class _InPlaceBackend(base):  # type: ignore[misc, valid-type]
        has_replica_groups = path.missing is None

        def __init__(self) -> None:
            super().__init__()
            self._coordinator: Any = None  # the actor's handle
            self._world_size = 0  # of the last full start: a replacement's group is one worker
            self._spares: _WarmSpares | None = None  # made in the controller (it holds a lock)

        def _coordinator_for(self, config: InPlaceRecovery, world_size: int) -> CoordinatorClient:
            if self._coordinator is None:  # lives as long as the run's controller
                node = ray.get_runtime_context().get_node_id()
                strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node, soft=False)
                self._coordinator = GenerationCoordinator.options(scheduling_strategy=strategy).remote(  # type: ignore[attr-defined]
                    config.settings.hang_timeout_s
                )
            return CoordinatorClient(self._coordinator, world_size)

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
            if _ray_compat.is_replica_group(group):  # a replacement: it rendezvouses in the train function
                coordinator = self._coordinator_for(config, self._world_size)
                epoch = coordinator.epoch()
                group.execute(_ray_compat.set_torch_distributed_env_vars)
                group.execute(_become, _Role(coordinator, epoch, None, None, config.settings))
                self._warm_spares(group, config, full_start=False)
                return
            self._world_size = len(group)
            coordinator = self._coordinator_for(config, self._world_size)
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
            role = _Role(coordinator, begun.epoch, begun.generation, begun.attempt, config.settings)
            group.execute(_become, role)
            self._warm_spares(group, config, full_start=True)

    return _InPlaceBackend


class _WarmSpares:
    """The run's warm spares, kept by its backend in the controller: after every start of
    workers, and every ``keep_alive_s / 2`` while the run lives, one warm worker process
    (Ray's prestarted worker with the workers' runtime env and job, so it has run ``warm_up``)
    on each node that has room for a worker and runs none of the run's, up to the number asked
    for. Which nodes have one, started when, is kept in the GCS (``_ray_compat.mark_warm_spare``):
    spares belong to the job and outlive one run, so a later run of the same job counts them
    and starts none twice; a worker starting on a node clears its mark (``_Worker``). Ray reaps
    a spare its keep-alive ran out on, once its node has more idle workers than CPUs."""

    def __init__(self) -> None:
        self.workers: dict[int, str] = {}  # world rank -> node id
        self._facts: dict[str, Any] | None = None  # a worker's runtime env, job and resources
        self._wanted = 0
        self._keep_alive_s = 600.0
        self._lock = threading.Lock()
        self._renewing = False

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
        threading.Thread(
            target=self._refresh,
            args=(pending, wanted, keep_alive_s, full_start),
            name="ray_ckpt-warm-spares",
            daemon=True,
        ).start()

    def _refresh(self, pending: list[Any], wanted: int, keep_alive_s: float, full_start: bool) -> None:
        try:
            facts = ray.get(pending)
            with self._lock:
                if full_start:
                    self.workers.clear()
                self.workers.update({f["rank"]: f["node_id"] for f in facts})
                self._facts, self._wanted, self._keep_alive_s = facts[0], wanted, keep_alive_s
                renew, self._renewing = not self._renewing, True
            self._start_spares()
            if renew:
                threading.Thread(target=self._renew, name="ray_ckpt-warm-spares-renew", daemon=True).start()
        except Exception as error:
            logger.info("ray_ckpt: could not start warm spares: %s", error)

    def _renew(self) -> None:
        while True:  # a daemon of the controller: it ends with the run
            time.sleep(self._keep_alive_s / 2)
            try:
                self._start_spares()
            except Exception as error:
                logger.info("ray_ckpt: could not renew warm spares: %s", error)

    def _start_spares(self) -> None:
        with self._lock:
            facts = self._facts
            if facts is None:
                return
            env, job, needs = facts["runtime_env"], facts["job_id"], facts["resources"]
            busy = set(self.workers.values())
            room = {  # node id -> its raylet's address
                str(node["NodeID"]): f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
                for node in ray.nodes()
                if node.get("Alive")
                and str(node["NodeID"]) not in busy
                and all(node.get("Resources", {}).get(k, 0) >= v for k, v in needs.items())
            }
            fresh = time.time() - self._keep_alive_s / 2
            waiting = [n for n in room if (_ray_compat.warm_spare_started(job, env, n) or 0.0) > fresh]
            chosen = [n for n in room if n not in waiting][: max(0, self._wanted - len(waiting))]
            for node in chosen:  # one at a time: a spare's imports take seconds of CPU
                if _ray_compat.prestart_worker(room[node], env, job, math.ceil(self._keep_alive_s)):
                    _ray_compat.mark_warm_spare(job, env, node, time.time())
                time.sleep(WARM_STAGGER_S)
        if chosen:
            logger.info("ray_ckpt: warm spare worker processes on %d node(s)", len(waiting) + len(chosen))


def _worker_facts() -> dict[str, Any]:
    """What ``_WarmSpares`` needs of one worker: rank, node, runtime env, job, resources."""
    runtime = ray.get_runtime_context()
    return {
        "rank": ray.train.get_context().get_world_rank(),
        "node_id": runtime.get_node_id(),
        "runtime_env": runtime.get_runtime_env_string(),
        "job_id": runtime.get_job_id(),
        "resources": {k: v for k, v in runtime.get_assigned_resources().items() if "_group_" not in k},
    }


class _Worker:
    """One worker process's side of in-place recovery."""

    def __init__(self) -> None:
        if _role is None:
            raise ConfigError(
                "this training function was wrapped by InPlaceRecovery.wrap() but the trainer was not "
                "given that InPlaceRecovery: pass TorchTrainer(..., torch_config=recovery)"
            )
        self.role = _role
        self.settings = _role.settings
        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.started = time.time()
        runtime = ray.get_runtime_context()
        self.member = Member(
            rank=self.rank,
            incarnation=uuid.uuid4().hex,
            node_id=runtime.get_node_id(),
            pid=os.getpid(),
            host=ray.util.get_node_ip_address(),
            epoch=_role.epoch,
        )
        self.backend = self.settings.backend
        self._store: Any = None
        global _gloo
        if _gloo is None:  # no warm-up hook ran (the job has its own): from the generations formed here on
            _gloo = GlooConnections()
        if self.settings.warm_spares > 0:  # this node's spare, if any, is taken or no longer needed
            try:
                _ray_compat.mark_warm_spare(
                    runtime.get_job_id(), runtime.get_runtime_env_string(), self.member.node_id, None
                )
            except Exception as error:
                logger.debug("clearing this node's warm spare mark: %s", error)
        self._beating = threading.Event()

    def run(self, train_loop: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        global _attempt
        coordinator = self.role.coordinator
        if self.role.generation is not None:  # a full start: Ray set up the process group
            self.backend = dist.get_backend() if dist.is_initialized() else self.backend
            if not coordinator.register(self.member, self.role.generation):
                raise InPlaceRecoveryError("this worker group was superseded by a full restart before it started")
            _attempt = self.role.attempt
        self._start_heartbeat()
        budget = RecoveryBudget(settings.inplace_max_recoveries())
        try:
            if self.role.generation is None:
                self._rejoin(role="replacement", detected_at=None)
            while True:
                try:
                    return train_loop(*args)
                except Exception as error:
                    peer = is_peer_failure(error)
                    reached = _newest_saved_step()
                    refused = budget.give_up(reached) if peer else None
                    if refused is not None:
                        logger.warning(
                            "rank %d: not recovering in place from %s: %s", self.rank, _first_line(error), refused
                        )
                        error.add_note(f"ray_ckpt: not recovered in place: {refused}")
                    if not peer or refused is not None:  # the job's error: Ray Train counts it
                        sendable = _transportable(error)
                        if sendable is error:
                            raise
                        raise sendable from None
                    detected_at = time.time()
                    logger.warning("rank %d: a peer is gone (%s); recovering in place", self.rank, _first_line(error))
                # Out of the except block: the failed generation's frames (its model, its DDP and
                # so its process group) are released only now, and the teardown must close the
                # group's connections, which fails the collectives peers are still blocked in.
                self._teardown()
                replaced = self._rejoin(role="survivor", detected_at=detected_at, torn_down_at=time.time())
                budget.recovered(reached, replaced)
        finally:
            self._beating.set()

    def _start_heartbeat(self) -> None:
        # as often as the coordinator takes every rank's beat (BEATS_PER_S), at most a quarter
        # of the hang bound and at least every quarter second
        interval = min(
            hang_bound_s(self.settings.hang_timeout_s, self.world_size) / 4,
            max(0.25, self.world_size / BEATS_PER_S),
        )
        coordinator, member = self.role.coordinator, self.member

        def beat() -> None:
            aborted: Any = None  # the process group aborted last (at most once each)
            while not self._beating.wait(interval):
                try:
                    stuck = coordinator.beat(member, timeout_s=interval)
                except CoordinatorTimeoutError:
                    continue
                except Exception:  # the run is ending
                    return
                group = dist.group.WORLD if dist.is_initialized() else None
                if not stuck or group is None or group is aborted:
                    continue
                # a round to replace this generation is open and this rank has not left it: its
                # collectives wait on a peer that is gone or left. Make them fail so the training
                # function raises and this rank joins the round.
                if self.backend == "nccl":  # NCCL hangs on a lost peer instead of failing
                    logger.warning("rank %d: aborting the NCCL process group stuck on a lost peer", self.rank)
                    group.abort()
                else:
                    logger.warning("rank %d: closing the gloo connections stuck on a lost peer", self.rank)
                    self._shut_gloo()
                aborted = group

        threading.Thread(target=beat, name=f"ray_ckpt-heartbeat-{self.rank}", daemon=True).start()

    def _shut_gloo(self) -> int:
        """Shut this process's accepted gloo connections (``GlooConnections``), but the
        rendezvous stores': every peer still blocked on one fails at once."""
        store_ports = [int(os.environ.get("MASTER_PORT") or 0)]  # Ray Train's store of a full start
        if self._store is not None:
            store_ports.append(int(self._store.port))
        return 0 if _gloo is None else _gloo.shut(store_ports)

    def _teardown(self) -> None:
        """Abandon the failed generation's checkpointers, close its gloo connections (peers
        blocked in a collective with this rank fail now, not at their timeout) and destroy its
        process group."""
        for checkpointer in list(_open):
            checkpointer.abandon()
        _open.clear()
        if dist.is_initialized() and self.backend != "nccl":
            self._shut_gloo()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as error:  # a broken group may fail to shut down cleanly
                logger.debug("destroying the failed process group: %s", error)
        gc.collect()  # drops the failed group's connections, so peers blocked on us fail fast

    def _rejoin(self, *, role: str, detected_at: float | None, torn_down_at: float | None = None) -> list[int]:
        """Join the next generation and set up its process group (retried if a member dies
        during the rendezvous); raises InPlaceRecoveryError when it cannot form in time.
        Returns the ranks whose process was replaced on the way (empty: no peer was lost)."""
        global _attempt, _rejoin
        coordinator = self.role.coordinator
        deadline = time.monotonic() + self.settings.timeout_s
        replaced: set[int] = set()
        while True:
            joined_at = time.time()
            left = max(0.0, deadline - time.monotonic())
            reply = coordinator.join(self.member, left)
            if reply.status is JoinStatus.SUPERSEDED:
                raise InPlaceRecoveryError(
                    f"rank {self.rank}: a full restart of the worker group overtook this in-place recovery"
                )
            if reply.status is JoinStatus.TIMEOUT:
                missing = list(reply.missing)
                raise InPlaceRecoveryError(
                    f"rank {self.rank}: ranks {missing} did not join the next generation within "
                    f"timeout_s={self.settings.timeout_s:g}s; Ray Train restarts the workers and they restore "
                    "from peers (raise InPlaceRecovery(timeout_s=...) if replacements start slowly)",
                    missing_ranks=missing,
                )
            replaced.update(reply.replaced)
            try:
                self._init_process_group(reply.generation, min(left, self.settings.collective_timeout_s))
            except (dist.DistError, RuntimeError, TimeoutError) as error:
                logger.warning(
                    "rank %d: generation %d did not form (%s); joining again", self.rank, reply.generation, error
                )
                self._teardown()
                continue
            _attempt = reply.attempt
            _rejoin = {
                "role": role,
                "generation": reply.generation,
                "pid": self.member.pid,
                "process_started": psutil.Process().create_time(),
                "warmed": _warmed_at,
                "worker_started": self.started,
                "detected": detected_at,
                "torn_down": torn_down_at,
                "joined": joined_at,
                "round_started": reply.round_started,
                "formed": reply.formed_at,
                "ready": time.time(),
            }
            return sorted(replaced)

    def _init_process_group(self, generation: int, timeout_s: float) -> None:
        coordinator = self.role.coordinator
        timeout = datetime.timedelta(seconds=max(1.0, timeout_s))
        if self.rank == 0:
            store = dist.TCPStore(self.member.host, 0, self.world_size, True, timeout, wait_for_workers=False)
            coordinator.publish(generation, f"{self.member.host}:{store.port}")
        else:
            address = coordinator.address(generation, max(1.0, timeout_s))
            if address is None:
                raise TimeoutError(f"generation {generation}'s rank 0 published no address")
            host, port = address.rsplit(":", 1)
            store = dist.TCPStore(host, int(port), self.world_size, False, timeout)
        self._store = store  # rank 0 serves the rendezvous while it lives
        backend = self.backend = self.backend or ("nccl" if _cuda_workers() else "gloo")
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"ray_ckpt/g{generation}", store),
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=self.settings.collective_timeout_s),
        )
        self.backend = backend


def _first_line(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _transportable(error: BaseException) -> BaseException:
    """``error`` itself when it survives the trip to the driver (Ray Train pickles a worker's
    error into the run's result); else an InPlaceRecoveryError carrying its type and text, so
    the user reads the failure instead of a deserialization error from ``trainer.fit()``."""
    try:
        ray.cloudpickle.loads(ray.cloudpickle.dumps(error))
        return error
    except Exception as pickling:
        return InPlaceRecoveryError(
            f"the training function raised {type(error).__name__}: {error} (it cannot be sent to the "
            f"driver as it is: {type(pickling).__name__}: {pickling})",
            error_type=type(error).__name__,
        )


def _cuda_workers() -> bool:
    import torch

    return torch.cuda.is_available() and bool(ray.get_gpu_ids())
