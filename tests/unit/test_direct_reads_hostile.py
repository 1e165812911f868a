"""The direct-read port against hostile clients on real sockets: header-only and trickling
connections, oversized and deeply nested frames, more connections than the cap and bursts of
connects. The store's memory and threads stay within their caps, nothing is parsed before the
fixed-size hello checks out, and a real read is served (or refused fast, so the reader goes
through Ray) meanwhile."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import psutil
import pytest

from ray_ckpt.core.checksum import checksum
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.store import ShardStore
from ray_ckpt.transport import direct_reads
from ray_ckpt.transport.direct_reads import DirectReadServer

SIZE = 1 << 20


@pytest.fixture
def server() -> Iterator[DirectReadServer]:
    data = np.random.default_rng(1).integers(0, 256, SIZE, dtype=np.uint8)
    store = ShardStore(node_id="n", budget_bytes=1 << 30)
    meta = ShardMeta(
        job="j", step=1, rank=0, index=0, world_size=1, data_shards=1, parity_shards=0,
        payload_size=SIZE, shard_size=SIZE, checksum=checksum(data),
    )  # fmt: skip
    store.put(meta, data)
    served = DirectReadServer(store, "127.0.0.1")
    yield served
    served.close()


def real_read(server: DirectReadServer, timeout_s: float = 5.0) -> bytes:
    _, _, (piece,) = direct_reads.read(  # type: ignore[misc]
        server.endpoint("j"), ShardAddress("j", 1, 0, 0), ranges=[(0, 64)], timeout_s=timeout_s
    )
    return bytes(piece)


def _read_once_slots_free(server: DirectReadServer, within_s: float) -> bytes:
    """A real read, tried again while the server refuses it (every slot held), for ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return real_read(server)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.25)


def connect(server: DirectReadServer) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=10)


def closed_by_server(sock: socket.socket, within_s: float) -> bool:
    sock.settimeout(within_s)
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_header_only_connections_hold_no_memory_and_a_read_is_served_meanwhile(server: DirectReadServer) -> None:
    """Forty connections that send only a length header claiming 16 MiB (the old protocol's
    attack: 128 MiB held by eight of them) cost the store nothing but their threads."""
    process = psutil.Process()
    rss, threads = process.memory_info().rss, process.num_threads()
    hostile = [connect(server) for _ in range(40)]
    for sock in hostile:
        sock.sendall(b"\x01\x00\x00\x00")
    time.sleep(0.5)
    started = time.monotonic()
    assert len(real_read(server)) == 64
    assert time.monotonic() - started < 4.0  # served beside them (the hostile ones hold on forever)
    assert process.memory_info().rss - rss < 16 << 20
    assert process.num_threads() - threads <= direct_reads.MAX_CONNECTIONS + 2
    for sock in hostile:
        sock.close()


def test_a_hello_or_a_request_that_trickles_is_cut_at_its_deadline(
    server: DirectReadServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(direct_reads, "HELLO_TIMEOUT_S", 1.0)
    monkeypatch.setattr(direct_reads, "REQUEST_TIMEOUT_S", 1.0)
    trickler = connect(server)
    stop = threading.Event()

    def trickle() -> None:  # one byte every 0.2 s: each recv is quick, the whole never is
        try:
            while not stop.wait(0.2):
                trickler.sendall(b"R")
        except OSError:
            pass

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    assert closed_by_server(trickler, within_s=8.0)
    assert time.monotonic() - started < 4.0  # at the 1 s deadline, give or take a starved thread
    stop.set()
    trickler.close()
    assert len(real_read(server)) == 64


def test_oversized_and_deeply_nested_frames_are_refused_without_parsing(server: DirectReadServer) -> None:
    token = bytes.fromhex(server.token("j"))

    def authenticated() -> socket.socket:
        sock = connect(server)
        sock.sendall(direct_reads._HELLO.pack(direct_reads.MAGIC, token, 1) + b"j")
        assert direct_reads._recv_frame(sock, 1 << 10) == {"ok": True}
        return sock

    big = authenticated()
    big.sendall((16 << 20).to_bytes(4, "big"))  # over MAX_REQUEST_BYTES: closed before any allocation
    assert closed_by_server(big, within_s=5.0)
    nested = authenticated()
    body = b"\x91" * (direct_reads.MAX_REQUEST_BYTES - 1) + b"\xc0"  # [[[[...None...]]]], 64 Ki deep
    rss = psutil.Process().memory_info().rss
    nested.sendall(len(body).to_bytes(4, "big") + body)
    assert closed_by_server(nested, within_s=5.0)
    assert psutil.Process().memory_info().rss - rss < 16 << 20
    wrong_job = connect(server)
    wrong_job.sendall(direct_reads._HELLO.pack(direct_reads.MAGIC, token, 1) + b"k")
    assert "wrong token" in str(direct_reads._recv_frame(wrong_job, 1 << 10))
    for sock in (big, nested, wrong_job):
        sock.close()
    assert len(real_read(server)) == 64


def test_connections_beyond_the_cap_are_refused_at_once_and_a_burst_of_connects_is_not_dropped(
    server: DirectReadServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MAX_CONNECTIONS idle connections hold every slot: the next one (a real reader) is closed
    at once, so it reads through Ray instead of waiting; once the idle ones pass their hello
    deadline the slots are free again. 300 simultaneous connects all complete within 4 s (a
    real listen backlog; socketserver's default of 5 made most of them wait one or more SYN
    retries, 1 s, 3 s, 7 s after their first).

    The hello deadline is long (5 s) beside "at once" (under 2.5 s), so a starved server thread
    (the test run at a low priority on a busy machine) cannot let an idle connection expire
    before the refusal is tested; the freed slots are then waited for, not slept on."""
    monkeypatch.setattr(direct_reads, "HELLO_TIMEOUT_S", 5.0)
    idle = [connect(server) for _ in range(direct_reads.MAX_CONNECTIONS)]
    time.sleep(0.3)
    started = time.monotonic()
    with pytest.raises(OSError):
        real_read(server)
    assert time.monotonic() - started < 2.5 and server.refused >= 1
    assert len(_read_once_slots_free(server, within_s=20.0)) == 64  # past the idle ones' hello deadline
    for sock in idle:
        sock.close()
    started = time.monotonic()
    burst = []
    for _ in range(300):
        burst.append(socket.create_connection((server.host, server.port), timeout=2))
    assert time.monotonic() - started < 4.0
    for sock in burst:
        sock.close()
