"""Checkpointer: one rank's save (snapshot -> encode -> scatter -> stage) and restore."""

from __future__ import annotations

import dataclasses
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import ray

from ray_ckpt import blob, naming, service, settings, snapshot
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
from ray_ckpt.shard import ShardMeta

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Restored:
    """A restored checkpoint: the step, the state (CPU tensors), where it came from
    (``"local"``, ``"peers"`` or ``"backup"``) and the restore's phase durations in seconds."""

    step: int
    state: Any
    source: str
    phases_s: dict[str, float]


class SaveHandle:
    """The future of one ``save``: ``staged()`` once this rank's shards are stored and staged,
    ``wait()`` once every rank staged the step (it committed)."""

    def __init__(self, checkpointer: Checkpointer, step: int, staged: Future[bool]) -> None:
        self.step = step
        self._checkpointer = checkpointer
        self._staged = staged

    def staged(self, timeout_s: float | None = None) -> None:
        """Block until this rank's part is stored and staged; re-raises a background error."""
        self._staged.result(timeout=timeout_s)

    def wait(self, timeout_s: float | None = None) -> None:
        """Block until the step committed on all ranks; CommitTimeoutError names missing ranks."""
        timeout = self._checkpointer.config.commit_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        if self._staged.result(timeout=timeout):
            return
        self._checkpointer._wait_committed(self.step, max(0.0, deadline - time.monotonic()))


class Checkpointer:
    """Saves and restores one rank's state through the ray_ckpt service.

    ``save`` blocks only while the state is copied into a host buffer it reuses; encoding,
    scattering the shards to peer stores and staging run on a background thread. At most one
    save is in flight: the next ``save`` first waits for the previous one. A background failure
    is re-raised by the next ``save``, ``wait`` or ``close``. Not thread-safe: one caller.
    """

    def __init__(
        self,
        *,
        job: str,
        rank: int,
        world_size: int,
        config: CheckpointConfig | None = None,
        namespace: str | None = None,
    ) -> None:
        if not isinstance(job, str) or not job:
            raise ConfigError(f"job must be a non-empty str, got {job!r}")
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
        self.config = config or CheckpointConfig()
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
        self._buffer = np.empty(0, dtype=np.uint8)
        self._parity: list[np.ndarray] = []
        self._last_step: int | None = None
        self._closed = False
        self.last_save_phases_s: dict[str, float] = {}

    # ---- save ---------------------------------------------------------------------------

    def save(self, step: int, state: Any) -> SaveHandle:
        """Checkpoint ``state`` as ``step`` (steps must increase). Returns once the state is
        copied; see SaveHandle for completion. Raises the previous save's background error."""
        self._check_open()
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ConfigError(f"step must be an int >= 0, got {step!r}")
        if self._last_step is not None and step <= self._last_step:
            raise ConfigError(f"step {step} is not newer than the last saved step {self._last_step}")
        started = time.perf_counter()
        layout = snapshot.plan(state)  # validates before anything is waited for or touched
        self._finish_in_flight()
        copy_start = time.perf_counter()
        size = blob.blob_size(len(layout.header), layout.payload_size)
        shard_size = self.code.shard_size(size)
        padded = shard_size * self.code.data_shards
        if self._buffer.size < padded:
            self._buffer = np.empty(padded, dtype=np.uint8)
        buffer = self._buffer[:padded]
        offset = blob.write_prefix(buffer, layout.header)
        snapshot.write_payload(layout, buffer[offset:])
        buffer[size:] = 0
        self._last_step = step
        phases = {"wait_previous": copy_start - started, "snapshot": time.perf_counter() - copy_start}
        phases["blocking"] = time.perf_counter() - started
        self.last_save_phases_s = phases
        future = self._background.submit(self._encode_scatter_stage, step, buffer, size, phases)
        self._in_flight = future
        return SaveHandle(self, step, future)

    def _finish_in_flight(self) -> float:
        if self._in_flight is None:
            return 0.0
        start = time.perf_counter()
        future, self._in_flight = self._in_flight, None
        future.result()  # re-raises a background failure
        return time.perf_counter() - start

    def _encode_scatter_stage(self, step: int, buffer: np.ndarray, size: int, phases: dict[str, float]) -> bool:
        t0 = time.perf_counter()
        k, m = self.code.data_shards, self.code.parity_shards
        shard_size = buffer.size // k
        if len(self._parity) != m or (m and self._parity[0].size != shard_size):
            self._parity = [np.empty(shard_size, dtype=np.uint8) for _ in range(m)]
        data = [buffer[i * shard_size : (i + 1) * shard_size] for i in range(k)]
        shards = data + self.code.encode_parity(data, self._parity)
        metas = [
            ShardMeta(
                job=self.job,
                step=step,
                rank=self.rank,
                index=i,
                world_size=self.world_size,
                data_shards=k,
                parity_shards=m,
                payload_size=size,
                shard_size=shard_size,
                checksum=checksum(shard),
            )
            for i, shard in enumerate(shards)
        ]
        t1 = time.perf_counter()
        nodes = service.storage_nodes(self.namespace, self.config.failure_domain_label)
        targets = place(nodes, shards=k + m, rank=self.rank, rank_node_id=self.node_id)
        stores = naming.store_handles(self.namespace, targets)
        refs = [
            stores[node_id].put.remote(meta.to_dict(), ray.put(shard))
            for node_id, meta, shard in zip(targets, metas, shards)
        ]
        ray.get(refs, timeout=settings.peer_timeout_s())
        t2 = time.perf_counter()
        committed = ray.get(
            self._registry.stage.remote(
                [meta.to_dict() for meta in metas], dict(enumerate(targets)), self.config.keep_committed
            ),
            timeout=settings.peer_timeout_s(),
        )
        t3 = time.perf_counter()
        phases.update(encode=t1 - t0, scatter=t2 - t1, stage=t3 - t2)
        return bool(committed)

    def _wait_committed(self, step: int, timeout_s: float) -> None:
        if ray.get(
            self._registry.wait_committed.remote(self.job, step, timeout_s),
            timeout=timeout_s + settings.peer_timeout_s(),
        ):
            return
        staged = ray.get(self._registry.staged_ranks.remote(self.job, step), timeout=settings.peer_timeout_s())
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
        latest = ray.get(self._registry.latest_committed.remote(self.job), timeout=settings.peer_timeout_s())
        return None if latest is None else int(latest)

    def restore(self, step: int | None = None) -> Restored | None:
        """Rebuild this rank's state of ``step`` (default: the latest committed step) from any
        k checksum-valid shards on live stores. None when the job never committed a step.
        InsufficientShardsError (naming rank, step and lost shards) when more than m are gone."""
        self._check_open()
        t0 = time.perf_counter()
        if step is None:
            step = self.latest_step()
            if step is None:
                return None
        located = ray.get(self._registry.locate.remote(self.job, step), timeout=settings.peer_timeout_s())
        if self.rank not in located:
            raise ConfigError(
                f"job {self.job!r} step {step} was saved by ranks {sorted(located)}; rank {self.rank} "
                f"is not among them (world size changed from {len(located)} to {self.world_size}?)"
            )
        record = located[self.rank]
        metas = {int(i): ShardMeta.from_dict(m) for i, m in record["metas"].items()}
        nodes = {int(i): n for i, n in record["nodes"].items()}
        t1 = time.perf_counter()
        shards, lost = self._fetch(step, metas, nodes)
        t2 = time.perf_counter()
        any_meta = next(iter(metas.values()))
        buffer = np.empty(any_meta.shard_size * self.code.data_shards, dtype=np.uint8)
        code = ReedSolomon(any_meta.data_shards, any_meta.parity_shards)
        code.decode_into(shards, buffer)
        t3 = time.perf_counter()
        header, payload = blob.split(buffer[: any_meta.payload_size])
        state = snapshot.restore(header, payload, copy=False)
        t4 = time.perf_counter()
        phases = {"locate": t1 - t0, "fetch": t2 - t1, "decode": t3 - t2, "load": t4 - t3}
        if lost:
            logger.warning("rank %d step %d: rebuilt without shards %s", self.rank, step, sorted(lost))
        return Restored(step=step, state=state, source="peers", phases_s=phases)

    def _fetch(
        self, step: int, metas: dict[int, ShardMeta], nodes: dict[int, str]
    ) -> tuple[dict[int, np.ndarray], dict[int, str]]:
        """Any k checksum-valid shards, fetched in parallel; data shards first (no decode work).
        A dead store, a missing shard or a bad checksum is an erasure: the next candidate is
        fetched instead. Returns (shards by index, lost index -> reason)."""
        k = next(iter(metas.values())).data_shards
        alive = {str(n["NodeID"]) for n in naming.alive_nodes()}
        stores = naming.store_handles(self.namespace, sorted(set(nodes.values()) & alive))
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
            remaining = deadline - time.monotonic()
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, remaining))
            if not done:
                for ref, index in pending.items():
                    lost[index] = "store did not answer in time"
                    ray.cancel(ref, force=False)
                pending.clear()
                break
            ref = done[0]
            index = pending.pop(ref)
            try:
                found = ray.get(ref)
            except (ray.exceptions.RayError, RayCkptError) as error:
                lost[index] = f"store failed: {type(error).__name__}"
            else:
                reason = self._check_shard(found, metas[index])
                if reason is None:
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
            self._buffer = np.empty(0, dtype=np.uint8)
            self._parity = []

    def _check_open(self) -> None:
        if self._closed:
            raise ConfigError("this Checkpointer is closed; create a new one")

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
