"""What restore does with bytes a peer sends back: anything off is an erasure, never used."""

from __future__ import annotations

import numpy as np
import pytest

from ray_ckpt.core.checksum import checksum
from ray_ckpt.core.shard import ShardMeta
from ray_ckpt.restore import check_shard

DATA = np.arange(1000, dtype=np.uint8)
META = ShardMeta(
    job="j",
    step=3,
    rank=0,
    index=1,
    world_size=2,
    data_shards=2,
    parity_shards=1,
    payload_size=2000,
    shard_size=1000,
    checksum=checksum(DATA),
)


def test_an_intact_shard_is_accepted() -> None:
    """Matching metadata, size and checksum: usable."""
    assert check_shard((META.to_dict(), DATA.copy()), META) is None


@pytest.mark.parametrize(
    ("found", "reason"),
    [
        (None, "no longer holds"),
        ((META.to_dict(), DATA[:-1].copy()), "wrong size"),  # truncated
        ((META.to_dict(), np.concatenate([DATA, DATA[:1]])), "wrong size"),  # padded
        ((META.to_dict(), DATA.astype(np.int16)), "wrong size"),  # wrong dtype
        ((META.to_dict(), np.where(DATA == 7, 8, DATA).astype(np.uint8)), "checksum mismatch"),  # one byte changed
        (({**META.to_dict(), "step": 2}, DATA.copy()), "differs from the registry"),  # another step's shard
        (({**META.to_dict(), "checksum": "x"}, DATA.copy()), "malformed metadata"),  # forged record
        (({"job": "j"}, DATA.copy()), "malformed metadata"),
    ],
)
def test_a_bad_shard_is_rejected_with_a_reason(found: object, reason: str) -> None:
    """Truncated, padded, mistyped, corrupted, mismatched or forged shards are refused."""
    result = check_shard(found, META)
    assert result is not None and reason in result
