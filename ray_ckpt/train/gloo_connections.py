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

``ConnectionWatch`` (from ``GlooConnections.watch``) tells, without reading a byte, whether one
of the accepted connections has been closed since: a peer process that dies closes its
sockets, so its survivors' heartbeats see it within a beat. Only the accepted end is watched, so
a peer whose every connection this process opened goes unseen here (it is seen on the other
ranks, or by its silence).
"""

from __future__ import annotations

import logging
import select
import socket
from collections.abc import Iterable

import psutil

logger = logging.getLogger(__name__)


def _listening() -> set[int]:
    return {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}


class GlooConnections:
    """This process's accepted gloo connections (see the module docstring). Made before any
    process group exists; thread-safe (it only reads the process's sockets)."""

    def __init__(self) -> None:
        self._before = _listening()

    def accepted(self, store_ports: Iterable[int] = ()) -> list[tuple[int, int, tuple[str, int]]]:
        """(fd, local port, peer address) of each established connection accepted on a gloo
        listener: one opened since this object was made, not one of ``store_ports``."""
        connections = psutil.Process().net_connections("tcp")
        listeners = {
            c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN and c.laddr.port not in self._before
        } - set(store_ports)
        return [
            (c.fd, c.laddr.port, (c.raddr.ip, c.raddr.port))
            for c in connections
            if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.laddr.port in listeners and c.fd >= 0
        ]

    def watch(self, store_ports: Iterable[int] = ()) -> ConnectionWatch:
        """A watch over the connections ``accepted`` now (none if they cannot be listed)."""
        try:
            return ConnectionWatch([fd for fd, _, _ in self.accepted(store_ports)])
        except (psutil.Error, OSError) as error:
            logger.debug("listing this process's connections: %s", error)
            return ConnectionWatch([])

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


class ConnectionWatch:
    """Whether any of a set of sockets (by descriptor) was closed since the watch was made: by
    its peer (end of stream, reset) or here (the descriptor is gone). Reads nothing; not
    thread-safe (one heartbeat thread polls it)."""

    def __init__(self, fds: Iterable[int]) -> None:
        self._poll = select.poll()
        self.fds = sorted(set(fds))
        for fd in self.fds:
            self._poll.register(fd, _CLOSED)

    def closed(self) -> bool:
        """Whether one of the sockets is closed now (does not wait)."""
        return any(events & (_CLOSED | select.POLLNVAL) for _, events in self._poll.poll(0))
