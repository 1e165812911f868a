"""The save pipeline of one rank: snapshot -> encode -> place -> scatter -> stage (-> backup).

``SavePipeline.snapshot`` is the only part the training loop waits for: the state is copied
into a reused host buffer (pinned, with non-blocking device->host copies and an event per
device, when tensors live on a GPU). ``SavePipeline.complete`` runs on the checkpointer's
background thread: it waits for those events, computes the m parity shards on the CPU into reused buffers
(data shards are slices of the buffer), checksums every shard, places the k+m shards on live
stores (doubling up when fewer than k+m are alive, see ray_ckpt.core.placement), puts them (and the
optional local copy), stages the step with the registry (through its node's store, which
batches the stages of the node's ranks into one registry call) and writes the periodic backup.
Collaborators are passed in (registry, stores, backup, and the process's ``OwnCopies``, where a
staged step's blob is noted for a rollback in this process), as for the restore path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import numpy as np
import torch

from ray_ckpt import settings
from ray_ckpt.backup import Backup
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.core import blob, hostmem, snapshot, workpool
from ray_ckpt.core.checksum import checksum, combined
from ray_ckpt.core.codec import ReedSolomon
from ray_ckpt.core.identity import RankIdentity, WithIdentity
from ray_ckpt.core.placement import place
from ray_ckpt.core.protection import cluster_margin, rank_protection
from ray_ckpt.core.shard import ShardMeta
from ray_ckpt.core.wire import StageRequest
from ray_ckpt.errors import RayCkptError, StoreUnavailableError, unwrap_remote
from ray_ckpt.own_copies import OwnCopies
from ray_ckpt.transport import metrics

if TYPE_CHECKING:
    from ray_ckpt.transport.registry_client import RegistryClient
    from ray_ckpt.transport.store_directory import StoreDirectory

logger = logging.getLogger(__name__)


class SaveOrigin(TypedDict):
    """What every shard's metadata of one save names, alike for its k+m shards and its local
    copy: the job, step and rank, the world size, the worker group's attempt and the writer."""

    job: str
    step: int
    rank: int
    world_size: int
    attempt: str
    writer: str


def shard_metas(
    shards: list[np.ndarray],
    payload_size: int,
    *,
    data_shards: int,
    **origin: Unpack[SaveOrigin],
) -> list[ShardMeta]:
    """The metadata of one save's k+m shards (index order), with their checksums."""
    return [
        ShardMeta(
            **origin,
            index=i,
            data_shards=data_shards,
            parity_shards=len(shards) - data_shards,
            payload_size=payload_size,
            shard_size=shard.size,
            checksum=checksum(shard),
        )
        for i, shard in enumerate(shards)
    ]


def local_copy_meta(
    body: np.ndarray,
    data_metas: Sequence[ShardMeta],
    **origin: Unpack[SaveOrigin],
) -> ShardMeta:
    """The metadata of a rank's full local copy of a save: one "shard" of a k=1, m=0 code. Its
    checksum combines the checksums of the save's data shards ``data_metas`` (slices of the
    same buffer, ``checksum.of_parts``), so the state is not hashed a second time."""
    digests = [m.checksum for m in data_metas]
    return ShardMeta(
        **origin,
        index=0,
        data_shards=1,
        parity_shards=0,
        payload_size=body.size,
        shard_size=body.size,
        checksum=combined(digests),
        checksum_parts=len(digests),
    )


def record_copies(tensors: Iterable[torch.Tensor], cuda: Any = torch.cuda) -> list[Any]:
    """One CUDA event per device that holds one of ``tensors``, recorded on that device's
    current stream: ``snapshot.write_payload`` queues a device tensor's copy to the host there,
    so once every event completed every copy landed (an event on the current device's stream
    alone says nothing of the copies queued on another device's stream). Empty when no tensor
    is on a GPU. Later work on those streams runs after the copies; work the caller queues on
    other streams is the caller's to order (``cuda``: the ``torch.cuda`` module, or a fake)."""
    devices = sorted({tensor.device.index or 0 for tensor in tensors if tensor.is_cuda})
    events = []
    for device in devices:
        event = cuda.Event()
        event.record(cuda.current_stream(device))
        events.append(event)
    return events


class SaveHandle:
    """The future of one ``save``: ``staged()`` once this rank's shards are stored and staged,
    ``wait()`` once every rank staged the step (it committed). ``skipped`` is True when the
    step was not saved; ``skip_reason`` then says why: "busy" (the previous save was still
    running, under ``on_busy="skip"``) or "not due" (``CheckpointConfig.every``
    does not save this step). ``staged`` and ``wait`` of a skipped handle return at once."""

    def __init__(
        self,
        step: int,
        staged: Future[bool] | None,
        wait_committed: Callable[[int, float], None],
        commit_timeout_s: float,
        *,
        skip_reason: str | None = None,
    ) -> None:
        self.step = step
        self.skipped = staged is None
        self.skip_reason = skip_reason if staged is None else None
        self._staged = staged
        self._wait_committed = wait_committed
        self._commit_timeout_s = commit_timeout_s

    def staged(self, timeout_s: float | None = None) -> None:
        """Block until this rank's part is stored and staged; re-raises a background error."""
        if self._staged is not None:
            self._staged.result(timeout=timeout_s)

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the step (or a newer one) committed on all ranks. TornStepError at once
        when it never can (ranks that did not save it went on); CommitTimeoutError after the
        timeout. Both name the missing ranks."""
        if self._staged is None:
            return
        timeout = self._commit_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        if self._staged.result(timeout=timeout):
            return
        self._wait_committed(self.step, max(0.0, deadline - time.monotonic()))


class SavePipeline(WithIdentity):
    """Buffers and steps of the saves of the rank ``identity`` names (its fields read as
    attributes: ``job``, ``rank``, ...). ``record(kind, **fields)`` sends an event.
    ``own_copies``: where the blob of each step staged with a local copy is noted while the
    buffer holds it (the process's, ``ProcessCopies.own_copies``).
    ``last_protection``: node losses the last placement survives. ``avoid``: nodes whose stores
    get no shards while other stores run (the caller's: nodes Ray drains). Not thread-safe: the
    checkpointer calls ``snapshot`` on the caller's thread and ``complete`` on its one
    background thread, never two of either at once."""

    def __init__(
        self,
        *,
        identity: RankIdentity,
        writer: str,
        config: CheckpointConfig,
        registry: RegistryClient,
        stores: StoreDirectory,
        backup: Backup | None,
        own_copies: OwnCopies,
        record: Callable[..., None],
    ) -> None:
        self.identity = identity
        self.writer = writer
        self.config = config
        self.code = ReedSolomon(config.data_shards, config.parity_shards)
        self.registry, self.stores, self.backup, self._record = registry, stores, backup, record
        self.own_copies = own_copies
        self._buffer: torch.Tensor = torch.empty(0, dtype=torch.uint8)
        self._reserved: Future[np.ndarray] | None = None  # a buffer mapped ahead (``reserve``)
        self._parity: list[np.ndarray] = []
        self._placement_checked = False
        self._degraded = False
        self._completed = 0  # saves completed since creation or the last restore
        self.last_protection: int | None = None
        self.avoid: frozenset[str] = frozenset()  # nodes that take no new shards while others can (they drain)

    def check_placement(self) -> None:
        """Once, at the first save: PlacementError if no store runs; rank 0 says how many node
        losses the cluster absorbs before a step's protection drops below parity_shards."""
        if self._placement_checked:
            return
        nodes = self.stores.storage_nodes(self.config.failure_domain_label)
        place(nodes, shards=self.config.total_shards, rank=self.rank, rank_node_id=self.node_id)
        self._placement_checked = True
        if self.rank == 0:
            k, m = self.config.data_shards, self.config.parity_shards
            spare, now = cluster_margin(len(nodes), k, m)
            logger.log(
                logging.WARNING if spare == 0 else logging.INFO,
                "job %r, RS(%d,%d) on %d store node(s): a step survives %d node loss(es); the cluster can lose %d "
                "node(s) before that drops%s",
                self.job,
                k,
                m,
                len(nodes),
                now,
                spare,
                "" if spare else f" (add nodes beyond {k + m} for spares)",
            )

    def reserve(self, blob_size: int) -> None:
        """Map the host buffer of a ``blob_size``-byte blob (padded or not) on a background
        thread for the next snapshot, unless the buffer is that large already: after a restore
        of that many bytes (the state saved next is as large), so that an incarnation's first
        save copies into mapped pages instead of mapping them while the training loop waits. A
        state on a GPU still maps pinned memory at its first save."""
        nbytes = self.code.shard_size(blob_size) * self.code.data_shards
        if self._buffer.numel() < nbytes and self._reserved is None:
            self._reserved = workpool.pool().submit(hostmem.allocate, nbytes)

    def _take_reserved(self) -> np.ndarray | None:
        """The buffer ``reserve`` mapped, once it is (None if none was, or mapping failed: the
        snapshot maps its own)."""
        reserved, self._reserved = self._reserved, None
        if reserved is None or reserved.exception() is not None:
            return None
        return reserved.result()

    def snapshot(self, layout: snapshot.SnapshotLayout) -> tuple[np.ndarray, int, list[Any]]:
        """Copy the state into the reused host buffer: (buffer of k * shard_size bytes, blob
        size, the CUDA events the copies are done at: ``record_copies``, empty for a state on
        the CPU). Blocks the caller."""
        self.own_copies.forget(self.job, self.rank)  # the buffer's blob of an older step is overwritten below
        size = blob.blob_size(len(layout.header), layout.payload_size)
        padded = self.code.shard_size(size) * self.code.data_shards
        on_gpu = any(t.is_cuda for t in layout.tensors)
        reserved = self._take_reserved()
        if reserved is not None and not on_gpu and reserved.size >= padded > self._buffer.numel():
            self._buffer = torch.from_numpy(reserved)
        if self._buffer.numel() < padded or (on_gpu and not self._buffer.is_pinned()):
            if on_gpu:
                self._buffer = torch.empty(padded, dtype=torch.uint8, pin_memory=True)
            else:
                self._buffer = torch.from_numpy(hostmem.allocate(padded))
        buffer = self._buffer[:padded]
        array = buffer.numpy()
        offset = blob.write_prefix(array, layout.header)
        snapshot.write_payload(layout, buffer[offset:])  # non_blocking device->host when on a GPU
        copied = record_copies(layout.tensors)
        array[size:] = 0
        return array, size, copied

    def restart_counting(self) -> None:
        """The next save is a new incarnation's first: its event is always sent."""
        self._completed = 0

    def complete(
        self, step: int, buffer: np.ndarray, size: int, copied: list[Any], phases: dict[str, float], returned: float
    ) -> bool:
        """Encode, place, scatter, stage and back up one snapshot (once every event in
        ``copied`` completed); True if the step committed."""
        for event in copied:
            event.synchronize()
        t0 = time.perf_counter()
        k, m = self.code.data_shards, self.code.parity_shards
        shard_size = buffer.size // k
        if len(self._parity) != m or (m and self._parity[0].size != shard_size):
            self._parity = [np.empty(shard_size, dtype=np.uint8) for _ in range(m)]
        data = [buffer[i * shard_size : (i + 1) * shard_size] for i in range(k)]
        shards = data + self.code.encode_parity(data, self._parity)
        common = self._common(step)
        metas = shard_metas(shards, size, data_shards=k, **common)
        t1 = time.perf_counter()
        targets, local = self._scatter(shards, metas, buffer[:size], common)
        t2 = time.perf_counter()
        committed = self._stage(
            StageRequest(
                metas=tuple(metas),
                nodes=dict(enumerate(targets)),
                keep_committed=self.config.keep_committed,
                attempt=self.attempt,
                local=local,
                local_node=self.node_id if local is not None else None,
            )
        )
        t3 = time.perf_counter()
        if local is not None:  # a rollback in this process may take the step from the buffer
            self.own_copies.note(self.job, self.rank, step, self.writer, buffer[:size], self)
        phases.update(encode=t1 - t0, scatter=t2 - t1, stage=t3 - t2)
        self._completed += 1
        if self.backup is not None and self.config.backup_every and step % self.config.backup_every == 0:
            self.backup.write(self.job, step, self.rank, self.world_size, buffer[:size])
            metrics.observe_backup(self.job, size, self.node_id)
            if self.rank == 0:
                self.backup.prune(self.job, self.config.backup_keep)
            phases["backup"] = time.perf_counter() - t3
        if self._completed == 1 or self._completed % settings.save_event_every() == 0:
            self._record(
                "save", step=step, phases_s=dict(phases), bytes=size, returned=returned, protection=self.last_protection
            )
        return committed

    def _stage(self, request: StageRequest) -> bool:
        """Stage this rank's step through its own node's store, which forwards the stages of
        the node's ranks to the registry in one batch; straight to the registry when that store
        is gone or fails (a request the registry holds already is acknowledged, not doubled).
        True if the step committed; a refused stage raises its ray_ckpt error."""
        try:
            result = self.stores.stage(self.node_id, request).result(timeout=3 * settings.peer_timeout_s())
        except Exception as error:  # no store here, it died, or it could not reach the registry
            logger.info("rank %d: staging through this node's store failed (%s); staging directly", self.rank, error)
            result = self.registry.stage_batch([request])[0]
        result.raise_error()
        return result.committed

    def _scatter(
        self, shards: list[np.ndarray], metas: list[ShardMeta], body: np.ndarray, common: SaveOrigin
    ) -> tuple[list[str], ShardMeta | None]:
        """Put every shard into the store of its node (and the local copy into this node's
        store). A store that dies or times out meanwhile is left out and the shards are placed
        again on the remaining nodes, once; StoreUnavailableError if that fails too.
        Returns (node of each shard, the local copy's metadata or None)."""
        excluded: set[str] = set()
        for _ in range(2):
            nodes = [
                n for n in self.stores.storage_nodes(self.config.failure_domain_label) if n.node_id not in excluded
            ]
            kept = [n for n in nodes if n.node_id not in self.avoid]
            nodes = kept or nodes  # a draining node's store takes shards only where no other can
            targets = place(
                nodes, shards=len(shards), rank=self.rank, rank_node_id=self.node_id, data_shards=self.code.data_shards
            )
            self._note_protection(targets, len(nodes))
            puts: list[tuple[str, Future[None] | None]] = [
                (node_id, self._put(node_id, meta, shard)) for node_id, meta, shard in zip(targets, metas, shards)
            ]
            local = None
            if self.config.local_copy and self.node_id not in excluded:
                local = local_copy_meta(body, metas[: self.code.data_shards], **common)
                puts.append((self.node_id, self._put(self.node_id, local, body, local=True)))
            failed = set()
            for node_id, future in puts:
                try:
                    if future is None:
                        raise StoreUnavailableError(f"no live store on node {node_id}")
                    future.result(timeout=settings.peer_timeout_s())
                except RayCkptError as error:
                    if not isinstance(error, StoreUnavailableError):
                        raise unwrap_remote(error) from None  # e.g. StoreFullError: the user's decision
                    failed.add(node_id)
                except Exception as error:  # a dead store or a timeout
                    logger.warning("rank %d: store on node %s failed during a save: %s", self.rank, node_id, error)
                    failed.add(node_id)
                    self.stores.forget(node_id)  # look it up again next time (it may be a new store)
            if not failed:
                return targets, local
            if failed == {self.node_id} and local is not None and self.node_id not in targets:
                return targets, None  # only the local copy was lost: the coded shards are in place
            excluded |= failed
        raise StoreUnavailableError(
            f"job {self.job!r} rank {self.rank} step {common['step']}: stores on nodes {sorted(excluded)} "
            "failed during the save, twice; the step is not staged",
            job=self.job,
            rank=self.rank,
            step=common["step"],
        )

    def _put(self, node_id: str, meta: ShardMeta, data: np.ndarray, local: bool = False) -> Future[None] | None:
        """Start a put; None when that node's store is gone already."""
        try:
            return self.stores.put(node_id, meta, data, local)
        except KeyError:
            return None

    def _common(self, step: int) -> SaveOrigin:
        """What every shard's metadata of ``step`` names."""
        return SaveOrigin(
            job=self.job,
            step=step,
            rank=self.rank,
            world_size=self.world_size,
            attempt=self.attempt or "",
            writer=self.writer,
        )

    def _note_protection(self, targets: list[str], stores: int) -> None:
        """Keep the protection of the placement just chosen, warning once when it drops below
        parity_shards (fewer stores than k+m) and once when full spreading is back."""
        self.last_protection = rank_protection(targets, self.code.data_shards)
        degraded = self.last_protection < self.code.parity_shards
        if degraded and not self._degraded:
            logger.warning(
                "job %r rank %d: only %d node(s) run a store for %d shards: shards share nodes and a step "
                "survives %d node loss(es) instead of %d until nodes rejoin (they get stores by themselves)",
                self.job,
                self.rank,
                stores,
                len(targets),
                self.last_protection,
                self.code.parity_shards,
            )
        elif self._degraded and not degraded:
            logger.warning("job %r rank %d: full protection is back (%d stores)", self.job, self.rank, stores)
        self._degraded = degraded

    def release(self, *, keep_for_rollback: bool = False) -> None:
        """Free the buffers; with ``keep_for_rollback`` the blob of the newest staged step
        stays held (``OwnCopies.orphan``) until a restore in this process takes it."""
        if keep_for_rollback:
            self.own_copies.orphan(self)
        else:
            self.own_copies.drop(self)
        self._buffer = torch.empty(0, dtype=torch.uint8)
        self._reserved = None
        self._parity = []
