"""Direct writes: a shard written over a store's socket is stored bit-exact under its address;
the store takes its budget before a byte is sent (a full store refuses with StoreFullError and
nothing is stored); a wrong token, another job's shard, malformed metadata and a write that
breaks off midway each store nothing, give their memory back, and leave the server serving."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import numpy as np
import pytest
from support.direct_port import authenticated, shard_meta

from ray_ckpt.core.identity import JOB_MAX_BYTES, RankIdentity
from ray_ckpt.core.shard import ShardAddress
from ray_ckpt.core.store import ShardStore
from ray_ckpt.errors import ConfigError, StoreFullError
from ray_ckpt.transport import direct_reads
from ray_ckpt.transport.direct_reads import DirectReadServer, Endpoint

SIZE = 3 << 20


@pytest.fixture
def data() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, SIZE, dtype=np.uint8)


@pytest.fixture
def store() -> ShardStore:
    return ShardStore(node_id="n", budget_bytes=4 * SIZE)


@pytest.fixture
def server(store: ShardStore) -> Iterator[DirectReadServer]:
    served = DirectReadServer(store, "127.0.0.1")
    yield served
    served.close()


def _used(store: ShardStore) -> tuple[int, int]:
    stats = store.stats()
    return stats.used_bytes, store._reserved


@pytest.mark.parametrize("same_node", [False, True], ids=["tcp", "unix"])
def test_a_shard_and_a_local_copy_written_directly_are_stored_bit_exact(
    server: DirectReadServer, store: ShardStore, data: np.ndarray, same_node: bool
) -> None:
    meta = shard_meta(data)
    direct_reads.write(server.endpoint("j"), meta, data, local=False, timeout_s=5.0, same_node=same_node)
    direct_reads.write(server.endpoint("j"), meta, data[::-1].copy(), local=True, timeout_s=5.0, same_node=same_node)
    stored = store.get(ShardAddress.of(meta))
    assert stored is not None and stored[0] == meta and stored[1].tobytes() == data.tobytes()
    copy = store.get(ShardAddress.of(meta, local=True))
    assert copy is not None and copy[1].tobytes() == data[::-1].tobytes()
    assert (server.writes, server.bytes_received) == (2, 2 * SIZE)
    assert store._reserved == 0


def test_a_full_store_refuses_before_any_byte_is_sent(data: np.ndarray) -> None:
    small = ShardStore(node_id="n", budget_bytes=SIZE)  # no room for the metadata beside the bytes
    server = DirectReadServer(small, "127.0.0.1")
    try:
        with pytest.raises(StoreFullError) as refused:
            direct_reads.write(server.endpoint("j"), shard_meta(data), data, local=False, timeout_s=5.0)
        assert refused.value.budget_bytes == SIZE and refused.value.node_id == "n"
        assert "Raise the budget" in str(refused.value)
        assert small.stats().used_bytes == 0 and small._reserved == 0 and server.bytes_received == 0
    finally:
        server.close()


def test_a_wrong_token_or_another_jobs_shard_stores_nothing(
    server: DirectReadServer, store: ShardStore, data: np.ndarray
) -> None:
    wrong = Endpoint(server.host, server.port, server.token("other"), None)
    with pytest.raises(ValueError, match="wrong token"):
        direct_reads.write(wrong, shard_meta(data), data, local=False, timeout_s=5.0)
    with authenticated(server, "other") as sock:  # other's token, j's shard
        direct_reads._send_frame(sock, {"op": "put", "meta": shard_meta(data).to_dict(), "local": False})
        refused = direct_reads._recv_frame(sock, 1 << 10)
        assert refused == {"error": "ValueError: this connection writes job 'other', not 'j'"}
    assert _used(store) == (0, 0)


@pytest.mark.parametrize(
    "meta",
    [
        "not a map",
        {"job": "j"},  # fields missing
        {**shard_meta(np.zeros(8, np.uint8)).to_dict(), "shard_size": 1 << 40},  # inconsistent with the payload
        {**shard_meta(np.zeros(8, np.uint8)).to_dict(), "step": -1},
        {**shard_meta(np.zeros(8, np.uint8)).to_dict(), "rank": True},
    ],
    ids=["not-a-map", "fields-missing", "size-inconsistent", "negative-step", "bool-rank"],
)
def test_malformed_metadata_is_answered_with_an_error_and_nothing_is_reserved(
    server: DirectReadServer, store: ShardStore, meta: object
) -> None:
    with authenticated(server) as sock:
        direct_reads._send_frame(sock, {"op": "put", "meta": meta, "local": False})
        answer = direct_reads._recv_frame(sock, 1 << 16)
        assert set(answer) == {"error"}, answer
    assert _used(store) == (0, 0)


def test_a_write_that_breaks_off_midway_stores_nothing_and_frees_its_reservation(
    server: DirectReadServer, store: ShardStore, data: np.ndarray
) -> None:
    meta = shard_meta(data)
    with authenticated(server) as sock:
        direct_reads._send_frame(sock, {"op": "put", "meta": meta.to_dict(), "local": False})
        assert direct_reads._recv_frame(sock, 1 << 10) == {"ready": True}
        sock.sendall(data[: SIZE // 2].tobytes())  # then the writer dies
    deadline = time.monotonic() + 5.0
    while store._reserved and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _used(store) == (0, 0)
    assert store.get(ShardAddress.of(meta)) is None
    direct_reads.write(server.endpoint("j"), meta, data, local=False, timeout_s=5.0)  # the server serves on
    stored = store.get(ShardAddress.of(meta))
    assert stored is not None and stored[1].tobytes() == data.tobytes()


def test_the_longest_job_name_a_checkpointer_takes_is_written_and_read_over_the_port(
    server: DirectReadServer, store: ShardStore, data: np.ndarray
) -> None:
    """One limit: a job of JOB_MAX_BYTES bytes of UTF-8 passes the identity check and the port
    serves it; one byte more is a ConfigError naming the limit where the job is named, so no
    save reaches the port with a name it would refuse (a ValueError that skipped the fallback)."""
    job = "é" * (JOB_MAX_BYTES // 2)
    assert len(job.encode()) == JOB_MAX_BYTES
    RankIdentity.check(job=job, rank=1, world_size=2, attempt=None)
    meta = dataclasses.replace(shard_meta(data), job=job)
    direct_reads.write(server.endpoint(job), meta, data, local=False, timeout_s=5.0)
    _, _, (whole,) = direct_reads.read(  # type: ignore[misc]
        server.endpoint(job), ShardAddress.of(meta), ranges=None, timeout_s=5.0
    )
    assert whole.tobytes() == data.tobytes()
    with pytest.raises(ConfigError, match=f"more than the {JOB_MAX_BYTES} a job name may have") as refused:
        RankIdentity.check(job=job + "x", rank=1, world_size=2, attempt=None)
    assert (refused.value.job_bytes, refused.value.max_bytes) == (JOB_MAX_BYTES + 1, JOB_MAX_BYTES)
