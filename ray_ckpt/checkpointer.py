"""Checkpointer: one rank's save (snapshot -> encode -> scatter -> stage) and layered restore."""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import ray
import torch

from ray_ckpt import backup, blob, events, hostmem, naming, service, settings, snapshot
from ray_ckpt.checksum import checksum
from ray_ckpt.codec import ReedSolomon
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.errors import (
    CommitTimeoutError,
    ConfigError,
    InsufficientShardsError,
    RayCkptError,
    StoreUnavailableError,
)
from ray_ckpt.placement import place
from ray_ckpt.protection import cluster_margin, rank_protection
from ray_ckpt.shard import ShardMeta

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Restored:
    """A restored checkpoint: the step, the state (CPU tensors), where it came from
    (``"local"``, ``"peers"`` or ``"backup"``) and the restore's phase durations in seconds
    (``locate``, ``fetch``, ``decode``, ``load``)."""

    step: int
    state: Any
    source: str
    phases_s: dict[str, float]


class SaveHandle:
    """The future of one ``save``: ``staged()`` once this rank's shards are stored and staged,
    ``wait()`` once every rank staged the step (it committed). ``skipped`` is True when the
    save was dropped because the previous one was still running (``on_busy="skip"``)."""

    def __init__(self, checkpointer: Checkpointer, step: int, staged: Future[bool] | None) -> None:
        self.step = step
        self.skipped = staged is None
        self._checkpointer = checkpointer
        self._staged = staged

    def staged(self, timeout_s: float | None = None) -> None:
        """Block until this rank's part is stored and staged; re-raises a background error."""
        if self._staged is not None:
            self._staged.result(timeout=timeout_s)

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the step committed on all ranks; CommitTimeoutError names missing ranks."""
        if self._staged is None:
            return
        timeout = self._checkpointer.config.commit_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        if self._staged.result(timeout=timeout):
            return
        self._checkpointer._wait_committed(self.step, max(0.0, deadline - time.monotonic()))


class Checkpointer:
    """Saves and restores one rank's state through the ray_ckpt service.

    ``save`` blocks only while the state is copied into a host buffer it reuses (pinned, with
    asynchronous device->host copies, when tensors live on a GPU); encoding, scattering the
    shards to peer stores, the local copy, staging and backups run on a background thread. At
    most one save is in flight: the next ``save`` waits for the previous one (recorded in
    ``last_save_phases_s["wait_previous"]``), or is skipped with ``on_busy="skip"``. A
    background failure is re-raised by the next ``save``, ``wait`` or ``close``.

    ``attempt`` names the incarnation of the job (one worker group): all ranks of one
    incarnation must pass the same value, and a new incarnation must pass a new one
    (``ray_ckpt.train.Checkpointer`` does this). Steps staged but not committed by an earlier
    incarnation are then discarded instead of being completed by the new one.
    Not thread-safe: one caller.
    """

    def __init__(
        self,
        *,
        job: str,
        rank: int,
        world_size: int,
        config: CheckpointConfig | None = None,
        namespace: str | None = None,
        attempt: str | None = None,
    ) -> None:
        if not isinstance(job, str) or not job or "/" in job:
            raise ConfigError(f"job must be a non-empty str without '/', got {job!r}")
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ConfigError(f"world_size must be an int >= 1, got {world_size!r}")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
            raise ConfigError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
        if config is not None and not isinstance(config, CheckpointConfig):
            raise ConfigError(f"config must be a ray_ckpt.CheckpointConfig, got {type(config).__name__}")
        if not ray.is_initialized():
            raise StoreUnavailableError("Ray is not initialized: call ray.init() and ray_ckpt.start() first")
        self.job = job
        self.rank = rank
        self.world_size = world_size
        self.attempt = attempt
        self.config = config or CheckpointConfig()
        if self.config.backup_every and not self.config.backup_uri:
            raise ConfigError(
                f"backup_every={self.config.backup_every} needs a backup_uri (a path or pyarrow.fs URI) "
                "in CheckpointConfig; ray_ckpt.train.Checkpointer fills it in from the run's storage path"
            )
        self.namespace = namespace or settings.namespace()
        self.code = ReedSolomon(self.config.data_shards, self.config.parity_shards)
        self.node_id = ray.get_runtime_context().get_node_id()
        try:
            self._registry = naming.registry_handle(self.namespace)
        except ValueError:
            raise StoreUnavailableError(
                f"no ray_ckpt registry in namespace {self.namespace!r}: call ray_ckpt.start() on the cluster first"
            ) from None
        self._background = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ray_ckpt-save-{rank}")
        self._in_flight: Future[bool] | None = None
        self._buffer: torch.Tensor = torch.empty(0, dtype=torch.uint8)
        self._parity: list[np.ndarray] = []
        self._last_step: int | None = None
        self._saves = 0
        self._placement_checked = False
        self._degraded = False
        self.last_protection: int | None = None  # node losses the last placement survives
        self._stores: dict[str, Any] = {}  # node id -> store handle (see _store_handles)
        self._restored_bytes = 0
        self._created = time.time()  # for the timeline: this rank's worker is running
        self._closed = False
        self.last_save_phases_s: dict[str, float] = {}

    # ---- save ---------------------------------------------------------------------------

    def save(self, step: int, state: Any) -> SaveHandle:
        """Checkpoint ``state`` as ``step`` (steps must increase). Returns once the state is
        copied; see SaveHandle for completion. Raises the previous save's background error, and
        on this Checkpointer's first save PlacementError when fewer nodes run a store than
        ``data_shards + parity_shards`` (nothing is saved then)."""
        self._check_open()
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"step must be an int >= 0, got {step!r}")
        if self._last_step is not None and step <= self._last_step:
            raise ConfigError(f"step {step} is not newer than the last saved step {self._last_step}")
        started = time.perf_counter()
        layout = snapshot.plan(state)  # validates before anything is waited for or touched
        if not self._placement_checked:  # no store at all: an error at the call
            self._check_placement()
        if self.config.on_busy == "skip" and self._in_flight is not None and not self._in_flight.done():
            self.last_save_phases_s = {"blocking": time.perf_counter() - started, "skipped": 1.0}
            return SaveHandle(self, step, None)
        self._finish_in_flight()
        copy_start = time.perf_counter()
        size = blob.blob_size(len(layout.header), layout.payload_size)
        padded = self.code.shard_size(size) * self.code.data_shards
        on_gpu = any(t.is_cuda for t in layout.tensors)
        if self._buffer.numel() < padded or (on_gpu and not self._buffer.is_pinned()):
            if on_gpu:
                self._buffer = torch.empty(padded, dtype=torch.uint8, pin_memory=True)
            else:
                self._buffer = torch.from_numpy(hostmem.allocate(padded))
        buffer = self._buffer[:padded]
        array = buffer.numpy()
        offset = blob.write_prefix(array, layout.header)
        snapshot.write_payload(layout, buffer[offset:])  # non_blocking device->host when on a GPU
        copied = None
        if on_gpu:
            copied = torch.cuda.Event()
            copied.record()  # later kernels on this stream run after the copies: no race
        array[size:] = 0
        self._last_step = step
        phases = {"wait_previous": copy_start - started, "snapshot": time.perf_counter() - copy_start}
        phases["blocking"] = time.perf_counter() - started
        self.last_save_phases_s = phases
        returned = time.time()  # training goes on from here; the event says so after the commit
        future = self._background.submit(self._encode_scatter_stage, step, array, size, copied, phases, returned)
        self._in_flight = future
        return SaveHandle(self, step, future)

    def _check_placement(self) -> None:
        """At the first save: PlacementError if no store runs; rank 0 says how many node losses
        the cluster absorbs before a step's protection drops below parity_shards."""
        nodes = service.storage_nodes(self.namespace, self.config.failure_domain_label)
        place(nodes, shards=self.config.total_shards, rank=self.rank, rank_node_id=self.node_id)
        self._placement_checked = True
        if self.rank == 0:
            k, m = self.config.data_shards, self.config.parity_shards
            spare, now = cluster_margin(len(nodes), k, m)
            level = logging.WARNING if spare == 0 else logging.INFO
            logger.log(
                level,
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

    def _finish_in_flight(self) -> None:
        if self._in_flight is not None:
            future, self._in_flight = self._in_flight, None
            future.result()  # re-raises a background failure

    def _encode_scatter_stage(
        self, step: int, buffer: np.ndarray, size: int, copied: Any, phases: dict[str, float], returned: float
    ) -> bool:
        if copied is not None:
            copied.synchronize()
        t0 = time.perf_counter()
        k, m = self.code.data_shards, self.code.parity_shards
        shard_size = buffer.size // k
        if len(self._parity) != m or (m and self._parity[0].size != shard_size):
            self._parity = [np.empty(shard_size, dtype=np.uint8) for _ in range(m)]
        data = [buffer[i * shard_size : (i + 1) * shard_size] for i in range(k)]
        shards = data + self.code.encode_parity(data, self._parity)
        common: dict[str, Any] = {"job": self.job, "step": step, "rank": self.rank, "world_size": self.world_size}
        metas = [
            ShardMeta(
                **common,
                index=i,
                data_shards=k,
                parity_shards=m,
                payload_size=size,
                shard_size=shard_size,
                checksum=checksum(shard),
            )
            for i, shard in enumerate(shards)
        ]
        t1 = time.perf_counter()
        targets, local = self._scatter(shards, metas, buffer[:size], common)
        t2 = time.perf_counter()
        committed = self._ask_registry(
            "stage",
            [meta.to_dict() for meta in metas],
            dict(enumerate(targets)),
            self.config.keep_committed,
            self.attempt,
            None if local is None else local.to_dict(),
            self.node_id if local is not None else None,
        )
        t3 = time.perf_counter()
        phases.update(encode=t1 - t0, scatter=t2 - t1, stage=t3 - t2)
        self._saves += 1
        if self.config.backup_uri and self.config.backup_every and step % self.config.backup_every == 0:
            backup.write(self.config.backup_uri, self.job, step, self.rank, self.world_size, buffer[:size])
            if self.rank == 0:
                backup.prune(self.config.backup_uri, self.job, self.config.backup_keep)
            phases["backup"] = time.perf_counter() - t3
        if self._saves == 1 or self._saves % settings.save_event_every() == 0:
            self._record(
                "save", step=step, phases_s=dict(phases), bytes=size, returned=returned, protection=self.last_protection
            )
        return bool(committed)

    def _ask_registry(self, method: str, *args: Any) -> Any:
        """Call the registry, riding out a restart: Ray restarts a dead registry, which then
        rebuilds its view from the stores (every call here is idempotent). StoreUnavailableError
        if it does not answer within RAY_CKPT_PEER_TIMEOUT_S."""
        deadline = time.monotonic() + settings.peer_timeout_s()
        while True:
            remaining = deadline - time.monotonic()
            try:
                return ray.get(getattr(self._registry, method).remote(*args), timeout=max(0.1, remaining))
            except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError) as error:
                if time.monotonic() >= deadline:
                    raise StoreUnavailableError(
                        f"the ray_ckpt registry did not answer {method} within {settings.peer_timeout_s():.0f}s "
                        f"({type(error).__name__}); raise RAY_CKPT_PEER_TIMEOUT_S if it is only slow",
                        method=method,
                    ) from None
                time.sleep(0.2)
            except ray.exceptions.ActorDiedError:
                raise StoreUnavailableError(
                    f"the ray_ckpt registry is gone ({method}); run ray_ckpt.start() again to recreate it "
                    "(it rebuilds its view from the stores)",
                    method=method,
                ) from None

    def _record(self, kind: str, **fields: Any) -> None:
        """Send an event to the registry's log (fire and forget: never blocks or fails a save)."""
        try:
            self._registry.record.remote(
                events.event(kind, job=self.job, rank=self.rank, attempt=self.attempt, node_id=self.node_id, **fields)
            )
        except Exception as error:  # observability must not break checkpointing
            logger.debug("could not record a %s event: %s", kind, error)

    def _scatter(
        self, shards: list[np.ndarray], metas: list[ShardMeta], body: np.ndarray, common: dict[str, Any]
    ) -> tuple[list[str], ShardMeta | None]:
        """Put every shard into the store of its node (and the local copy into this node's
        store). A store that dies or times out meanwhile is left out and the shards are placed
        again on the remaining nodes, once; StoreUnavailableError if that fails too.
        Returns (node of each shard, the local copy's metadata or None)."""
        excluded: set[str] = set()
        for _ in range(2):
            nodes = [
                n
                for n in service.storage_nodes(self.namespace, self.config.failure_domain_label)
                if n.node_id not in excluded
            ]
            targets = place(
                nodes, shards=len(shards), rank=self.rank, rank_node_id=self.node_id, data_shards=self.code.data_shards
            )
            self._note_protection(targets, len(nodes))
            wanted = [*targets, self.node_id] if self.config.local_copy else targets
            stores = self._store_handles(set(wanted) - excluded)
            refs = {
                stores[node_id].put.remote(meta.to_dict(), ray.put(shard)): node_id
                for node_id, meta, shard in zip(targets, metas, shards)
            }
            local = None
            if self.config.local_copy and self.node_id in stores:
                local = ShardMeta(
                    **{**common, "index": 0, "data_shards": 1, "parity_shards": 0},
                    payload_size=body.size,
                    shard_size=body.size,
                    checksum=checksum(body),
                )
                refs[stores[self.node_id].put.remote(local.to_dict(), ray.put(body), True)] = self.node_id
            failed = set()
            for ref, node_id in refs.items():
                try:
                    ray.get(ref, timeout=settings.peer_timeout_s())
                except RayCkptError:
                    raise  # e.g. StoreFullError: a decision for the user, not a dead peer
                except (ray.exceptions.RayError, TimeoutError) as error:
                    logger.warning("rank %d: store on node %s failed during a save: %s", self.rank, node_id, error)
                    failed.add(node_id)
                    self._stores.pop(node_id, None)  # look it up again next time (it may be a new store)
            if not failed:
                return targets, local
            if failed == {self.node_id} and local is not None:
                return targets, None  # only the local copy was lost: the coded shards are in place
            excluded |= failed
        raise StoreUnavailableError(
            f"job {self.job!r} rank {self.rank} step {common['step']}: stores on nodes {sorted(excluded)} "
            "failed during the save, twice; the step is not staged",
            job=self.job,
            rank=self.rank,
            step=common["step"],
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

    def _store_handles(self, node_ids: set[str]) -> dict[str, Any]:
        """Handles of these nodes' stores, resolved once per Checkpointer (a save looks up only
        the stores it has not used before, not every node of the cluster)."""
        missing = sorted(node_ids - set(self._stores))
        if missing:
            self._stores.update(naming.store_handles(self.namespace, missing))
        return {n: self._stores[n] for n in node_ids if n in self._stores}

    def _wait_committed(self, step: int, timeout_s: float) -> None:
        if ray.get(
            self._registry.wait_committed.remote(self.job, step, timeout_s),
            timeout=timeout_s + settings.peer_timeout_s(),
        ):
            return
        staged = self._ask_registry("staged_ranks", self.job, step)
        missing = sorted(set(range(self.world_size)) - set(staged))
        raise CommitTimeoutError(
            f"job {self.job!r} step {step} did not commit within {timeout_s:.1f}s: still waiting for "
            f"ranks {missing} to stage it (raise CheckpointConfig.commit_timeout_s if they are slow)",
            job=self.job,
            step=step,
            missing_ranks=missing,
        )

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait until the last save committed (re-raising a background failure)."""
        self._check_open()
        if self._in_flight is not None and self._last_step is not None:
            SaveHandle(self, self._last_step, self._in_flight).wait(timeout_s)

    # ---- restore ------------------------------------------------------------------------

    def latest_step(self) -> int | None:
        """The newest step committed by all ranks of this job, or None if none is."""
        latest = self._ask_registry("latest_committed", self.job)
        return None if latest is None else int(latest)

    def restore(self, step: int | None = None) -> Restored | None:
        """Rebuild this rank's state of the newest step every rank can restore (or of ``step``),
        from its local copy on this node, else any k checksum-valid shards on live peers, else
        the newest complete persistent backup. All ranks of one attempt get the same step.

        Returns None only when the job never committed a step and has no backup. Raises
        ConfigError, the same on every rank, when the step was saved at another world size
        (nothing is lost: it stays restorable at that size); InsufficientShardsError when a
        committed step can no longer be rebuilt and no backup exists. A failed restore is
        recorded as a failed recovery (a ``restore`` event with ``error``)."""
        try:
            restored, plan = self._restore(step)
        except Exception as error:
            self._record(
                "restore",
                step=None,
                source=None,
                error=f"{type(error).__name__}: {error}",
                started=self._created,
                phases_s={},
            )
            raise
        self._saves = 0  # the next save is this incarnation's first step: always recorded
        newest = plan.get("newest_staged")
        self._record(
            "restore",
            step=None if restored is None else restored.step,
            source=None if restored is None else restored.source,
            steps_lost=None if restored is None or newest is None else max(0, int(newest) - restored.step),
            bytes=self._restored_bytes,
            started=self._created,
            phases_s={} if restored is None else restored.phases_s,
        )
        return restored

    def _restore(self, step: int | None) -> tuple[Restored | None, dict[str, Any]]:
        """``restore`` without its event. With ``step=None`` the registry decides the step once
        per attempt (the newest committed step that every rank can still rebuild from memory,
        else the newest complete backup), so every rank restores the same one."""
        self._check_open()
        t0 = time.perf_counter()
        self._restored_bytes = 0
        if step is not None:
            record = self._locate(step)
            return self._restore_from_memory(step, record, t0), {}
        plan = self._ask_registry("plan_restore", self.job, self.attempt)
        if plan["source"] == "peers":
            chosen = int(plan["step"])
            self._check_world_size(int(plan["world_size"]), chosen)
            try:
                restored = self._restore_from_memory(chosen, self._locate(chosen), t0)
                if plan.get("newest_committed") is not None and chosen < int(plan["newest_committed"]):
                    # an older kept step: forget the newer, unrebuildable ones so training can
                    # save those step numbers again
                    self._ask_registry("rollback", self.job, chosen)
                return restored, plan
            except InsufficientShardsError:
                # this rank cannot rebuild the step every rank agreed on: make sure no later
                # plan picks it, then fail this attempt so all ranks restart and agree anew
                self._ask_registry("mark_unrestorable", self.job, chosen)
                raise
        return self._restore_from_backup(plan, t0), plan

    def _locate(self, step: int) -> dict[str, Any]:
        located = self._ask_registry("locate", self.job, step)
        self._check_world_size(len(located), step)
        return dict(located[self.rank])

    def _check_world_size(self, saved: int, step: int) -> None:
        """The same ConfigError on every rank when ``step`` was saved by another number of
        ranks: per-rank state cannot be resharded, and restoring it silently would be wrong."""
        if saved != self.world_size:
            raise ConfigError(
                f"job {self.job!r} step {step} was saved by {saved} rank(s), but this run has world size "
                f"{self.world_size}: per-rank state cannot be restored into another world size. Restore at "
                f"world size {saved}, start under a new job name, or drop this job's checkpoints "
                f"(`ray-ckpt drop {self.job}` or ray_ckpt.drop({self.job!r})); the step stays restorable at "
                f"world size {saved} until then",
                job=self.job,
                step=step,
                saved_world_size=saved,
                world_size=self.world_size,
            )

    def _restore_from_memory(self, step: int, record: dict[str, Any], t0: float) -> Restored:
        t1 = time.perf_counter()
        local = self._fetch_local(step, record)
        if local is not None:
            t2 = time.perf_counter()
            state = self._load(local)
            return Restored(step, state, "local", self._phases(t0, t1, t2, t2, time.perf_counter()))
        metas = {int(i): ShardMeta.from_dict(m) for i, m in record["metas"].items()}
        nodes = {int(i): n for i, n in record["nodes"].items()}
        first = next(iter(metas.values()))
        # map the output buffer's pages while the shards are in flight
        buffer_future = self._background.submit(hostmem.allocate, first.shard_size * first.data_shards)
        shards, lost = self._fetch(step, metas, nodes, buffer_future)
        buffer = buffer_future.result()
        self._restored_bytes = first.shard_size * len(shards)
        t2 = time.perf_counter()
        code = ReedSolomon(first.data_shards, first.parity_shards)
        code.decode_into(shards, buffer)
        t3 = time.perf_counter()
        state = self._load(buffer[: first.payload_size])
        if lost:
            logger.warning("rank %d step %d: rebuilt without shards %s", self.rank, step, sorted(lost))
        return Restored(step, state, "peers", self._phases(t0, t1, t2, t3, time.perf_counter()))

    @staticmethod
    def _phases(t0: float, t1: float, t2: float, t3: float, t4: float) -> dict[str, float]:
        return {"locate": t1 - t0, "fetch": t2 - t1, "decode": t3 - t2, "load": t4 - t3}

    @staticmethod
    def _load(data: np.ndarray) -> Any:
        header, payload = blob.split(data)
        return snapshot.restore(header, payload, copy=False)

    def _fetch_local(self, step: int, record: dict[str, Any]) -> np.ndarray | None:
        """This rank's local copy, if it lives on this node and is intact."""
        if record.get("local") is None or record.get("local_node") != self.node_id:
            return None
        store = naming.store_handles(self.namespace, [self.node_id]).get(self.node_id)
        if store is None:
            return None
        try:
            found = ray.get(store.get.remote(self.job, step, self.rank, 0, True), timeout=settings.peer_timeout_s())
        except (ray.exceptions.RayError, RayCkptError):
            return None
        if self._check_shard(found, ShardMeta.from_dict(record["local"])) is not None:
            return None
        return np.array(found[1], copy=True)  # writable, owned: tensors are views into it

    def _fetch(
        self, step: int, metas: dict[int, ShardMeta], nodes: dict[int, str], buffer: Future[np.ndarray]
    ) -> tuple[dict[int, np.ndarray], dict[int, str]]:
        """Any k checksum-valid shards, fetched in parallel; data shards first (no decode work).
        A dead store, a missing shard or a bad checksum is an erasure: the next candidate is
        fetched instead. Valid data shards are copied into their place in the output buffer
        (``buffer``'s result) as they arrive, overlapping the copy with the other transfers. Returns (shards by index,
        lost index -> reason)."""
        k = next(iter(metas.values())).data_shards
        shard_size = next(iter(metas.values())).shard_size
        stores = naming.store_handles(self.namespace, sorted(set(nodes.values())))
        lost: dict[int, str] = {}
        candidates = []
        for index in sorted(metas):
            if nodes[index] in stores:
                candidates.append(index)
            else:
                lost[index] = f"node {nodes[index]} is dead or has no store"
        pending: dict[Any, int] = {}
        valid: dict[int, np.ndarray] = {}
        deadline = time.monotonic() + settings.peer_timeout_s()

        def launch() -> None:
            while candidates and len(valid) + len(pending) < k:
                index = candidates.pop(0)
                pending[stores[nodes[index]].get.remote(self.job, step, self.rank, index)] = index

        launch()
        while pending and len(valid) < k:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not done:
                for ref, index in pending.items():
                    lost[index] = "store did not answer in time"
                    ray.cancel(ref, force=False)
                pending.clear()
                break
            index = pending.pop(done[0])
            try:
                found = ray.get(done[0])
            except (ray.exceptions.RayError, RayCkptError) as error:
                lost[index] = f"store failed: {type(error).__name__}"
            else:
                reason = self._check_shard(found, metas[index])
                if reason is None:
                    if index < k:
                        slot = buffer.result()[index * shard_size : (index + 1) * shard_size]
                        np.copyto(slot, found[1])
                        valid[index] = slot
                    else:
                        valid[index] = found[1]
                else:
                    lost[index] = reason
            launch()
        if len(valid) < k:
            raise InsufficientShardsError(
                f"job {self.job!r} rank {self.rank} step {step}: only {len(valid)} of the {k} shards "
                f"needed survive; lost shards {dict(sorted(lost.items()))}. More than parity_shards="
                f"{len(metas) - k} shards are gone, so this step cannot be rebuilt from memory",
                job=self.job,
                rank=self.rank,
                step=step,
                lost=sorted(lost),
                needed=k,
                available=len(valid),
            )
        return valid, lost

    @staticmethod
    def _check_shard(found: Any, expected: ShardMeta) -> str | None:
        """Why a fetched shard is unusable, or None if it matches its registered metadata."""
        if found is None:
            return "store no longer holds it"
        meta_dict, data = found
        try:
            meta = ShardMeta.from_dict(meta_dict)
        except RayCkptError:
            return "malformed metadata"
        if meta != expected:
            return "metadata differs from the registry's"
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.size != expected.shard_size:
            return "wrong size"
        if checksum(data) != expected.checksum:
            return "checksum mismatch (corrupted bytes)"
        return None

    def _restore_from_backup(self, plan: dict[str, Any], t0: float) -> Restored | None:
        uri = self.config.backup_uri
        proposal = None
        if uri:
            complete = backup.complete_steps(uri, self.job)
            proposal = complete[-1] if complete else None
        step = self._ask_registry("settle_backup_step", self.job, self.attempt, proposal)
        if step is None or uri is None:
            if not plan["ever_committed"]:
                return None
            raise self._unrebuildable(plan.get("newest_committed"), uri)
        saved = backup.saved_world_size(uri, self.job, step)
        if saved is not None:
            self._check_world_size(saved, step)
        t1 = time.perf_counter()
        data = backup.read(uri, self.job, step, self.rank)
        self._restored_bytes = data.size
        t2 = time.perf_counter()
        state = self._load(data)
        self._ask_registry("rollback", self.job, step)
        logger.warning(
            "job %r rank %d: restored backup step %d (peer memory could not serve)", self.job, self.rank, step
        )
        return Restored(step, state, "backup", self._phases(t0, t1, t2, t2, time.perf_counter()))

    def _unrebuildable(self, step: int | None, uri: str | None) -> InsufficientShardsError:
        """The error for a committed ``step`` that no rank can restore from memory or backup,
        naming the ranks whose shards are gone and this rank's lost shards."""
        lost_by_rank: dict[int, list[int]] = {}
        needed = 0
        if step is not None:
            located = self._ask_registry("locate", self.job, step)
            for rank, record in sorted(located.items()):
                nodes = {int(i): n for i, n in record["nodes"].items()}
                live = naming.store_handles(self.namespace, sorted(set(nodes.values())))
                needed = next(iter(record["metas"].values()))["data_shards"]
                lost = sorted(i for i, n in nodes.items() if n not in live)
                if len(nodes) - len(lost) < needed:
                    lost_by_rank[int(rank)] = lost
        mine = lost_by_rank.get(self.rank, [])
        return InsufficientShardsError(
            f"job {self.job!r} rank {self.rank} step {step}: the committed step cannot be rebuilt from peer "
            f"memory: ranks {sorted(lost_by_rank)} have fewer than the {needed} shards needed on live nodes "
            f"(lost shard indices by rank: {lost_by_rank}); this rank lost shards {mine}. There is no "
            f"complete backup{'' if uri else ' (backup_uri is not set)'}; refusing to start from scratch",
            job=self.job,
            rank=self.rank,
            step=step,
            lost=mine,
            lost_by_rank=lost_by_rank,
            needed=needed,
        )

    # ---- lifecycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Finish the save in flight (re-raising its error) and release the buffers."""
        if self._closed:
            return
        try:
            self._finish_in_flight()
        finally:
            self._closed = True
            self._background.shutdown(wait=True)
            self._buffer = torch.empty(0, dtype=torch.uint8)
            self._parity = []
            self._stores.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this Checkpointer is closed; create a new one")

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
