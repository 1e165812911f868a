"""What the direct-read and direct-write tests share (and the checks of fetched shards): a
shard's metadata for given bytes, and a connection to a store's port past its hello."""

from __future__ import annotations

import socket

import numpy as np

from ray_ckpt.core.shard import ShardMeta
from ray_ckpt.save import SaveOrigin, shard_metas
from ray_ckpt.transport import direct_reads
from ray_ckpt.transport.direct_reads import DirectReadServer


def shard_meta(data: np.ndarray, *, step: int = 4, rank: int = 1, index: int = 0, writer: str = "") -> ShardMeta:
    """Job "j", rank ``rank`` of 2, RS(2,1): the metadata a save writes for shard ``index`` of
    ``step`` holding ``data`` (``ray_ckpt.save.shard_metas``)."""
    origin = SaveOrigin(job="j", step=step, rank=rank, world_size=2, attempt="", writer=writer)
    return shard_metas([data] * 3, 2 * data.size, data_shards=2, **origin)[index]


def authenticated(server: DirectReadServer, job: str = "j") -> socket.socket:
    """A connection past its hello (the hello's answer read)."""
    sock = socket.create_connection((server.host, server.port), timeout=5)
    name = job.encode()
    sock.sendall(direct_reads._HELLO.pack(direct_reads.MAGIC, bytes.fromhex(server.token(job)), len(name)) + name)
    assert direct_reads._recv_frame(sock, 1 << 10) == {"ok": True}
    return sock
