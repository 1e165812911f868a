"""Direct reads: a store's shards served over a plain socket connection, one per read.

Restores read shards through here, not through Ray's object store. A Ray call that returns an
array copies it into the store node's object store, the reader's node pulls it over in chunks,
and the reader copies it once more. Here the store's own memory goes onto the socket and
arrives in the reader's buffer (or straight in the caller's tensors); on this machine a 64 MiB
read from another node took 0.24-0.69 s through Ray and 0.09-0.13 s here (docs/benchmarks.md,
"Resharded restore").

Each store runs one ``DirectReadServer`` bound to its node's address, on a port the system
picks, and on Linux also on an abstract Unix socket, which readers on the same node use (twice
the throughput of a loopback TCP connection here, and no room needed in Ray's object store,
which a Ray get of a local copy needs for the whole copy). A reader learns the endpoint and a
token from the store actor, so only those who can call the Ray actor can read. One request per
round trip, all framed as a 4-byte big-endian length and a msgpack map:

  request   {"token", "job", "step", "rank", "index", "writer", "local", "ranges": [[start, stop], ...] | None}
  answer    {"found": False} | {"error": str} |
            {"found": True, "meta": ShardMeta dict, "intact": bool | None, "sizes": [int, ...]}
            then the bytes of each range (or of the whole shard for ``ranges`` None), back to back.

``intact`` says whether the whole shard still matches its checksum, which a reader of ranges
cannot check; for a whole shard it is None, and the reader checks the bytes itself. A reader
that cannot connect, or loses the connection, gets an OSError and goes through Ray instead.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import secrets
import socket
import socketserver
import struct
import sys
import threading
from typing import Any

import msgpack
import numpy as np

from ray_ckpt import hostmem
from ray_ckpt.shard import ShardMeta
from ray_ckpt.store import ShardStore

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
_MAX_FRAME = 16 << 20  # a request or answer header; its ranges are far smaller
_SERVER_IDLE_S = 300.0  # a connection silent this long is closed by the store


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where a store serves direct reads, and the token it asks of readers."""

    host: str
    port: int
    token: str
    unix: str | None = None  # the abstract Unix socket's name, for readers on the same node

    def to_wire(self) -> list[Any]:
        return [self.host, self.port, self.token, self.unix]

    @classmethod
    def from_wire(cls, values: list[Any]) -> Endpoint:
        host, port, token, unix = values
        return cls(str(host), int(port), str(token), None if unix is None else str(unix))


class DirectReadServer:
    """Serves ``store``'s shards on ``host`` (port 0: one the system picks) from a daemon
    thread per connection. ``reads`` and ``bytes_sent`` count what it served."""

    def __init__(self, store: ShardStore, host: str, port: int = 0) -> None:
        self.store = store
        self.token = secrets.token_hex(16)
        self.reads = 0
        self.bytes_sent = 0
        self._count = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._servers: list[socketserver.BaseServer] = [Server((host, port), Handler)]
        unix = None
        if sys.platform.startswith("linux"):
            unix = f"ray_ckpt-{secrets.token_hex(8)}"

            class UnixServer(socketserver.ThreadingUnixStreamServer):
                daemon_threads = True

            self._servers.append(UnixServer("\0" + unix, Handler))
        tcp_port = int(self._servers[0].server_address[1])  # type: ignore[index]
        self.endpoint = Endpoint(host, tcp_port, self.token, unix)
        for server in self._servers:
            threading.Thread(target=server.serve_forever, name="ray_ckpt-direct-reads", daemon=True).start()

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(_SERVER_IDLE_S)
        _no_delay(sock)
        try:
            while True:
                request = _recv_frame(sock)
                if request is None:
                    return
                if not isinstance(request, dict) or not hmac.compare_digest(str(request.get("token", "")), self.token):
                    _send_frame(sock, {"error": "wrong or missing token"})
                    return
                self._answer(sock, request)
        except (OSError, ValueError, TypeError) as error:  # the reader went away or spoke nonsense
            logger.debug("ray_ckpt direct read: connection closed (%s)", error)

    def _answer(self, sock: socket.socket, request: dict[str, Any]) -> None:
        try:
            shard = (str(request["job"]), int(request["step"]), int(request["rank"]), int(request["index"]))
            writer = str(request.get("writer", ""))
            local, ranges = bool(request["local"]), request["ranges"]
            found: tuple[ShardMeta, bool | None, list[np.ndarray]] | None
            if ranges is None:
                whole = self.store.get(*shard, local=local, writer=writer)
                found = None if whole is None else (whole[0], None, [whole[1]])
            else:
                spans = [(int(start), int(stop)) for start, stop in ranges]
                found = self.store.get_ranges(*shard, spans, local=local, writer=writer)
        except (KeyError, TypeError, ValueError) as error:
            _send_frame(sock, {"error": f"{type(error).__name__}: {error}"})
            return
        if found is None:
            _send_frame(sock, {"found": False})
            return
        meta, intact, pieces = found
        _send_frame(sock, {"found": True, "meta": meta.to_dict(), "intact": intact, "sizes": [p.size for p in pieces]})
        for piece in pieces:
            sock.sendall(piece.data)
        with self._count:
            self.reads += 1
            self.bytes_sent += sum(piece.size for piece in pieces)


@dataclasses.dataclass(frozen=True)
class Landing:
    """Where a ranged read's bytes go when the store vouches for them: range i straight into
    ``arrays[i]`` (a writable uint8 array of its size, or None), but only when the store says
    the shard is intact and its checksum is ``checksum``; else into fresh memory."""

    checksum: int
    arrays: list[np.ndarray | None]


def read(
    endpoint: Endpoint,
    *,
    job: str,
    step: int,
    rank: int,
    index: int,
    ranges: list[tuple[int, int]] | None,
    local: bool,
    timeout_s: float,
    writer: str = "",
    into: Landing | None = None,
    same_node: bool = False,
) -> tuple[dict[str, Any], bool | None, list[np.ndarray]] | None:
    """``(meta dict, intact, pieces)`` of one shard (or with ``local`` a rank's local copy)
    that ``writer`` saved, from the store at ``endpoint``, or None if it does not hold it. ``ranges`` None reads the
    whole shard as one writable piece. A piece that landed ``into`` is that array.
    ``same_node``: the store runs on the caller's node (its Unix socket is used when it has
    one). OSError when the store cannot be reached or the connection breaks; ValueError for an
    answer that is an error (a range out of bounds)."""
    with _connect(endpoint, same_node, timeout_s) as sock:
        _send_frame(
            sock,
            {
                "token": endpoint.token,
                "job": job,
                "step": step,
                "rank": rank,
                "index": index,
                "writer": writer,
                "local": local,
                "ranges": None if ranges is None else [list(span) for span in ranges],
            },
        )
        answer = _recv_frame(sock)
        if not isinstance(answer, dict):
            raise ConnectionError(f"store at {endpoint.host}:{endpoint.port} closed the connection")
        if "error" in answer:
            raise ValueError(f"store at {endpoint.host}:{endpoint.port}: {answer['error']}")
        if not answer["found"]:
            return None
        sizes = [int(size) for size in answer["sizes"]]
        vouched = into is not None and answer["intact"] is True and answer["meta"].get("checksum") == into.checksum
        arrays = into.arrays if vouched and into is not None else [None] * len(sizes)
        targets = [a if a is not None and a.size == size else None for a, size in zip(arrays, sizes, strict=True)]
        scratch = hostmem.allocate(sum(size for size, target in zip(sizes, targets, strict=True) if target is None))
        pieces, cursor = [], 0
        for size, target in zip(sizes, targets, strict=True):
            if target is None:
                target, cursor = scratch[cursor : cursor + size], cursor + size
            _recv_into(sock, target.data)
            pieces.append(target)
        return answer["meta"], answer["intact"], pieces


def _connect(endpoint: Endpoint, same_node: bool, timeout_s: float) -> socket.socket:
    if same_node and endpoint.unix is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect("\0" + endpoint.unix)
        except BaseException:
            sock.close()
            raise
        return sock
    sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
    _no_delay(sock)
    return sock


def _no_delay(sock: socket.socket) -> None:
    """Requests and answer headers are small: send them at once (TCP only)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _send_frame(sock: socket.socket, value: Any) -> None:
    body = msgpack.packb(value)
    sock.sendall(_LENGTH.pack(len(body)) + body)


def _recv_frame(sock: socket.socket) -> Any:
    """The next frame's value, or None at a clean end of the connection."""
    head = bytearray(_LENGTH.size)
    if not _recv_into(sock, memoryview(head), eof_ok=True):
        return None
    (length,) = _LENGTH.unpack(head)
    if length > _MAX_FRAME:
        raise ValueError(f"frame of {length} bytes is over the {_MAX_FRAME}-byte limit")
    body = bytearray(length)
    _recv_into(sock, memoryview(body))
    return msgpack.unpackb(bytes(body))


def _recv_into(sock: socket.socket, view: memoryview, *, eof_ok: bool = False) -> bool:
    """Fill ``view`` from ``sock``; False if the connection ended before its first byte and
    ``eof_ok``, ConnectionError if it ended anywhere else."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0 and eof_ok:
                return False
            raise ConnectionError(f"connection ended after {got} of {len(view)} bytes")
        got += n
    return True
