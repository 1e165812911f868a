"""Coordinator relays: ranks' calls to their run's generation coordinator, merged per node and
up the stores' relay tree.

Every rank of an in-place run beats to the run's one ``GenerationCoordinator`` and joins its
generations there (``ray_ckpt.actors.generation_coordinator``). Sent one by one, a run of R ranks costs
that actor R calls per beat interval and per rendezvous. Instead a rank sends each call to the
store of its node, and the stores pass them on along the tree that carries stages
(``ray_ckpt.core.relay``): a store merges the calls of one run and coordinator, kind and key
that reach it while its call up is in flight into its next call up (``Batcher``), and splits
the answers back. So the coordinator takes one call per batch from the root, or from each store
not yet placed in the tree, however many ranks the run has. Calls that name another coordinator
(one made for a probe, or a run's next controller, under the same run id) never share a batch,
so each entry reaches the coordinator its caller named. A store keeps a batcher per (run,
coordinator, op, key) only while it is used: one no call used for ``IDLE_S`` is dropped at
the next call, and beyond ``MAX_BATCHERS`` the least recently used go first, so ended runs and
past generations leave little behind.

A call is ``(op, key, entries)``: ``op`` one of ``OPS``, ``key`` the arguments every merged
caller shares (the generation a poll waits on), ``entries`` one per rank, and the answer is
one result per entry, in order (the coordinator's ``<op>_many``-style methods take and return
exactly that). Pure: no Ray import.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
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

IDLE_S = 60.0
"""How long a store keeps a batcher no call used (a beat's is used every beat interval)."""

MAX_BATCHERS = 1024
"""The most batchers a store keeps (about five per run and coordinator); the least recently
used go first."""

Send = Callable[[str, Any, str, tuple[Any, ...], list[Any]], Sequence[Any]]
"""``send(run, target, op, key, entries)``: one call up (to the parent store, or to the
coordinator ``target``), one result per entry."""

_Name = tuple[str, Hashable, str, tuple[Any, ...]]
"""A batcher's (run, coordinator's name, op, key)."""

_Batcher = Batcher[tuple[Any, list[Any]], list[Any]]
"""Calls (target, entries) of one name, each answered with its entries' results."""


def check_op(op: str) -> str:
    """``op`` itself, or a ValueError naming the ops there are."""
    if op not in OPS:
        raise ValueError(f"unknown coordinator op {op!r}: use one of {sorted(OPS)}")
    return op


class CoordinatorRelay:
    """Concurrent calls to coordinators, merged per (run, coordinator, op, key) into one ``send``
    at a time, each caller getting the results of its own entries. ``target`` (the coordinator's
    handle) goes with every call and is sent with its batch; ``identify(target)`` names the
    coordinator (default: the target itself), so calls of one run that name two coordinators
    never merge. Batchers are kept by that name, not by the handle: a store keeps no coordinator
    alive. At most ``max_batchers`` are kept, and a call drops those no call used for ``idle_s``
    (``clock`` tells the time); a call that finds its batcher dropped makes a new one (one
    dropped while a call of it is in flight still answers that call). Thread-safe."""

    def __init__(
        self,
        send: Send,
        *,
        identify: Callable[[Any], Hashable] = lambda target: target,
        idle_s: float = IDLE_S,
        max_batchers: int = MAX_BATCHERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if idle_s <= 0 or max_batchers < 1:
            raise ValueError(f"idle_s must be > 0 and max_batchers >= 1, got {idle_s} and {max_batchers}")
        self._send, self._identify = send, identify
        self._idle_s, self._max_batchers, self._clock = idle_s, max_batchers, clock
        self._lock = threading.Lock()
        self._batchers: OrderedDict[_Name, tuple[_Batcher, float]] = OrderedDict()  # least recently used first
        self._sends = 0

    @property
    def sends(self) -> int:
        """Calls sent up so far."""
        with self._lock:
            return self._sends

    @property
    def batchers(self) -> list[tuple[str, Hashable, str, tuple[Any, ...]]]:
        """The (run, coordinator's name, op, key) of each batcher kept, least recently used first."""
        with self._lock:
            return list(self._batchers)

    def submit(self, run: str, target: Any, op: str, key: tuple[Any, ...], entries: list[Any]) -> list[Any]:
        """The results of ``entries``, from the call up to ``target`` they went in
        (``Batcher.submit``)."""
        batcher = self._batcher((run, self._identify(target), check_op(op), tuple(key)))
        return batcher.submit((target, list(entries)))

    def _batcher(self, name: _Name) -> _Batcher:
        run, coordinator, op, key = name
        now = self._clock()
        with self._lock:
            kept = self._batchers.pop(name, None)
            if kept is not None:
                batcher = kept[0]
            else:
                if key:  # a key names a generation: forget the calls of older ones
                    for stale in [n for n in self._batchers if n[:3] == (run, coordinator, op) and n[3] != key]:
                        del self._batchers[stale]
                batcher = Batcher(lambda calls: self._flush(run, op, key, calls))
            self._batchers[name] = (batcher, now)
            while len(self._batchers) > self._max_batchers:
                self._batchers.popitem(last=False)
            while now - next(iter(self._batchers.values()))[1] > self._idle_s:  # never this call's own
                self._batchers.popitem(last=False)
            return batcher

    def _flush(self, run: str, op: str, key: tuple[Any, ...], calls: list[tuple[Any, list[Any]]]) -> list[list[Any]]:
        """One call up with every entry of ``calls``, to their coordinator (all name the same)."""
        merged = [entry for _, entries in calls for entry in entries]
        with self._lock:
            self._sends += 1
        results = list(self._send(run, calls[0][0], op, key, merged))
        if len(results) != len(merged):
            raise RuntimeError(f"a coordinator call of {len(merged)} entries got {len(results)} results back")
        split, start = [], 0
        for _, entries in calls:
            split.append(results[start : start + len(entries)])
            start += len(entries)
        return split
