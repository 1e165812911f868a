"""Shard metadata of one rank's step as the registry sees it (no bytes), for registry tests."""

from __future__ import annotations

from ray_ckpt.core.shard import ShardMeta


def shard_metas(
    job: str,
    step: int,
    rank: int,
    world_size: int,
    *,
    data_shards: int = 2,
    parity_shards: int = 1,
    payload_size: int = 100,
    tag: int = 0,
) -> list[ShardMeta]:
    """The k+m shards' metadata; ``tag`` goes into the checksum to tell stages apart."""
    return [
        ShardMeta(
            job=job,
            step=step,
            rank=rank,
            index=index,
            world_size=world_size,
            data_shards=data_shards,
            parity_shards=parity_shards,
            payload_size=payload_size,
            shard_size=-(-payload_size // data_shards),
            checksum=tag * 1_000_000 + step * 1000 + rank * 10 + index,
        )
        for index in range(data_shards + parity_shards)
    ]
