"""ShardStore: one node's budgeted, thread-safe, in-memory shard table (wrapped by a Ray actor)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from ray_ckpt.core import hostmem
from ray_ckpt.core.checksum import verify
from ray_ckpt.core.job_share import FAIR, JobHoldings, make_room
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.wire import StoreStats
from ray_ckpt.errors import ConfigError, StoreFullError

INTACT_TTL_S = 5.0  # a ranged read trusts a shard's checksum verdict this long (a restore reads many ranges)


@dataclass
class _Entry:
    meta: ShardMeta
    data: np.ndarray
    metadata_bytes: int
    verified_at: float | None = None  # when its bytes last matched its checksum (ranged reads)


class ShardStore:
    """Holds shards in memory it owns, keyed by their ``ShardAddress`` (job, step, rank, index,
    writer, and whether it is a rank's full local copy).

    Contracts:
      * ``put`` copies the bytes (never keeps a reference to a caller-owned buffer) and
        reserves budget before copying, so concurrent puts can never overshoot the budget.
      * The budget is shared among the jobs holding shards here (``ray_ckpt.core.job_share``):
        by default (``job_fraction`` None) each job may hold ``budget // jobs present``, a job
        alone all of it. A put past its job's share first evicts that job's superseded steps
        (older than its newest committed step); a put within its share that does not fit the
        budget evicts superseded steps of jobs over their share, then its own job's. A job's
        newest committed step and its saves in flight are never evicted for another job.
      * A put that does not fit even so raises StoreFullError (naming the budget, or the job
        and its share) and changes nothing.
      * A put that needs new memory (no spare array of its size to reuse) while the node's
        memory in use would pass ``memory_ceiling`` of its total raises StoreFullError too,
        so a store never pushes its node into Ray's memory monitor (which kills workers at
        95% by default). Reused arrays need no new memory, so steady-state saves go on.
        (Superseded steps it evicted to fit the budget stay evicted.)
      * Putting an existing key replaces it (a retried save). A save by another writer (another
        Checkpointer, e.g. a zombie of a replaced worker group) has another key: it can never
        replace this one's shards, and a read names the writer it wants.
      * ``mark_committed``/``drop`` evict only the named job's steps; a put evicts only
        superseded steps, as above.
      * All methods are safe to call from many threads at once; copies run outside the lock,
        so a large put does not block gets.
    """

    def __init__(
        self,
        *,
        node_id: str,
        budget_bytes: int,
        memory_ceiling: float = 1.0,
        node_memory: Callable[[], tuple[int, int]] | None = None,
        job_fraction: float | None = None,
        learn_commits: Callable[[str], object] | None = None,
    ) -> None:
        """``node_memory()`` returns the node's (bytes in use, total bytes); None: no guard.
        ``memory_ceiling`` is in (0, 1]; ``job_fraction`` too, or None for the fair share
        (the default); ConfigError otherwise. ``learn_commits(job)`` is called when a put of
        ``job`` finds no room: it may tell this store of the job's commits it has not heard of
        yet (``mark_committed``: a commit is announced to the stores after it is made, so the
        next step's shards can arrive first), which evicts the steps they supersede; then the
        put tries once more. None: the put fails at once."""
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.node_id = node_id
        self.budget_bytes = int(budget_bytes)
        self._memory_ceiling = _fraction("memory_ceiling", memory_ceiling, "RAY_CKPT_NODE_MEMORY_CEILING")
        self._job_fraction = _share_fraction(job_fraction)
        self._node_memory = node_memory
        self._learn_commits = learn_commits
        self._lock = threading.Lock()
        self._allocating = threading.Lock()
        self._entries: dict[ShardAddress, _Entry] = {}
        self._step_bytes: dict[str, dict[int, int]] = {}  # job -> step -> bytes its entries hold
        self._reserved = 0  # bytes of puts in progress
        self._reserved_by_job: dict[str, int] = {}  # the same, per job
        self._committed: dict[str, int] = {}  # job -> newest committed step this store heard of
        self._committed_by: dict[str, str] = {}  # job -> the attempt that committed that step, if told
        self._plans: dict[str, Any] = {}  # job -> the newest plan mark it heard of (wire form)
        # arrays of evicted shards, reused by later puts of the same size (the next step's
        # shards usually are): no page faults, no allocation. Data + spare <= budget.
        self._spare: dict[int, list[np.ndarray]] = {}

    @property
    def memory_ceiling(self) -> float:
        """The share of the node's memory in use past which a put needing new memory is refused."""
        return self._memory_ceiling

    @memory_ceiling.setter
    def memory_ceiling(self, fraction: float) -> None:
        self._memory_ceiling = _fraction("memory_ceiling", fraction, "RAY_CKPT_NODE_MEMORY_CEILING")

    @property
    def job_fraction(self) -> float | None:
        """The share of ``budget_bytes`` one job may hold here (1: no per-job limit); None: the
        fair share, ``budget // jobs present``."""
        return self._job_fraction

    @job_fraction.setter
    def job_fraction(self, fraction: float | None) -> None:
        self._job_fraction = _share_fraction(fraction)

    # ---- writes -------------------------------------------------------------------------

    def put(self, meta: ShardMeta, data: Any, *, local: bool = False) -> None:
        """Store one shard, or with ``local`` a rank's full local copy (a k=1, m=0 "shard", index
        0: ConfigError for another index), at ``ShardAddress.of(meta, local=local)``."""
        view = hostmem.as_bytes(data)
        if view.size != meta.shard_size:
            raise ValueError(
                f"shard {ShardAddress.of(meta, local=local)} has {view.size} bytes, its metadata says {meta.shard_size}"
            )
        self.receive(meta, lambda owned: np.copyto(owned, view), local=local)

    def receive(self, meta: ShardMeta, fill: Callable[[np.ndarray], Any], *, local: bool = False) -> None:
        """``put``, with the bytes written by ``fill`` into ``meta.shard_size`` bytes of memory
        this store owns (a direct write receives them from its socket there). The budget is
        reserved before ``fill`` runs (StoreFullError before a byte is taken); if ``fill``
        raises, nothing is stored and the reservation is released."""
        key = ShardAddress.of(meta, local=local)
        size = meta.shard_size
        metadata_bytes = len(msgpack.packb(meta.to_dict()))
        need = size + metadata_bytes
        try:
            self._reserve_room(meta, key, need)
        except StoreFullError:
            if self._learn_commits is None:
                raise
            self._learn_commits(meta.job)
            self._reserve_room(meta, key, need)
        owned: np.ndarray | None = None
        try:
            owned = self._take_spare(size)
            if owned is None:
                with self._allocating:  # one at a time, so concurrent puts see each other's memory
                    self._check_node_memory(meta, need)
                    owned = hostmem.allocate(size)
            fill(owned)
        except BaseException:
            with self._lock:
                self._reserve_locked(meta.job, -need)
                if owned is not None:  # a fill that failed midway: the memory is reused later
                    self._spare.setdefault(size, []).append(owned)
                    self._trim_spare_locked()
            raise
        with self._lock:
            self._reserve_locked(meta.job, -need)
            replaced = self._entries.get(key)
            self._entries[key] = _Entry(meta, owned, metadata_bytes)
            self._count_locked(key, need)
            if replaced is not None:
                self._count_locked(key, -(replaced.data.size + replaced.metadata_bytes))
                self._spare.setdefault(replaced.data.size, []).append(replaced.data)
            self._trim_spare_locked()

    def _reserve_room(self, meta: ShardMeta, key: ShardAddress, need: int) -> None:
        """Evict what a put of ``need`` bytes at ``key`` may evict and reserve its bytes;
        StoreFullError, with nothing changed, where it does not fit."""
        with self._lock:
            replaced = self._entries.get(key)
            freed = replaced.data.size + replaced.metadata_bytes if replaced else 0
            room = make_room(
                self._holdings_locked(),
                job=meta.job,
                step=meta.step,
                need_bytes=need,
                replaced_bytes=freed,
                budget_bytes=self.budget_bytes,
                fraction=self._job_fraction,
            )
            if room.refused == "budget":
                used = self._used_locked()
                raise StoreFullError(
                    f"store on node {self.node_id} cannot take shard {meta.index} of rank {meta.rank}, "
                    f"step {meta.step} of job {meta.job!r} ({need} bytes): {used} of "
                    f"{self.budget_bytes} bytes used ({self._usage_by_job_locked()}), {self._reserved} "
                    "reserved by puts in flight. Raise the budget (ray_ckpt.start(store_budget_bytes=...) "
                    "or RAY_CKPT_STORE_BUDGET_FRACTION), lower keep_committed, or add nodes",
                    node_id=self.node_id,
                    used_bytes=used,
                    budget_bytes=self.budget_bytes,
                    requested_bytes=need,
                )
            if room.refused == "share":
                raise self._over_share_error(meta, need, room.share_bytes, room.jobs_present)
            self._evict_steps_locked(room.evict)
            self._reserve_locked(meta.job, need)
            self._trim_spare_locked()  # the evicted steps' arrays, now that the put holds its bytes

    def mark_committed(self, job: str, step: int, keep_steps: list[int], attempt: str | None = None) -> int:
        """Record that ``step`` of ``job`` committed (by ``attempt``, when told) and evict the
        job's shards of steps older than it that are not in ``keep_steps``. Returns the bytes
        freed."""
        keep = set(keep_steps) | {step}
        with self._lock:
            if step >= self._committed.get(job, step):
                if attempt is not None:
                    self._committed_by[job] = attempt
                elif step > self._committed.get(job, step):
                    self._committed_by.pop(job, None)
            self._committed[job] = max(step, self._committed.get(job, step))
            doomed = [k for k in self._entries if k.job == job and k.step < step and k.step not in keep]
            return self._drop_locked(doomed)

    def drop(
        self,
        job: str,
        steps: list[int] | None = None,
        attempts: Collection[str] | None = None,
        writers: Collection[str] | None = None,
    ) -> int:
        """Evict the job's shards of ``steps`` (all steps when None): all of them, or, when
        ``attempts`` or ``writers`` is given, only those saved under one of ``attempts`` (""
        for saves without one) or by one of ``writers``. Returns the bytes freed."""
        wanted = None if steps is None else set(steps)
        chosen = attempts is not None or writers is not None
        of_attempts, of_writers = set(attempts or ()), set(writers or ())
        with self._lock:
            doomed = [
                k
                for k, entry in self._entries.items()
                if k.job == job
                and (wanted is None or k.step in wanted)
                and (not chosen or entry.meta.attempt in of_attempts or k.writer in of_writers)
            ]
            if steps is None:
                self._committed.pop(job, None)
                self._committed_by.pop(job, None)
                self._plans.pop(job, None)
            return self._drop_locked(doomed)

    # ---- reads --------------------------------------------------------------------------

    def get(self, address: ShardAddress) -> tuple[ShardMeta, np.ndarray] | None:
        """The shard (or the rank's local copy) at ``address``, and its metadata, or None if
        this store does not hold it."""
        with self._lock:
            entry = self._entries.get(address)
        return None if entry is None else (entry.meta, entry.data)

    def get_ranges(
        self, address: ShardAddress, ranges: list[tuple[int, int]]
    ) -> tuple[ShardMeta, bool, list[np.ndarray]] | None:
        """Byte ranges ``[start, stop)`` of the shard (or the rank's local copy) at ``address``:
        ``(meta, intact, pieces)``, ``intact`` saying whether the whole shard still matches its
        checksum (a reader of ranges cannot check that itself; the verdict is reused for
        ``INTACT_TTL_S``, so the many ranged reads of one restore hash the shard once); None if
        this store does not hold it. ValueError for a range outside the shard."""
        with self._lock:
            entry = self._entries.get(address)
        if entry is None:
            return None
        meta, data = entry.meta, entry.data
        for start, stop in ranges:
            if not 0 <= start <= stop <= data.size:
                raise ValueError(f"range [{start}, {stop}) is outside the shard's {data.size} bytes")
        now = time.monotonic()
        intact = entry.verified_at is not None and now - entry.verified_at < INTACT_TTL_S
        if not intact:
            intact = verify(meta, data)
            entry.verified_at = now if intact else None
        return meta, intact, [data[start:stop] for start, stop in ranges]

    def inventory(self, job: str | None = None) -> list[ShardMeta]:
        """Metadata of every coded shard held (of one job when given; local copies are not
        listed); for rebuilding the registry."""
        with self._lock:
            return [e.meta for k, e in self._entries.items() if (job is None or k.job == job) and not k.local]

    def note_plan(self, job: str, mark: Any) -> None:
        """Keep ``job``'s newest restore plan (a ``PlanMark`` on the wire; its first item, the
        sequence number, orders them) for a registry that restarts."""
        with self._lock:
            held = self._plans.get(job)
            if held is None or held[0] <= mark[0]:
                self._plans[job] = mark

    def plan_marks(self) -> dict[str, Any]:
        """job -> the newest plan mark this store was told (wire form)."""
        with self._lock:
            return dict(self._plans)

    def committed_attempts(self) -> dict[str, str]:
        """job -> the attempt that committed its newest marked step (when the mark said)."""
        with self._lock:
            return dict(self._committed_by)

    def committed_marks(self) -> dict[str, int]:
        """job -> the newest committed step this store was told about."""
        with self._lock:
            return dict(self._committed)

    def stats(self) -> StoreStats:
        """Usage for status pages and metrics: bytes used (shard data and metadata), budget,
        shards, bytes per job."""
        with self._lock:
            data = sum(e.data.size for e in self._entries.values())
            meta = sum(e.metadata_bytes for e in self._entries.values())
            return StoreStats(
                node_id=self.node_id,
                budget_bytes=self.budget_bytes,
                used_bytes=data + meta,
                data_bytes=data,
                metadata_bytes=meta,
                shards=len(self._entries),
                jobs=self._usage_by_job_locked(),
            )

    # ---- internals ----------------------------------------------------------------------

    def _used_locked(self) -> int:
        return sum(sum(steps.values()) for steps in self._step_bytes.values())

    def _count_locked(self, key: ShardAddress, nbytes: int) -> None:
        """Count ``nbytes`` more (or fewer, when negative) held for ``key``'s job and step."""
        steps = self._step_bytes.setdefault(key.job, {})
        steps[key.step] = steps.get(key.step, 0) + nbytes
        if not steps[key.step]:
            del steps[key.step]
            if not steps:
                del self._step_bytes[key.job]

    def _reserve_locked(self, job: str, nbytes: int) -> None:
        """Count ``nbytes`` more (or fewer, when negative) in puts in flight, of ``job``."""
        self._reserved += nbytes
        held = self._reserved_by_job.get(job, 0) + nbytes
        if held:
            self._reserved_by_job[job] = held
        else:
            self._reserved_by_job.pop(job, None)

    def _holdings_locked(self) -> dict[str, JobHoldings]:
        """Every job's bytes per step, bytes in puts in flight and newest committed step here."""
        jobs = self._step_bytes.keys() | self._reserved_by_job.keys()
        return {
            job: JobHoldings(
                step_bytes=dict(self._step_bytes.get(job, {})),
                in_flight_bytes=self._reserved_by_job.get(job, 0),
                committed=self._committed.get(job),
            )
            for job in jobs
        }

    def _evict_steps_locked(self, steps: tuple[tuple[str, int], ...]) -> None:
        """Drop every shard and local copy of these (job, step) pairs (superseded steps a put
        makes room with)."""
        if steps:
            doomed = set(steps)
            self._drop_locked([k for k in self._entries if (k.job, k.step) in doomed])

    def _over_share_error(self, meta: ShardMeta, need: int, share: int, jobs_present: int) -> StoreFullError:
        """StoreFullError for a put that would take its job past its share of the budget."""
        used = sum(e.data.size + e.metadata_bytes for k, e in self._entries.items() if k.job == meta.job)
        reserved = self._reserved_by_job.get(meta.job, 0)
        if self._job_fraction is None:
            rule = (
                f"its fair share: the store's {self.budget_bytes} bytes shared among the {jobs_present} jobs "
                f"holding shards here, RAY_CKPT_STORE_JOB_FRACTION={FAIR}"
            )
        else:
            rule = f"{self._job_fraction:.0%} of the store's {self.budget_bytes} bytes, RAY_CKPT_STORE_JOB_FRACTION"
        return StoreFullError(
            f"store on node {self.node_id} cannot take shard {meta.index} of rank {meta.rank}, step {meta.step} "
            f"of job {meta.job!r} ({need} bytes): the job holds {used} bytes here ({reserved} more in puts in "
            f"flight) and may hold {share} ({rule}), even after giving up its steps older than its newest "
            "committed one. Turn the job's local_copy off, drop checkpoints no longer needed (ray-ckpt drop), "
            "add nodes, raise the store budget, or set RAY_CKPT_STORE_JOB_FRACTION on the stores to a fixed "
            "share (1: no per-job limit)",
            node_id=self.node_id,
            job=meta.job,
            used_bytes=used,
            budget_bytes=share,
            requested_bytes=need,
        )

    def _usage_by_job_locked(self) -> dict[str, int]:
        usage: dict[str, int] = {}
        for key, entry in self._entries.items():
            usage[key.job] = usage.get(key.job, 0) + entry.data.size + entry.metadata_bytes
        return usage

    def _drop_locked(self, keys: list[ShardAddress]) -> int:
        freed = 0
        for key in keys:
            entry = self._entries.pop(key)
            freed += entry.data.size + entry.metadata_bytes
            self._count_locked(key, -(entry.data.size + entry.metadata_bytes))
            self._spare.setdefault(entry.data.size, []).append(entry.data)
        self._trim_spare_locked()
        return freed

    def _take_spare(self, size: int) -> np.ndarray | None:
        with self._lock:
            arrays = self._spare.get(size, [])
            while arrays:
                candidate = arrays.pop()
                # reuse only if nobody else still holds it (e.g. a get being serialized)
                if sys.getrefcount(candidate) <= 2:
                    return candidate
        return None

    def _check_node_memory(self, meta: ShardMeta, need: int) -> None:
        if self._node_memory is None:
            return
        in_use, total = self._node_memory()
        if in_use + need > self.memory_ceiling * total:
            raise StoreFullError(
                f"store on node {self.node_id} cannot take shard {meta.index} of rank {meta.rank}, step "
                f"{meta.step} of job {meta.job!r} ({need} bytes): the node's memory in use "
                f"({in_use} of {total} bytes, {in_use / total:.0%}) would pass the ceiling of "
                f"{self._memory_ceiling:.0%} (RAY_CKPT_NODE_MEMORY_CEILING), which keeps the node clear of "
                "Ray's memory monitor. Free memory on the node, lower the store budget or keep_committed, "
                "or add nodes",
                node_id=self.node_id,
                used_bytes=in_use,
                budget_bytes=int(self.memory_ceiling * total),
                requested_bytes=need,
            )

    def _trim_spare_locked(self) -> None:
        """Free spare arrays until live data, puts in flight and spares fit the budget."""
        spare = sum(size * len(arrays) for size, arrays in self._spare.items())
        room = self.budget_bytes - self._used_locked() - self._reserved
        for size in sorted(self._spare):
            while spare > room and self._spare[size]:
                self._spare[size].pop()
                spare -= size
        self._spare = {size: arrays for size, arrays in self._spare.items() if arrays}


def _share_fraction(value: object) -> float | None:
    """``job_fraction``: None (the fair share) or a fraction in (0, 1]."""
    return None if value is None else _fraction("job_fraction", value, "RAY_CKPT_STORE_JOB_FRACTION")


def _fraction(name: str, value: object, knob: str) -> float:
    """``value`` as a float in (0, 1]; ConfigError naming ``name`` and ``knob`` otherwise (NaN
    too: every comparison with it is False, so a NaN ceiling would turn its guard off)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= 1):
        raise ConfigError(f"{name} ({knob}) must be a number in (0, 1], got {value!r}")
    return float(value)
