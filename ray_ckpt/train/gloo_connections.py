"""Making this process's gloo collectives, and its peers' collectives with it, fail now.

A gloo collective blocked on a peer that is alive but gone elsewhere (a survivor that left the
failed collective for the next generation) waits out the whole collective timeout: with torch
2.13 neither ``ProcessGroup.abort``, ``shutdown`` nor ``destroy_process_group`` closes the
connections while anything still holds the group (FSDP2's meshes do), and they do not wake a
collective already blocked. Shutting a connection down does, on both ends at once ("Connection
closed by peer"), and the process stays whole.

``GlooConnections`` finds the connections to shut: gloo's pairs this process accepted on a gloo
listener, a listening TCP socket it opened after ``GlooConnections()`` was made (at the start of
the worker process, before any process group) other than a rendezvous store's. A socket is
gloo's pair by what gloo does to it (``_torch_compat.is_gloo_pair``: its receive and send
timeouts are the group's), checked on the very descriptor just before it is shut (never one
whose number was taken by another socket since); so are the gloo pairs it made to its peers'
listeners since. Each rank of a failed generation shuts both kinds (the ones that leave at
their teardown, the others when the run tells them a round is open): a pair is closed even
when the peer at its other end is silent (a node that lost power or its link shuts nothing).
Ray's connections are older than the listener (or go to its own ports), a rendezvous store's
port is left out, and a server the training function runs itself on this process, like any
connection that is not gloo's, is left alone.

``ConnectionWatch`` (from ``GlooConnections.watch``) tells, without reading a byte, which of
this process's gloo pairs have been closed since: the accepted ones, and every one made since
``GlooConnections()`` (gloo's own connections to its peers' listeners). It follows each socket
by its identity (its inode), not its descriptor number: a pair is closed once its own socket
hung up or its descriptor is gone, or holds another socket now. A peer process that dies closes
its sockets, so its survivors' heartbeats see it within a beat. The watch also lists those
connections, which the heartbeats report: a survivor that sees one of them close at its end
names this process to the run (``ray_ckpt.core.generations``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import select
import socket
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import psutil

from ray_ckpt.core.generations import Connection, address
from ray_ckpt.train import _torch_compat

logger = logging.getLogger(__name__)


MAX_REPORTED = 4096  # the most connections a process reports: a gloo full mesh has one per peer


class GlooConnections:
    """This process's gloo pairs (see the module docstring). Made before any process group
    exists; thread-safe (it only reads the process's sockets, and shuts gloo's)."""

    def __init__(self) -> None:
        connections = tcp_sockets()
        self._before = {c.laddr.port for c in connections if c.status == LISTEN}
        self._older = {(c.laddr, c.raddr) for c in connections if c.status == ESTABLISHED}

    def _listed(self, store_ports: Iterable[int]) -> tuple[list[Connected], list[Connected]]:
        """The connections accepted on listeners opened since this object was made and the other
        connections made since, none of them a rendezvous store's: gloo's pairs among them, and
        maybe others (``_is_listed_pair`` tells)."""
        stores = set(store_ports)
        connections = tcp_sockets()
        ports = {c.laddr.port for c in connections if c.status == LISTEN} - self._before - stores
        accepted, made = [], []
        for c in connections:
            if c.status != ESTABLISHED or not c.raddr or c.fd < 0:
                continue
            pair = Connected(c.fd, c.laddr, c.raddr)
            if c.laddr.port in ports:
                accepted.append(pair)
            elif (c.laddr, c.raddr) not in self._older and not {c.laddr.port, c.raddr.port} & stores:
                made.append(pair)
        return accepted, made

    def accepted(self, store_ports: Iterable[int] = ()) -> list[tuple[int, int, tuple[str, int]]]:
        """(fd, local port, peer address) of each gloo pair accepted on a gloo listener: one
        opened since this object was made, not one of ``store_ports``."""
        accepted, _ = self._listed(store_ports)
        found = []
        for c in accepted:
            with _socket_at(c.fd) as sock:
                if sock is not None and _is_listed_pair(sock, c):
                    found.append((c.fd, c.laddr.port, (c.raddr.ip, c.raddr.port)))
        return found

    def watch(self, store_ports: Iterable[int] = ()) -> ConnectionWatch:
        """A watch over the gloo pairs accepted on gloo listeners and made since this object was
        made, as they are now (none if they cannot be listed)."""
        try:
            accepted, made = self._listed(store_ports)
        except (psutil.Error, OSError) as error:
            logger.debug("listing this process's connections: %s", error)
            return ConnectionWatch({})
        watched = {}
        for c, was_accepted in [(c, True) for c in accepted] + [(c, False) for c in made]:
            inode = _inode(c.fd)
            with _socket_at(c.fd) as sock:
                pair = sock is not None and _is_listed_pair(sock, c)
            if pair and inode is not None and _inode(c.fd) == inode:  # the same socket throughout
                watched[c.fd] = Watched((address(*c.laddr), address(*c.raddr)), was_accepted, inode)
        return ConnectionWatch(watched)

    def shut(self, store_ports: Iterable[int] = ()) -> int:
        """Shut down every gloo pair of this process, accepted on a gloo listener or made to a
        peer's, for reading and writing, so that a collective blocked on one, here or at the
        peer, fails at once; the sockets stay open for gloo to close. Both ends it holds: a peer
        that went silent (its node lost power or its link) cannot shut the end it accepted, and a
        collective blocked on a pair this process made would wait out the group's timeout. Any
        other socket (a server's the training function runs, a descriptor whose number another
        socket took since it was listed) is left alone. Returns how many were shut. Never raises."""
        try:
            accepted, made = self._listed(store_ports)
        except (psutil.Error, OSError) as error:
            logger.debug("listing this process's connections: %s", error)
            return 0
        shut = 0
        for c in accepted + made:
            with _socket_at(c.fd) as sock:
                if sock is None or not _is_listed_pair(sock, c):
                    continue
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    shut += 1
                except OSError:
                    pass
        return shut


@contextlib.contextmanager
def _socket_at(fd: int) -> Iterator[socket.socket | None]:
    """The socket at descriptor ``fd``, borrowed (it stays its owner's, open), or None where
    ``fd`` is closed or no socket."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        yield None
        return
    try:
        yield sock
    finally:
        sock.detach()


LISTEN, ESTABLISHED = "LISTEN", "ESTABLISHED"  # a listed socket's status, as psutil names it
_TCP_STATES = {1: ESTABLISHED, 10: LISTEN}  # the kernel's tcpi_state numbers (include/net/tcp_states.h)
_TCP_CLOSE = 7


class Endpoint(NamedTuple):
    ip: str
    port: int


class Listed(NamedTuple):
    """One of this process's TCP sockets as ``tcp_sockets`` listed it: its descriptor, its two
    ends (``raddr`` None: not connected), and its status (``LISTEN``, ``ESTABLISHED`` or another)."""

    fd: int
    laddr: Endpoint
    raddr: Endpoint | None
    status: str


class Connected(NamedTuple):
    """A connected socket of ``Listed``'s: its descriptor and both its ends."""

    fd: int
    laddr: Endpoint
    raddr: Endpoint


def tcp_sockets() -> list[Listed]:
    """This process's TCP sockets, read from its own descriptors (``/proc/self/fd``, and each
    socket's own name, peer and state): never the host's whole connection table, which psutil
    parses (on a node with many processes' connections, a tenth of a second or more of a
    recovery's critical path). Where ``/proc/self/fd`` or ``TCP_INFO`` is missing, psutil's
    listing."""
    try:
        return _own_tcp_sockets()
    except (_CannotReadOwn, OSError):
        return [
            Listed(c.fd, Endpoint(*c.laddr), Endpoint(*c.raddr) if c.raddr else None, c.status)
            for c in psutil.Process().net_connections("tcp")
        ]


class _CannotReadOwn(Exception):
    """This platform does not tell a socket's TCP state (``TCP_INFO``)."""


def _own_tcp_sockets() -> list[Listed]:
    if not hasattr(socket, "TCP_INFO"):
        raise _CannotReadOwn()
    names = os.listdir("/proc/self/fd")
    found = []
    for name in names:
        fd = int(name)
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
        except OSError:  # closed since it was listed (the listing's own descriptor, for one)
            continue
        with _socket_at(fd) as sock:
            if sock is None or sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
                local = Endpoint(*sock.getsockname()[:2])
            except OSError as error:
                if error.errno == errno.ENOPROTOOPT:  # no TCP_INFO here: every socket would be missed
                    raise _CannotReadOwn() from error
                continue  # closed, or no socket, since it was listed
            if state == _TCP_CLOSE:  # never connected nor listening (or closed): not in the host's table either
                continue
            try:
                remote: Endpoint | None = Endpoint(*sock.getpeername()[:2])
            except OSError:  # not connected
                remote = None
            found.append(Listed(fd, local, remote, _TCP_STATES.get(state, "OTHER")))
    return found


def _is_listed_pair(sock: socket.socket, listed: Connected) -> bool:
    """Whether ``sock`` is still the connection ``tcp_sockets`` listed (its descriptor not
    taken by another socket since) and a gloo pair."""
    try:
        same = sock.getsockname()[:2] == tuple(listed.laddr) and sock.getpeername()[:2] == tuple(listed.raddr)
    except OSError:
        return False
    return same and _torch_compat.is_gloo_pair(sock)


def _inode(fd: int) -> int | None:
    """The identity of the file at descriptor ``fd`` (a socket's inode), None where it is closed."""
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return None


_CLOSED = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)


@dataclasses.dataclass(frozen=True)
class Closures:
    """What a ``ConnectionWatch`` saw: whether a gloo pair accepted on a gloo listener closed,
    and every watched pair that closed."""

    accepted: bool = False
    connections: tuple[Connection, ...] = ()


class Watched(NamedTuple):
    """A socket a ``ConnectionWatch`` follows: its connection as this end sees it, whether it
    was accepted on a gloo listener, and its identity (the socket's inode, ``os.fstat``)."""

    connection: Connection
    accepted: bool
    inode: int


class ConnectionWatch:
    """Which of a set of sockets (descriptor -> ``Watched``) were closed since the watch was
    made: by the peer (end of stream, reset, on that very socket) or here (the descriptor is
    gone, or holds another socket now). Reads nothing; not thread-safe (one heartbeat thread
    polls it)."""

    def __init__(self, sockets: dict[int, Watched]) -> None:
        self._poll = select.poll()
        self._sockets = dict(sockets)
        self._open = dict(sockets)
        self._closed: list[Watched] = []
        for fd in self._sockets:
            self._poll.register(fd, _CLOSED)

    @property
    def fds(self) -> list[int]:
        return sorted(self._sockets)

    @property
    def connections(self) -> tuple[Connection, ...]:
        """The watched connections (at most ``MAX_REPORTED``), as this process reports them."""
        return tuple(sorted(watched.connection for watched in self._sockets.values()))[:MAX_REPORTED]

    def closures(self) -> Closures:
        """The watched sockets closed by now (does not wait; one found closed stays so). A
        descriptor's events count only while it holds the socket watched on it: those of
        another socket that took its number are never taken for the watched one's."""
        if self._open:
            events = dict(self._poll.poll(0))
            for fd, watched in list(self._open.items()):
                if _inode(fd) == watched.inode and not events.get(fd, 0) & _CLOSED:
                    continue
                self._poll.unregister(fd)
                del self._open[fd]
                self._closed.append(watched)
        return Closures(
            any(watched.accepted for watched in self._closed),
            tuple(sorted({watched.connection for watched in self._closed})),
        )
