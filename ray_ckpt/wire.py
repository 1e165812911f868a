"""Wire records: what crosses an actor boundary, as frozen dataclasses with ``to_wire/from_wire``.

Actors send and return plain dicts (msgpack-friendly: str and int keys, no objects of ours),
built by ``to_wire``; the receiving side parses them once with ``from_wire`` and works with the
typed record. Nobody re-parses a dict by hand. Pure: no Ray import.

- ``RankRecord``: where one rank's shards of one step live (and its local copy), with the
  code parameters and the protection derived from it.
- ``RankLocation``: one rank's ``RankRecord`` of a committed step and the step's world size
  (a restoring rank's share of the registry's view, O(1) in the world size).
- ``RestorePlan``: the step every rank of an attempt restores, and from where.
- ``StoreHoldings``: what one store holds, for rebuilding the registry.
- ``KillResult``: one simulated failure (the kill tool's answer).
- ``StageRequest`` / ``StageResult``: one rank's stage of one step and its outcome, as a
  node's store forwards them to the registry in one batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Mapping
from typing import Any

from ray_ckpt import errors
from ray_ckpt.protection import rank_protection
from ray_ckpt.shard import ShardMeta


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

    @property
    def data_shards(self) -> int:
        return self.first.data_shards

    @property
    def parity_shards(self) -> int:
        return self.first.parity_shards

    @property
    def payload_size(self) -> int:
        return self.first.payload_size

    @property
    def shard_size(self) -> int:
        return self.first.shard_size

    @property
    def world_size(self) -> int:
        return self.first.world_size

    def live_shards(self, live_nodes: Container[str]) -> int:
        return sum(1 for node in self.nodes.values() if node in live_nodes)

    def protection(self, live_nodes: Container[str] | None = None) -> int:
        """Node losses these shards survive from now (see ray_ckpt.protection)."""
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
class RestorePlan:
    """The step all ranks of one attempt restore. ``source``: "peers" (``step`` is committed
    and every rank can rebuild it from memory; ``world_size`` ranks saved it), "backup" (use
    the newest complete persistent backup) or None (nothing was ever committed).
    ``newest_committed`` and ``newest_staged`` (the newest step any rank staged) let a
    restore forget unrebuildable newer steps and count the steps a failure lost."""

    step: int | None = None
    source: str | None = None
    ever_committed: bool = False
    newest_committed: int | None = None
    newest_staged: int | None = None
    world_size: int | None = None

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> RestorePlan:
        return cls(
            step=values.get("step"),
            source=values.get("source"),
            ever_committed=bool(values.get("ever_committed")),
            newest_committed=values.get("newest_committed"),
            newest_staged=values.get("newest_staged"),
            world_size=values.get("world_size"),
        )


@dataclasses.dataclass(frozen=True)
class StoreHoldings:
    """What one store holds: its node, the metadata of every shard, and per job the newest
    step it was told committed."""

    node_id: str
    metas: tuple[ShardMeta, ...]
    committed: Mapping[str, int]

    def to_wire(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "metas": [m.to_dict() for m in self.metas], "committed": dict(self.committed)}

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> StoreHoldings:
        return cls(
            node_id=str(values["node_id"]),
            metas=tuple(ShardMeta.from_dict(m) for m in values["metas"]),
            committed={str(j): int(s) for j, s in values["committed"].items()},
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
    )


def _checked_shared(shared: Any) -> tuple[Any, ...]:
    """The fields a rank's shards share (``_shared``), validated as ``ShardMeta.from_dict``
    validates a record; SnapshotFormatError if malformed."""
    if not isinstance(shared, (list, tuple)) or len(shared) != 8:
        raise errors.SnapshotFormatError("shared shard metadata must list job, step, rank, world_size, k, m, sizes")
    job, _step, rank, world_size, k, m, payload_size, shard_size = shared
    if not isinstance(job, str):
        raise errors.SnapshotFormatError("shard metadata field job must be a str")
    if not all(type(n) is int and n >= 0 for n in shared[1:]):
        raise errors.SnapshotFormatError(f"shard metadata fields must be ints >= 0, got {shared}")
    if k < 1 or k + m > 256 or rank >= world_size or shard_size != -(-payload_size // k):
        raise errors.SnapshotFormatError(f"shard metadata is inconsistent: {shared}")
    return tuple(shared)


def _meta(shared: tuple[Any, ...], index: int, digest: int) -> ShardMeta:
    job, step, rank, world_size, k, m, payload_size, shard_size = shared
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
        error = None
        if self.error is not None:
            error = {"kind": type(self.error).__name__, "message": self.error.message, "details": self.error.details}
        return {"committed": self.committed, "error": error}

    @classmethod
    def from_wire(cls, values: Mapping[str, Any]) -> StageResult:
        error = values.get("error")
        if error is None:
            return cls(committed=bool(values.get("committed")))
        kind = getattr(errors, str(error.get("kind")), None)
        if not (isinstance(kind, type) and issubclass(kind, errors.RayCkptError)):
            kind = errors.RayCkptError
        return cls(committed=False, error=kind(str(error.get("message")), **dict(error.get("details") or {})))


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
