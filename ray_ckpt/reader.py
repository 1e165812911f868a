"""Reader: a job's committed state, read by a process that is none of its ranks, changing nothing.

An evaluation sidecar or a notebook that watches a running job's weights must not take part in
the job: a ``Checkpointer.restore()`` there plans a restore and opens a new attempt, which
supersedes the training ranks (their next stage fails with ``StaleAttemptError``). A ``Reader``
asks the registry only what is committed and where (``latest_committed``, ``locate_rank``), never
a call that changes it (no plan, no attempt joined, no step given up or rolled back), and rebuilds
one rank's state of a committed step as a restore from peers does: any k shards, each checked
against the checksum the registry holds, missing data shards decoded, the snapshot header
validated before any byte is used (``restore.rebuild_from_peers``, ``restore.load``; no pickle).

A step can be evicted while it is read, since the job goes on committing and keeps only its
``keep_committed`` newest steps: reading the newest step then starts over on the then-newest one,
at most ``READ_TRIES`` times.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import ray

from ray_ckpt import settings
from ray_ckpt.core import dtensor, hostmem, workpool
from ray_ckpt.core.identity import RankIdentity
from ray_ckpt.core.shard import check_step
from ray_ckpt.core.wire import RankLocation, RankRecord
from ray_ckpt.errors import ConfigError, InsufficientShardsError, NoCheckpointError, StoreUnavailableError
from ray_ckpt.restore import Restored, ShardSource, load, rebuild_from_peers
from ray_ckpt.transport.registry_client import RegistryClient
from ray_ckpt.transport.store_directory import StoreDirectory

__all__ = ["READ_TRIES", "CommittedSteps", "Reader", "read"]

logger = logging.getLogger(__name__)

READ_TRIES = 3
"""How many steps one read of the newest step tries, each evicted while it was read, before it
gives up with NoCheckpointError."""


class CommittedSteps(Protocol):
    """What reading asks the registry (``RegistryClient`` in production): queries that change
    nothing."""

    def latest_committed(self, job: str) -> int | None: ...

    def locate_rank(self, job: str, step: int, rank: int) -> RankLocation: ...


class Reader:
    """Reads the committed steps of ``job`` as they stand, without taking part in the job.

    ``registry`` and ``stores`` are what it reads through (``connect`` builds them for a
    namespace of a running ray_ckpt service); ``timeout_s`` bounds each store call;
    ``allocate`` maps the buffer a state is rebuilt in (its tensors view it). Not thread-safe:
    one caller. ``close`` (or ``with``) releases what ``connect`` opened."""

    def __init__(
        self,
        job: str,
        *,
        registry: CommittedSteps,
        stores: ShardSource,
        timeout_s: Callable[[], float] = settings.peer_timeout_s,
        allocate: Callable[[int], np.ndarray] = hostmem.allocate,
    ) -> None:
        RankIdentity.check(job=job, rank=0, world_size=1, attempt=None)  # the job's name, as a rank's is checked
        self.job = job
        self.registry, self.stores = registry, stores
        self._timeout_s, self._allocate = timeout_s, allocate
        self._directory: StoreDirectory | None = None  # what ``connect`` opened, released by ``close``

    @classmethod
    def connect(cls, job: str, *, namespace: str | None = None) -> Reader:
        """A reader of ``job`` through the ray_ckpt service of ``namespace`` (default
        RAY_CKPT_NAMESPACE) on the cluster this process is connected to (``ray.init()`` first).
        StoreUnavailableError when Ray is not initialized or no service runs there."""
        if not ray.is_initialized():
            raise StoreUnavailableError("Ray is not initialized: call ray.init() (or ray.init(address='auto')) first")
        namespace = namespace or settings.namespace()
        directory = StoreDirectory(namespace)
        reader = cls(job, registry=RegistryClient(namespace), stores=directory)
        reader._directory = directory
        return reader

    def read(self, *, step: int | None = None, rank: int = 0, into: Any = None) -> Restored | None:
        """``rank``'s state of the newest committed step of the job as it stands now (or of
        ``step``, which must be committed), from any k checksum-valid shards in the stores:
        ``Restored`` with ``source`` "peers". None when the job has no committed step.

        Plans nothing and joins no attempt: the job's ranks, their attempt, its plan and its
        committed steps are the same after a read as before, and the job's next save commits as
        it would have. The newest step can be evicted while it is read (the job committed newer
        ones): the read then starts over on the then-newest, ``READ_TRIES`` steps in all, and
        raises NoCheckpointError naming the steps if each was evicted. A given ``step`` evicted
        while it is read, or not committed, is NoCheckpointError at once.

        ``into``: a state of the same tree (``model.state_dict()``): the tensors read are
        copied into its tensors, as ``Checkpointer.restore(into=...)`` does (same shapes and
        dtypes; a DTensor only into a DTensor of the sharding it was saved in). A state saved
        with DTensors needs ``into`` (ConfigError naming them). ConfigError also for a ``rank``
        that did not save the step; InsufficientShardsError or ShardsUnreachableError when the
        step cannot be rebuilt from the stores now, as for a restore."""
        if step is not None:
            check_step(step)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ConfigError(f"rank must be an int >= 0 (a rank that saved the step), got {rank!r}")
        evicted: list[int] = []
        for _ in range(READ_TRIES):
            t0 = time.perf_counter()
            target = step if step is not None else self.registry.latest_committed(self.job)
            if target is None:
                return None
            try:
                located = self.registry.locate_rank(self.job, target, rank)
            except NoCheckpointError:
                if step is not None:
                    raise
                evicted.append(target)  # evicted between the two questions
                continue
            record = self._record(located, target, rank)
            try:
                restored = self._rebuilt(target, rank, record, t0)
            except InsufficientShardsError as error:
                if not self._evicted(target, rank):
                    raise  # the step is still committed: its shards are lost, not evicted
                if step is not None:
                    raise NoCheckpointError(
                        f"job {self.job!r} step {step} was evicted while it was read: the job committed newer "
                        "steps and keeps only its keep_committed newest; read a newer step, or none to read the "
                        "newest",
                        job=self.job,
                        step=step,
                    ) from error
                evicted.append(target)
                logger.info("job %r: step %d was evicted while it was read; reading the newest step", self.job, target)
                continue
            return self._filled(restored, rank, into)
        raise NoCheckpointError(
            f"job {self.job!r}: steps {evicted} were each evicted while rank {rank}'s state was read (the job "
            "commits newer steps faster than a read takes, and keeps only its keep_committed newest); read again, "
            "or raise the job's CheckpointConfig.keep_committed",
            job=self.job,
            steps=evicted,
        )

    def _record(self, located: RankLocation, step: int, rank: int) -> RankRecord:
        if located.record is None:
            raise ConfigError(
                f"job {self.job!r} step {step} was saved by {located.world_size} rank(s): rank must be in "
                f"[0, {located.world_size}), got {rank}",
                job=self.job,
                step=step,
                rank=rank,
                world_size=located.world_size,
            )
        return located.record

    def _rebuilt(self, step: int, rank: int, record: RankRecord, t0: float) -> Restored:
        """``rank``'s state of ``step`` from the stores, with the phases a restore reports."""
        t1 = time.perf_counter()
        # map the output buffer's pages while the shards are in flight
        buffer = workpool.pool().submit(self._allocate, record.shard_size * record.data_shards)
        read = rebuild_from_peers(
            self.stores, record, job=self.job, step=step, rank=rank, buffer=buffer, timeout_s=self._timeout_s()
        )
        state = load(read.blob)
        phases = {
            "locate": t1 - t0,
            "fetch": read.fetched_at - t1,
            "decode": read.decoded_at - read.fetched_at,
            "load": time.perf_counter() - read.decoded_at,
        }
        return Restored(step, state, "peers", phases)

    def _evicted(self, step: int, rank: int) -> bool:
        """Whether ``step`` is no longer committed (asked anew: a query)."""
        try:
            self.registry.locate_rank(self.job, step, rank)
        except NoCheckpointError:
            return True
        return False

    def _filled(self, restored: Restored, rank: int, into: Any) -> Restored:
        if into is not None:
            return dataclasses.replace(restored, state=dtensor.load_into(restored.state, into))
        sharded = dtensor.holds_shards(restored.state)
        if sharded:
            raise ConfigError(
                f"job {self.job!r} step {restored.step} rank {rank} holds DTensors "
                f"({', '.join(sharded[:3])}{', ...' if len(sharded) > 3 else ''}): read them into a state dict of "
                "the same tree and sharding, read(..., into=...), in a process that has their device mesh",
                keys=sharded,
            )
        return restored

    def close(self) -> None:
        """Release the store handles and threads ``connect`` opened (states read stay valid)."""
        if self._directory is not None:
            self._directory.clear()
            self._directory = None

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read(
    job: str, *, step: int | None = None, rank: int = 0, into: Any = None, namespace: str | None = None
) -> Restored | None:
    """``rank``'s state of the newest committed step of ``job`` as it stands (or of ``step``),
    read without taking part in the job: ``Reader.connect(job, namespace=namespace).read(...)``
    (see ``Reader.read``). None when the job has no committed step. For watching a running job's
    weights from a process that is none of its ranks (an evaluation sidecar, a notebook)."""
    with Reader.connect(job, namespace=namespace) as reader:
        return reader.read(step=step, rank=rank, into=into)
