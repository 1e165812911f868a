"""StoreDirectory: one rank's view of the store actors: which are alive, and calls to them.

Handles are looked up once and cached (a save touches only the stores it uses, never every
node of the cluster); ``live`` asks Ray afresh, so a restore never counts on a dead store.
Calls return ``concurrent.futures.Future``s, which is what the save and restore paths (and
their fakes in unit tests) wait on, of the typed records of ``ray_ckpt.core.wire``: a store's
answer is parsed here, once (``FoundShard``, ``FoundRanges``, ``PlanAnswer``, ``StageResult``),
and a malformed one fails its future with SnapshotFormatError.

Reads (``get``, ``get_ranges``) and writes (``put``) go straight to the store's socket
(``ray_ckpt.transport.direct_reads``; its Unix socket for the store on this rank's own node) when
it serves one, from a small pool of threads; a store that cannot be reached that way is read
and written through its Ray actor from then on (one that turns a connection away at its cap,
this once).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import ray

from ray_ckpt import settings
from ray_ckpt.core.placement import Node
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.wire import FoundRanges, FoundShard, PlanAnswer, StageRequest, StageResult
from ray_ckpt.transport import direct_reads, naming, remote
from ray_ckpt.transport.direct_reads import Endpoint, Landing

logger = logging.getLogger(__name__)

_DIRECT_THREADS = 16  # direct reads or writes in flight at once (a resharded restore reads every old rank)

_Parsed = TypeVar("_Parsed")


class StoreDirectory:
    """The stores of ``namespace``. Not thread-safe: one rank's save and restore paths, which
    never run at once, share it."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._handles: dict[str, Any] = {}
        # node id -> (job, its endpoint there; None: through Ray)
        self._endpoints: dict[str, tuple[str, Endpoint | None]] = {}
        self._endpoints_lock = threading.Lock()  # also guards the reader pool's creation
        self._threads: ThreadPoolExecutor | None = None
        self._own_node: str | None = None

    def storage_nodes(self, failure_domain_label: str | None) -> list[Node]:
        """The alive nodes that run a store, with their failure domain from the node label (two
        GCS calls, whatever the cluster's size)."""
        stores = naming.store_node_ids(self.namespace)
        result = []
        for node in naming.alive_nodes():
            if node.node_id in stores:
                domain = node.labels.get(failure_domain_label) if failure_domain_label else None
                result.append(Node(node.node_id, domain))
        return result

    def live(self, node_ids: Iterable[str]) -> set[str]:
        """Which of these nodes run a live store now (their handles are cached)."""
        found = naming.store_handles(self.namespace, sorted(set(node_ids)))
        with self._endpoints_lock:
            for node_id, handle in found.items():
                if self._handles.get(node_id, handle) != handle:  # a new store there: ask it anew
                    self._endpoints.pop(node_id, None)
        self._handles.update(found)
        return set(found)

    def _handle(self, node_id: str) -> Any:
        if node_id not in self._handles:
            self._handles.update(naming.store_handles(self.namespace, [node_id]))
        return self._handles[node_id]  # KeyError: no live store there

    def put(self, node_id: str, meta: ShardMeta, data: np.ndarray, local: bool = False) -> Future[None]:
        """Copy ``data`` into that node's store (KeyError: no live store there): straight over the
        store's socket (``direct_reads.write``), or through Ray where it cannot be reached that
        way (the store pulls a ``ray.put`` copy from this node's object store). ``data`` is read
        until the future is done: the caller keeps it unchanged until then."""
        handle = self._handle(node_id)
        if not settings.direct_writes():
            return handle.put.remote(meta.to_dict(), ray.put(data), local).future()

        def push() -> None:
            if self._write(node_id, handle, meta, data, local) is _THROUGH_RAY:
                call = handle.put.remote(meta.to_dict(), ray.put(data), local)
                remote.get(call, timeout=settings.peer_timeout_s())

        return self._pool().submit(push)

    def _write(self, node_id: str, handle: Any, meta: ShardMeta, data: np.ndarray, local: bool) -> Any:
        """A direct write into that store (None), or ``_THROUGH_RAY`` (``_direct``)."""
        timeout_s = settings.peer_timeout_s()
        return self._direct(
            "write to",
            node_id,
            handle,
            meta.job,
            lambda endpoint, same_node: direct_reads.write(
                endpoint, meta, data, local=local, timeout_s=timeout_s, same_node=same_node
            ),
        )

    def get(
        self, node_id: str, address: ShardAddress, into: Callable[[], np.ndarray | None] | None = None
    ) -> Future[FoundShard | None]:
        """The shard (or local copy) at ``address`` in that node's store (None: it holds none).
        Data read directly is writable, and lands in ``into()`` when that is a writable uint8
        array of the shard's size (``direct_reads.read``'s ``whole_into``: unchecked bytes; the
        caller checks them)."""
        handle = self._handle(node_id)
        if not settings.direct_reads():
            return _parsed(handle.get.remote(address.to_wire()).future(), _found_shard)

        def whole() -> FoundShard | None:
            found = self._read(node_id, handle, address, None, None, into)
            if found is _THROUGH_RAY:
                call = handle.get.remote(address.to_wire())
                return _found_shard(remote.get(call, timeout=settings.peer_timeout_s()))
            return None if found is None else FoundShard.from_wire([found[0], found[2][0]])

        return self._pool().submit(whole)

    def get_ranges(
        self, node_id: str, address: ShardAddress, ranges: list[tuple[int, int]], into: Landing | None = None
    ) -> Future[FoundRanges | None]:
        """Byte ranges of the shard (or local copy) at ``address`` in that node's store (None:
        it holds none). A direct read puts the pieces ``into`` its arrays when the store vouches
        for them (``direct_reads.Landing``); the caller copies any other piece."""
        handle = self._handle(node_id)
        if not settings.direct_reads():
            return _parsed(handle.get_ranges.remote(address.to_wire(), ranges).future(), _found_ranges)

        def spans() -> FoundRanges | None:
            found = self._read(node_id, handle, address, ranges, into)
            if found is _THROUGH_RAY:
                call = handle.get_ranges.remote(address.to_wire(), ranges)
                return _found_ranges(remote.get(call, timeout=settings.peer_timeout_s()))
            return _found_ranges(found)

        return self._pool().submit(spans)

    def _read(
        self,
        node_id: str,
        handle: Any,
        address: ShardAddress,
        ranges: list[tuple[int, int]] | None,
        into: Landing | None,
        whole_into: Callable[[], np.ndarray | None] | None = None,
    ) -> Any:
        """A direct read from that store, or ``_THROUGH_RAY`` (``_direct``)."""
        timeout_s = settings.peer_timeout_s()
        return self._direct(
            "read from",
            node_id,
            handle,
            address.job,
            lambda endpoint, same_node: direct_reads.read(
                endpoint,
                address,
                ranges=ranges,
                timeout_s=timeout_s,
                into=into,
                whole_into=whole_into,
                same_node=same_node,
            ),
        )

    def _direct(self, what: str, node_id: str, handle: Any, job: str, call: Callable[[Endpoint, bool], Any]) -> Any:
        """``call(endpoint, same_node)`` on that store's socket, or ``_THROUGH_RAY`` when it
        serves none, turns the connection away at its cap (through Ray this once), or cannot be
        reached (through Ray from now on)."""
        endpoint = self._endpoint(node_id, handle, job)
        if endpoint is None:
            return _THROUGH_RAY
        try:
            return call(endpoint, node_id == self._own_node_id())
        except direct_reads.StoreBusyError:
            return _THROUGH_RAY
        except OSError as error:
            logger.info("ray_ckpt: direct %s the store on %s failed (%s); going through Ray", what, node_id, error)
            with self._endpoints_lock:
                self._endpoints[node_id] = (job, None)
            return _THROUGH_RAY

    def _own_node_id(self) -> str:
        if self._own_node is None:
            self._own_node = str(ray.get_runtime_context().get_node_id())
        return self._own_node

    def _endpoint(self, node_id: str, handle: Any, job: str) -> Endpoint | None:
        """That store's endpoint with ``job``'s token (asked once per store and job)."""
        with self._endpoints_lock:
            known = self._endpoints.get(node_id)
            if known is not None and known[0] == job:
                return known[1]
        wire = remote.get(handle.direct_endpoint.remote(job), timeout=settings.peer_timeout_s())
        endpoint = None if wire is None else Endpoint.from_wire(wire)
        with self._endpoints_lock:
            self._endpoints[node_id] = (job, endpoint)
        return endpoint

    def _pool(self) -> ThreadPoolExecutor:
        """The threads direct reads and writes run on."""
        with self._endpoints_lock:  # a resharded restore's readers ask from several threads
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=_DIRECT_THREADS, thread_name_prefix="ray_ckpt-direct")
            return self._threads

    def stage(self, node_id: str, request: StageRequest) -> Future[StageResult]:
        """Stage through that node's store, which batches its ranks' stages into one registry
        call (KeyError: no live store)."""
        return _parsed(self._handle(node_id).stage.remote(request.to_wire()).future(), StageResult.from_wire)

    def plan(self, node_id: str, job: str, attempt: str | None, rank: int) -> Future[PlanAnswer]:
        """The restore plan of ``attempt`` and ``rank``'s record of its step, through that node's
        store and the relay tree (KeyError: no live store)."""
        return _parsed(self._handle(node_id).plan.remote(job, attempt, rank).future(), PlanAnswer.from_wire)

    def forget(self, node_id: str) -> None:
        """Drop a cached handle (its store failed; a new one may take its place)."""
        self._handles.pop(node_id, None)
        with self._endpoints_lock:
            self._endpoints.pop(node_id, None)

    def clear(self) -> None:
        self._handles.clear()
        with self._endpoints_lock:
            self._endpoints.clear()
        if self._threads is not None:
            self._threads.shutdown(wait=False)
            self._threads = None


_THROUGH_RAY = object()  # a read the store's Ray actor must serve


def _found_shard(wire: Any) -> FoundShard | None:
    return None if wire is None else FoundShard.from_wire(wire)


def _found_ranges(wire: Any) -> FoundRanges | None:
    return None if wire is None else FoundRanges.from_wire(wire)


def _parsed(answer: Future[Any], parse: Callable[[Any], _Parsed]) -> Future[_Parsed]:
    """``answer``'s result parsed by ``parse``, as a future that fails with ``answer``'s error
    or the parse's."""
    parsed: Future[_Parsed] = Future()

    def done(call: Future[Any]) -> None:
        try:
            parsed.set_result(parse(call.result()))
        except BaseException as error:  # the call's error (or the parse's) is the caller's to see
            parsed.set_exception(error)

    answer.add_done_callback(done)
    return parsed
