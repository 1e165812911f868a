"""Per-shard checksums: 64-bit XXH3 (xxhash), which runs at tens of GB/s on one core.

A shard's ``ShardMeta.checksum`` is the digest of its bytes. A rank's local copy (the whole
state, which the save's k data shards already cover, as slices of one buffer) carries instead
the digest of its parts' digests (``of_parts``): part i is data shard i's bytes, the last
ones zero-padded as the data shards are, so the save reuses the data shards' checksums and
does not hash the state a second time. ``ShardMeta.checksum_parts`` says which it is, and
``verify`` checks either.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import xxhash

from ray_ckpt.core.hostmem import as_bytes


def checksum(buffer: Any) -> int:
    """The XXH3-64 digest of a C-contiguous buffer's bytes, as an unsigned int."""
    return int(xxhash.xxh3_64_intdigest(as_bytes(buffer).data))


def matches(buffer: Any, expected: int) -> bool:
    """True when the buffer's bytes hash to ``expected``."""
    return checksum(buffer) == expected


def combined(digests: Sequence[int]) -> int:
    """The checksum of a buffer made of parts whose digests are ``digests``, in order: the one
    digest itself for one part, else the XXH3-64 of the digests as little-endian u64s."""
    if len(digests) == 1:
        return int(digests[0])
    return int(xxhash.xxh3_64_intdigest(struct.pack(f"<{len(digests)}Q", *digests)))


def of_parts(buffer: Any, parts: int) -> int:
    """``combined`` over the digests of ``parts`` equal parts of the buffer, each
    ``ceil(size / parts)`` bytes, the last ones zero-padded to that size (how a save splits
    its state into data shards)."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    data = as_bytes(buffer)
    if parts == 1:
        return checksum(data)
    part = -(-data.size // parts)
    digests = []
    for i in range(parts):
        piece = data[i * part : (i + 1) * part]
        if piece.size == part:
            digests.append(checksum(piece))
        else:
            hasher = xxhash.xxh3_64(piece.data)
            hasher.update(bytes(part - piece.size))
            digests.append(hasher.intdigest())
    return combined(digests)


def verify(meta: Any, data: Any) -> bool:
    """True when ``data`` matches ``meta.checksum`` (a ``ShardMeta``), as its
    ``checksum_parts`` says it was taken."""
    return of_parts(data, meta.checksum_parts) == meta.checksum
