"""Making this process's gloo collectives, and its peers' collectives with it, fail now.

A gloo collective blocked on a peer that is alive but gone elsewhere (a survivor that left the
failed collective for the next generation) waits out the whole collective timeout: with torch
2.13 neither ``ProcessGroup.abort``, ``shutdown`` nor ``destroy_process_group`` closes the
connections while anything still holds the group (FSDP2's meshes do), and they do not wake a
collective already blocked. Shutting a connection down does, on both ends at once ("Connection
closed by peer"), and the process stays whole.

``GlooConnections`` finds the connections to shut: those this process accepted on a gloo
listener, a listening TCP socket it opened after ``GlooConnections()`` was made (at the start of
the worker process, before any process group) other than a rendezvous store's. Every gloo pair
is accepted on one side, so when every rank of a failed generation shuts its accepted ends (the
ones that leave at their teardown, the others when the run tells them a round is open) every
pair is closed. Ray's connections are older than the listener (or go to its own ports), and a
rendezvous store's port is left out; a server the training function itself opens on this
process would have its accepted connections shut too, and only when a generation fails.

``ConnectionWatch`` (from ``GlooConnections.watch``) tells, without reading a byte, which of
this process's connections have been closed since: the accepted ones, and every one made since
``GlooConnections()`` (gloo's own connections to its peers' listeners among them). A peer
process that dies closes its sockets, so its survivors' heartbeats see it within a beat. The
watch also lists those connections, which the heartbeats report: a survivor that sees one of
them close at its end names this process to the run (``ray_ckpt.core.generations``).
"""

from __future__ import annotations

import dataclasses
import logging
import select
import socket
from collections.abc import Iterable
from typing import Any

import psutil

from ray_ckpt.core.generations import Connection, address

logger = logging.getLogger(__name__)


MAX_REPORTED = 4096  # the most connections a process reports: a gloo full mesh has one per peer


class GlooConnections:
    """This process's accepted gloo connections (see the module docstring). Made before any
    process group exists; thread-safe (it only reads the process's sockets)."""

    def __init__(self) -> None:
        connections = psutil.Process().net_connections("tcp")
        self._before = {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}
        self._older = {(c.laddr, c.raddr) for c in connections if c.status == psutil.CONN_ESTABLISHED}

    def _listed(self, store_ports: Iterable[int]) -> tuple[list[Any], list[Any]]:
        """The connections accepted on this process's gloo listeners and the other connections
        made since this object was made, none of them a rendezvous store's."""
        stores = set(store_ports)
        connections = psutil.Process().net_connections("tcp")
        ports = {c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN} - self._before - stores
        accepted, made = [], []
        for c in connections:
            if c.status != psutil.CONN_ESTABLISHED or not c.raddr or c.fd < 0:
                continue
            if c.laddr.port in ports:
                accepted.append(c)
            elif (c.laddr, c.raddr) not in self._older and not {c.laddr.port, c.raddr.port} & stores:
                made.append(c)
        return accepted, made

    def accepted(self, store_ports: Iterable[int] = ()) -> list[tuple[int, int, tuple[str, int]]]:
        """(fd, local port, peer address) of each established connection accepted on a gloo
        listener: one opened since this object was made, not one of ``store_ports``."""
        accepted, _ = self._listed(store_ports)
        return [(c.fd, c.laddr.port, (c.raddr.ip, c.raddr.port)) for c in accepted]

    def watch(self, store_ports: Iterable[int] = ()) -> ConnectionWatch:
        """A watch over the connections accepted on gloo listeners and made since this object
        was made, as they are now (none if they cannot be listed)."""
        try:
            accepted, made = self._listed(store_ports)
        except (psutil.Error, OSError) as error:
            logger.debug("listing this process's connections: %s", error)
            return ConnectionWatch({})
        watched = {c.fd: ((address(*c.laddr), address(*c.raddr)), True) for c in accepted}
        watched.update({c.fd: ((address(*c.laddr), address(*c.raddr)), False) for c in made})
        return ConnectionWatch(watched)

    def shut(self, store_ports: Iterable[int] = ()) -> int:
        """Shut down every accepted gloo connection (``accepted``) for reading and writing, so
        that a collective blocked on one, here or at the peer, fails at once; the sockets stay
        open for gloo to close. Returns how many were shut. Never raises."""
        shut = 0
        try:
            found = self.accepted(store_ports)
        except (psutil.Error, OSError) as error:
            logger.debug("listing this process's connections: %s", error)
            return 0
        for fd, port, peer in found:
            try:
                sock = socket.socket(fileno=fd)
            except OSError:  # closed meanwhile
                continue
            try:
                if sock.getsockname()[1] == port and sock.getpeername()[:2] == peer:  # not a reused descriptor
                    sock.shutdown(socket.SHUT_RDWR)
                    shut += 1
            except OSError:
                pass
            finally:
                sock.detach()  # the descriptor stays gloo's
        return shut


_CLOSED = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)


@dataclasses.dataclass(frozen=True)
class Closures:
    """What a ``ConnectionWatch`` saw: whether a connection accepted on a gloo listener closed,
    and every watched connection that closed."""

    accepted: bool = False
    connections: tuple[Connection, ...] = ()


class ConnectionWatch:
    """Which of a set of sockets (descriptor -> its connection, whether accepted on a gloo
    listener) were closed since the watch was made: by the peer (end of stream, reset) or here
    (the descriptor is gone). Reads nothing; not thread-safe (one heartbeat thread polls it)."""

    def __init__(self, sockets: dict[int, tuple[Connection, bool]]) -> None:
        self._poll = select.poll()
        self._sockets = dict(sockets)
        for fd in self._sockets:
            self._poll.register(fd, _CLOSED)

    @property
    def fds(self) -> list[int]:
        return sorted(self._sockets)

    @property
    def connections(self) -> tuple[Connection, ...]:
        """The watched connections (at most ``MAX_REPORTED``), as this process reports them."""
        return tuple(sorted(connection for connection, _ in self._sockets.values()))[:MAX_REPORTED]

    def closures(self) -> Closures:
        """The sockets closed now (does not wait)."""
        closed = [self._sockets[fd] for fd, events in self._poll.poll(0) if events & (_CLOSED | select.POLLNVAL)]
        return Closures(
            any(accepted for _, accepted in closed), tuple(sorted({connection for connection, _ in closed}))
        )
