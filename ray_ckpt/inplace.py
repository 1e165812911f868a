"""In-place recovery for Ray Train: survivors keep their processes, only lost workers are replaced.

Opt in with one object used twice::

    recovery = ray_ckpt.train.InPlaceRecovery()
    trainer = TorchTrainer(recovery.wrap(train_loop), torch_config=recovery, ...)

``InPlaceRecovery`` is a ``TorchConfig`` whose backend tells Ray Train's controller to replace
only the failed workers (Ray's replica-group path, fenced in ``_ray_compat``). ``wrap`` runs the
training function and, when it fails because a peer is gone (a collective error, or a commit
that timed out), turns that into a recovery in the same process: the function's checkpointers
are abandoned, the process group is destroyed, the survivors and the replacement meet in a new
generation (``generations.GenerationCoordinator``) with a fresh TCP store, and the function runs
again from the top. There it restores as it always does: survivors from their local copy,
the replacement from peers. The contract on the training function: it must be safe to re-run
in the same process (build the model and optimizer, ``prepare_model``, create its Checkpointer,
restore), which is what a function written for Ray Train's restarts already does.

When in-place recovery cannot go on (no replacement within ``timeout_s``, a full restart of the
worker group overtook it, or this Ray lacks the path), the function raises
``InPlaceRecoveryError`` or runs as without ray_ckpt, and Ray Train restarts the worker group,
which restores from peers as before.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import gc
import logging
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

from ray_ckpt import _ray_compat
from ray_ckpt.errors import CommitTimeoutError, ConfigError, InPlaceRecoveryError
from ray_ckpt.generations import GenerationCoordinator, Member

logger = logging.getLogger(__name__)

_PEER_LOST_MARKERS = ("gloo", "nccl", "connection closed", "connection reset", "read error", "broken pipe", "timed out")


def is_peer_failure(error: BaseException) -> bool:
    """Whether ``error`` says a collective (or a commit) failed because a peer is gone."""
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


@dataclasses.dataclass
class _Role:
    """What ``on_start`` told this worker process: its run's coordinator, epoch, and for a full
    start the generation Ray's process group carries (None for a replacement)."""

    coordinator: Any
    epoch: int
    generation: int | None
    attempt: str | None
    settings: _Settings


_role: _Role | None = None
_attempt: str | None = None  # the ray_ckpt attempt of the generation this process is in
_rejoin: dict[str, Any] | None = None  # how this process entered that generation, for its event
_open: weakref.WeakSet[Any] = weakref.WeakSet()


def _become(role: _Role) -> None:
    global _role
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
    """Abandon ``checkpointer`` if this generation fails (its in-flight save is waited for)."""
    _open.add(checkpointer)


class InPlaceRecovery(TorchConfig):
    """TorchConfig for in-place recovery; see the module docstring.

    timeout_s: how long a survivor waits for every rank to join the next generation before it
    gives up (``InPlaceRecoveryError``; Ray Train then restarts workers). hang_timeout_s: a
    worker whose heartbeat is silent this long (its process stopped) is killed and replaced.
    collective_timeout_s: the process groups' timeout, the bound on a collective that waits
    for a peer that vanished without closing its connections. ``backend`` and the remaining
    keyword arguments are TorchConfig's.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 120.0,
        hang_timeout_s: float = 10.0,
        collective_timeout_s: float = 300.0,
        backend: str | None = None,
        **torch_config: Any,
    ) -> None:
        for name, value in (
            ("timeout_s", timeout_s),
            ("hang_timeout_s", hang_timeout_s),
            ("collective_timeout_s", collective_timeout_s),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"InPlaceRecovery {name} must be a number of seconds > 0, got {value!r}")
        super().__init__(backend=backend, timeout_s=int(collective_timeout_s), **torch_config)
        self.settings = _Settings(float(timeout_s), float(hang_timeout_s), float(collective_timeout_s), backend)

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

    class _InPlaceBackend(base):  # type: ignore[misc, valid-type]
        has_replica_groups = path.missing is None

        def __init__(self) -> None:
            super().__init__()
            self._coordinator: Any = None

        def _coordinator_for(self, config: InPlaceRecovery) -> Any:
            if self._coordinator is None:  # lives as long as the run's controller
                node = ray.get_runtime_context().get_node_id()
                strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node, soft=False)
                self._coordinator = GenerationCoordinator.options(scheduling_strategy=strategy).remote(  # type: ignore[attr-defined]
                    config.settings.hang_timeout_s
                )
            return self._coordinator

        def on_start(self, group: Any, config: InPlaceRecovery) -> None:
            if path.missing is not None:
                logger.warning(
                    "ray_ckpt in-place recovery is off (%s): failures restart the worker group", path.missing
                )
                super().on_start(group, config)
                return
            _ray_compat.restart_when_a_replacement_fails()  # here: the controller's class exists by now
            coordinator = self._coordinator_for(config)
            if _ray_compat.is_replica_group(group):  # a replacement: it rendezvouses in the train function
                epoch = ray.get(coordinator.epoch.remote())
                group.execute(_ray_compat.set_torch_distributed_env_vars)
                group.execute(_become, _Role(coordinator, epoch, None, None, config.settings))
                return
            super().on_start(group, config)
            begun = ray.get(coordinator.begin.remote(len(group)))
            role = _Role(coordinator, begun["epoch"], begun["generation"], begun["attempt"], config.settings)
            group.execute(_become, role)

    return _InPlaceBackend


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
        self._beating = threading.Event()

    def run(self, train_loop: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        global _attempt
        coordinator = self.role.coordinator
        if self.role.generation is not None:  # a full start: Ray set up the process group
            self.backend = dist.get_backend() if dist.is_initialized() else self.backend
            if not ray.get(coordinator.register.remote(self.member, self.role.generation)):
                raise InPlaceRecoveryError("this worker group was superseded by a full restart before it started")
            _attempt = self.role.attempt
        self._start_heartbeat()
        try:
            if self.role.generation is None:
                self._rejoin(role="replacement", detected_at=None)
            while True:
                try:
                    return train_loop(*args)
                except Exception as error:
                    if not is_peer_failure(error):
                        raise
                    detected_at = time.time()
                    logger.warning(
                        "rank %d: a peer is gone (%s: %s); recovering in place",
                        self.rank,
                        type(error).__name__,
                        str(error).splitlines()[0][:200] if str(error) else "",
                    )
                # Out of the except block: the failed generation's frames (its model, its DDP and
                # so its process group) are released only now, and the teardown must close the
                # group's connections, which fails the collectives peers are still blocked in.
                self._teardown()
                self._rejoin(role="survivor", detected_at=detected_at)
        finally:
            self._beating.set()

    def _start_heartbeat(self) -> None:
        interval = max(0.1, self.settings.hang_timeout_s / 4)
        coordinator, member = self.role.coordinator, self.member

        def beat() -> None:
            aborted: Any = None  # the process group aborted last (at most once each)
            while not self._beating.wait(interval):
                try:
                    stuck = ray.get(coordinator.beat.remote(member), timeout=interval)
                except ray.exceptions.GetTimeoutError:
                    continue
                except Exception:  # the run is ending
                    return
                group = dist.group.WORLD if dist.is_initialized() else None
                if stuck and self.backend == "nccl" and group is not None and group is not aborted:
                    # NCCL collectives hang on a lost peer instead of failing: abort them so the
                    # training function raises and this rank joins the round
                    logger.warning("rank %d: aborting the NCCL process group stuck on a lost peer", self.rank)
                    group.abort()
                    aborted = group

        threading.Thread(target=beat, name=f"ray_ckpt-heartbeat-{self.rank}", daemon=True).start()

    def _teardown(self) -> None:
        """Abandon the failed generation's checkpointers and destroy its process group."""
        for checkpointer in list(_open):
            checkpointer.abandon(timeout_s=self.settings.timeout_s)
        _open.clear()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as error:  # a broken group may fail to shut down cleanly
                logger.debug("destroying the failed process group: %s", error)
        gc.collect()  # drops the failed group's connections, so peers blocked on us fail fast

    def _rejoin(self, *, role: str, detected_at: float | None) -> None:
        """Join the next generation and set up its process group (retried if a member dies
        during the rendezvous); raises InPlaceRecoveryError when it cannot form in time."""
        global _attempt, _rejoin
        coordinator = self.role.coordinator
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            joined_at = time.time()
            left = max(0.0, deadline - time.monotonic())
            reply = ray.get(coordinator.join.remote(self.member, left))
            if reply["status"] == "superseded":
                raise InPlaceRecoveryError(
                    f"rank {self.rank}: a full restart of the worker group overtook this in-place recovery"
                )
            if reply["status"] == "timeout":
                raise InPlaceRecoveryError(
                    f"rank {self.rank}: ranks {reply['missing']} did not join the next generation within "
                    f"timeout_s={self.settings.timeout_s:g}s; Ray Train restarts the workers and they restore "
                    "from peers (raise InPlaceRecovery(timeout_s=...) if replacements start slowly)",
                    missing_ranks=reply["missing"],
                )
            try:
                self._init_process_group(reply["generation"], min(left, self.settings.collective_timeout_s))
            except (dist.DistError, RuntimeError, TimeoutError) as error:
                logger.warning(
                    "rank %d: generation %d did not form (%s); joining again", self.rank, reply["generation"], error
                )
                self._teardown()
                continue
            _attempt = reply["attempt"]
            _rejoin = {
                "role": role,
                "generation": reply["generation"],
                "pid": self.member.pid,
                "process_started": psutil.Process().create_time(),
                "worker_started": self.started,
                "detected": detected_at,
                "joined": joined_at,
                "round_started": reply["round_started"],
                "formed": reply["formed_at"],
                "ready": time.time(),
            }
            return

    def _init_process_group(self, generation: int, timeout_s: float) -> None:
        coordinator = self.role.coordinator
        timeout = datetime.timedelta(seconds=max(1.0, timeout_s))
        if self.rank == 0:
            store = dist.TCPStore(self.member.host, 0, self.world_size, True, timeout, wait_for_workers=False)
            ray.get(coordinator.publish.remote(generation, f"{self.member.host}:{store.port}"))
        else:
            address = ray.get(coordinator.address.remote(generation, max(1.0, timeout_s)))
            if address is None:
                raise TimeoutError(f"generation {generation}'s rank 0 published no address")
            host, port = address.rsplit(":", 1)
            store = dist.TCPStore(host, int(port), self.world_size, False, timeout)
        self._store = store  # rank 0 serves the rendezvous while it lives
        backend = self.backend or ("nccl" if _cuda_workers() else "gloo")
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"ray_ckpt/g{generation}", store),
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=self.settings.collective_timeout_s),
        )
        self.backend = backend


def _cuda_workers() -> bool:
    import torch

    return torch.cuda.is_available() and bool(ray.get_gpu_ids())
