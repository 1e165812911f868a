"""ShardMeta: the self-describing record that travels and is stored with every shard."""

from __future__ import annotations

import dataclasses
from typing import Any

from ray_ckpt.errors import SnapshotFormatError

ShardKey = tuple[str, int, int, int]  # (job, step, rank, index)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardMeta:
    """Everything needed to use a shard without asking anyone else.

    job, step, rank, index: which shard this is (index < k: data, else parity).
    world_size: ranks that must stage ``step`` before it commits.
    data_shards, parity_shards: the code (k, m).
    payload_size: bytes of the coded payload (the caller of the codec keeps it).
    shard_size: bytes of this shard (ceil(payload_size / k)).
    checksum: XXH3-64 of this shard's bytes.
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

    @property
    def key(self) -> ShardKey:
        return (self.job, self.step, self.rank, self.index)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ShardMeta:
        """Parse and validate a record from an untrusted peer; SnapshotFormatError if malformed."""
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(values, dict) or set(values) != fields:
            raise SnapshotFormatError(f"shard metadata must have exactly the fields {sorted(fields)}")
        if not isinstance(values["job"], str):
            raise SnapshotFormatError("shard metadata field job must be a str")
        for name in fields - {"job"}:
            value = values[name]
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SnapshotFormatError(f"shard metadata field {name} must be an int >= 0, got {value!r}")
        meta = cls(**values)
        k, m = meta.data_shards, meta.parity_shards
        if k < 1 or k + m > 256 or meta.index >= k + m or meta.rank >= meta.world_size:
            raise SnapshotFormatError(f"shard metadata is inconsistent: {values}")
        if meta.shard_size != -(-meta.payload_size // k):
            raise SnapshotFormatError(
                f"shard metadata is inconsistent: shard_size {meta.shard_size} for payload "
                f"{meta.payload_size} with k={k}"
            )
        return meta
