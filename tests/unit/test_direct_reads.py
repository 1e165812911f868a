"""Direct reads: a store's shards and byte ranges over its socket, bit-exact; bytes land in the
caller's arrays only when the store vouches for them; a wrong token, a missing shard, a bad
range, a corrupted shard, garbage on the wire and a closed server each give their answer."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from support.direct_port import authenticated, shard_meta

from ray_ckpt.core import store as store_module
from ray_ckpt.core.checksum import checksum
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.store import ShardStore
from ray_ckpt.transport import direct_reads
from ray_ckpt.transport.direct_reads import DirectReadServer, Endpoint, Landing

SIZE = 3 << 20  # over hostmem's threshold, so received bytes go to mapped memory


@pytest.fixture
def served() -> Iterator[tuple[DirectReadServer, np.ndarray]]:
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8)
    store = ShardStore(node_id="n", budget_bytes=1 << 30)
    store.put(shard_meta(data), data)
    store.put(shard_meta(data), data, local=True)
    server = DirectReadServer(store, "127.0.0.1")
    yield server, data
    server.close()


def _read(endpoint: Endpoint, **kwargs: object) -> object:
    args: dict[str, object] = {"job": "j", "step": 4, "rank": 1, "index": 0, "local": False, "timeout_s": 5.0}
    args.update(kwargs)
    address = ShardAddress(**{name: args.pop(name) for name in ("job", "step", "rank", "index", "local")})  # type: ignore[arg-type]
    return direct_reads.read(endpoint, address, **args)  # type: ignore[arg-type]


def test_ranges_and_whole_shards_come_back_bit_exact(served: tuple[DirectReadServer, np.ndarray]) -> None:
    server, data = served
    spans = [(0, 10), (100, 100), (SIZE - 4096, SIZE), (7, 1 << 20)]
    meta, intact, pieces = _read(server.endpoint("j"), ranges=spans)  # type: ignore[misc]
    assert ShardMeta.from_dict(meta) == shard_meta(data)
    assert intact is True
    assert [p.tobytes() for p in pieces] == [data[a:b].tobytes() for a, b in spans]
    meta, intact, (whole,) = _read(server.endpoint("j"), ranges=None, local=True)  # type: ignore[misc]
    assert intact is None  # the reader checks a whole shard itself
    assert whole.flags.writeable and np.array_equal(whole, data)
    assert server.reads == 2
    assert server.bytes_sent == sum(b - a for a, b in spans) + SIZE


def test_bytes_land_in_the_callers_arrays_only_when_the_store_vouches_for_them(
    served: tuple[DirectReadServer, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, data = served
    monkeypatch.setattr(store_module, "INTACT_TTL_S", 0.0)  # every read hashes the shard again
    spans = [(0, 1 << 20), (5, 9)]
    target = np.zeros(1 << 20, dtype=np.uint8)
    _, _, pieces = _read(server.endpoint("j"), ranges=spans, into=Landing(checksum(data), [target, None]))  # type: ignore[misc]
    assert pieces[0] is target and np.array_equal(target, data[: 1 << 20])
    assert pieces[1].tobytes() == data[5:9].tobytes()

    other = np.zeros(1 << 20, dtype=np.uint8)  # another checksum: not the shard the caller expects
    _, _, pieces = _read(server.endpoint("j"), ranges=spans, into=Landing(checksum(data) ^ 1, [other, None]))  # type: ignore[misc]
    assert pieces[0] is not other and not other.any()
    assert np.array_equal(pieces[0], data[: 1 << 20])

    # corrupt the store's own copy of the shard (once the verdict is old)
    held = server.store.get(ShardAddress("j", 4, 1, 0))
    assert held is not None
    held[1][SIZE - 1] ^= 0xFF
    landed = np.zeros(1 << 20, dtype=np.uint8)
    _, intact, pieces = _read(server.endpoint("j"), ranges=spans, into=Landing(checksum(data), [landed, None]))  # type: ignore[misc]
    assert intact is False
    assert pieces[0] is not landed and not landed.any()


def test_a_whole_shard_lands_where_the_caller_says_when_it_fits(served: tuple[DirectReadServer, np.ndarray]) -> None:
    """``whole_into``: the whole shard is received into the caller's array (asked for once the
    store answered, so the caller may still be mapping it) when that array fits; a read of
    ranges or an array of another size or type gets fresh memory."""
    server, data = served
    asked: list[int] = []
    target = np.zeros(SIZE, dtype=np.uint8)

    def place() -> np.ndarray:
        asked.append(1)
        return target

    _, intact, (whole,) = _read(server.endpoint("j"), ranges=None, whole_into=place)  # type: ignore[misc]
    assert whole is target and np.array_equal(target, data) and asked == [1]
    assert intact is None  # unchecked: the caller checks a whole shard itself
    read_only = np.zeros(SIZE, dtype=np.uint8)
    read_only.flags.writeable = False
    for misfit in (np.zeros(SIZE - 1, dtype=np.uint8), np.zeros(SIZE // 4, dtype=np.int32), read_only):
        _, _, (whole,) = _read(server.endpoint("j"), ranges=None, whole_into=lambda m=misfit: m)  # type: ignore[misc]
        assert whole is not misfit and np.array_equal(whole, data) and not misfit.any()
    _, _, pieces = _read(server.endpoint("j"), ranges=[(0, 10)], whole_into=place)  # type: ignore[misc]
    assert pieces[0] is not target and asked == [1]


def test_a_wrong_token_reads_nothing_and_a_jobs_token_reads_that_job_only(
    served: tuple[DirectReadServer, np.ndarray],
) -> None:
    server, data = served
    forged = Endpoint(server.host, server.port, "0" * 64)
    with pytest.raises(ValueError, match="token"):
        _read(forged, ranges=[(0, 10)])
    other = ShardMeta(**{**shard_meta(data).to_dict(), "job": "k"})
    server.store.put(other, data)
    with pytest.raises(ValueError, match="token"):  # job j's token does not read job k
        _read(server.endpoint("j"), job="k", ranges=[(0, 10)])
    assert server.reads == 0 and server.bytes_sent == 0
    assert server.token("j") != server.token("k") and len(server.token("j")) == 64
    assert _read(server.endpoint("k"), job="k", ranges=[(0, 10)]) is not None


def test_a_missing_shard_is_none_and_a_bad_range_an_error(served: tuple[DirectReadServer, np.ndarray]) -> None:
    server, _ = served
    assert _read(server.endpoint("j"), ranges=[(0, 10)], index=1) is None
    assert _read(server.endpoint("j"), ranges=None, step=5) is None
    with pytest.raises(ValueError, match="outside the shard"):
        _read(server.endpoint("j"), ranges=[(0, SIZE + 1)])
    assert server.reads == 0


def test_garbage_on_the_wire_closes_that_connection_and_the_server_serves_on(
    served: tuple[DirectReadServer, np.ndarray],
) -> None:
    server, data = served
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        sock.sendall(b"\xff\xff\xff\xff" + b"x" * 64)  # not a hello
        assert b"not a ray_ckpt direct-read hello" in _drain(sock)  # answered, then closed
    with authenticated(server) as sock:
        sock.sendall(b"\xff\xff\xff\xff" + b"x" * 64)  # a request over the size limit
        assert _drain(sock) == b""
    with authenticated(server) as sock:
        sock.sendall(b"\x00\x00\x00\x03abc")  # not msgpack of a request
        sock.shutdown(socket.SHUT_WR)
        _drain(sock)  # an error answer or nothing, then the end
    _, _, (piece,) = _read(server.endpoint("j"), ranges=[(3, 30)])  # type: ignore[misc]
    assert piece.tobytes() == data[3:30].tobytes()


def _drain(sock: socket.socket) -> bytes:
    """Everything until the store closes the connection."""
    chunks = []
    while chunk := sock.recv(1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_closed_server_is_an_os_error(served: tuple[DirectReadServer, np.ndarray]) -> None:
    server, _ = served
    server.close()
    with pytest.raises(OSError):
        _read(server.endpoint("j"), ranges=[(0, 10)])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets are Linux's")
def test_a_reader_on_the_same_node_reads_through_the_unix_socket(served: tuple[DirectReadServer, np.ndarray]) -> None:
    server, data = served
    assert server.unix is not None
    with socket.socket() as probe:  # a TCP port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    unix_only = Endpoint(server.host, closed, server.token("j"), server.unix)
    _, _, (piece,) = _read(unix_only, ranges=[(10, 20)], same_node=True)  # type: ignore[misc]
    assert piece.tobytes() == data[10:20].tobytes()
    with pytest.raises(OSError):
        _read(unix_only, ranges=[(10, 20)], same_node=False)
    assert Endpoint.from_wire(server.endpoint("j").to_wire()) == server.endpoint("j")


@pytest.mark.parametrize(
    "field",
    [{"step": 4.9}, {"step": 4.0}, {"step": True}, {"rank": 1.0}, {"index": -1}, {"local": 1}, {"writer": 7}],
)
def test_a_request_field_of_the_wrong_type_is_an_error_not_truncated(
    served: tuple[DirectReadServer, np.ndarray], field: dict[str, object]
) -> None:
    """Step 4.9 is not step 4, 1 is not ``local=True`` and 7 is not a writer's id: each is
    answered with an error naming the value, nothing is read, and the connection serves on."""
    server, data = served
    request: dict[str, object] = {"step": 4, "rank": 1, "index": 0, "writer": "", "local": False, "ranges": [[0, 8]]}
    with authenticated(server) as sock:
        direct_reads._send_frame(sock, {**request, **field})
        answer = direct_reads._recv_frame(sock, 1 << 10)
        assert set(answer) == {"error"} and repr(next(iter(field.values()))) in answer["error"]
        direct_reads._send_frame(sock, request)
        assert direct_reads._recv_frame(sock, 1 << 10)["found"] is True
        piece = bytearray(8)
        direct_reads._recv_into(sock, memoryview(piece))
        assert bytes(piece) == data[:8].tobytes()
