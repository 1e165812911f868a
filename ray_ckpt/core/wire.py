"""Wire records: what crosses an actor boundary, as frozen dataclasses with ``to_wire/from_wire``.

Actors send and return plain dicts (msgpack-friendly: str and int keys, no objects of ours),
built by ``to_wire``; the receiving side parses them once with ``from_wire`` and works with the
typed record. Nobody re-parses a dict by hand. Pure: no Ray import.

- ``RankRecord``: where one rank's shards of one step live (and its local copy), with the
  code parameters and the protection derived from it.
- ``RankLocation``: one rank's ``RankRecord`` of a committed step and the step's world size
  (a restoring rank's share of the registry's view, O(1) in the world size).
- ``FoundShard`` / ``FoundRanges``: a store's answer to a read of a whole shard (or a rank's
  local copy), and of byte ranges of one; their bytes are arrays, never parsed.
- ``RestorePlan``: the step every rank of an attempt restores, and from where.
- ``StoreHoldings``: what one store holds, for rebuilding the registry.
- ``JobInfo``: one job's committed and staged steps and world size (``ray_ckpt.status()``'s
  jobs).
- ``StoreStats`` / ``StoreStatus``: one store's usage, and with it the store actor's place in
  the relay tree and the direct reads it served (what ``ray_ckpt.status()`` shows per node).
- ``KillResult``: one simulated failure (the kill tool's answer).
- ``StageRequest`` / ``StageResult``: one rank's stage of one step and its outcome.
- ``StageGroup`` / ``GroupResult``: the stages of many ranks of one step, packed, as the
  stores pass them up the relay tree to the registry (``ray_ckpt.core.relay``), and their outcome.
- ``PlanQuery`` / ``PlanAnswer``: ranks asking for their attempt's restore plan and their
  records of its step, merged up the same tree, and the answer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Any, Literal, get_args

import msgpack
import numpy as np

from ray_ckpt import errors
from ray_ckpt.config import MAX_SHARDS
from ray_ckpt.core.forwarded import Forwarded
from ray_ckpt.core.protection import rank_protection
from ray_ckpt.core.record_dict import fields_dict
from ray_ckpt.core.shard import SAVE_ID_MAX, ShardMeta


@dataclasses.dataclass(frozen=True)
class RankRecord:
    """One rank's shards of one step: metadata by shard index, the node holding each, and the
    rank's full local copy (``local``, on ``local_node``) if it made one."""

    metas: Mapping[int, ShardMeta]
    nodes: Mapping[int, str]
    local: ShardMeta | None = None
    local_node: str | None = None

    @property
    def first(self) -> ShardMeta:
        return next(iter(self.metas.values()))

    # the code and sizes, alike in every shard's metadata
    data_shards = Forwarded[int]("first")
    parity_shards = Forwarded[int]("first")
    payload_size = Forwarded[int]("first")
    shard_size = Forwarded[int]("first")
    world_size = Forwarded[int]("first")

    def holders(self) -> set[str]:
        """The nodes holding these shards or the local copy."""
        return {*self.nodes.values(), *([self.local_node] if self.local is not None and self.local_node else [])}

    def live_shards(self, live_nodes: Container[str]) -> int:
        return sum(1 for node in self.nodes.values() if node in live_nodes)

    def protection(self, live_nodes: Container[str] | None = None) -> int:
        """Node losses these shards survive from now (see ray_ckpt.core.protection)."""
        return rank_protection(self.nodes.values(), self.data_shards, live_nodes)

    def to_wire(self) -> dict[str, Any]:
        return {
            "metas": {i: m.to_dict() for i, m in self.metas.items()},
            "nodes": dict(self.nodes),
            "local": None if self.local is None else self.local.to_dict(),
            "local_node": self.local_node,
        }

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> RankRecord:
        return cls(
            metas={int(i): ShardMeta.from_dict(m) for i, m in values["metas"].items()},
            nodes={int(i): str(n) for i, n in values["nodes"].items()},
            local=None if values.get("local") is None else ShardMeta.from_dict(values["local"]),
            local_node=values.get("local_node"),
        )


def step_protection(ranks: Mapping[int, RankRecord], live_nodes: Container[str] | None = None) -> int | None:
    """The weakest rank's protection, or None for no ranks."""
    return min((r.protection(live_nodes) for r in ranks.values()), default=None)


def ranks_to_wire(ranks: Mapping[int, RankRecord]) -> dict[int, dict[str, Any]]:
    return {rank: record.to_wire() for rank, record in ranks.items()}


def ranks_from_wire(values: Mapping[Any, Mapping[str, Any]]) -> dict[int, RankRecord]:
    return {int(rank): RankRecord.from_wire(record) for rank, record in values.items()}


@dataclasses.dataclass(frozen=True)
class RankLocation:
    """One rank's records of a committed step (None if that rank did not save it) and how many
    ranks saved the step (``world_size``)."""

    world_size: int
    record: RankRecord | None

    def to_wire(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "record": None if self.record is None else self.record.to_wire()}

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> RankLocation:
        record = values.get("record")
        return cls(
            world_size=int(values["world_size"]), record=None if record is None else RankRecord.from_wire(record)
        )


@dataclasses.dataclass(frozen=True)
class FoundShard:
    """A store's answer to a read of one whole shard (or a rank's local copy): the metadata the
    store holds it under and its bytes as they arrived, unchecked (the reader checks both
    against the registry's metadata: ``restore.check_shard``). On the wire ``[meta dict,
    bytes]``, the bytes an array (through Ray's object store, or read over the store's socket)."""

    meta: ShardMeta
    data: np.ndarray

    def to_wire(self) -> list[Any]:
        return [self.meta.to_dict(), self.data]

    @classmethod
    def from_wire(cls, values: Sequence[Any]) -> FoundShard:
        """Parse a store's answer; SnapshotFormatError if it is malformed (nothing usable was
        read: an erasure, as a checksum mismatch is)."""
        meta, data = _answer(values, 2)
        return cls(ShardMeta.from_dict(meta), data)


@dataclasses.dataclass(frozen=True)
class FoundRanges:
    """A store's answer to a read of byte ranges of one shard (or local copy): the metadata the
    store holds it under, whether the whole shard still matches its checksum there (``intact``,
    which a reader of ranges cannot check itself; None where the store did not say) and the
    bytes of each range asked, in order (``pieces``). On the wire ``[meta dict, intact,
    [bytes, ...]]``."""

    meta: ShardMeta
    intact: bool | None
    pieces: tuple[np.ndarray, ...]

    def to_wire(self) -> list[Any]:
        return [self.meta.to_dict(), self.intact, list(self.pieces)]

    @classmethod
    def from_wire(cls, values: Sequence[Any]) -> FoundRanges:
        """Parse a store's answer; SnapshotFormatError if it is malformed (as ``FoundShard``)."""
        meta, intact, pieces = _answer(values, 3)
        if intact is not None and not isinstance(intact, bool):
            raise errors.SnapshotFormatError(f"a store's ranged read says intact={intact!r}, not a bool or None")
        if not isinstance(pieces, (list, tuple)):
            raise errors.SnapshotFormatError(
                f"a store's ranged read holds {type(pieces).__name__}, not a list of bytes"
            )
        return cls(ShardMeta.from_dict(meta), intact, tuple(pieces))


def _answer(values: Any, fields: int) -> Sequence[Any]:
    """A store's answer of ``fields`` fields; SnapshotFormatError if it has not that many."""
    if not isinstance(values, (list, tuple)) or len(values) != fields:
        raise errors.SnapshotFormatError(f"a store's answer to a read must have {fields} fields, got {values!r:.200}")
    return values


PlanSource = Literal["peers", "backup"]  # the restore sources the registry plans (ray_ckpt.core.events.RestoreSource)


def _plan_source(value: Any) -> PlanSource | None:
    if value is not None and value not in get_args(PlanSource):
        raise ValueError(f"a restore plan's source is 'peers', 'backup' or None, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class RestorePlan:
    """The step all ranks of one attempt restore. ``source``: "peers" (``step`` is committed
    and every rank can rebuild it from memory; ``world_size`` ranks saved it), "backup" (use
    the newest complete persistent backup) or None (nothing was ever committed).
    ``newest_committed`` and ``newest_staged`` (the newest step any rank staged) let a
    restore forget unrebuildable newer steps; with ``newest_reached`` (the newest step the
    attempt before said it trained, saved or not: ``Registry.note_reached``) they count the
    steps a failure makes the job train again. ``attempt``:
    the attempt the plan belongs to (for ranks that asked without one, the registry's)."""

    step: int | None = None
    source: PlanSource | None = None
    ever_committed: bool = False
    newest_committed: int | None = None
    newest_staged: int | None = None
    world_size: int | None = None
    attempt: str | None = None
    newest_reached: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> RestorePlan:
        return cls(
            step=values.get("step"),
            source=_plan_source(values.get("source")),
            ever_committed=bool(values.get("ever_committed")),
            newest_committed=values.get("newest_committed"),
            newest_staged=values.get("newest_staged"),
            world_size=values.get("world_size"),
            attempt=values.get("attempt"),
            newest_reached=values.get("newest_reached"),
        )


@dataclasses.dataclass(frozen=True)
class StoreHoldings:
    """What one store holds: its node, the metadata of every shard, per job the newest step it
    was told committed, and per job the newest restore plan it was told (``PlanMark``)."""

    node_id: str
    metas: tuple[ShardMeta, ...]
    committed: Mapping[str, int]
    plans: Mapping[str, PlanMark] = dataclasses.field(default_factory=dict)
    committed_by: Mapping[str, str] = dataclasses.field(default_factory=dict)  # job -> attempt of its mark

    def to_wire(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "metas": [m.to_dict() for m in self.metas],
            "committed": dict(self.committed),
            "plans": {job: mark.to_wire() for job, mark in self.plans.items()},
            "committed_by": dict(self.committed_by),
        }

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> StoreHoldings:
        return cls(
            node_id=str(values["node_id"]),
            metas=tuple(ShardMeta.from_dict(m) for m in values["metas"]),
            committed={str(j): int(s) for j, s in values["committed"].items()},
            plans={str(j): PlanMark.from_wire(m) for j, m in (values.get("plans") or {}).items()},
            committed_by={str(j): str(a) for j, a in (values.get("committed_by") or {}).items()},
        )


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """One job as the registry knows it (``Registry.jobs``): its ``committed_steps`` (oldest
    first), the steps it ``staged`` but did not commit yet (step -> the ranks that staged it),
    and its ``world_size`` (the largest of its steps'). ``interval``: what ``every="auto"``
    chose on its ranks lately (``ray_ckpt.core.interval.summarize``: low, high, reason), set by
    the registry actor for a job whose ranks sent ``interval`` events, else None. On the wire
    (and in ``ray_ckpt.status()``, per job) a dict of these fields, ``interval`` only when set."""

    committed_steps: tuple[int, ...]
    staged: Mapping[int, tuple[int, ...]]
    world_size: int
    interval: Mapping[str, object] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire: dict[str, Any] = {
            "committed_steps": list(self.committed_steps),
            "staged": {step: list(ranks) for step, ranks in self.staged.items()},
            "world_size": self.world_size,
        }
        if self.interval is not None:
            wire["interval"] = dict(self.interval)
        return wire

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> JobInfo:
        interval = values.get("interval")
        return cls(
            committed_steps=tuple(int(s) for s in values["committed_steps"]),
            staged={int(step): tuple(int(r) for r in ranks) for step, ranks in values["staged"].items()},
            world_size=int(values["world_size"]),
            interval=None if interval is None else dict(interval),
        )


@dataclasses.dataclass(frozen=True)
class StoreStats:
    """One store's usage (``ShardStore.stats``), for status pages and metrics: its node, its
    budget, the bytes it holds (``used_bytes`` = shard data ``data_bytes`` + their metadata
    ``metadata_bytes``), the shards and local copies it holds (``shards``) and the bytes per
    job (``jobs``)."""

    node_id: str
    budget_bytes: int
    used_bytes: int
    data_bytes: int
    metadata_bytes: int
    shards: int
    jobs: Mapping[str, int]

    def as_dict(self) -> dict[str, Any]:
        """The fields by name, as ``ray_ckpt.status()`` shows a node's store."""
        return fields_dict(self)


@dataclasses.dataclass(frozen=True)
class StoreStatus:
    """A store actor's answer to ``stats``: its ``usage`` and its place in the relay tree:
    ``parent`` (None: it stages with the registry), the calls it made up the tree
    (``relay_sends``), the relay calls it took from stores below (``relayed``), and the direct
    reads it served (``direct_reads``, of ``direct_bytes`` in all) and the direct writes it
    stored (``direct_writes``, of ``direct_bytes_received`` in all); for in-place runs, the
    coordinator calls it took from its node's ranks and the stores below (``coordinator_calls``)
    and the calls it sent up for them (``coordinator_sends``). On the wire (and in
    ``ray_ckpt.status()``, per node) one flat dict: the usage's fields, then these."""

    usage: StoreStats
    parent: str | None = None
    relay_sends: int = 0
    relayed: int = 0
    direct_reads: int = 0
    direct_bytes: int = 0
    direct_writes: int = 0
    direct_bytes_received: int = 0
    coordinator_calls: int = 0
    coordinator_sends: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            **self.usage.as_dict(),
            "parent": self.parent,
            "relay_sends": self.relay_sends,
            "relayed": self.relayed,
            "direct_reads": self.direct_reads,
            "direct_bytes": self.direct_bytes,
            "direct_writes": self.direct_writes,
            "direct_bytes_received": self.direct_bytes_received,
            "coordinator_calls": self.coordinator_calls,
            "coordinator_sends": self.coordinator_sends,
        }

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> StoreStatus:
        usage = StoreStats(
            node_id=str(values["node_id"]),
            budget_bytes=int(values["budget_bytes"]),
            used_bytes=int(values["used_bytes"]),
            data_bytes=int(values["data_bytes"]),
            metadata_bytes=int(values["metadata_bytes"]),
            shards=int(values["shards"]),
            jobs={str(job): int(used) for job, used in values["jobs"].items()},
        )
        parent = values.get("parent")
        return cls(
            usage=usage,
            parent=None if parent is None else str(parent),
            relay_sends=int(values.get("relay_sends", 0)),
            relayed=int(values.get("relayed", 0)),
            direct_reads=int(values.get("direct_reads", 0)),
            direct_bytes=int(values.get("direct_bytes", 0)),
            direct_writes=int(values.get("direct_writes", 0)),
            direct_bytes_received=int(values.get("direct_bytes_received", 0)),
            coordinator_calls=int(values.get("coordinator_calls", 0)),
            coordinator_sends=int(values.get("coordinator_sends", 0)),
        )


@dataclasses.dataclass(frozen=True)
class PlanMark:
    """A job's attempt history and newest restore plan, kept by every store so that a restarted
    registry refuses the zombies the old one refused and gives the ranks of the current attempt
    still to restore the plan the others restored. ``seq`` orders the marks of a job (the newest
    wins); ``current`` is the attempt current when the mark was made and ``superseded`` every
    attempt it had superseded (a zombie of one stays refused after a restart, even when none of
    its shards is left to name it); ``plan`` is the current attempt's plan (None: it joined
    without one, at a stage); ``ranks`` are the ranks that asked without an attempt under it
    (the registry's attempt); ``newest_step`` the newest step the registry knew when it made
    the mark (a step saved after it by another attempt shows that attempt came later)."""

    seq: int
    plan: RestorePlan | None
    ranks: tuple[int, ...] = ()
    newest_step: int | None = None
    current: str | None = None
    superseded: tuple[str, ...] = ()

    def to_wire(self) -> list[Any]:
        plan = None if self.plan is None else self.plan.to_wire()
        return [self.seq, plan, list(self.ranks), self.newest_step, self.current, list(self.superseded)]

    @classmethod
    def from_wire(cls, values: Sequence[Any]) -> PlanMark:
        seq, plan, ranks, newest, current, superseded = values
        return cls(
            int(seq),
            None if plan is None else RestorePlan.from_wire(plan),
            tuple(int(r) for r in ranks),
            newest,
            None if current is None else str(current),
            tuple(str(a) for a in superseded),
        )


@dataclasses.dataclass(frozen=True)
class StageRequest:
    """One rank's stage of one step: its shards' metadata, the node of each shard index, how
    many commits the job keeps, its attempt, and its optional local copy (on ``local_node``)."""

    metas: tuple[ShardMeta, ...]
    nodes: Mapping[int, str]
    keep_committed: int
    attempt: str | None = None
    local: ShardMeta | None = None
    local_node: str | None = None

    def check(self) -> None:
        """ConfigError unless this is one rank's stage: at least one shard, all of the same job,
        step, rank and world size, and ``nodes`` naming the node of exactly the staged indices."""
        if not self.metas:
            raise errors.ConfigError("stage needs the metadata of at least one shard")
        first = self.metas[0]
        head = (first.job, first.step, first.rank, first.world_size)
        if any((m.job, m.step, m.rank, m.world_size) != head for m in self.metas):
            raise errors.ConfigError("all shards staged together must share job, step, rank and world_size")
        if set(self.nodes) != {m.index for m in self.metas}:
            raise errors.ConfigError("nodes must name the node of every staged shard index, and only those")

    def record(self) -> RankRecord:
        """What the registry keeps of this stage."""
        return RankRecord({m.index: m for m in self.metas}, dict(self.nodes), self.local, self.local_node)

    def to_wire(self) -> dict[str, Any]:
        """Compact: what the rank's shards share is sent once, then per shard index its
        checksum and node (a batch of a node's ranks is parsed by the registry at every step,
        so its size and parse time per rank matter). Requests whose shards do not share job,
        step, rank, world size and code (never built by ray_ckpt) go as full records."""
        first = self.metas[0] if self.metas else None
        if (
            first is None
            or any(_shared(m) != _shared(first) for m in self.metas)
            or set(self.nodes) != {m.index for m in self.metas}
        ):
            return {"metas": [m.to_dict() for m in self.metas], "nodes": dict(self.nodes), **self._tail()}
        return {
            "shared": list(_shared(first)),
            "shards": [[m.index, m.checksum, self.nodes[m.index]] for m in self.metas],
            **self._tail(),
        }

    def _tail(self) -> dict[str, Any]:
        return {
            "keep_committed": self.keep_committed,
            "attempt": self.attempt,
            "local": None if self.local is None else self.local.to_dict(),
            "local_node": self.local_node,
        }

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> StageRequest:
        """Parse a peer's request; SnapshotFormatError if its metadata is malformed (the same
        checks as ``ShardMeta.from_dict``)."""
        local = values.get("local")
        if "shared" in values:
            shared = _checked_shared(values["shared"])
            metas = []
            nodes = {}
            for index, digest, node in values["shards"]:
                if not (
                    type(index) is int and type(digest) is int and 0 <= index < shared[4] + shared[5] and digest >= 0
                ):
                    raise errors.SnapshotFormatError(
                        f"shard metadata is inconsistent: index {index!r}, checksum {digest!r}"
                    )
                metas.append(_meta(shared, index, digest))
                nodes[index] = str(node)
        else:
            metas = [ShardMeta.from_dict(meta) for meta in values["metas"]]
            nodes = {int(i): str(n) for i, n in values["nodes"].items()}
        return cls(
            metas=tuple(metas),
            nodes=nodes,
            keep_committed=int(values["keep_committed"]),
            attempt=values.get("attempt"),
            local=None if local is None else ShardMeta.from_dict(local),
            local_node=values.get("local_node"),
        )


def _shared(meta: ShardMeta) -> tuple[Any, ...]:
    return (
        meta.job,
        meta.step,
        meta.rank,
        meta.world_size,
        meta.data_shards,
        meta.parity_shards,
        meta.payload_size,
        meta.shard_size,
        meta.attempt,
        meta.writer,
    )


def _checked_shared(shared: Any) -> tuple[Any, ...]:
    """The fields a rank's shards share (``_shared``), validated as ``ShardMeta.from_dict``
    validates a record; SnapshotFormatError if malformed."""
    if not isinstance(shared, (list, tuple)) or len(shared) != 10:
        raise errors.SnapshotFormatError(
            "shared shard metadata must list job, step, rank, world_size, k, m, sizes, attempt and writer"
        )
    job, _step, rank, world_size, k, m, payload_size, shard_size, attempt, writer = shared
    if not all(isinstance(text, str) for text in (job, attempt, writer)):
        raise errors.SnapshotFormatError("shard metadata fields job, attempt and writer must be str")
    if max(len(attempt), len(writer)) > SAVE_ID_MAX:
        raise errors.SnapshotFormatError(f"shard metadata fields attempt and writer are over {SAVE_ID_MAX} characters")
    if not all(type(n) is int and n >= 0 for n in shared[1:8]):
        raise errors.SnapshotFormatError(f"shard metadata fields must be ints >= 0, got {shared}")
    if k < 1 or k + m > MAX_SHARDS or rank >= world_size or shard_size != -(-payload_size // k):
        raise errors.SnapshotFormatError(f"shard metadata is inconsistent: {shared}")
    return tuple(shared)


def _meta(shared: tuple[Any, ...], index: int, digest: int) -> ShardMeta:
    job, step, rank, world_size, k, m, payload_size, shard_size, attempt, writer = shared
    return ShardMeta(
        job=job,
        step=step,
        rank=rank,
        index=index,
        world_size=world_size,
        data_shards=k,
        parity_shards=m,
        payload_size=payload_size,
        shard_size=shard_size,
        checksum=digest,
        attempt=attempt,
        writer=writer,
    )


@dataclasses.dataclass(frozen=True)
class StageResult:
    """The outcome of one ``StageRequest``: whether the step committed with it, or the ray_ckpt
    error that refused it (raised at the rank as itself, see ``raise_error``)."""

    committed: bool = False
    error: errors.RayCkptError | None = None

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def to_wire(self) -> dict[str, Any]:
        return {"committed": self.committed, "error": None if self.error is None else _error_to_wire(self.error)}

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> StageResult:
        error = values.get("error")
        if error is None:
            return cls(committed=bool(values.get("committed")))
        return cls(committed=False, error=_error_from_wire(error))


def _error_to_wire(error: errors.RayCkptError) -> dict[str, Any]:
    return {"kind": type(error).__name__, "message": error.message, "details": error.details}


def _error_from_wire(values: Mapping[str, Any]) -> errors.RayCkptError:
    kind = getattr(errors, str(values.get("kind")), None)
    if not (isinstance(kind, type) and issubclass(kind, errors.RayCkptError)):
        kind = errors.RayCkptError
    return kind(str(values.get("message")), **dict(values.get("details") or {}))


@dataclasses.dataclass(frozen=True)
class StagePart:
    """Ranks' stages, packed, with what the registry needs of them without unpacking: ``packed``
    holds their ``StageRequest``s on the wire in the order of ``ranks``, each packed with
    msgpack, one after the other (so two parts join by joining their ranks and bytes);
    ``protection`` is the weakest of their placements' protections and ``nodes`` every node
    holding one of their shards or local copies."""

    ranks: tuple[int, ...]
    packed: bytes
    protection: int
    nodes: frozenset[str]

    @classmethod
    def of(cls, requests: Sequence[StageRequest]) -> StagePart:
        """Checked requests, packed."""
        records = [r.record() for r in requests]
        return cls(
            ranks=tuple(r.metas[0].rank for r in requests),
            packed=b"".join(msgpack.packb(r.to_wire(), use_bin_type=True) for r in requests),
            protection=min(r.protection() for r in records),
            nodes=frozenset().union(*(r.holders() for r in records)),
        )

    @staticmethod
    def joined(parts: Sequence[StagePart]) -> StagePart:
        if len(parts) == 1:
            return parts[0]
        return StagePart(
            ranks=tuple(rank for part in parts for rank in part.ranks),
            packed=b"".join(part.packed for part in parts),
            protection=min(part.protection for part in parts),
            nodes=frozenset().union(*(part.nodes for part in parts)),
        )

    def requests(self, limit: int | None = None) -> list[StageRequest]:
        """The stages (the first ``limit`` of them), parsed and checked; SnapshotFormatError if
        they are malformed or are not the stages of the ranks the part names."""
        wanted = len(self.ranks) if limit is None else min(limit, len(self.ranks))
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(len(self.packed), 1 << 20))
        unpacker.feed(self.packed)
        try:
            values = [value for _, value in zip(range(wanted), unpacker)]
        except (ValueError, TypeError, msgpack.UnpackException) as error:
            raise errors.SnapshotFormatError(f"a stage part is not valid msgpack: {error}") from None
        requests = [StageRequest.from_wire(v) for v in values]
        if [r.metas[0].rank if r.metas else None for r in requests] != list(self.ranks[:wanted]):
            raise errors.SnapshotFormatError(f"a stage part of ranks {list(self.ranks)} holds other stages")
        return requests

    def to_wire(self) -> list[Any]:
        return [list(self.ranks), self.packed, self.protection, sorted(self.nodes)]

    @classmethod
    def from_wire(cls, values: Sequence[Any]) -> StagePart:
        ranks, packed, protection, nodes = values
        part = cls(tuple(ranks), packed, protection, frozenset(nodes))
        if not (
            isinstance(packed, bytes)
            and all(type(r) is int for r in part.ranks)
            and type(protection) is int
            and all(isinstance(n, str) for n in part.nodes)
        ):
            raise TypeError("a stage part must hold int ranks, bytes, an int protection and node ids")
        return part


@dataclasses.dataclass(frozen=True)
class StageGroup:
    """The stages of one step of one job by ranks that share world size, ``keep_committed``
    and attempt, as the stores pass them up the relay tree (``ray_ckpt.core.relay``). ``parts``: the
    ranks and their requests packed (``StagePart``; one part once merged), so relays and the
    registry move and count stages without parsing them; the registry unpacks a part only when
    it needs a rank's record (a restore, a status snapshot). The store that packs a request has
    validated it (``StageRequest.from_wire`` and ``check``)."""

    job: str
    step: int
    world_size: int
    keep_committed: int
    attempt: str | None
    parts: tuple[StagePart, ...]

    @property
    def key(self) -> tuple[str, int, int, int, str | None]:
        """What the group's stages share: groups with the same key merge."""
        return (self.job, self.step, self.world_size, self.keep_committed, self.attempt)

    @property
    def ranks(self) -> list[int]:
        return [rank for part in self.parts for rank in part.ranks]

    @classmethod
    def of(cls, requests: Iterable[StageRequest]) -> list[StageGroup]:
        """Checked requests grouped by what they share, one part per group, in first-seen order."""
        by_key: dict[tuple[str, int, int, int, str | None], list[StageRequest]] = {}
        for request in requests:
            first = request.metas[0]
            by_key.setdefault(
                (first.job, first.step, first.world_size, request.keep_committed, request.attempt), []
            ).append(request)
        return [cls(*key, parts=(StagePart.of(group),)) for key, group in by_key.items()]

    @staticmethod
    def merged(groups: Iterable[StageGroup]) -> list[StageGroup]:
        """Groups with the same key joined into one of a single part (their parts joined in
        order), in first-seen order: a relay passes on one part per group, however many it got."""
        parts: dict[tuple[str, int, int, int, str | None], list[StagePart]] = {}
        first: dict[tuple[str, int, int, int, str | None], StageGroup] = {}
        for group in groups:
            first.setdefault(group.key, group)
            parts.setdefault(group.key, []).extend(group.parts)
        return [dataclasses.replace(group, parts=(StagePart.joined(parts[key]),)) for key, group in first.items()]

    def to_wire(self) -> dict[str, Any]:
        return {
            "head": [self.job, self.step, self.world_size, self.keep_committed, self.attempt],
            "parts": [part.to_wire() for part in self.parts],
        }

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> StageGroup:
        """Parse a relayed group (its parts stay packed); SnapshotFormatError if malformed."""
        try:
            job, step, world_size, keep_committed, attempt = values["head"]
            parts = tuple(StagePart.from_wire(part) for part in values["parts"])
        except (KeyError, TypeError, ValueError) as error:
            raise errors.SnapshotFormatError(f"malformed stage group ({type(error).__name__}: {error})") from None
        if not (
            isinstance(job, str)
            and all(type(n) is int and n >= 0 for n in (step, world_size, keep_committed))
            and (attempt is None or isinstance(attempt, str))
        ):
            raise errors.SnapshotFormatError(f"malformed stage group {values['head']!r}")
        return cls(job, step, world_size, keep_committed, attempt, parts)


@dataclasses.dataclass(frozen=True)
class GroupResult:
    """The outcome of one ``StageGroup``: whether its step is committed now, the job's committed
    steps the stores keep (``keep_steps``, empty before the first commit: stores evict the
    others), and per rank the ray_ckpt error that refused its stage (``refused``: that stage
    changed nothing; the others went through)."""

    committed: bool = False
    keep_steps: tuple[int, ...] = ()
    refused: Mapping[int, errors.RayCkptError] = dataclasses.field(default_factory=dict)

    def for_ranks(self, ranks: Iterable[int]) -> GroupResult:
        """This result as seen by a part of the group: only its ranks' errors."""
        wanted = set(ranks)
        return dataclasses.replace(self, refused={r: e for r, e in self.refused.items() if r in wanted})

    def result(self, rank: int) -> StageResult:
        """What one rank of the group gets back."""
        error = self.refused.get(rank)
        return StageResult(committed=self.committed and error is None, error=error)

    def to_wire(self) -> dict[str, Any]:
        return {
            "committed": self.committed,
            "keep": list(self.keep_steps),
            "refused": [[rank, _error_to_wire(error)] for rank, error in self.refused.items()],
        }

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> GroupResult:
        return cls(
            committed=bool(values["committed"]),
            keep_steps=tuple(int(s) for s in values["keep"]),
            refused={int(rank): _error_from_wire(error) for rank, error in values["refused"]},
        )


@dataclasses.dataclass(frozen=True)
class PlanQuery:
    """Ranks of ``job`` asking for the restore plan of ``attempt`` and their records of its step."""

    job: str
    attempt: str | None
    ranks: tuple[int, ...]

    @property
    def key(self) -> tuple[str, str | None]:
        return (self.job, self.attempt)

    @staticmethod
    def merged(queries: Iterable[PlanQuery]) -> list[PlanQuery]:
        """Queries of the same job and attempt joined into one, in first-seen order."""
        ranks: dict[tuple[str, str | None], dict[int, None]] = {}
        for query in queries:
            ranks.setdefault(query.key, {}).update(dict.fromkeys(query.ranks))
        return [PlanQuery(job, attempt, tuple(asking)) for (job, attempt), asking in ranks.items()]

    def to_wire(self) -> list[Any]:
        return [self.job, self.attempt, list(self.ranks)]

    @classmethod
    def from_wire(cls, values: Sequence[Any]) -> PlanQuery:
        job, attempt, ranks = values
        query = cls(job, attempt, tuple(ranks))
        if not (
            isinstance(job, str)
            and (attempt is None or isinstance(attempt, str))
            and all(type(r) is int and r >= 0 for r in query.ranks)
        ):
            raise errors.ConfigError(f"malformed restore-plan query {list(values)!r}")
        return query


@dataclasses.dataclass(frozen=True)
class PlanAnswer:
    """An attempt's ``plan`` and, when it restores a step from memory, the asking ranks'
    records of it (``records``: rank -> ``RankLocation``; empty for a backup or nothing)."""

    plan: RestorePlan
    records: Mapping[int, RankLocation] = dataclasses.field(default_factory=dict)
    error: errors.RayCkptError | None = None  # why the registry refused the query (a stale attempt)

    def for_ranks(self, ranks: Iterable[int]) -> PlanAnswer:
        """This answer as seen by some of the asking ranks: only their records."""
        return dataclasses.replace(self, records={r: self.records[r] for r in ranks if r in self.records})

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def to_wire(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_wire(),
            "records": [[r, loc.to_wire()] for r, loc in self.records.items()],
            "error": None if self.error is None else _error_to_wire(self.error),
        }

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> PlanAnswer:
        error = values.get("error")
        return cls(
            RestorePlan.from_wire(values["plan"]),
            {int(rank): RankLocation.from_wire(loc) for rank, loc in values["records"]},
            None if error is None else _error_from_wire(error),
        )


@dataclasses.dataclass
class KillResult:
    """One simulated failure: the victim node, when it was struck (``kill_time``, on the
    victim's clock) and seen gone (``dead_time``, None when not waited for), the fault's
    ``mode``, the victim's ``host``, whether the events reached the registry (``recorded``),
    and what a schedule adds (``details``: e.g. the step a kill during a save caught)."""

    node_id: str
    kill_time: float
    mode: str
    host: str | None = None
    dead_time: float | None = None
    recorded: bool = False
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        """A flat dict: the fields, with ``details`` merged in."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "details"}
        return {**self.details, **fields}

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> KillResult:
        names = {f.name for f in dataclasses.fields(cls)} - {"details"}
        return cls(
            node_id=str(values["node_id"]),
            kill_time=float(values["kill_time"]),
            mode=str(values["mode"]),
            host=values.get("host"),
            dead_time=values.get("dead_time"),
            recorded=bool(values.get("recorded")),
            details={k: v for k, v in values.items() if k not in names},
        )
