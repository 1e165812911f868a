"""What restore does with bytes a peer sends back: anything off is an erasure, never used."""

from __future__ import annotations

import numpy as np
import pytest
from support.direct_port import shard_meta

from ray_ckpt.core.shard import ShardMeta
from ray_ckpt.core.wire import FoundShard
from ray_ckpt.errors import SnapshotFormatError
from ray_ckpt.restore import check_shard

DATA = np.arange(1000, dtype=np.uint8)
META = shard_meta(DATA, step=3, rank=0, index=1)  # job "j", RS(2,1) of a 2000-byte payload


def test_an_intact_shard_is_accepted() -> None:
    """Matching metadata, size and checksum: usable."""
    assert check_shard(FoundShard.from_wire([META.to_dict(), DATA.copy()]), META) is None


@pytest.mark.parametrize(
    ("found", "reason"),
    [
        (None, "no longer holds"),
        (FoundShard(META, DATA[:-1].copy()), "wrong size"),  # truncated
        (FoundShard(META, np.concatenate([DATA, DATA[:1]])), "wrong size"),  # padded
        (FoundShard(META, DATA.astype(np.int16)), "wrong size"),  # wrong dtype
        (FoundShard(META, np.where(DATA == 7, 8, DATA).astype(np.uint8)), "checksum mismatch"),  # one byte changed
        (FoundShard(ShardMeta(**{**META.to_dict(), "step": 2}), DATA.copy()), "differs from the registry"),
    ],
)
def test_a_bad_shard_is_rejected_with_a_reason(found: FoundShard | None, reason: str) -> None:
    """Truncated, padded, mistyped, corrupted or mismatched (another step's) shards are refused."""
    result = check_shard(found, META)
    assert result is not None and reason in result


@pytest.mark.parametrize(
    "answer",
    [
        [{**META.to_dict(), "checksum": "x"}, DATA.copy()],  # forged record
        [{"job": "j"}, DATA.copy()],
        [META.to_dict()],  # no bytes
        "not an answer",
    ],
)
def test_a_malformed_answer_is_refused_when_it_is_parsed(answer: object) -> None:
    """A store's answer whose metadata is forged or incomplete, or that is no answer at all, is
    never a ``FoundShard``: SnapshotFormatError, which restore counts as an erasure."""
    with pytest.raises(SnapshotFormatError):
        FoundShard.from_wire(answer)  # type: ignore[arg-type]
