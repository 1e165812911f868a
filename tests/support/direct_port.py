"""What the direct-read and direct-write tests share: a shard's metadata for given bytes, and a
connection to a store's port past its hello."""

from __future__ import annotations

import socket

import numpy as np

from ray_ckpt.core.checksum import checksum
from ray_ckpt.core.shard import ShardMeta
from ray_ckpt.transport import direct_reads
from ray_ckpt.transport.direct_reads import DirectReadServer


def shard_meta(data: np.ndarray, *, index: int = 0, writer: str = "") -> ShardMeta:
    """Job "j", step 4, rank 1 of 2, RS(2,1): the metadata of shard ``index`` holding ``data``."""
    return ShardMeta(
        job="j",
        step=4,
        rank=1,
        index=index,
        world_size=2,
        data_shards=2,
        parity_shards=1,
        payload_size=2 * data.size,
        shard_size=data.size,
        checksum=checksum(data),
        writer=writer,
    )


def authenticated(server: DirectReadServer, job: str = "j") -> socket.socket:
    """A connection past its hello (the hello's answer read)."""
    sock = socket.create_connection((server.host, server.port), timeout=5)
    name = job.encode()
    sock.sendall(direct_reads._HELLO.pack(direct_reads.MAGIC, bytes.fromhex(server.token(job)), len(name)) + name)
    assert direct_reads._recv_frame(sock, 1 << 10) == {"ok": True}
    return sock
