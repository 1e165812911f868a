"""The coordinator's probe of a raylet (``generation_coordinator.probe`` and ``reachable``): a
listener and a refusal are answers, told apart (a refusal says the raylet is gone); a host that
never completes the handshake is silence; and a loop held up past the probe's bound (a loaded
host) does not turn a live node's answer into silence. ``refused_fences``: which lost ranks'
nodes are declared dead for a raylet gone."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest
from ray_ckpt.actors.generation_coordinator import (
    ANSWERS,
    REFUSED,
    REFUSED_FENCE_AFTER_S,
    REFUSED_PROBES,
    SILENT,
    probe,
    reachable,
    refused_fences,
)

from ray_ckpt.core.generations import Member


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock
    sock.close()


def address(sock: socket.socket) -> str:
    host, port = sock.getsockname()
    return f"{host}:{port}"


def test_a_listener_answers(listener: socket.socket) -> None:
    assert asyncio.run(reachable(address(listener))) is True
    assert asyncio.run(probe(address(listener))) == ANSWERS


def test_a_refusal_is_an_answer() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    free = address(sock)
    sock.close()  # nothing listens there now: the host refuses
    assert asyncio.run(reachable(free)) is True
    assert asyncio.run(probe(free)) == REFUSED


def test_a_host_that_never_completes_the_handshake_is_silent() -> None:
    """A listener whose accept queue is full drops further handshakes, as a host that lost its
    link never answers them."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(0)
    held = []
    try:
        for _ in range(4):  # fill the accept queue (never accepted)
            client = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            client.setblocking(False)
            client.connect_ex(sock.getsockname())
            held.append(client)
        time.sleep(0.1)
        started = time.monotonic()
        assert asyncio.run(reachable(address(sock), timeout_s=0.3)) is False
        assert time.monotonic() - started >= 0.3
        assert asyncio.run(probe(address(sock), timeout_s=0.1)) == SILENT
    finally:
        for client in held:
            client.close()
        sock.close()


def test_a_loop_held_up_past_the_bound_still_hears_a_live_node(listener: socket.socket) -> None:
    """The probe's verdict is the socket's, not the loop's timing: a coordinator whose loop is
    held up for twice the bound right after the probe began (a loaded host) still finds the
    node reachable."""

    async def probe_while_the_loop_is_held() -> bool:
        probe = asyncio.ensure_future(reachable(address(listener), timeout_s=0.2))
        await asyncio.sleep(0)  # the probe starts its connect
        time.sleep(0.4)  # the loop is held up past the probe's bound
        return await probe

    assert asyncio.run(probe_while_the_loop_is_held()) is True


def test_a_probe_whose_socket_gets_a_descriptor_number_past_1024_still_hears_the_node(listener: socket.socket) -> None:
    """A coordinator of a large run holds many connections: its probe's socket may get a
    descriptor number past what ``select`` takes, and must still give a verdict."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"this process may open {hard} descriptors at most")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while not held or held[-1] < 1100:
            held.append(os.dup(listener.fileno()))
        assert asyncio.run(reachable(address(listener))) is True
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _member(rank: int, node_id: str) -> Member:
    return Member(rank, f"i{rank}", node_id, 100 + rank, "10.0.0.1", 1)


def test_a_node_whose_host_kept_refusing_long_enough_is_fenced_whether_or_not_its_rank_was_lost() -> None:
    """Ranks 1 and 2's nodes refused two probes over the bound: fenced (rank 2 may not have
    been found lost yet: its raylet is gone all the same). Rank 3's node refused only once,
    rank 4's only for a moment: not yet (a raylet still starting refuses too). Rank 0's node
    never refused."""
    members = {rank: _member(rank, f"n{rank}") for rank in range(5)}
    now = 50.0
    long_ago = now - REFUSED_FENCE_AFTER_S - 0.01
    since = {"n1": long_ago, "n2": long_ago, "n3": long_ago, "n4": now - REFUSED_FENCE_AFTER_S / 2}
    refusals = {"n1": REFUSED_PROBES, "n2": 5, "n3": REFUSED_PROBES - 1, "n4": 5}
    fences = refused_fences(members, since, refusals, now)
    assert [(rank, node) for rank, node, _ in fences] == [(1, "n1"), (2, "n2")]
    assert fences[0][2] == pytest.approx(REFUSED_FENCE_AFTER_S + 0.01)


def test_a_node_carrying_several_ranks_is_fenced_once() -> None:
    members = {0: _member(0, "n0"), 1: _member(1, "n1"), 2: _member(2, "n1")}
    fences = refused_fences(members, {"n1": 0.0}, {"n1": 3}, 1.0)
    assert [(rank, node) for rank, node, _ in fences] == [(1, "n1")]
