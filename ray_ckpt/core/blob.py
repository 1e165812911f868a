"""The coded blob: one rank's checkpoint as a single buffer (prefix, snapshot header, tensor bytes).

Layout: 16-byte prefix (magic b"RCKB", u32 version, u64 header length), the msgpack snapshot
header, zero padding to a 64-byte boundary, then the snapshot payload. Coding the header with
the tensors means a rank's whole checkpoint is rebuilt from any k shards, with no separate
metadata to replicate.
"""

from __future__ import annotations

import struct

import numpy as np

from ray_ckpt.errors import SnapshotFormatError

MAGIC = b"RCKB"
VERSION = 1
_PREFIX = struct.Struct("<4sIQ")
ALIGN = 64


def payload_offset(header_size: int) -> int:
    """Where the snapshot payload starts, for a header of ``header_size`` bytes."""
    return -(-(_PREFIX.size + header_size) // ALIGN) * ALIGN


def blob_size(header_size: int, payload_size: int) -> int:
    return payload_offset(header_size) + payload_size


def write_prefix(buffer: np.ndarray, header: bytes) -> int:
    """Write prefix, header and padding into ``buffer``; returns the payload offset."""
    offset = payload_offset(len(header))
    _PREFIX.pack_into(buffer.data, 0, MAGIC, VERSION, len(header))
    buffer[_PREFIX.size : _PREFIX.size + len(header)] = np.frombuffer(header, dtype=np.uint8)
    buffer[_PREFIX.size + len(header) : offset] = 0
    return offset


PREFIX_SIZE = _PREFIX.size


def header_size(prefix: np.ndarray) -> int:
    """The snapshot header's length from a blob's first PREFIX_SIZE bytes; SnapshotFormatError
    if they are not a blob prefix this build reads."""
    if prefix.size < _PREFIX.size:
        raise SnapshotFormatError(f"checkpoint blob of {prefix.size} bytes is shorter than its prefix")
    magic, version, size = _PREFIX.unpack_from(prefix.data, 0)
    if magic != MAGIC:
        raise SnapshotFormatError(f"checkpoint blob has magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise SnapshotFormatError(f"checkpoint blob version {version} is not supported (this build reads {VERSION})")
    return int(size)


def split(buffer: np.ndarray) -> tuple[bytes, np.ndarray]:
    """(snapshot header, payload view) of a rebuilt blob; SnapshotFormatError if malformed."""
    size = header_size(buffer)
    offset = payload_offset(size)
    if offset > buffer.size:
        raise SnapshotFormatError(f"checkpoint blob header of {size} bytes runs past its {buffer.size} bytes")
    return buffer[_PREFIX.size : _PREFIX.size + size].tobytes(), buffer[offset:]
