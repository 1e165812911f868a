"""Direct reads and writes: a store's shards served and stored over a plain socket connection,
one per read or write.

Restores read shards through here, not through Ray's object store. A Ray call that returns an
array copies it into the store node's object store, the reader's node pulls it over in chunks,
and the reader copies it once more. Here the store's own memory goes onto the socket and
arrives in the reader's buffer (or straight in the caller's tensors); on this machine a 64 MiB
read from another node took 0.24-0.69 s through Ray and 0.09-0.13 s here (docs/benchmarks.md,
"Resharded restore").

Each store runs one ``DirectReadServer`` bound to its node's address, on a port the system
picks, and on Linux also on an abstract Unix socket, which readers on the same node use (twice
the throughput of a loopback TCP connection here, and no room needed in Ray's object store,
which a Ray get of a local copy needs for the whole copy).

A reader learns the endpoint and its job's token from the store actor (``direct_endpoint(job)``),
so only those who can call the Ray actor can read or write, and a job's token reads and writes
that job only: it is
an HMAC of the job with the store's secret, which never leaves the store. A connection starts
with a fixed-size hello that the store checks before it allocates anything else:

  hello     b"RCK2", the job's token (32 bytes), the job's length (2 bytes, big-endian), the job
            (at most ``JOB_MAX_BYTES``, UTF-8: the limit a ``Checkpointer`` checks at construction);
            answered {"ok": True} or {"error": str} (closed)

then one request per round trip, each framed as a 4-byte big-endian length (at most
``MAX_REQUEST_BYTES``) and a msgpack map, parsed with limits sized to a request:

  request   {"step", "rank", "index", "writer", "local", "ranges": [[start, stop], ...] | None}
            (step, rank, index and range bounds ints >= 0, never a float or bool; writer a str,
            local a bool; anything else is answered {"error": str}): a ``ShardAddress`` but its
            job, which the hello named. With local the index is not used: a reader sends 0, the
            local copy's index, and the store answers with the local copy whatever it is
  answer    {"found": False} | {"error": str} |
            {"found": True, "meta": ShardMeta dict, "intact": bool | None, "sizes": [int, ...]}
            then the bytes of each range (or of the whole shard for ``ranges`` None), back to back.

A save writes its shards the same way (``write``), in the place of a Ray call that would copy
them into the object store of the saver's node, pull them into the store's node and copy them
once more: the store reserves the shard's memory from its budget, says so, and receives the
bytes into it:

  put       {"op": "put", "meta": ShardMeta dict (of the hello's job), "local": bool}
  answer    {"ready": True}, then the shard's bytes arrive, then {"ok": True} |
            {"error": str, "kind": "StoreFullError" | "ConfigError", "details": {...}} |
            {"error": str} (nothing is sent, nothing stored)

The bytes must arrive within ``REQUEST_TIMEOUT_S`` plus their size at ``MIN_WRITE_BYTES_PER_S``;
a write that breaks off stores nothing and gives its memory back.

``intact`` says whether the whole shard still matches its checksum, which a reader of ranges
cannot check (the store hashes a shard at most once per ``INTACT_TTL_S`` for it, not once per
request); for a whole shard it is None, and the reader checks the bytes itself. The store serves
at most ``MAX_CONNECTIONS`` connections at once and refuses more; a hello must arrive within
``HELLO_TIMEOUT_S``, a request within ``REQUEST_TIMEOUT_S`` of its first byte, the next request
within ``IDLE_TIMEOUT_S``. A reader that cannot connect, or loses the connection, gets an
OSError and goes through Ray instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import secrets
import socket
import socketserver
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from ray_ckpt.core import hostmem
from ray_ckpt.core.identity import JOB_MAX_BYTES
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.store import ShardStore
from ray_ckpt.errors import ConfigError, RayCkptError, StoreFullError

logger = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
_HELLO = struct.Struct(">4s32sH")  # magic, the job's token, the job's length
MAGIC = b"RCK2"
MAX_REQUEST_BYTES = 64 << 10  # a request: a few fields and its ranges
MAX_RANGES = 4096  # byte ranges in one request
MAX_ANSWER_BYTES = 16 << 20  # an answer's header (its sizes list), for the reader
# served at once per server; more are refused. A step's saves all write at once: with 8 ranks a
# node and RS(4,2), a store takes about 48 shards and 8 local copies at the same moment
MAX_CONNECTIONS = 256
HELLO_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0
SHUTDOWN_POLL_S = 0.1  # how often a serving thread checks for close()
IDLE_TIMEOUT_S = 120.0
MIN_WRITE_BYTES_PER_S = 16 << 20  # a write's bytes must arrive at least this fast (after REQUEST_TIMEOUT_S)


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
    thread per connection, at most ``MAX_CONNECTIONS`` at once. ``reads`` and ``bytes_sent``
    count what it served, ``writes`` and ``bytes_received`` what it stored, ``refused`` the
    connections turned away at the cap."""

    def __init__(self, store: ShardStore, host: str, port: int = 0) -> None:
        self.store = store
        self._secret = secrets.token_bytes(32)  # never leaves this process: readers get job tokens
        self.reads = 0
        self.bytes_sent = 0
        self.writes = 0
        self.bytes_received = 0
        self.refused = 0
        self._count = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                if not outer._slots.acquire(blocking=False):
                    with outer._count:
                        outer.refused += 1
                    return  # closed at once: the reader goes through Ray
                try:
                    outer._serve(self.request)
                finally:
                    outer._slots.release()

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
            request_queue_size = socket.SOMAXCONN  # a restore of many ranks connects at once

        self._servers: list[socketserver.BaseServer] = [Server((host, port), Handler)]
        unix = None
        if sys.platform.startswith("linux"):
            unix = f"ray_ckpt-{secrets.token_hex(8)}"

            class UnixServer(socketserver.ThreadingUnixStreamServer):
                daemon_threads = True
                request_queue_size = socket.SOMAXCONN

            self._servers.append(UnixServer("\0" + unix, Handler))
        self.host, self.port, self.unix = host, int(self._servers[0].server_address[1]), unix  # type: ignore[index]
        for server in self._servers:
            threading.Thread(
                target=server.serve_forever, args=(SHUTDOWN_POLL_S,), name="ray_ckpt-direct-reads", daemon=True
            ).start()

    def token(self, job: str) -> str:
        """The token that reads ``job``'s shards here (and nothing else): 64 hex digits."""
        return self._mac(job).hex()

    def _mac(self, job: str) -> bytes:
        return hmac.new(self._secret, job.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def endpoint(self, job: str) -> Endpoint:
        """Where and how a reader of ``job`` reads from this store."""
        return Endpoint(self.host, self.port, self.token(job), self.unix)

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def _serve(self, sock: socket.socket) -> None:
        _no_delay(sock)
        try:
            job = self._hello(sock)
            if job is None:
                return
            while True:
                request = _recv_request(sock)
                if request is None:
                    return
                self._answer(sock, job, request)
        except (OSError, ValueError, TypeError, msgpack.UnpackException) as error:  # gone, slow or nonsense
            logger.debug("ray_ckpt direct read: connection closed (%s)", error)

    def _hello(self, sock: socket.socket) -> str | None:
        """The job this connection reads, once its hello checked out; None (answered and to be
        closed) otherwise. Nothing is allocated before the fixed-size part is read and checked."""
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        head = bytearray(_HELLO.size)
        if not _recv_into(sock, memoryview(head), eof_ok=True, deadline=deadline):
            return None
        magic, token, length = _HELLO.unpack(head)
        if magic != MAGIC or length > JOB_MAX_BYTES:
            _send_frame(sock, {"error": "not a ray_ckpt direct-read hello (or a job name over the limit)"})
            return None
        raw = bytearray(length)
        _recv_into(sock, memoryview(raw), deadline=deadline)
        job = raw.decode("utf-8", "surrogatepass")
        if not hmac.compare_digest(token, self._mac(job)):
            _send_frame(sock, {"error": "wrong token for this job"})
            return None
        _send_frame(sock, {"ok": True})
        return job

    def _answer(self, sock: socket.socket, job: str, request: Any) -> None:
        if isinstance(request, dict) and request.get("op") == "put":
            self._receive(sock, job, request)
            return
        try:
            if not isinstance(request, dict):
                raise TypeError("a request is a map")
            step, rank, index = _count_int(request["step"]), _count_int(request["rank"]), _count_int(request["index"])
            writer, local, ranges = request.get("writer", ""), request["local"], request["ranges"]
            if type(writer) is not str or type(local) is not bool:
                raise TypeError(f"writer must be a str and local a bool, got {writer!r} and {local!r}")
            if ranges is not None and (not isinstance(ranges, list) or len(ranges) > MAX_RANGES):
                raise ValueError(f"ranges must be a list of at most {MAX_RANGES} [start, stop] pairs")
            address = ShardAddress(job, step, rank, 0 if local else index, local=local, writer=writer)
            found: tuple[ShardMeta, bool | None, list[np.ndarray]] | None
            if ranges is None:
                whole = self.store.get(address)
                found = None if whole is None else (whole[0], None, [whole[1]])
            else:
                spans = [(_count_int(start), _count_int(stop)) for start, stop in ranges]
                found = self.store.get_ranges(address, spans)
        except (KeyError, TypeError, ValueError) as error:
            _send_frame(sock, {"error": f"{type(error).__name__}: {error}"})
            return
        if found is None:
            _send_frame(sock, {"found": False})
            return
        meta, intact, pieces = found
        with self._count:  # counted before the reader can see the last byte (and check the counts)
            self.reads += 1
            self.bytes_sent += sum(piece.size for piece in pieces)
        _send_frame(sock, {"found": True, "meta": meta.to_dict(), "intact": intact, "sizes": [p.size for p in pieces]})
        for piece in pieces:
            sock.sendall(piece.data)

    def _receive(self, sock: socket.socket, job: str, request: dict[str, Any]) -> None:
        """A direct write: the store reserves the shard's memory from its budget, says it is
        ready, and receives the bytes into that memory; nothing is stored unless every byte came."""
        try:
            meta = ShardMeta.from_dict(request["meta"])
            local = request["local"]
            if type(local) is not bool:
                raise TypeError(f"local must be a bool, got {local!r}")
            if meta.job != job:
                raise ValueError(f"this connection writes job {job!r}, not {meta.job!r}")
        except (KeyError, TypeError, ValueError, RayCkptError) as error:
            _send_frame(sock, {"error": f"{type(error).__name__}: {error}"})
            return
        deadline = time.monotonic() + REQUEST_TIMEOUT_S + meta.shard_size / MIN_WRITE_BYTES_PER_S

        def fill(owned: np.ndarray) -> None:
            _send_frame(sock, {"ready": True})
            _recv_into(sock, hostmem.as_bytes(owned).data, deadline=deadline)

        try:
            self.store.receive(meta, fill, local=local)
        except (StoreFullError, ConfigError) as error:  # refused before the bytes were asked for
            _send_frame(sock, {"error": str(error), "kind": type(error).__name__, "details": error.details})
            return
        with self._count:  # counted before the writer hears it is done
            self.writes += 1
            self.bytes_received += meta.shard_size
        _send_frame(sock, {"ok": True})


@dataclasses.dataclass(frozen=True)
class Landing:
    """Where a ranged read's bytes go when the store vouches for them: range i straight into
    ``arrays[i]`` (a writable uint8 array of its size, or None), but only when the store says
    the shard is intact and its checksum is ``checksum``; else into fresh memory."""

    checksum: int
    arrays: list[np.ndarray | None]


def read(
    endpoint: Endpoint,
    address: ShardAddress,
    *,
    ranges: list[tuple[int, int]] | None,
    timeout_s: float,
    into: Landing | None = None,
    whole_into: Callable[[], np.ndarray | None] | None = None,
    same_node: bool = False,
) -> tuple[dict[str, Any], bool | None, list[np.ndarray]] | None:
    """``(meta dict, intact, pieces)`` of the shard (or a rank's local copy) at ``address``,
    from the store at ``endpoint``, or None if it does not hold it.
    ``ranges`` None reads the whole shard as one writable piece: into ``whole_into()`` (called
    once the store answered) when that is a writable uint8 array of the shard's size, whatever
    the bytes are (the caller checks a whole shard itself), else fresh memory. A piece that
    landed ``into`` (ranges) or ``whole_into`` is that array.
    ``same_node``: the store runs on the caller's node (its Unix socket is used when it has
    one). OSError when the store cannot be reached or the connection breaks; ValueError for an
    answer that is an error (a range out of bounds)."""
    with _connect(endpoint, same_node, timeout_s) as sock:
        _open(sock, endpoint, address.job)
        _send_frame(
            sock,
            {
                "step": address.step,
                "rank": address.rank,
                "index": address.index,
                "writer": address.writer,
                "local": address.local,
                "ranges": None if ranges is None else [list(span) for span in ranges],
            },
        )
        answer = _recv_frame(sock, MAX_ANSWER_BYTES)
        if not isinstance(answer, dict):
            raise ConnectionError(f"store at {endpoint.host}:{endpoint.port} closed the connection")
        if "error" in answer:
            raise ValueError(f"store at {endpoint.host}:{endpoint.port}: {answer['error']}")
        if not answer["found"]:
            return None
        sizes = [int(size) for size in answer["sizes"]]
        vouched = into is not None and answer["intact"] is True and answer["meta"].get("checksum") == into.checksum
        arrays = into.arrays if vouched and into is not None else [None] * len(sizes)
        if ranges is None and whole_into is not None:
            arrays = [_writable_bytes(whole_into())]
        targets = [a if a is not None and a.size == size else None for a, size in zip(arrays, sizes, strict=True)]
        scratch = hostmem.allocate(sum(size for size, target in zip(sizes, targets, strict=True) if target is None))
        pieces, cursor = [], 0
        for size, target in zip(sizes, targets, strict=True):
            if target is None:
                target, cursor = scratch[cursor : cursor + size], cursor + size
            _recv_into(sock, target.data)
            pieces.append(target)
        return answer["meta"], answer["intact"], pieces


def _writable_bytes(array: Any) -> np.ndarray | None:
    """``array`` if bytes can be received into it (a writable, contiguous uint8 array)."""
    if isinstance(array, np.ndarray) and array.dtype == np.uint8 and array.flags.writeable and array.flags.c_contiguous:
        return array
    return None


def write(
    endpoint: Endpoint, meta: ShardMeta, data: np.ndarray, *, local: bool, timeout_s: float, same_node: bool = False
) -> None:
    """Store ``data`` (a shard, or with ``local`` a rank's local copy) as ``meta`` in the store at
    ``endpoint``: the bytes go from ``data`` onto the socket and into memory the store took from
    its budget. StoreFullError or ConfigError as the store raised them (nothing was sent);
    OSError when the store cannot be reached or the connection breaks (nothing was stored);
    ValueError for any other refusal."""
    with _connect(endpoint, same_node, timeout_s) as sock:
        _open(sock, endpoint, meta.job)
        _send_frame(sock, {"op": "put", "meta": meta.to_dict(), "local": local})
        ready = _recv_frame(sock, MAX_ANSWER_BYTES)
        if isinstance(ready, dict) and "error" in ready:
            kind = {"StoreFullError": StoreFullError, "ConfigError": ConfigError}.get(str(ready.get("kind")))
            if kind is not None and isinstance(ready.get("details"), dict):
                raise kind(str(ready["error"]), **ready["details"])
            raise ValueError(f"store at {endpoint.host}:{endpoint.port}: {ready['error']}")
        if not isinstance(ready, dict) or not ready.get("ready"):
            raise ConnectionError(f"store at {endpoint.host}:{endpoint.port} closed the connection")
        sock.sendall(hostmem.as_bytes(data).data)
        done = _recv_frame(sock, MAX_ANSWER_BYTES)
        if not isinstance(done, dict) or not done.get("ok"):
            raise ConnectionError(f"store at {endpoint.host}:{endpoint.port} did not confirm the write: {done!r}")


class StoreBusyError(ConnectionError):
    """The store closed a connection before its hello was answered: it serves its cap of
    connections (or it is going away). The caller goes through Ray this once."""


def _open(sock: socket.socket, endpoint: Endpoint, job: str) -> None:
    """Send the hello for ``job`` and check the store's answer to it."""
    name = job.encode("utf-8", "surrogatepass")
    sock.sendall(_HELLO.pack(MAGIC, _token_bytes(endpoint.token), len(name)) + name)
    try:
        hello = _recv_frame(sock, MAX_ANSWER_BYTES)
    except ConnectionResetError:
        hello = None
    if not isinstance(hello, dict):  # refused at the cap, or gone: the caller goes through Ray
        raise StoreBusyError(f"store at {endpoint.host}:{endpoint.port} closed the connection")
    if not hello.get("ok"):
        raise ValueError(f"store at {endpoint.host}:{endpoint.port}: {hello.get('error')}")


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


def _recv_frame(sock: socket.socket, limit: int) -> Any:
    """The next frame's value (a reader's: the store's answers), or None at a clean end of the
    connection; ValueError for a frame over ``limit`` bytes."""
    head = bytearray(_LENGTH.size)
    if not _recv_into(sock, memoryview(head), eof_ok=True):
        return None
    (length,) = _LENGTH.unpack(head)
    if length > limit:
        raise ValueError(f"frame of {length} bytes is over the {limit}-byte limit")
    body = bytearray(length)
    _recv_into(sock, memoryview(body))
    return msgpack.unpackb(body)


def _recv_request(sock: socket.socket) -> Any:
    """The store's side: the next request, parsed with limits sized to a request, within
    ``IDLE_TIMEOUT_S`` of the last one and ``REQUEST_TIMEOUT_S`` of its first byte; None at a
    clean end of the connection."""
    head = bytearray(_LENGTH.size)
    first = bytearray(1)
    if not _recv_into(sock, memoryview(first), eof_ok=True, deadline=time.monotonic() + IDLE_TIMEOUT_S):
        return None
    head[0] = first[0]
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    _recv_into(sock, memoryview(head)[1:], deadline=deadline)
    (length,) = _LENGTH.unpack(head)
    if length > MAX_REQUEST_BYTES:
        raise ValueError(f"request of {length} bytes is over the {MAX_REQUEST_BYTES}-byte limit")
    body = bytearray(length)
    _recv_into(sock, memoryview(body), deadline=deadline)
    return msgpack.unpackb(
        body,
        max_str_len=4096,
        max_bin_len=0,
        max_ext_len=0,
        max_array_len=2 * MAX_RANGES,
        max_map_len=16,
    )


def _token_bytes(token: str) -> bytes:
    """A token's 32 bytes (a malformed one: 32 zero bytes, which no job's token is)."""
    try:
        raw = bytes.fromhex(token)
    except ValueError:
        raw = b""
    return raw if len(raw) == 32 else bytes(32)


def _count_int(value: Any) -> int:
    """An int >= 0 from a request (never a bool or float: 1.9 is no index); ValueError."""
    if type(value) is not int or value < 0:
        raise ValueError(f"expected an int >= 0, got {value!r}")
    return value


def _recv_into(sock: socket.socket, view: memoryview, *, eof_ok: bool = False, deadline: float | None = None) -> bool:
    """Fill ``view`` from ``sock``; False if the connection ended before its first byte and
    ``eof_ok``, ConnectionError if it ended anywhere else. With a ``deadline`` (monotonic
    time) it gives up (TimeoutError) then, however the bytes trickle."""
    got = 0
    while got < len(view):
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{got} of {len(view)} bytes arrived in time")
            sock.settimeout(left)
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0 and eof_ok:
                return False
            raise ConnectionError(f"connection ended after {got} of {len(view)} bytes")
        got += n
    return True
