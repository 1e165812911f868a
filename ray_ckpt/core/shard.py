"""ShardMeta: the self-describing record that travels and is stored with every shard."""

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


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardMeta:
    """Everything needed to use a shard without asking anyone else.

    job, step, rank, index: which shard this is (index < k: data, else parity).
    world_size: ranks that must stage ``step`` before it commits.
    data_shards, parity_shards: the code (k, m).
    payload_size: bytes of the coded payload (the caller of the codec keeps it).
    shard_size: bytes of this shard (ceil(payload_size / k)).
    checksum: XXH3-64 of this shard's bytes.
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

    @property
    def key(self) -> ShardKey:
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
        if meta.shard_size != -(-meta.payload_size // k):
            raise SnapshotFormatError(
                f"shard metadata is inconsistent: shard_size {meta.shard_size} for payload "
                f"{meta.payload_size} with k={k}"
            )
        return meta


_FIELDS = tuple(f.name for f in dataclasses.fields(ShardMeta))
