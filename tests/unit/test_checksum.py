"""Checksums of shards and local copies: a local copy's checksum combines its data shards'
(``checksum_parts``), catches a flipped byte anywhere, and costs a save no second pass over the
state: the save hashes each byte of its k+m shards once and nothing more."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest
from support.save_pipelines import lone_pipeline

from ray_ckpt import save as save_module
from ray_ckpt.core.checksum import checksum, combined, of_parts, verify
from ray_ckpt.core.codec import ReedSolomon
from ray_ckpt.core.placement import Node
from ray_ckpt.core.shard import ShardMeta


def padded(size: int, k: int, seed: int = 0) -> np.ndarray:
    """A save's buffer: ``size`` random bytes, zero-padded to k equal data shards."""
    shard = -(-size // k)
    buffer = np.zeros(shard * k, dtype=np.uint8)
    buffer[:size] = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    return buffer


@pytest.mark.parametrize("size", [1, 3, 5, 64, 1001, 1 << 16])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_the_checksum_of_parts_is_the_combined_checksum_of_the_data_shards(size: int, k: int) -> None:
    buffer = padded(size, k)
    shard = buffer.size // k
    digests = [checksum(buffer[i * shard : (i + 1) * shard]) for i in range(k)]
    assert of_parts(buffer[:size], k) == combined(digests)
    if k == 1:
        assert of_parts(buffer[:size], 1) == checksum(buffer[:size])


@pytest.mark.parametrize("k", [2, 3, 4])
def test_a_flipped_byte_anywhere_in_a_local_copy_fails_its_check(k: int) -> None:
    size = 1001
    buffer = padded(size, k, seed=k)
    body = buffer[:size].copy()
    meta = ShardMeta(
        job="j", step=0, rank=0, index=0, world_size=1, data_shards=1, parity_shards=0, payload_size=size,
        shard_size=size, checksum=of_parts(body, k), checksum_parts=k,
    )  # fmt: skip
    assert verify(meta, body)
    for position in (0, size // k - 1, size // k, size // 2, size - 1):
        body[position] ^= 0x01
        assert not verify(meta, body), position
        body[position] ^= 0x01
    assert not verify(ShardMeta(**{**meta.to_dict(), "checksum_parts": 1}), body)  # parts are part of the checksum


class FakeStores:
    """Stores that take every put at once; the nodes ``a``..``f`` run one each."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, ShardMeta, bool]] = []

    def storage_nodes(self, label: Any) -> list[Node]:
        return [Node(name) for name in "abcdef"]

    def put(self, node_id: str, meta: ShardMeta, data: np.ndarray, local: bool) -> Future[None]:
        assert verify(meta, data), (node_id, meta)
        self.puts.append((node_id, meta, local))
        done: Future[None] = Future()
        done.set_result(None)
        return done


def test_a_save_hashes_its_shards_once_and_its_local_copy_not_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """RS(4,2) with the local copy: the save hashes (k+m) x shard_size bytes, the shards'; the
    local copy's checksum comes from the data shards' and checks out against its bytes."""
    hashed: list[int] = []

    def counting(buffer: Any) -> int:
        hashed.append(np.asarray(buffer).nbytes)
        return checksum(buffer)

    monkeypatch.setattr(save_module, "checksum", counting)
    stores = FakeStores()
    saver = lone_pipeline("j", stores=stores, data_shards=4, parity_shards=2)
    size = 100_003
    code = ReedSolomon(4, 2)
    buffer = padded(size, 4)
    assert saver.complete(1, buffer, size, [], {}, 0.0)
    assert sum(hashed) == 6 * code.shard_size(size)
    locals_ = [meta for _, meta, local in stores.puts if local]
    assert len(locals_) == 1 and locals_[0].checksum_parts == 4 and locals_[0].payload_size == size
