"""ShardMeta, the self-describing record that travels and is stored with every shard, and
ShardAddress, the key a store holds it under and a reader names it by."""

from __future__ import annotations

import dataclasses
from typing import Any

from ray_ckpt.config import MAX_SHARDS
from ray_ckpt.errors import ConfigError, SnapshotFormatError

ShardKey = tuple[str, int, int, int, str]  # (job, step, rank, index, writer)
SAVE_ID_MAX = 128  # characters of an attempt or writer id
STEP_MAX = 2**63 - 1  # the largest step: a signed 64-bit int, which every store, wire and reader holds


def check_step(step: object) -> int:
    """``step`` when it is an int in [0, STEP_MAX] (not a bool); ConfigError naming the limit
    otherwise. For the steps a caller hands to ``save`` and ``restore``."""
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= STEP_MAX:
        raise ConfigError(f"step must be an int in [0, 2**63), got {step!r}")
    return step


@dataclasses.dataclass(frozen=True, order=True, slots=True)
class ShardAddress:
    """Where one shard is kept in a store, and what a reader names to get it back: the shard
    ``index`` of rank ``rank``'s save of ``step`` of ``job`` by ``writer`` (the Checkpointer that
    saved it, ``ShardMeta.writer``), or with ``local`` that save's full local copy.

    A local copy is kept apart from the coded shards by ``local`` alone, never by its index: it
    is the one shard of a k=1, m=0 code, so its index is always 0, as its ``ShardMeta`` says
    (``ShardAddress.of(meta, local=True)``), and an address with ``local`` and another index is
    refused. Shard 0 of the coded save and the local copy are thus two addresses that differ
    only in ``local``.

    Frozen and hashable (a store's table is keyed by it), ordered field by field. The fields are
    checked here: ConfigError names the bad one. Across an actor boundary it travels as
    ``to_wire()``, a list; the direct-read protocol keeps its own request fields
    (``ray_ckpt.transport.direct_reads``).
    """

    job: str
    step: int
    rank: int
    index: int
    _: dataclasses.KW_ONLY
    local: bool = False
    writer: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.job, str):
            raise ConfigError(f"a shard address's job must be a str, got {self.job!r}")
        for name in ("step", "rank", "index"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"a shard address's {name} must be an int >= 0, got {value!r}")
        if not isinstance(self.local, bool):
            raise ConfigError(f"a shard address's local must be a bool, got {self.local!r}")
        if not isinstance(self.writer, str):
            raise ConfigError(f"a shard address's writer must be a str (a Checkpointer's id), got {self.writer!r}")
        if self.local and self.index != 0:
            raise ConfigError(
                f"a local copy's address has index 0 (the one shard of its k=1, m=0 code), got index {self.index}: "
                "address a coded shard with local=False, or the local copy with index 0"
            )

    @classmethod
    def of(cls, meta: ShardMeta, *, local: bool = False) -> ShardAddress:
        """The address of the shard ``meta`` describes, or with ``local`` of the local copy it
        describes (index 0)."""
        return cls(meta.job, meta.step, meta.rank, meta.index, local=local, writer=meta.writer)

    @classmethod
    def local_copy(cls, job: str, step: int, rank: int, *, writer: str = "") -> ShardAddress:
        """The address of rank ``rank``'s full local copy of ``step`` saved by ``writer``."""
        return cls(job, step, rank, 0, local=True, writer=writer)

    def to_wire(self) -> list[Any]:
        return [self.job, self.step, self.rank, self.index, self.local, self.writer]

    @classmethod
    def from_wire(cls, values: Any) -> ShardAddress:
        """Parse ``to_wire``'s list; ConfigError if malformed."""
        if not isinstance(values, (list, tuple)) or len(values) != 6:
            raise ConfigError(f"a shard address on the wire is [job, step, rank, index, local, writer], got {values!r}")
        job, step, rank, index, local, writer = values
        return cls(job, step, rank, index, local=local, writer=writer)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardMeta:
    """Everything needed to use a shard without asking anyone else.

    job, step, rank, index: which shard this is (index < k: data, else parity).
    world_size: ranks that must stage ``step`` before it commits.
    data_shards, parity_shards: the code (k, m).
    payload_size: bytes of the coded payload (the caller of the codec keeps it).
    shard_size: bytes of this shard (ceil(payload_size / k)).
    checksum: XXH3-64 of this shard's bytes; with ``checksum_parts`` p > 1 (a rank's local
    copy), of the digests of its p equal parts, the save's data shards
    (``ray_ckpt.core.checksum.of_parts``; ``verify`` checks either).
    attempt: the incarnation of the job that saved it ("" for none; docs/commit-protocol.md).
    writer: the Checkpointer that saved it (a random id): two saves of one (step, rank) never
    share a key, so neither can overwrite or be mistaken for the other.
    """

    job: str
    step: int
    rank: int
    index: int
    world_size: int
    data_shards: int
    parity_shards: int
    payload_size: int
    shard_size: int
    checksum: int
    attempt: str = ""
    writer: str = ""
    checksum_parts: int = 1

    @property
    def key(self) -> ShardKey:
        """Which save's shard this is, as a plain tuple (job, step, rank, index, writer). A
        store keeps it at ``ShardAddress.of(meta)`` (``local=True`` for a local copy)."""
        return (self.job, self.step, self.rank, self.index, self.writer)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ShardMeta:
        """Parse and validate a record from an untrusted peer; SnapshotFormatError if malformed."""
        fields = {f.name for f in dataclasses.fields(cls)}
        texts = {"job", "attempt", "writer"}
        if not isinstance(values, dict) or set(values) != fields:
            raise SnapshotFormatError(f"shard metadata must have exactly the fields {sorted(fields)}")
        for name in sorted(texts):
            if not isinstance(values[name], str):
                raise SnapshotFormatError(f"shard metadata field {name} must be a str")
            if name != "job" and len(values[name]) > SAVE_ID_MAX:
                raise SnapshotFormatError(f"shard metadata field {name} is over {SAVE_ID_MAX} characters")
        for name in fields - texts:
            value = values[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SnapshotFormatError(f"shard metadata field {name} must be an int >= 0, got {value!r}")
        meta = cls(**values)
        k, m = meta.data_shards, meta.parity_shards
        if k < 1 or k + m > MAX_SHARDS or meta.index >= k + m or meta.rank >= meta.world_size:
            raise SnapshotFormatError(f"shard metadata is inconsistent: {values}")
        if not 1 <= meta.checksum_parts <= MAX_SHARDS or (meta.checksum_parts > 1 and (k, m) != (1, 0)):
            raise SnapshotFormatError(
                f"shard metadata is inconsistent: checksum_parts {meta.checksum_parts} (1 for a coded shard, "
                f"1 to {MAX_SHARDS} for a local copy)"
            )
        if meta.shard_size != -(-meta.payload_size // k):
            raise SnapshotFormatError(
                f"shard metadata is inconsistent: shard_size {meta.shard_size} for payload "
                f"{meta.payload_size} with k={k}"
            )
        return meta


_FIELDS = tuple(f.name for f in dataclasses.fields(ShardMeta))
