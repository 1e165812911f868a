"""Wire records: what crosses an actor boundary, as frozen dataclasses with ``to_wire/from_wire``.

Actors send and return plain dicts (msgpack-friendly: str and int keys, no objects of ours),
built by ``to_wire``; the receiving side parses them once with ``from_wire`` and works with the
typed record. Nobody re-parses a dict by hand. Pure: no Ray import.

- ``RankRecord``: where one rank's shards of one step live (and its local copy), with the
  code parameters and the protection derived from it.
- ``RestorePlan``: the step every rank of an attempt restores, and from where.
- ``StoreHoldings``: what one store holds, for rebuilding the registry.
- ``KillResult``: one simulated failure (the kill tool's answer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container, Mapping
from typing import Any

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
