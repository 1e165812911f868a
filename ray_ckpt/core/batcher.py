"""Batcher: coalesces concurrent calls into batches, with no added latency when idle.

``Batcher(send).submit(item)`` returns ``send([..., item, ...])``'s result for ``item``. When
no batch is in flight the caller sends its item at once, alone; items submitted while a batch
is in flight queue up and go together as the next batch, sent by one of their callers as soon
as the batch in flight returned. So a call waits for at most the batch in flight plus its own,
and N concurrent callers make about log-many sends instead of N. ``submit(item, linger_s)``
trades latency for fewer sends: a caller that finds nothing in flight waits ``linger_s`` for
more items before it sends. Pure: no Ray import.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    def __init__(self, item: T) -> None:
        self.item = item
        self.done = False
        self.result: R | None = None
        self.error: BaseException | None = None


class Batcher(Generic[T, R]):
    """``send(items)`` must return one result per item, in order; if it raises (or returns the
    wrong number of results), every caller of that batch gets the error. Thread-safe."""

    def __init__(self, send: Callable[[list[T]], Sequence[R]]) -> None:
        self._send = send
        self._cond = threading.Condition()
        self._queue: list[_Slot[T, R]] = []
        self._in_flight = False
        self.batches = 0  # batches sent so far (for tests and stats)

    def submit(self, item: T, linger_s: float = 0.0) -> R:
        """``item``'s result, from the batch it went in; re-raises that batch's error. With
        ``linger_s``, a batch this call starts waits that long for more items first."""
        slot: _Slot[T, R] = _Slot(item)
        batch: list[_Slot[T, R]] = []
        with self._cond:
            self._queue.append(slot)
            while self._in_flight and not slot.done:
                self._cond.wait()
            if not slot.done:  # nothing in flight: this caller sends everything queued
                self._in_flight = True
                deadline = time.monotonic() + linger_s
                while (left := deadline - time.monotonic()) > 0:  # others queue meanwhile
                    self._cond.wait(left)
                batch, self._queue = self._queue, []
                self.batches += 1
        if batch:
            self._flush(batch)
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _flush(self, batch: list[_Slot[T, R]]) -> None:
        error: BaseException | None = None
        results: Sequence[R] = ()
        try:
            results = self._send([s.item for s in batch])
            if len(results) != len(batch):
                error = RuntimeError(f"a batch of {len(batch)} items got {len(results)} results back")
        except BaseException as raised:  # handed to every caller of the batch, re-raised there
            error = raised
        with self._cond:
            for index, waiting in enumerate(batch):
                if error is None:
                    waiting.result = results[index]
                else:
                    waiting.error = error
                waiting.done = True
            self._in_flight = False
            self._cond.notify_all()
