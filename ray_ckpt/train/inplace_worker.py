"""In-place recovery, the worker side: what runs in each Ray Train worker process.

``_Worker.run`` is the wrapper ``InPlaceRecovery.wrap`` puts around the training function: it
runs the function and, when it fails because a peer is gone (``is_peer_failure``), tears the
failed generation down (abandons its checkpointers, shuts its gloo connections, destroys its
process group), joins the next generation at the run's coordinator with a fresh TCP store, and
runs the function again in the same process, until the ``RecoveryBudget`` says the error is the
job's own. A thread beats to the coordinator meanwhile (reporting this process's connections
once per generation, those it saw close, and when its raylet is gone), and when the coordinator
says a peer of the generation is lost, it makes this rank's collectives fail and raises
``PeerLost`` into the training function (``ray_ckpt.train.interrupts``), so neither a long
compute nor a blocked collective holds the recovery up.

``warm_up`` is the setup hook of the run's worker processes, warm spares included (its public
name is ``ray_ckpt.train.inplace.warm_up``, ``WARM_HOOK``); ``_become`` is what the controller's
``on_start`` runs in a worker to give it its ``_Role``. What the process keeps between runs of
the function is one object, ``PROCESS`` (``ProcessState``); the Ray Train Checkpointer reaches it
through ``current_attempt``, ``take_rejoin`` and ``track``. The controller side is
``ray_ckpt.train.inplace_controller``.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
import ray
import ray.train
import torch.distributed as dist

from ray_ckpt import _ray_compat, prefetch, settings
from ray_ckpt.core.generations import Beat, DrainNotice, JoinStatus, Member, beat_interval_s, run_of
from ray_ckpt.core.identity import RankIdentity
from ray_ckpt.core.recovery_budget import RecoveryBudget
from ray_ckpt.errors import (
    CommitTimeoutError,
    ConfigError,
    CoordinatorTimeoutError,
    HandedOver,
    InPlaceRecoveryError,
    PeerLost,
)
from ray_ckpt.process_copies import THIS_PROCESS
from ray_ckpt.restore import Restorer
from ray_ckpt.train import process_groups
from ray_ckpt.train.gloo_connections import Closures, ConnectionWatch, GlooConnections
from ray_ckpt.train.interrupts import Interrupts
from ray_ckpt.transport.coordinator_client import CoordinatorClient
from ray_ckpt.transport.registry_client import RegistryClient
from ray_ckpt.transport.store_directory import StoreDirectory

logger = logging.getLogger(__name__)

_PEER_LOST_MARKERS = ("gloo", "nccl", "connection closed", "connection reset", "read error", "broken pipe", "timed out")


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` says a collective (or a commit) failed because a peer is gone. By its
    type or its text only: the wrapper's ``RecoveryBudget`` stops a job's own error that reads
    like one from being recovered from again and again."""
    if isinstance(error, (dist.DistError, CommitTimeoutError, PeerLost)):
        return True
    if isinstance(error, RuntimeError):
        text = str(error).lower()
        return any(marker in text for marker in _PEER_LOST_MARKERS)
    return False


@dataclasses.dataclass(frozen=True)
class _Settings:
    """``InPlaceRecovery``'s arguments, as the controller and every worker read them."""

    timeout_s: float
    hang_timeout_s: float
    collective_timeout_s: float
    backend: str | None
    warm_spares: int = 0
    warm_keep_alive_s: float = 600.0
    fence_silent_nodes: bool = True
    await_spares_s: float = 15.0


WARM_HOOK = "ray_ckpt.train.inplace.warm_up"  # what a Ray Train worker process runs when it starts
WARM_MODULES = (
    _ray_compat.train_worker_module(),
    "torch.distributed.fsdp",  # FSDP2 (0.7 s to import here)
    "torch._dynamo",  # loaded by torch calls on first use: use_deterministic_algorithms, compile (0.7 s)
)


WARM_NICENESS = 10  # added to a process's niceness while it warms up, where it can be taken back


@dataclasses.dataclass
class _Role:
    """What ``on_start`` told this worker process: its run's coordinator, epoch, and for a full
    start the generation Ray's process group carries (None for a replacement)."""

    coordinator: CoordinatorClient
    epoch: int
    generation: int | None
    attempt: str | None
    settings: _Settings


@dataclasses.dataclass(frozen=True)
class Rejoin:
    """How this process entered its in-place generation, which the first Checkpointer of the
    generation records as its ``rejoin`` event (``ray_ckpt.core.events``: the fields' meaning):
    the ``role`` it joined in ("survivor" or "replacement"), the ``generation``, its ``pid``,
    and the moments (Unix seconds; None where they do not apply) its process started, it
    warmed up, its worker started, it detected the failure, it tore the failed generation
    down, it joined, the round started, the generation formed and it was ready; ``lost``: the
    members the generation before lost, (rank, how it was found lost)."""

    role: str
    generation: int
    pid: int
    process_started: float
    warmed: float | None
    worker_started: float
    detected: float | None
    torn_down: float | None
    joined: float
    round_started: float | None
    formed: float
    lost: tuple[tuple[int, str], ...]
    ready: float

    def to_wire(self) -> dict[str, Any]:
        """The event's fields, in this order (``lost`` as lists of [rank, reason])."""
        return {**dataclasses.asdict(self), "lost": [list(lost) for lost in self.lost]}


@dataclasses.dataclass
class ProcessState:
    """What this worker process keeps of in-place recovery outside any one run of the training
    function; ``PROCESS`` is its one instance, and no other module-level state is kept.

    - ``warmed_at`` (when ``warm_up`` finished), ``niceness_before`` (the niceness ``warm_up``
      raised, None once ``_become`` gave it back) and ``gloo`` (the process's gloo connections,
      made before any process group) are set by ``warm_up`` as the process starts; where the job
      runs its own setup hook instead, the first ``_Worker`` makes ``gloo``.
    - ``role`` is set by ``_become``, which the controller's ``on_start`` runs in the process
      (a later one replaces it); None: this process is no worker of an in-place run.
    - ``attempt`` (the ray_ckpt attempt of the generation the process is in) and ``rejoin`` (how
      it entered that generation, for the next Checkpointer's event) are set by ``_Worker`` as
      each generation starts; ``checkpointers`` holds, weakly, the Checkpointers made in the
      current generation, which ``_Worker``'s teardown abandons when the generation fails.
    - Outside this module it is read and written only through ``current_attempt``,
      ``take_rejoin`` (``rejoin`` is handed out once) and ``track``.
    - ``interrupts`` raises ``PeerLost`` into the training function (armed by ``_Worker.run``,
      fired by its heartbeat); ``shielded`` keeps it out of ray_ckpt's own calls.
    - ``member`` (this process's ``Member`` in the run, set by ``_Worker``) and ``drain`` (the
      generation and the ``DrainNotice`` of the drain under way there, as the coordinator's last
      beat reply said; written by the heartbeat thread) are read through ``drain_notice`` and
      ``hand_over``.
    - The reads a replacement begins ahead of its restores are not kept here: they go to the
      process's ``ProcessCopies`` (``ray_ckpt.process_copies.THIS_PROCESS``), which its
      checkpointers' restorers are handed; ``_Worker`` begins them and clears them at each
      generation.
    - It lives as long as the process and is never reset. Ray's calls into the process
      (``warm_up``, ``_become``) and the training function's thread write it one after the
      other; the heartbeat thread reads ``gloo`` only, set before it starts, and fires
      ``interrupts`` (thread-safe).
    """

    role: _Role | None = None
    attempt: str | None = None
    rejoin: Rejoin | None = None
    checkpointers: weakref.WeakSet[Any] = dataclasses.field(default_factory=weakref.WeakSet)
    gloo: GlooConnections | None = None
    warmed_at: float | None = None
    niceness_before: int | None = None
    interrupts: Interrupts = dataclasses.field(default_factory=Interrupts)
    member: Member | None = None
    generation: int | None = None  # the generation this process trains in (None: between)
    drain: tuple[int, DrainNotice] | None = None
    handing_over: bool = False  # this rank hands its place over, or did


PROCESS = ProcessState()


def warm_up() -> None:
    """The setup hook of this run's Ray Train worker processes: import what a worker needs as
    the process starts (importing the hook's module, ``ray_ckpt.train.inplace``, loads
    torch.distributed and Ray Train's torch support; then ``WARM_MODULES``), so that a warm spare
    has done it before a replacement lands in it. Workers that are not spares import them
    anyway, or soon would. Where the process may lower its niceness again (root, or RLIMIT_NICE
    allows it), it warms up at ``WARM_NICENESS`` more, so that spares starting beside training
    on shared cores yield to it; a worker takes its priority back when it becomes one
    (``_become``)."""
    import importlib

    PROCESS.gloo = GlooConnections()  # before any process group: what listens later is gloo's
    if _may_renice():
        PROCESS.niceness_before = os.nice(0)
        os.nice(WARM_NICENESS)
    for module in WARM_MODULES:
        importlib.import_module(module)
    # What the imports made lives as long as the process: the collector need not walk it again.
    # A full collection here walks ~400k objects (0.3 s idle, over a second on a busy host) with
    # the GIL held, and a survivor runs one in every recovery (``_teardown``).
    gc.freeze()
    PROCESS.warmed_at = time.time()
    if not ray.is_initialized():  # not a Ray worker (asking Ray would start a local instance)
        return
    try:  # the controller tells this process apart from the job's other idle workers by it
        runtime = ray.get_runtime_context()
        _ray_compat.note_warm_process(runtime.get_job_id(), runtime.get_node_id(), os.getpid())
    except Exception as error:  # warm spares only make replacements start sooner
        logger.info("ray_ckpt: this warm process could not be noted: %s", error)


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
    if PROCESS.niceness_before is not None:
        try:
            os.nice(PROCESS.niceness_before - os.nice(0))
        except OSError as error:  # the limit changed since: the worker keeps the lower priority
            logger.warning("ray_ckpt: could not restore this worker's CPU priority: %s", error)
        PROCESS.niceness_before = None


def _become(role: _Role) -> None:
    _take_priority_back()  # this process is a worker now, no longer a spare
    PROCESS.role = role


def _become_replacement(role: _Role) -> None:
    """``_become`` for a replacement, whose torch.distributed environment (RANK, WORLD_SIZE,
    ...) Ray's full start did not set: one call from the controller for both."""
    _ray_compat.set_torch_distributed_env_vars()
    _become(role)


def current_attempt() -> str | None:
    """The attempt id of this worker's generation, or None outside an in-place run."""
    return PROCESS.attempt if PROCESS.role is not None else None


def take_rejoin() -> Rejoin | None:
    """How this process entered its generation (once; the first Checkpointer records it)."""
    rejoin, PROCESS.rejoin = PROCESS.rejoin, None
    return rejoin


def shielded() -> Any:
    """A context in which no ``PeerLost`` is raised into the training function (ray_ckpt's
    own calls); one fired meanwhile is raised as it exits. Outside an in-place run: no effect."""
    return PROCESS.interrupts.shielded()


def track(checkpointer: Any) -> None:
    """Abandon ``checkpointer`` if this generation fails (its in-flight save is left to finish)."""
    PROCESS.checkpointers.add(checkpointer)


def drain_notice() -> DrainNotice | None:
    """The drain under way in this worker's generation (Ray drains the node of some of its
    ranks), as the coordinator's last beat reply said; None where none is, or outside an
    in-place run."""
    drain = PROCESS.drain
    if PROCESS.role is None or drain is None or drain[0] != PROCESS.generation:
        return None
    return drain[1]


def hand_over() -> HandedOver | None:
    """This rank's node drains and a step saved after the notice committed: tell the
    coordinator that this rank leaves its place (its peers leave the generation and a
    replacement restores that step), and return the ``HandedOver`` to raise into the training
    function. None where the coordinator did not take it: this rank is no live member of the
    current generation any more (a peer was lost meanwhile; ``PeerLost`` follows), or this
    process is no worker of an in-place run."""
    role, member = PROCESS.role, PROCESS.member
    if role is None or member is None:
        return None
    PROCESS.handing_over = True  # its own heartbeat, told to leave once it is taken, stays quiet
    try:
        taken = role.coordinator.hand_over(member)
    except CoordinatorTimeoutError:  # maybe taken: then its peers leave, and its join is refused
        taken = False
    PROCESS.handing_over = taken
    return HandedOver(f"rank {member.rank}: its node drains; it handed its place over") if taken else None


def _newest_saved_step() -> int | None:
    """The newest step this generation's checkpointers saved (None: none saved one), which
    says how far the failed generation got."""
    steps = [c._last_step for c in list(PROCESS.checkpointers) if getattr(c, "_last_step", None) is not None]
    return max(steps, default=None)


class _Worker:
    """One worker process's side of in-place recovery."""

    def __init__(self) -> None:
        role = PROCESS.role
        if role is None:
            raise ConfigError(
                "this training function was wrapped by InPlaceRecovery.wrap() but the trainer was not "
                "given that InPlaceRecovery: pass TorchTrainer(..., torch_config=recovery)"
            )
        self.role = role
        self.settings = role.settings
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
            epoch=role.epoch,
        )
        self.backend = self.settings.backend
        self._store: Any = None
        self._full_start_port = int(os.environ.get("MASTER_PORT") or 0)  # Ray Train's rendezvous, if any
        try:  # this rank's beats and joins go up the stores' relay tree where its node has a store
            role.coordinator.use_node_store(settings.namespace(), self.member.node_id)
        except Exception as error:  # no store to find: every call goes to the coordinator itself
            logger.debug("rank %d: finding this node's store for coordinator calls: %s", self.rank, error)
        if PROCESS.gloo is None:  # no warm-up hook ran (the job has its own): from the generations formed here on
            PROCESS.gloo = GlooConnections()
        if self.settings.warm_spares > 0:  # this node's spare, if any, is taken or no longer needed
            try:
                _ray_compat.mark_warm_spare(
                    runtime.get_job_id(), runtime.get_runtime_env_string(), self.member.node_id, None
                )
            except Exception as error:
                logger.debug("clearing this node's warm spare mark: %s", error)
        self._raylet = _raylet_parent()
        self._beating = threading.Event()
        PROCESS.member = self.member
        PROCESS.generation, PROCESS.drain, PROCESS.handing_over = None, None, False

    def run(self, train_loop: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        coordinator = self.role.coordinator
        if self.role.generation is not None:  # a full start: Ray set up the process group
            self.backend = dist.get_backend() if dist.is_initialized() else self.backend
            if not coordinator.register(self.member, self.role.generation):
                raise InPlaceRecoveryError("this worker group was superseded by a full restart before it started")
            PROCESS.attempt = self.role.attempt
            PROCESS.generation = self.role.generation
        self._start_heartbeat()
        budget = RecoveryBudget(settings.inplace_max_recoveries())
        interrupts = PROCESS.interrupts
        handed_over = ""
        try:
            if self.role.generation is None:
                self._rejoin(role="replacement", detected_at=None)
                self._read_ahead()
            while True:
                try:
                    interrupts.arm()
                    try:
                        result = train_loop(*args)
                    finally:
                        interrupts.disarm()
                    self._finish()
                    return result
                except BaseException as error:
                    if not isinstance(error, (Exception, PeerLost)):  # KeyboardInterrupt, SystemExit
                        raise
                    if isinstance(error, HandedOver) or PROCESS.handing_over:  # its text only: frames must go
                        handed_over = str(error) if isinstance(error, HandedOver) else "it handed its place over"
                        break
                    detected_at = time.time()
                    # once told a peer is lost, whatever the function raised next is that loss's doing
                    peer = interrupts.fired or is_peer_failure(error)
                    reached = _newest_saved_step()
                    refused = budget.give_up(reached) if peer else None
                    if peer and refused is None and self._orphaned():
                        self._await_own_end()
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
                    PROCESS.generation = None
                    logger.warning("rank %d: a peer is gone (%s); recovering in place", self.rank, _first_line(error))
                # Out of the except block: the failed generation's frames (its model, its DDP and
                # so its process group) are released only now, and the teardown must close the
                # group's connections, which fails the collectives peers are still blocked in.
                self._teardown()
                replaced = self._rejoin(role="survivor", detected_at=detected_at, torn_down_at=time.time())
                budget.recovered(reached, replaced)
            # Out of the except block, as above. This rank handed its place over: its peers'
            # collectives fail now, and its process ends with its node, which the coordinator
            # declares dead once every rank there handed over.
            PROCESS.generation = None
            self._teardown()
            logger.warning("%s", handed_over)
            self._await_own_end(handed_over)
        finally:
            self._beating.set()

    def _finish(self) -> None:
        """Tell the coordinator the training function returned: its beats stop on purpose, and
        a rank that returned before its peers (rank 0 still evaluating) must not be taken for
        hung. Tried twice; the heartbeat goes on until it is told."""
        for attempt in range(2):
            try:
                self.role.coordinator.finish(self.member)
                return
            except Exception as error:
                logger.log(
                    logging.DEBUG if attempt == 0 else logging.WARNING,
                    "rank %d: telling the coordinator this rank finished: %s",
                    self.rank,
                    error,
                )

    def _orphaned(self) -> bool:
        """Whether this process's raylet is gone: its node is going, and this process with it
        (never, where the process was not started as the raylet's child)."""
        return self._raylet is not None and os.getppid() != self._raylet

    def _await_own_end(self, why: str = "its raylet is gone") -> None:
        """This process's node is going: wait for Ray to end the process, which then counts as
        the lost rank, rather than rejoin or fail as a job error. Raises InPlaceRecoveryError
        if it is still alive after ``timeout_s``."""
        logger.warning("rank %d: this worker's node is going; not rejoining", self.rank)
        time.sleep(self.settings.timeout_s)
        raise InPlaceRecoveryError(
            f"rank {self.rank}: this worker's node is going ({why}) but the process lived on for "
            f"timeout_s={self.settings.timeout_s:g}s"
        )

    def _start_heartbeat(self) -> None:
        coordinator, member = self.role.coordinator, self.member
        interval = beat_interval_s(self.settings.hang_timeout_s, self.world_size, batched=coordinator.store is not None)

        def beat() -> None:
            watched: tuple[int | None, ConnectionWatch | None] = (None, None)  # generation, its watch
            reported: int | None = None  # the generation whose connections the coordinator took
            left: int | None = None  # the generation this rank was last told to leave
            while not self._beating.wait(interval):
                generation = PROCESS.generation
                if generation is not None and watched[0] != generation:
                    watched = (generation, self._watch_gloo())
                watch = watched[1] if watched[0] == generation else None
                closures = watch.closures() if watch is not None else Closures()
                connections = None
                if watch is not None and generation is not None and reported != generation:
                    connections = (generation, watch.connections)
                orphaned = self._orphaned()  # its node is going: say so before this process goes too
                signs = Beat(member, closures.accepted, orphaned, closures.connections, connections)
                try:
                    reply = coordinator.beat(signs, timeout_s=interval)
                except CoordinatorTimeoutError:
                    continue
                except Exception:  # the run is ending
                    return
                leave = reply.leave
                if generation is not None:
                    PROCESS.drain = None if reply.drain is None else (generation, reply.drain)
                reported = generation if connections is not None else reported
                if not leave or generation is None or generation != PROCESS.generation or generation == left:
                    continue
                if PROCESS.handing_over:  # it leaves by ``HandedOver``; told again if not taken
                    continue
                left = generation
                self._leave(generation)

        threading.Thread(target=beat, name=f"ray_ckpt-heartbeat-{self.rank}", daemon=True).start()

    def _leave(self, generation: int) -> None:
        """A peer of ``generation`` is lost: make this rank's collectives fail
        (``_fail_collectives``) and interrupt the training function (``PeerLost``), so it
        leaves for the next generation now."""
        logger.warning(
            "rank %d: a peer of generation %d is lost; interrupting the training function", self.rank, generation
        )
        PROCESS.interrupts.fire()
        if dist.is_initialized():
            self._fail_collectives()

    def _fail_collectives(self) -> None:
        """Make every collective of this rank, and its peers' with it, fail now, per device type
        of the backend: shut its gloo connections (a gloo group, a ``"cpu:gloo,cuda:nccl"``
        group's CPU side, a gloo subgroup beside NCCL ones; nothing where none is gloo's), then
        abort every group where NCCL runs (it hangs on a lost peer, and destroying a group stuck
        on one hangs too)."""
        self._shut_gloo()
        if process_groups.uses_nccl(self.backend or ""):
            process_groups.abort_all()

    def _store_ports(self) -> list[int]:
        ports = [self._full_start_port]  # Ray Train's store of a full start
        if self._store is not None:
            ports.append(int(self._store.port))
        return ports

    def _watch_gloo(self) -> ConnectionWatch | None:
        gloo = PROCESS.gloo
        return None if gloo is None else gloo.watch(self._store_ports())

    def _shut_gloo(self) -> int:
        """Shut this process's gloo connections (``GlooConnections``: accepted and made), but the
        rendezvous stores': a collective blocked on one, here or at a peer, fails at once, even
        where the peer went silent."""
        gloo = PROCESS.gloo
        return 0 if gloo is None else gloo.shut(self._store_ports())

    def _teardown(self) -> None:
        """Abandon the failed generation's checkpointers, close its gloo connections and abort
        its NCCL communicators, on every group (``_fail_collectives``: peers blocked in a
        collective with this rank fail now, not at their timeout) and destroy its process group."""
        for checkpointer in list(PROCESS.checkpointers):
            checkpointer.abandon()
        PROCESS.checkpointers.clear()
        if dist.is_initialized():
            self._fail_collectives()
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
        THIS_PROCESS.reads_ahead.clear()  # a read begun for the generation before is not this one's
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
            if reply.status is JoinStatus.DOOMED:
                if self._orphaned():  # its node is going: Ray ends this process, the lost rank
                    self._await_own_end()
                drain = PROCESS.drain
                if PROCESS.handing_over or (drain is not None and self.member.node_id in drain[1].nodes):
                    # its node drains, and goes once its ranks handed over (this one, or another there)
                    self._await_own_end("its node drains and its ranks handed their places over")
                # its raylet lives: the run declared its node dead while it did not answer (a
                # link that flapped, a partition that healed) and replaces it; it ends now
                raise InPlaceRecoveryError(
                    f"rank {self.rank}: the run took this worker for lost while its node did not answer "
                    "and is replacing it; this process leaves"
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
            PROCESS.attempt = reply.attempt
            PROCESS.generation = reply.generation
            PROCESS.rejoin = Rejoin(
                role=role,
                generation=reply.generation,
                pid=self.member.pid,
                process_started=psutil.Process().create_time(),
                warmed=PROCESS.warmed_at,
                worker_started=self.started,
                detected=detected_at,
                torn_down=torn_down_at,
                joined=joined_at,
                round_started=reply.round_started,
                formed=reply.formed_at,
                lost=tuple(reply.lost),
                ready=time.time(),
            )
            return sorted(replaced)

    def _read_ahead(self) -> None:
        """Begin this replacement's read of its state from peers now that its generation formed
        (``ray_ckpt.prefetch``, in the process's ``THIS_PROCESS``, whose reads its checkpointers'
        restores claim), while its training function builds what it needs before it calls
        ``restore()``: for every job this run checkpoints, in the default namespace."""
        attempt = PROCESS.attempt
        run = run_of(attempt)
        if attempt is None or run is None:
            return
        namespace = settings.namespace()
        registry, stores = RegistryClient(namespace), StoreDirectory(namespace)

        def read(job: str) -> prefetch.Planned | None:
            identity = RankIdentity(
                job=job, rank=self.rank, world_size=self.world_size, attempt=attempt, node_id=self.member.node_id
            )
            with ThreadPoolExecutor(1, thread_name_prefix=f"ray_ckpt-prefetch-{self.rank}") as background:
                restorer = Restorer(
                    identity=identity,
                    registry=registry,
                    stores=stores,
                    backup=None,
                    copies=THIS_PROCESS,
                    background=background,
                    timeout_s=settings.peer_timeout_s,
                )
                return restorer.read_planned()

        THIS_PROCESS.reads_ahead.begin(attempt, self.rank, lambda: registry.jobs_of_run(run), read)

    def _init_process_group(self, generation: int, timeout_s: float) -> None:
        coordinator = self.role.coordinator
        timeout = datetime.timedelta(seconds=max(1.0, timeout_s))
        if self.rank == 0:
            store = dist.TCPStore(self.member.host, 0, self.world_size, True, timeout, wait_for_workers=False)
            host, port = self.member.host, str(store.port)
            coordinator.publish(generation, f"{host}:{port}")
        else:
            address = coordinator.address(generation, max(1.0, timeout_s))
            if address is None:
                raise TimeoutError(f"generation {generation}'s rank 0 published no address")
            host, port = address.rsplit(":", 1)
            store = dist.TCPStore(host, int(port), self.world_size, False, timeout)
        self._store = store  # rank 0 serves the rendezvous while it lives
        # torch's env:// variables, which trainers read even where the group exists (accelerate's
        # PartialState refuses a multi-process run without MASTER_ADDR): this generation's
        os.environ.update(MASTER_ADDR=host, MASTER_PORT=port, RANK=str(self.rank), WORLD_SIZE=str(self.world_size))
        backend = self.backend = self.backend or ("nccl" if _cuda_workers() else "gloo")
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"ray_ckpt/g{generation}", store),
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=self.settings.collective_timeout_s),
        )
        self.backend = backend


def _raylet_parent() -> int | None:
    """This process's parent pid if the parent is a raylet (Ray starts its workers as the
    raylet's children), else None: a worker started by another process, whose exit says
    nothing about the node, is never taken for orphaned."""
    parent = os.getppid()
    try:
        return parent if psutil.Process(parent).name() == "raylet" else None
    except psutil.Error:
        return None


def _first_line(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"


def _transportable(error: BaseException) -> BaseException:
    """``error`` itself when it survives the trip to the driver (Ray Train pickles a worker's
    error into the run's result); else an InPlaceRecoveryError carrying its type and text, so
    the user reads the failure instead of a deserialization error from ``trainer.fit()``.
    A ``PeerLost`` (a BaseException, which Ray Train would not count as the function's failure)
    becomes an InPlaceRecoveryError."""
    if isinstance(error, PeerLost):
        return InPlaceRecoveryError(f"the training function was interrupted: {error}", error_type="PeerLost")
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
