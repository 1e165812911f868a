"""Coordinator relays: ranks' calls to their run's generation coordinator, merged per node and
up the stores' relay tree.

Every rank of an in-place run beats to the run's one ``GenerationCoordinator`` and joins its
generations there (``actors.generation_coordinator``). Sent one by one, a run of R ranks costs
that actor R calls per beat interval and per rendezvous. Instead a rank sends each call to the
store of its node, and the stores pass them on along the tree that carries stages
(``ray_ckpt.core.relay``): a store merges the calls of one run, kind and key that reach it
while its call up is in flight into its next call up (``Batcher``), and splits the answers
back. So the coordinator takes one call per batch from the root, or from each store not yet
placed in the tree, however many ranks the run has.

A call is ``(op, key, entries)``: ``op`` one of ``OPS``, ``key`` the arguments every merged
caller shares (the generation a poll waits on), ``entries`` one per rank, and the answer is
one result per entry, in order (the coordinator's ``<op>_many``-style methods take and return
exactly that). Pure: no Ray import.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ray_ckpt.core.batcher import Batcher

OPS = {
    "register": "register_many",
    "beat": "beat_many",
    "join": "join_many",
    "await": "await_formed",
    "address": "address_many",
}
"""Each op and the coordinator's method for it: ``method(*key, entries)``."""

WAITING_OPS = frozenset({"await", "address"})
"""Ops whose coordinator call may wait up to ``generations.POLL_S`` before it answers."""

Send = Callable[[str, Any, str, tuple[Any, ...], list[Any]], Sequence[Any]]
"""``send(run, target, op, key, entries)``: one call up (to the parent store, or to the
coordinator ``target``), one result per entry."""


def check_op(op: str) -> str:
    """``op`` itself, or a ValueError naming the ops there are."""
    if op not in OPS:
        raise ValueError(f"unknown coordinator op {op!r}: use one of {sorted(OPS)}")
    return op


class CoordinatorRelay:
    """Concurrent calls to coordinators, merged per (run, op, key) into one ``send`` at a time,
    each caller getting the results of its own entries. ``target`` (the run's coordinator
    handle) goes with every call; the first caller's is sent. Thread-safe."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._batchers: dict[tuple[str, str, tuple[Any, ...]], Batcher[tuple[Any, list[Any]], list[Any]]] = {}

    @property
    def sends(self) -> int:
        """Calls sent up so far."""
        with self._lock:
            return sum(batcher.batches for batcher in self._batchers.values())

    def submit(self, run: str, target: Any, op: str, key: tuple[Any, ...], entries: list[Any]) -> list[Any]:
        """The results of ``entries``, from the call up they went in (``Batcher.submit``)."""
        batcher = self._batcher(run, check_op(op), tuple(key))
        return batcher.submit((target, list(entries)))

    def _batcher(self, run: str, op: str, key: tuple[Any, ...]) -> Batcher[tuple[Any, list[Any]], list[Any]]:
        name = (run, op, key)
        with self._lock:
            batcher = self._batchers.get(name)
            if batcher is None:
                if key:  # a key names a generation: forget the calls of older ones
                    for stale in [n for n in self._batchers if n[:2] == (run, op) and n[2] != key]:
                        del self._batchers[stale]
                batcher = self._batchers[name] = Batcher(lambda calls: self._flush(run, op, key, calls))
            return batcher

    def _flush(self, run: str, op: str, key: tuple[Any, ...], calls: list[tuple[Any, list[Any]]]) -> list[list[Any]]:
        merged = [entry for _, entries in calls for entry in entries]
        results = list(self._send(run, calls[0][0], op, key, merged))
        if len(results) != len(merged):
            raise RuntimeError(f"a coordinator call of {len(merged)} entries got {len(results)} results back")
        split, start = [], 0
        for _, entries in calls:
            split.append(results[start : start + len(entries)])
            start += len(entries)
        return split
