"""ShardMeta parsing, the blob prefix, and CheckpointConfig validation reject malformed input."""

from __future__ import annotations

import dataclasses
import math
import struct
from typing import Any

import numpy as np
import pytest

from ray_ckpt.config import CheckpointConfig
from ray_ckpt.core import blob
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.errors import ConfigError, SnapshotFormatError

VALID: dict[str, Any] = {
    "job": "train-42",
    "step": 100,
    "rank": 3,
    "index": 5,
    "world_size": 4,
    "data_shards": 4,
    "parity_shards": 2,
    "payload_size": 1001,
    "shard_size": 251,
    "checksum": 2**64 - 1,
    "attempt": "attempt-1",
    "writer": "writer-1",
    "checksum_parts": 1,
}
LOCAL = {**VALID, "index": 0, "data_shards": 1, "parity_shards": 0, "shard_size": 1001, "checksum_parts": 4}


def with_(**changes: Any) -> dict[str, Any]:
    return {**VALID, **changes}


def without(name: str) -> dict[str, Any]:
    return {key: value for key, value in VALID.items() if key != name}


def test_shard_meta_round_trips_through_dict() -> None:
    """from_dict(to_dict(meta)) == meta, and to_dict gives exactly the parsed values."""
    meta = ShardMeta.from_dict(dict(VALID))
    assert meta.to_dict() == VALID
    assert ShardMeta.from_dict(meta.to_dict()) == meta
    assert meta.key == ("train-42", 100, 3, 5, "writer-1")


@pytest.mark.parametrize(
    "values",
    [
        without("checksum"),
        without("job"),
        with_(extra=1),
        {},
        [("job", "x")],
        "not a dict",
        with_(job=7),
        with_(job=None),
        with_(step="100"),
        with_(step=1.0),
        with_(rank=None),
        with_(index=True),
        with_(world_size=False),
        with_(checksum=-1),
        with_(step=-1),
        with_(payload_size=-1),
        with_(data_shards=0, shard_size=0, payload_size=0),
        with_(data_shards=200, parity_shards=57, payload_size=200, shard_size=1),
        with_(index=6),
        with_(index=99),
        with_(rank=4),
        with_(world_size=0, rank=0),
        with_(shard_size=250),
        with_(shard_size=252),
        with_(payload_size=1005),
        without("writer"),
        with_(attempt=None),
        with_(writer="w" * 129),
        with_(checksum_parts=0),
        with_(checksum_parts=2),
        {**LOCAL, "checksum_parts": 257},
    ],
    ids=[
        "missing checksum",
        "missing job",
        "extra field",
        "empty",
        "a list",
        "a str",
        "job int",
        "job None",
        "step str",
        "step float",
        "rank None",
        "index bool",
        "world_size bool",
        "negative checksum",
        "negative step",
        "negative payload_size",
        "k=0",
        "k+m=257",
        "index == k+m",
        "index > k+m",
        "rank == world_size",
        "world_size 0",
        "shard_size too small",
        "shard_size too large",
        "payload too large for shard_size",
        "missing writer",
        "attempt None",
        "writer too long",
        "checksum_parts 0",
        "a coded shard's checksum of parts",
        "a local copy of 257 parts",
    ],
)
def test_shard_meta_from_dict_rejects_malformed_records(values: Any) -> None:
    """A malformed or inconsistent record raises SnapshotFormatError (never TypeError or a bad ShardMeta)."""
    with pytest.raises(SnapshotFormatError):
        ShardMeta.from_dict(values)


@pytest.mark.parametrize(
    "values",
    [
        with_(index=0, rank=0, world_size=1),
        with_(payload_size=0, shard_size=0),
        with_(data_shards=1, parity_shards=0, index=0, shard_size=1001),
        LOCAL,
        with_(data_shards=128, parity_shards=128, index=255, payload_size=257, shard_size=3),
    ],
    ids=["first shard of a single rank", "empty payload", "k=1 m=0", "a local copy of 4 parts", "k+m=256"],
)
def test_shard_meta_from_dict_accepts_edge_values(values: dict[str, Any]) -> None:
    """Boundary-valid records parse and round-trip."""
    assert ShardMeta.from_dict(values).to_dict() == values


def make_blob(header: bytes, payload: bytes) -> np.ndarray:
    buffer = np.full(blob.blob_size(len(header), len(payload)), 0xEE, dtype=np.uint8)
    offset = blob.write_prefix(buffer, header)
    buffer[offset:] = np.frombuffer(payload, dtype=np.uint8)
    return buffer


@pytest.mark.parametrize(
    ("header", "payload"),
    [
        (b"", b""),
        (b"h", b"payload"),
        (b"x" * 48, b"\x00" * 10),
        (b"y" * 49, b"z" * 1000),
        (b"\xff" * 300, b""),
    ],
)
def test_blob_write_prefix_and_split_round_trip(header: bytes, payload: bytes) -> None:
    """split returns the header written and the payload, which starts 64-byte aligned after zero padding."""
    buffer = make_blob(header, payload)
    offset = blob.payload_offset(len(header))
    assert offset % blob.ALIGN == 0
    assert offset >= 16 + len(header)
    assert not buffer[16 + len(header) : offset].any()
    got_header, got_payload = blob.split(buffer)
    assert got_header == header
    assert got_payload.tobytes() == payload
    assert np.shares_memory(got_payload, buffer) or not payload


def prefix(magic: bytes = blob.MAGIC, version: int = blob.VERSION, header_size: int = 0) -> bytes:
    return struct.pack("<4sIQ", magic, version, header_size)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (prefix(magic=b"XCKB") + bytes(48), "magic"),
        (prefix(version=blob.VERSION + 1) + bytes(48), "version"),
        (prefix(version=0) + bytes(48), "version"),
        (prefix(header_size=100) + bytes(48), "runs past"),
        (prefix(header_size=2**64 - 1) + bytes(48), "runs past"),
        (prefix()[:15], "shorter than its prefix"),
        (b"", "shorter than its prefix"),
    ],
    ids=["wrong magic", "newer version", "version 0", "header past end", "huge header", "15 bytes", "empty"],
)
def test_blob_split_rejects_malformed_buffers(raw: bytes, message: str) -> None:
    """split raises SnapshotFormatError naming the problem for each kind of malformed blob."""
    with pytest.raises(SnapshotFormatError, match=message):
        blob.split(np.frombuffer(raw, dtype=np.uint8))


def test_blob_split_rejects_a_truncated_blob() -> None:
    """A real blob cut short inside its header padding is rejected, not read past its end."""
    buffer = make_blob(b"h" * 60, b"p" * 10)
    with pytest.raises(SnapshotFormatError, match="runs past"):
        blob.split(buffer[: blob.payload_offset(60) - 1])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("data_shards", 0),
        ("data_shards", -3),
        ("data_shards", 2.0),
        ("data_shards", True),
        ("parity_shards", -1),
        ("parity_shards", "2"),
        ("parity_shards", False),
        ("keep_committed", 0),
        ("keep_committed", None),
        ("keep_committed", True),
        ("failure_domain_label", ""),
        ("failure_domain_label", 5),
        ("commit_timeout_s", 0),
        ("commit_timeout_s", -1.5),
        ("commit_timeout_s", "30"),
        ("commit_timeout_s", True),
        ("commit_timeout_s", math.nan),
        ("commit_timeout_s", math.inf),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: Any) -> None:
    """Each invalid setting raises ConfigError whose message names that setting."""
    with pytest.raises(ConfigError, match=field):
        CheckpointConfig(**{field: value})


@pytest.mark.parametrize(("k", "m"), [(200, 57), (1, 256), (256, 1)])
def test_config_rejects_more_than_256_shards(k: int, m: int) -> None:
    """data_shards + parity_shards > 256 raises ConfigError naming both settings and the total."""
    with pytest.raises(ConfigError, match=f"data_shards \\+ parity_shards = {k + m}"):
        CheckpointConfig(data_shards=k, parity_shards=m)


def test_config_accepts_boundary_values_and_round_trips() -> None:
    """Boundary-valid settings are accepted; to_dict/from_dict round-trips; total_shards is k+m."""
    config = CheckpointConfig(
        data_shards=255, parity_shards=1, keep_committed=1, failure_domain_label="zone", commit_timeout_s=0.5
    )
    assert config.total_shards == 256
    assert CheckpointConfig.from_dict(config.to_dict()) == config
    assert CheckpointConfig(parity_shards=0, commit_timeout_s=3).parity_shards == 0
    assert CheckpointConfig().total_shards == 6


def test_config_is_frozen() -> None:
    """A CheckpointConfig cannot be changed after construction."""
    config = CheckpointConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.data_shards = 8  # type: ignore[misc]
    assert config.data_shards == 4


def test_a_shard_address_is_a_hashable_ordered_record_that_round_trips_on_the_wire() -> None:
    meta = ShardMeta.from_dict(dict(VALID))
    address = ShardAddress.of(meta)
    assert address == ShardAddress("train-42", 100, 3, 5, writer="writer-1") and not address.local
    assert ShardAddress.from_wire(address.to_wire()) == address
    local = ShardAddress.local_copy("train-42", 100, 3, writer="writer-1")
    assert (local.index, local.local) == (0, True) and ShardAddress.from_wire(local.to_wire()) == local
    assert local != ShardAddress("train-42", 100, 3, 0, writer="writer-1")  # shard 0 is not the local copy
    assert {address: 1, local: 2}[ShardAddress.of(meta)] == 1
    assert sorted([address, local]) == [local, address]  # field by field: index 0 before 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        address.step = 7  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"job": 3}, "job"),
        ({"step": -1}, "step"),
        ({"step": 1.0}, "step"),
        ({"rank": True}, "rank"),
        ({"index": "0"}, "index"),
        ({"local": 1}, "local"),
        ({"writer": None}, "writer"),
        ({"local": True, "index": 2}, "index 0"),
    ],
)
def test_a_shard_address_names_its_bad_field(fields: dict[str, Any], named: str) -> None:
    values: dict[str, Any] = {"job": "j", "step": 1, "rank": 0, "index": 0, "local": False, "writer": "", **fields}
    with pytest.raises(ConfigError, match=named):
        ShardAddress(**values)
    wire = [values[name] for name in ("job", "step", "rank", "index", "local", "writer")]
    with pytest.raises(ConfigError, match=named):
        ShardAddress.from_wire(wire)
    with pytest.raises(ConfigError, match="on the wire"):
        ShardAddress.from_wire(wire[:5])
