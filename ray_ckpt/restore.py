"""Restore: rebuild one rank's state from its local copy, any k shards on peers, or a backup.

The layered order (``Restorer.restore``):
  1 plan    the registry decides once per attempt which step every rank restores (the newest
            committed step every rank can rebuild from memory, else the newest backup);
  2 local   this rank's full copy in its own node's store, checked against the registry's
            checksum: no network;
  3 peers   any k checksum-valid shards fetched in parallel, data shards first; a dead store,
            a missing shard or a bad checksum is an erasure and the next shard is fetched;
            missing data shards are decoded;
  4 backup  the newest complete persistent backup, the same step on every rank.

The restorer takes its collaborators (``RegistryView``, ``ShardSource``, ``Backup``, and the
process's ``ProcessCopies``: its own save buffers' copies and the reads begun ahead) as
arguments, so it runs against fakes in unit tests, without Ray. Shard checks are pure
functions. No pickle: a peer's bytes are data, validated before use.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol

import numpy as np

from ray_ckpt import prefetch, reshard
from ray_ckpt.backup import Backup
from ray_ckpt.core import blob, dtensor, hostmem, snapshot
from ray_ckpt.core.checksum import verify
from ray_ckpt.core.codec import ReedSolomon
from ray_ckpt.core.events import RestoreSource
from ray_ckpt.core.identity import RankIdentity, WithIdentity
from ray_ckpt.core.shard import ShardAddress, ShardMeta, check_step
from ray_ckpt.core.wire import FoundShard, PlanAnswer, RankLocation, RankRecord, RestorePlan
from ray_ckpt.errors import (
    ConfigError,
    CorruptShardError,
    InsufficientShardsError,
    LayoutChangedError,
    ShardMismatchError,
    ShardsUnreachableError,
    SnapshotFormatError,
)
from ray_ckpt.process_copies import ProcessCopies
from ray_ckpt.ranges import RangeReader, RangeSource

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Restored:
    """A restored checkpoint: the step, the state (CPU tensors), where it came from (a
    ``RestoreSource``: ``"local"``, ``"peers"`` or ``"backup"``) and the restore's phase
    durations in seconds (``locate``, ``fetch``, ``decode``, ``load``). After a resharded restore (the step was
    saved at another world size or sharding), ``from_world_size`` is the saving world size and ``values_by_rank``
    holds every old rank's non-tensor values (tensors as None), e.g. data loader positions."""

    step: int
    state: Any
    source: RestoreSource
    phases_s: dict[str, float]
    from_world_size: int | None = None
    values_by_rank: dict[int, Any] | None = None


class RegistryView(Protocol):
    """What restoring needs from the registry (``RegistryClient`` in production)."""

    def plan_restore(self, job: str, attempt: str | None) -> RestorePlan: ...

    def plan_for_rank(self, job: str, attempt: str | None, rank: int) -> PlanAnswer: ...

    def locate(self, job: str, step: int) -> dict[int, RankRecord]: ...

    def locate_rank(self, job: str, step: int, rank: int) -> RankLocation: ...

    def settle_backup_step(self, job: str, attempt: str | None, step: int | None) -> int | None: ...

    def mark_unrestorable(self, job: str, step: int) -> None: ...

    def rollback(self, job: str, step: int) -> list[int]: ...


class ShardSource(RangeSource, Protocol):
    """Where shards are read from (``StoreDirectory`` in production): ``live`` and
    ``get_ranges`` as for ranged reads, and these. Answers are the records of
    ``ray_ckpt.core.wire``, parsed once by the source."""

    def plan(self, node_id: str, job: str, attempt: str | None, rank: int) -> Future[PlanAnswer]:
        """The restore plan of ``attempt`` and ``rank``'s record of its step, through that node's
        store (KeyError: no live store there)."""
        ...

    def get(
        self, node_id: str, address: ShardAddress, into: Callable[[], np.ndarray | None] | None = None
    ) -> Future[FoundShard | None]:
        """The shard (or the rank's full local copy) at ``address``, from that node's store
        (None: it holds none); the future fails if the store does, and with SnapshotFormatError
        if the store's answer is malformed. Its bytes may land in ``into()`` (an array of the
        shard's size), unchecked; the answer's data is then that array."""


LIVENESS_CHECK_S = 0.5  # how often a fetch that waits asks whether the nodes it waits on live
_NOT_HELD = "store no longer holds it"
_MALFORMED = "malformed metadata"  # the store's answer did not parse (``FoundShard.from_wire``)


def check_shard(found: FoundShard | None, expected: ShardMeta) -> str | None:
    """Why a fetched shard is unusable, or None if it matches its registered metadata."""
    if found is None:
        return _NOT_HELD
    data = found.data
    if found.meta != expected:
        return "metadata differs from the registry's"
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.size != expected.shard_size:
        return "wrong size"
    if not verify(expected, data):
        return "checksum mismatch (corrupted bytes)"
    return None


def load(data: np.ndarray) -> Any:
    """The state in a blob; tensors are views into ``data``."""
    header, payload = blob.split(data)
    return snapshot.restore(header, payload, copy=False)


def fetch_shards(
    source: ShardSource,
    record: RankRecord,
    *,
    job: str,
    step: int,
    rank: int,
    buffer: Future[np.ndarray],
    timeout_s: float,
) -> tuple[dict[int, np.ndarray], dict[int, str]]:
    """Any k checksum-valid shards of ``record``, fetched in parallel; data shards first (no
    decode work). A dead store, a missing shard or a bad checksum is an erasure: the next
    candidate is fetched instead. Data shards land in their place in the output buffer
    (``buffer``'s result): a direct read receives them there and they are checked in place (one
    that fails its check is rebuilt there by the decode), others are copied in as they arrive.
    While it waits it asks, every ``LIVENESS_CHECK_S``, whether the nodes it waits on still
    live: a fetch from a node Ray declared dead since (a silent node the run fenced) is given up
    and the next candidate fetched instead; a data shard's read given up so lands, if it ever
    answers, in fresh memory, never in the output buffer (``_SlotLease``), and its answer is not
    used. Returns (shards by index, lost index -> reason). Fewer than k valid: InsufficientShardsError
    (naming rank, step and lost shards) only when that is proven, that is when more than m shards
    are gone for good (their node has no live store, the store answered that it no longer holds
    them or answered malformed metadata, or their bytes fail their checks); when shards whose
    live store did not answer in time or failed a call could still make up k,
    ShardsUnreachableError: a slow store is no dead one."""
    k, shard_size = record.data_shards, record.shard_size
    live = source.live(set(record.nodes.values()))
    lost: dict[int, str] = {}
    candidates = []
    for index in sorted(record.metas):
        if record.nodes[index] in live:
            candidates.append(index)
        else:
            lost[index] = f"node {record.nodes[index]} is dead or has no store"
    pending: dict[Future[FoundShard | None], int] = {}
    leases: dict[int, _SlotLease] = {}
    given_up: set[int] = set()  # pending fetches from nodes that died meanwhile: answers not used
    valid: dict[int, np.ndarray] = {}
    deadline = time.monotonic() + timeout_s

    def active() -> list[int]:
        return [index for index in pending.values() if index not in given_up]

    def launch() -> None:
        while candidates and len(valid) + len(active()) < k:
            index = candidates.pop(0)
            address = ShardAddress(job, step, rank, index, writer=record.first.writer)
            lease = _SlotLease(buffer, index, shard_size) if index < k else None
            if lease is not None:
                leases[index] = lease
            pending[source.get(record.nodes[index], address, lease)] = index

    def route_around_the_dead() -> None:
        waiting_on = {index: record.nodes[index] for index in active()}
        alive = source.live(set(waiting_on.values()))
        for index, node in waiting_on.items():
            lease = leases.get(index)
            if node not in alive and (lease is None or lease.revoke()):
                given_up.add(index)
                lost[index] = f"node {node} died while the shard was read"

    unanswered: set[int] = set()  # lost for this read only: their store is alive but did not serve them

    launch()
    while active() and len(valid) < k:
        left = deadline - time.monotonic()
        done, _ = wait(list(pending), timeout=max(0.0, min(left, LIVENESS_CHECK_S)), return_when=FIRST_COMPLETED)
        if not done and left > LIVENESS_CHECK_S:
            route_around_the_dead()
            launch()
            continue
        if not done:
            for index in active():
                lost[index] = "store did not answer in time"
                unanswered.add(index)
            pending.clear()
            break
        for future in done:
            index = pending.pop(future)
            if index in given_up:  # its node died meanwhile: another shard was asked for instead
                continue
            try:
                found = future.result()
            except SnapshotFormatError:  # the store answered, with nothing usable: as a bad checksum
                lost[index] = _MALFORMED
                continue
            except Exception as error:  # a failed store call is an erasure for this read
                lost[index] = f"store failed: {type(error).__name__}"
                unanswered.add(index)
                continue
            if found is None:
                lost[index] = _NOT_HELD
            elif (reason := check_shard(found, record.metas[index])) is not None:
                lost[index] = reason
            elif index < k:
                slot = _slot(buffer, index, shard_size)
                if not hostmem.same_memory(slot, found.data):
                    np.copyto(slot, found.data)
                valid[index] = slot
            else:
                valid[index] = found.data
        launch()
    if len(valid) < k:
        unanswered &= set(lost)
        if unanswered:  # the stores that did not serve are gone for good only if Ray no longer lists them
            still = source.live({record.nodes[index] for index in unanswered})
            unanswered = {index for index in unanswered if record.nodes[index] in still}
        untried = len(candidates)  # never asked: as good as the unanswered ones
        if len(valid) + len(unanswered) + untried >= k:
            raise ShardsUnreachableError(
                f"job {job!r} rank {rank} step {step}: only {len(valid)} of the {k} shards needed were read, "
                f"but the stores of shards {sorted(unanswered)} are alive and did not answer within "
                f"{timeout_s:g}s or failed a call (lost shards {dict(sorted(lost.items()))}). The step is kept: "
                "the next attempt reads it again (raise RAY_CKPT_PEER_TIMEOUT_S for stores that pause longer)",
                job=job,
                rank=rank,
                step=step,
                unanswered=sorted(unanswered),
                needed=k,
                available=len(valid),
            )
        raise InsufficientShardsError(
            f"job {job!r} rank {rank} step {step}: only {len(valid)} of the {k} shards needed survive; "
            f"lost shards {dict(sorted(lost.items()))}. More than parity_shards={len(record.metas) - k} "
            "shards are gone, so this step cannot be rebuilt from memory",
            job=job,
            rank=rank,
            step=step,
            lost=sorted(lost),
            needed=k,
            available=len(valid),
        )
    return valid, lost


PROOF_OF_LOSS: tuple[type[BaseException], ...] = (
    InsufficientShardsError,
    CorruptShardError,
    ShardMismatchError,
    SnapshotFormatError,
)
"""The errors that prove a committed step cannot be rebuilt by this rank (too few intact shards
exist, or intact shards whose bytes do not decode or load), the only ones for which a restore
gives the step up (``Registry.mark_unrestorable``). Every other error fails the attempt and
leaves the step restorable: ``ShardsUnreachableError`` (slow or paused stores), MemoryError,
timeouts and the like."""


@dataclasses.dataclass(frozen=True)
class PeersRead:
    """One rank's blob rebuilt from peers (``rebuild_from_peers``): the blob (a view of the
    output buffer), the bytes fetched, and the moments (perf_counter) the fetch and the decode
    ended."""

    blob: np.ndarray
    fetched_bytes: int
    fetched_at: float
    decoded_at: float


def rebuild_from_peers(
    source: ShardSource,
    record: RankRecord,
    *,
    job: str,
    step: int,
    rank: int,
    buffer: Future[np.ndarray],
    timeout_s: float,
) -> PeersRead:
    """``rank``'s blob of ``step`` from any k checksum-valid shards of ``record``
    (``fetch_shards``, with its errors), missing data shards decoded into ``buffer``'s result
    (an array of ``shard_size * data_shards`` bytes). The blob is not loaded: ``load`` checks
    and parses it. Asks the stores only: the registry is not called."""
    shards, lost = fetch_shards(source, record, job=job, step=step, rank=rank, buffer=buffer, timeout_s=timeout_s)
    output = buffer.result()
    fetched = time.perf_counter()
    ReedSolomon(record.data_shards, record.parity_shards).decode_into(shards, output)
    if lost:
        logger.warning("rank %d step %d: rebuilt without shards %s", rank, step, sorted(lost))
    return PeersRead(output[: record.payload_size], record.shard_size * len(shards), fetched, time.perf_counter())


def _slot(buffer: Future[np.ndarray], index: int, shard_size: int) -> np.ndarray:
    """Data shard ``index``'s place in the output buffer (waits for the buffer)."""
    return buffer.result()[index * shard_size : (index + 1) * shard_size]


class _SlotLease:
    """Data shard ``index``'s place in the output buffer, lent to the one read of that shard
    (its ``into``): the read lands there if its store answers before the fetch gives the read
    up (``revoke``); after that it gets None and lands in fresh memory, so an answer that comes
    late never writes into a state already restored and in use."""

    def __init__(self, buffer: Future[np.ndarray], index: int, shard_size: int) -> None:
        self._buffer, self._index, self._shard_size = buffer, index, shard_size
        self._lock = threading.Lock()
        self._landing = self._revoked = False

    def __call__(self) -> np.ndarray | None:
        with self._lock:
            if self._revoked:
                return None
            self._landing = True
        return _slot(self._buffer, self._index, self._shard_size)

    def revoke(self) -> bool:
        """Take the place back unless the read already lands in it; whether it was taken."""
        with self._lock:
            if not self._landing:
                self._revoked = True
            return self._revoked


def _phases(t0: float, t1: float, t2: float, t3: float, t4: float) -> dict[str, float]:
    return {"locate": t1 - t0, "fetch": t2 - t1, "decode": t3 - t2, "load": t4 - t3}


class Restorer(WithIdentity):
    """One rank's layered restore, for the rank ``identity`` names (its fields read as
    attributes: ``job``, ``rank``, ...; a rank that restores without an attempt gets the
    registry's, a new ``identity``). ``copies``: what this process keeps between restores
    (``ProcessCopies``): a step its own save buffer still holds is taken from there, a read
    begun ahead for this rank is claimed. ``allocate`` maps output buffers (hostmem.allocate);
    ``background`` runs that mapping while shards are in flight. ``restored_bytes`` is what
    the last restore moved. Not thread-safe: one caller."""

    def __init__(
        self,
        *,
        identity: RankIdentity,
        registry: RegistryView,
        stores: ShardSource,
        backup: Backup | None,
        copies: ProcessCopies,
        background: ThreadPoolExecutor,
        timeout_s: Callable[[], float],
        allocate: Callable[[int], np.ndarray] = hostmem.allocate,
    ) -> None:
        self.identity = identity
        self.registry, self.stores, self.backup, self.copies = registry, stores, backup, copies
        self._background, self._timeout_s, self._allocate = background, timeout_s, allocate
        self.restored_bytes = 0

    def restore(self, step: int | None = None, into: Any = None) -> tuple[Restored | None, RestorePlan | None]:
        """The state of the step every rank of this attempt restores (or of ``step``), with the
        plan it followed (None for an explicit step). With ``into``, a step saved at another
        world size is resharded into it (``reshard``). See ``Checkpointer.restore``."""
        t0 = time.perf_counter()
        self.restored_bytes = 0
        read = self.copies.reads_ahead.claim(self.job, self.attempt, self.rank)  # this rank's blob, read ahead
        if step is not None:
            check_step(step)
            located = self.registry.locate_rank(self.job, step, self.rank)
            if into is not None and located.world_size != self.world_size:
                return self._resharded(step, into, t0), None
            return self._from_memory(step, self._record(located, step), t0, read), None
        answer = self._plan()
        plan = answer.plan
        if self.attempt is None:  # the registry's attempt for ranks that restore without one
            self.identity = self.identity.with_attempt(plan.attempt)
        if plan.source == "peers" and plan.step is not None:
            reshard_into = into is not None and int(plan.world_size or 0) != self.world_size
            if not reshard_into:
                self.check_world_size(int(plan.world_size or 0), plan.step)
            try:
                if reshard_into:
                    restored = self._resharded(plan.step, into, t0)
                else:
                    located = answer.records.get(self.rank) or self.registry.locate_rank(self.job, plan.step, self.rank)
                    restored = self._from_memory(plan.step, self._record(located, plan.step), t0, read)
            except ConfigError:
                raise  # the caller's state or world size, not the step: it stays restorable
            except PROOF_OF_LOSS:
                # proven: this rank cannot rebuild the step every rank agreed on (fewer than k
                # shards exist intact, or intact bytes that do not decode or load): make sure no
                # later plan picks it, then fail this attempt so all ranks restart and agree anew
                self.registry.mark_unrestorable(self.job, plan.step)
                raise
            except Exception as error:
                # anything else (a store that did not answer, memory short while old workers
                # exit, a timeout on a loaded node) proves nothing about the step: fail this
                # attempt and leave the step as it is, for the next attempt to read again
                logger.warning(
                    "job %r rank %d: restoring step %d failed (%s: %s); the step is kept for the next attempt",
                    self.job,
                    self.rank,
                    plan.step,
                    type(error).__name__,
                    error,
                )
                raise
            if plan.newest_committed is not None and plan.step < plan.newest_committed:
                # an older kept step: forget the newer, unrebuildable ones so training can save
                # those step numbers again
                self.registry.rollback(self.job, plan.step)
            return restored, plan
        return self._from_backup(plan, t0), plan

    def join(self) -> RestorePlan:
        """Join the attempt a restore joins, loading nothing: without an attempt, the registry's
        (``Registry.plan_restore``; ``identity`` then names it), through the same plan call as
        ``restore``, so the registry counts this rank as restored under it. Returns the
        attempt's plan; changes nothing else (no rollback, no step given up)."""
        plan = self._plan().plan
        if self.attempt is None:
            self.identity = self.identity.with_attempt(plan.attempt)
        return plan

    def fill(self, restored: Restored, into: Any) -> Restored:
        """``restored`` with its state copied into ``into`` (``dtensor.load_into``). When a
        state from peer memory was saved in another sharding than ``into`` holds (same world
        size, another device mesh or placements), it is resharded into ``into`` instead, with
        ``from_world_size`` set; from a backup that raises LayoutChangedError."""
        try:
            return dataclasses.replace(restored, state=dtensor.load_into(restored.state, into))
        except LayoutChangedError as error:
            if restored.source not in ("local", "peers"):
                raise
            logger.info("rank %d: %s; resharding step %d into it", self.rank, error, restored.step)
            return self._resharded(restored.step, into, time.perf_counter())

    def _plan(self) -> PlanAnswer:
        """The attempt's plan and this rank's record of its step, through this node's store
        (whose ranks, and the stores below it in the relay tree, ask the registry together);
        from the registry itself when that store is gone or fails."""
        try:
            asked = self.stores.plan(self.node_id, self.job, self.attempt, self.rank)
            answer = asked.result(timeout=self._timeout_s())
        except Exception as error:  # no store here, it died, or it could not reach the registry
            logger.info(
                "rank %d: asking this node's store for the plan failed (%s); asking the registry", self.rank, error
            )
            answer = self.registry.plan_for_rank(self.job, self.attempt, self.rank)
        answer.raise_error()
        return answer

    def check_world_size(self, saved: int, step: int) -> None:
        """The same ConfigError on every rank when ``step`` was saved by another number of
        ranks: per-rank state cannot be resharded, and restoring it silently would be wrong."""
        if saved != self.world_size:
            raise ConfigError(
                f"job {self.job!r} step {step} was saved by {saved} rank(s), but this run has world size "
                f"{self.world_size}: per-rank state cannot be restored into another world size. Restore at "
                f"world size {saved}, start under a new job name, or drop this job's checkpoints "
                f"(a state saved as DTensors restores into any world size with restore(into=...)) "
                f"(`ray-ckpt drop {self.job}` or ray_ckpt.drop({self.job!r})); the step stays restorable at "
                f"world size {saved} until then",
                job=self.job,
                step=step,
                saved_world_size=saved,
                world_size=self.world_size,
            )

    def _record(self, located: RankLocation, step: int) -> RankRecord:
        """This rank's record of ``step`` from the registry's ``locate_rank`` (only its own:
        O(1) bytes in the world size), after the world-size check every rank makes alike."""
        self.check_world_size(located.world_size, step)
        if located.record is None:
            raise ConfigError(
                f"job {self.job!r} step {step}: the registry holds no record of rank {self.rank} although "
                f"{located.world_size} ranks saved the step; rank ids must be 0..world_size-1",
                job=self.job,
                step=step,
                rank=self.rank,
            )
        return located.record

    def _from_memory(self, step: int, record: RankRecord, t0: float, read: prefetch.Read | None = None) -> Restored:
        t1 = time.perf_counter()
        local = self._local_copy(step, record)
        if local is not None:
            self.restored_bytes = local.size
            t2 = time.perf_counter()
            state = load(local)
            return Restored(step, state, "local", _phases(t0, t1, t2, t2, time.perf_counter()))
        blob = None if read is None else read.blob_of(step, record, self._timeout_s())
        if blob is not None:  # read from peers ahead of this call: its fetch is the wait for that read
            self.restored_bytes = record.shard_size * record.data_shards
            t2 = time.perf_counter()
            return Restored(step, load(blob), "peers", _phases(t0, t1, t2, t2, time.perf_counter()))
        blob, fetched, decoded = self._from_peers(step, record)
        return Restored(step, load(blob), "peers", _phases(t0, t1, fetched, decoded, time.perf_counter()))

    def _from_peers(self, step: int, record: RankRecord) -> tuple[np.ndarray, float, float]:
        """This rank's blob of ``step`` from any k checksum-valid shards on peers, decoded, with
        the moments (perf_counter) the fetch and the decode ended."""
        # map the output buffer's pages while the shards are in flight
        buffer = self._background.submit(self._allocate, record.shard_size * record.data_shards)
        read = rebuild_from_peers(
            self.stores, record, job=self.job, step=step, rank=self.rank, buffer=buffer, timeout_s=self._timeout_s()
        )
        self.restored_bytes = read.fetched_bytes
        return read.blob, read.fetched_at, read.decoded_at

    def read_planned(self) -> prefetch.Planned | None:
        """This rank's blob of the step its attempt's plan restores from memory, read from peers
        ahead of ``restore`` (``ray_ckpt.prefetch``): (step, this rank's record of it, blob), or
        None when the plan restores no step from memory at this world size or this node holds
        the rank's local copy (read by the restore itself, without the network). Asks for the
        plan as ``restore`` does (the same, decided once per attempt) and changes nothing else."""
        answer = self._plan()
        plan = answer.plan
        if plan.source != "peers" or plan.step is None or int(plan.world_size or 0) != self.world_size:
            return None
        located = answer.records.get(self.rank) or self.registry.locate_rank(self.job, plan.step, self.rank)
        record = self._record(located, plan.step)
        if record.local is not None and record.local_node == self.node_id:
            return None
        blob, _, _ = self._from_peers(plan.step, record)
        return plan.step, record, blob

    def _resharded(self, step: int, into: Any, t0: float) -> Restored:
        """This rank's new shards of ``step`` (saved at another world size or sharding), read as byte
        ranges from every old rank's checkpoint and copied into ``into``."""
        by_rank = self.range_readers(step)
        t1 = time.perf_counter()
        readers = [by_rank[r] for r in sorted(by_rank)]
        result = reshard.restore_into(reshard.read_old_ranks(readers), into, rank=self.rank)
        self.restored_bytes = sum(reader.fetched_bytes for reader in readers)
        t2 = time.perf_counter()
        logger.info(
            "job %r rank %d: step %d resharded from %d ranks, %d bytes read for %d needed",
            self.job,
            self.rank,
            step,
            len(readers),
            self.restored_bytes,
            result.needed_bytes,
        )
        return Restored(
            step,
            result.state,
            "peers",
            _phases(t0, t1, t2, t2, t2),
            from_world_size=len(readers),
            values_by_rank=result.values_by_rank,
        )

    def range_readers(self, step: int) -> dict[int, RangeReader]:
        """A ``RangeReader`` per rank that saved the committed ``step`` (rank -> reader), over the
        stores alive now (looked up once for all): byte ranges of any rank's blob, a lost data
        shard's positions decoded from k others. NoCheckpointError when ``step`` is not committed.
        Plans nothing and joins no attempt: reading a step changes no registry state."""
        records = self.registry.locate(self.job, step)
        live = self.stores.live({node for record in records.values() for node in record.nodes.values()})
        return {
            r: RangeReader(
                self.stores,
                records[r],
                job=self.job,
                step=step,
                rank=r,
                node_id=self.node_id,
                timeout_s=self._timeout_s,
                live_nodes=live,
            )
            for r in sorted(records)
        }

    def _local_copy(self, step: int, record: RankRecord) -> np.ndarray | None:
        """This rank's local copy, if it lives on this node and is intact: from this process's
        own save buffer where it still holds the step (``copies.own_copies``), else from the node's store."""
        if record.local is None or record.local_node != self.node_id:
            return None
        held = self.copies.own_copies.take(self.job, self.rank, step, record.local.writer)
        if held is not None and held.size == record.local.shard_size and verify(record.local, held):
            return held
        if not self.stores.live([self.node_id]):
            return None
        try:
            address = ShardAddress.local_copy(self.job, step, self.rank, writer=record.local.writer)
            asked = self.stores.get(self.node_id, address)
            found = asked.result(timeout=self._timeout_s())
        except Exception:  # an unreachable or failing store: fetch from peers instead
            return None
        if found is None or check_shard(found, record.local) is not None:  # a malformed answer raised above
            return None
        data = found.data
        return data if data.flags.writeable else np.array(data, copy=True)  # tensors view it: writable, owned

    def _from_backup(self, plan: RestorePlan, t0: float) -> Restored | None:
        proposal = None
        if self.backup is not None:
            complete = self.backup.complete_steps(self.job)
            proposal = complete[-1] if complete else None
        step = self.registry.settle_backup_step(self.job, self.attempt, proposal)
        if step is None or self.backup is None:
            if not plan.ever_committed:
                return None
            raise self.unrebuildable(plan.newest_committed)
        saved = self.backup.saved_world_size(self.job, step)
        if saved is not None:
            self.check_world_size(saved, step)
        t1 = time.perf_counter()
        data = self.backup.read(self.job, step, self.rank)
        self.restored_bytes = data.size
        t2 = time.perf_counter()
        state = load(data)
        self.registry.rollback(self.job, step)
        logger.warning(
            "job %r rank %d: restored backup step %d (peer memory could not serve)", self.job, self.rank, step
        )
        return Restored(step, state, "backup", _phases(t0, t1, t2, t2, time.perf_counter()))

    def unrebuildable(self, step: int | None) -> InsufficientShardsError:
        """The error for a committed ``step`` that no rank can restore from memory or backup,
        naming the ranks whose shards are gone and this rank's lost shards."""
        lost_by_rank: dict[int, list[int]] = {}
        needed = 0
        if step is not None:
            for rank, record in sorted(self.registry.locate(self.job, step).items()):
                live = self.stores.live(set(record.nodes.values()))
                needed = record.data_shards
                lost = sorted(i for i, n in record.nodes.items() if n not in live)
                if len(record.nodes) - len(lost) < needed:
                    lost_by_rank[rank] = lost
        mine = lost_by_rank.get(self.rank, [])
        return InsufficientShardsError(
            f"job {self.job!r} rank {self.rank} step {step}: the committed step cannot be rebuilt from peer "
            f"memory: ranks {sorted(lost_by_rank)} have fewer than the {needed} shards needed on live nodes "
            f"(lost shard indices by rank: {lost_by_rank}); this rank lost shards {mine}. There is no "
            f"complete backup{'' if self.backup is not None else ' (backup_uri is not set)'}; refusing to start "
            "from scratch",
            job=self.job,
            rank=self.rank,
            step=step,
            lost=mine,
            lost_by_rank=lost_by_rank,
            needed=needed,
        )
