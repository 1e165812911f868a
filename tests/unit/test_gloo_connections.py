"""Shutting down the gloo connections a process holds wakes every collective blocked on them,
here and at the peers, at once (even beside a peer that went silent), where abort and destroy
do not; the process stays whole and
connections it had before (Ray's) or that are not gloo's (a server of the training function's
own) are left alone. Real gloo ranks in spawned processes; plain sockets set up as gloo sets up
its pairs (``like_gloo``) where one process is enough."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import struct
import threading
import time
from typing import Any

COLLECTIVE_TIMEOUT_S = 60.0
SUBGROUPS = 4  # beside WORLD: pairs whose accepting end falls on one side or the other by chance


def like_gloo(sock: socket.socket, timeout_s: int = 1800) -> socket.socket:
    """``sock`` with the receive and send timeouts gloo gives each pair's socket (its group's)."""
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("@ll", timeout_s, 0))
    return sock


def _rank(rank: int, port: int, results: Any, left: Any) -> None:
    import torch
    import torch.distributed as dist

    from ray_ckpt.train.gloo_connections import GlooConnections

    older = socket.create_server(("127.0.0.1", 0))  # like Ray's: listening before the baseline
    connections = GlooConnections()
    client = socket.create_connection(older.getsockname())
    kept, _ = older.accept()
    _join_gloo(rank, port, world_size=3)
    subgroup = dist.new_group([0, 1, 2])  # held, as FSDP2's meshes hold theirs
    own = socket.create_server(("127.0.0.1", 0))  # a server the training function runs itself
    own_client = socket.create_connection(own.getsockname())
    own_accepted, _ = own.accept()
    tensor = torch.ones(1024)
    dist.all_reduce(tensor)
    accepted = len(connections.accepted(store_ports=[port]))
    if rank == 1:  # it left the collective the others are blocked in
        time.sleep(1.0)
        shut = connections.shut(store_ports=[port])
        left.set()
        time.sleep(3.0)
        kept.sendall(b"x")
        own_accepted.sendall(b"y")
        own_works = own_client.recv(1) == b"y"
        results.put((rank, "left", shut, client.recv(1) == b"x" and own_works, accepted))
        _end(results)

    def interrupted() -> None:  # what the heartbeat does when the run says a round is open
        left.wait(timeout=COLLECTIVE_TIMEOUT_S)  # after rank 1 shut its ends, however slow this machine
        time.sleep(0.5)
        connections.shut(store_ports=[port])

    threading.Thread(target=interrupted, daemon=True).start()
    started = time.monotonic()
    try:
        dist.all_reduce(tensor, group=subgroup if rank == 0 else None)
        outcome = "returned"
    except RuntimeError as error:
        outcome = str(error)
    results.put((rank, outcome, time.monotonic() - started, subgroup is not None, accepted))
    _end(results)


def _join_gloo(rank: int, port: int, world_size: int) -> None:
    """Form the default gloo group over ``world_size`` local ranks (its store at ``port``)."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )


def _run_ranks(context: Any, count: int, target: Any, *extra: Any) -> tuple[dict[int, tuple[Any, ...]], list[Any]]:
    """``target(rank, port, results, *extra)`` in ``count`` spawned processes, which form a gloo
    group on a free port: what each put in ``results`` (by rank, its first field), and the
    processes (ended: joined, or killed when still alive 3 s after their results came)."""
    results = context.Queue()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [context.Process(target=target, args=(rank, port, results, *extra)) for rank in range(count)]
    for process in ranks:
        process.start()
    found: dict[int, tuple[Any, ...]] = {}
    try:
        for _ in range(count):
            item = results.get(timeout=120)
            found[item[0]] = item[1:]
    finally:
        for process in ranks:
            process.join(timeout=3)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
    return found, ranks


def _end(results: Any) -> None:
    """Hand the results over, then exit without torch's exit-time teardown of a broken group."""
    results.close()
    results.join_thread()
    os._exit(0)


def test_every_rank_shutting_its_accepted_ends_fails_the_blocked_collectives_at_once() -> None:
    """Rank 1 leaves a collective that ranks 0 (on a subgroup) and 2 (on WORLD) are blocked in;
    it shuts the gloo connections it accepted, they shut theirs half a second later: both
    collectives fail within seconds of the leave (not the 60 s timeout) with gloo's closed
    connection, every process lives on, and a connection accepted on an older listener works,
    as does one accepted by a server each rank opened after its groups (not gloo's: never
    counted, never shut). Which end of a pair accepts follows the order of the listeners'
    ports, so rank 1 may have accepted none of its pairs (the others then shut them): the ranks
    together accepted each of the two groups' three pairs once."""
    context = multiprocessing.get_context("spawn")
    left = context.Event()
    found, ranks = _run_ranks(context, 3, _rank, left)
    assert sum(item[-1] for item in found.values()) == 6, found  # each of the two groups' 3 pairs, on one side
    _, shut, kept_works, _ = found[1]
    assert shut == 4 and kept_works, found  # both ends it held: 2 groups x 2 peers, accepted or made
    for rank in (0, 2):
        outcome, waited_s, _, _ = found[rank]
        assert "Connection closed by peer" in outcome or "closed" in outcome.lower(), found
        assert waited_s < 10.0, found
    assert all(process.exitcode == 0 for process in ranks), [p.exitcode for p in ranks]


def _rank_beside_a_silent_peer(rank: int, port: int, results: Any) -> None:
    import signal

    import torch
    import torch.distributed as dist

    from ray_ckpt.train.gloo_connections import GlooConnections

    connections = GlooConnections()
    _join_gloo(rank, port, world_size=2)
    subgroups = [dist.new_group([0, 1]) for _ in range(SUBGROUPS)]  # held, as FSDP2's meshes hold theirs
    tensor = torch.ones(1024)
    for group in [None, *subgroups]:
        dist.all_reduce(tensor, group=group)
    if rank == 1:  # silent, as a node that lost power: nothing closes, nothing answers
        results.put((rank, "stopping", 0.0, 0))
        results.close()
        results.join_thread()  # handed over before it stops
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
    shut: list[int] = []

    def interrupted() -> None:  # the heartbeat, told that the peer is lost
        time.sleep(1.0)
        shut.append(connections.shut(store_ports=[port]))

    shutting = threading.Thread(target=interrupted, daemon=True)
    shutting.start()
    started = time.monotonic()
    try:
        dist.all_reduce(tensor)
        outcome = "returned"
    except RuntimeError as error:
        outcome = str(error)
    waited_s = time.monotonic() - started
    shutting.join(timeout=10)  # the all-reduce fails as the first pair is shut, before the count
    results.put((rank, outcome, waited_s, shut[0] if shut else -1))
    _end(results)


def test_a_rank_whose_peer_went_silent_shuts_both_ends_it_holds_and_leaves_at_once() -> None:
    """Rank 1 stops (SIGSTOP) after five groups formed: it will shut nothing. Rank 0, blocked in
    an all-reduce with it, shuts its gloo connections a second later: its pair of every group,
    the ends it accepted and those it made, and the all-reduce fails within seconds, not at the
    group's 60 s timeout."""
    found, _ = _run_ranks(multiprocessing.get_context("spawn"), 2, _rank_beside_a_silent_peer)
    outcome, waited_s, shut = found[0]
    assert "closed" in outcome.lower() or "Connection" in outcome, found
    assert waited_s < 10.0, found
    assert shut == 1 + SUBGROUPS, found  # both kinds: with 5 pairs, all accepted here 1 time in 32


def test_without_a_process_group_there_is_nothing_to_shut() -> None:
    from ray_ckpt.train.gloo_connections import GlooConnections

    with socket.create_server(("127.0.0.1", 0)) as server:
        connections = GlooConnections()
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                assert connections.accepted() == [] and connections.shut() == 0
                client.sendall(b"y")
                assert accepted.recv(1) == b"y"


def test_only_gloos_pairs_on_a_listener_opened_after_the_baseline_are_shut() -> None:
    """A listener opened after the baseline may be a server the training function runs itself:
    a connection it accepted is shut only if it is a gloo pair (set up as gloo sets up its
    pairs), never a plain one, and never one on a rendezvous store's port."""
    from ray_ckpt.train.gloo_connections import GlooConnections

    connections = GlooConnections()
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        plain_client = socket.create_connection(server.getsockname())
        plain, _ = server.accept()
        gloo_client = socket.create_connection(server.getsockname())
        pair, _ = server.accept()
        like_gloo(pair)
        with plain, plain_client, pair, gloo_client:
            watch = connections.watch()
            assert pair.fileno() in watch.fds and plain.fileno() not in watch.fds
            assert plain_client.fileno() not in watch.fds and gloo_client.fileno() not in watch.fds
            assert connections.shut(store_ports=[port]) == 0
            assert [(fd, p) for fd, p, _ in connections.accepted()] == [(pair.fileno(), port)]
            assert connections.shut() == 1
            assert gloo_client.recv(1) == b""  # the peer sees the connection closed
            plain.sendall(b"p")
            assert plain_client.recv(1) == b"p"  # the server's own connection works on


def test_a_watch_sees_an_accepted_connection_closed_by_its_peer_without_reading_it() -> None:
    """What a survivor's heartbeat polls: nothing while the peer is connected (even with bytes
    waiting), closed once the peer's end goes away; the waiting byte is still there to read."""
    from ray_ckpt.core.generations import address
    from ray_ckpt.train.gloo_connections import Closures, GlooConnections

    connections = GlooConnections()
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = like_gloo(socket.create_connection(server.getsockname()))
        accepted, _ = server.accept()
        with like_gloo(accepted):
            watch = connections.watch()
            assert accepted.fileno() in watch.fds and client.fileno() in watch.fds  # made since, too
            client.sendall(b"z")
            time.sleep(0.05)
            assert watch.closures() == Closures()
            seen_here = (address(*accepted.getsockname()), address(*accepted.getpeername()))
            client.close()  # as a dying process's kernel closes it
            deadline = time.monotonic() + 5
            while not watch.closures().accepted and time.monotonic() < deadline:
                time.sleep(0.01)
            assert watch.closures().accepted and seen_here in watch.closures().connections
            assert accepted.recv(1) == b"z"


def test_a_watch_over_a_descriptor_closed_here_says_closed() -> None:
    """gloo closes its end as soon as it reads the peer's end of stream: the descriptor is gone."""
    from ray_ckpt.train.gloo_connections import Closures, ConnectionWatch, Watched

    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        one, two = (("127.0.0.1", 1), ("127.0.0.1", 2)), (("127.0.0.1", 2), ("127.0.0.1", 1))
        watch = ConnectionWatch(
            {
                accepted.fileno(): Watched(one, True, os.fstat(accepted.fileno()).st_ino),
                client.fileno(): Watched(two, False, os.fstat(client.fileno()).st_ino),
            }
        )
        assert watch.closures() == Closures()
        accepted.close()  # gone here; its peer, the client, sees the end of stream too
        assert watch.closures().accepted and one in watch.closures().connections
        client.close()
        assert watch.closures() == Closures(True, (one, two))
    assert ConnectionWatch({}).closures() == Closures()


def test_a_watch_follows_its_sockets_not_their_descriptor_numbers() -> None:
    """A watched pair closed here whose descriptor number another socket took before the next
    poll is reported closed (not missed because the number is open and quiet), and the socket
    that took the number is never reported, not even when it closes in turn."""
    from ray_ckpt.core.generations import address
    from ray_ckpt.train.gloo_connections import Closures, GlooConnections

    connections = GlooConnections()
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())  # the peer's end: not watched here
        pair, _ = server.accept()
        like_gloo(pair)
        number = pair.fileno()
        seen_here = (address(*pair.getsockname()), address(*pair.getpeername()))
        watch = connections.watch()
        assert number in watch.fds and watch.closures() == Closures()
        other_client = socket.create_connection(server.getsockname())
        other, _ = server.accept()
        pair.close()  # gloo closed its end ...
        os.dup2(other.fileno(), number)  # ... and a new socket took the number before the next poll
        closures = watch.closures()
        assert closures.accepted and closures.connections == (seen_here,)
        other_client.close()  # the socket now at that number hangs up
        time.sleep(0.05)
        assert watch.closures() == closures
        os.close(number)
        for sock in (client, other):
            sock.close()


def test_a_connection_made_since_is_watched_and_reported_but_an_older_one_is_not() -> None:
    """A gloo pair this process dialed after the baseline (as gloo dials its peers' listeners)
    is watched and reported as (local, remote): the peer that accepted it names this process by
    it; older ones are neither, nor a plain connection made since (closing it reports nothing)."""
    from ray_ckpt.core.generations import address
    from ray_ckpt.train.gloo_connections import GlooConnections

    with socket.create_server(("127.0.0.1", 0)) as server:
        older = like_gloo(socket.create_connection(server.getsockname()))
        connections = GlooConnections()
        dialed = like_gloo(socket.create_connection(server.getsockname()))
        plain = socket.create_connection(server.getsockname())  # made since, but not gloo's
        ends = [server.accept()[0] for _ in range(3)]
        watch = connections.watch()
        seen_here = (address(*dialed.getsockname()), address(*dialed.getpeername()))
        assert dialed.fileno() in watch.fds and older.fileno() not in watch.fds and plain.fileno() not in watch.fds
        assert seen_here in watch.connections
        assert (address(*older.getsockname()), address(*older.getpeername())) not in watch.connections
        peer = next(end for end in ends if end.getpeername() == dialed.getsockname())
        peer.close()
        deadline = time.monotonic() + 5
        while seen_here not in watch.closures().connections and time.monotonic() < deadline:
            time.sleep(0.01)
        closures = watch.closures()  # the end closed here (as gloo closes its own) is a connection made since too
        assert not closures.accepted and seen_here in closures.connections
        plain.close()  # its owner is done with it: no closure of anyone's
        assert watch.closures().connections == closures.connections
        for sock in [older, dialed, *ends]:
            sock.close()


def _watching_rank(rank: int, port: int, results: Any) -> None:
    """A gloo rank that reports its connections, then, once a peer is killed, what its watch saw."""
    import torch.distributed as dist

    from ray_ckpt.train.gloo_connections import GlooConnections

    connections = GlooConnections()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3)
    watch = connections.watch(store_ports=[port])
    results.put((rank, "connections", watch.connections))
    deadline = time.monotonic() + 60
    while not watch.closures().connections and time.monotonic() < deadline:
        time.sleep(0.01)
    results.put((rank, "closures", watch.closures()))
    _end(results)


def test_every_survivor_of_a_killed_gloo_rank_sees_a_connection_close_whose_other_end_it_reported() -> None:
    """Three real gloo ranks; rank 1 is killed. Each survivor's pair with it was accepted on
    one side and dialed on the other (by the order of the listeners' ports); either way the
    connection the survivor saw close is one the dead rank reported, seen from the other end,
    and none the live peer reported: the run can name the dead rank from any survivor's report."""
    context = multiprocessing.get_context("spawn")
    # a queue per rank: a rank killed inside a put would hold a shared queue's lock for good
    queues = [context.Queue() for _ in range(3)]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [context.Process(target=_watching_rank, args=(rank, port, queues[rank])) for rank in range(3)]
    for process in ranks:
        process.start()
    try:
        reported = {rank: set(queues[rank].get(timeout=120)[2]) for rank in range(3)}
        ranks[1].kill()
        closures = {rank: queues[rank].get(timeout=60)[2] for rank in (0, 2)}
    finally:
        for process in ranks:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    for rank, seen in closures.items():
        other_end = {(remote, local) for local, remote in seen.connections}
        assert other_end & reported[1], (rank, seen, reported)
        assert not other_end & reported[2 - rank], (rank, seen, reported)  # the live peer is not named


def test_this_process_tcp_sockets_are_listed_from_its_own_descriptors_as_psutil_lists_them() -> None:
    """``tcp_sockets`` reads this process's descriptors, never the host's connection table,
    and lists what psutil lists: a listener, both ends of a connection, no UDP socket, an
    unconnected one not at all."""
    import psutil

    from ray_ckpt.train.gloo_connections import ESTABLISHED, LISTEN, tcp_sockets

    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    unconnected = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:

        def as_rows(listed: Any) -> set[tuple[int, tuple[Any, ...], tuple[Any, ...] | None, str]]:
            return {(c.fd, tuple(c.laddr), tuple(c.raddr) if c.raddr else None, c.status) for c in listed}

        ours = as_rows(tcp_sockets())
        assert ours == as_rows(psutil.Process().net_connections("tcp"))
        port = server.getsockname()[1]
        assert (server.fileno(), ("127.0.0.1", port), None, LISTEN) in ours
        assert (client.fileno(), client.getsockname(), ("127.0.0.1", port), ESTABLISHED) in ours
        assert (accepted.fileno(), ("127.0.0.1", port), client.getsockname(), ESTABLISHED) in ours
        assert not {row for row in ours if row[0] == udp.fileno()}
    finally:
        for sock in (server, client, accepted, udp, unconnected):
            sock.close()
