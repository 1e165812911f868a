"""Interrupting a worker's training function from another thread when a peer is lost.

The heartbeat thread learns that the generation lost a member while the training function may
be anywhere: in a long compute, in a collective, in a ray_ckpt call. ``Interrupts.fire`` raises
``ray_ckpt.errors.PeerLost`` into the thread that runs the function, at its next Python
operation (``PyThreadState_SetAsyncExc``, as ``KeyboardInterrupt`` reaches the main thread). A
thread blocked inside one C call (a collective, a sleep) sees it when that call returns: the
heartbeat shuts the generation's connections first, so a collective returns at once.

The contract, with the thread that runs the function:
- ``arm()`` before calling the function, ``disarm()`` when it returns or raises (in a
  ``finally``); ``fire`` raises only into an armed thread, at most once per ``arm``, and
  ``disarm`` withdraws a ``PeerLost`` not yet raised. ``fired`` says whether ``fire`` came
  during the last arm, so the caller counts whatever the function then raised as the peer's loss.
- Inside ``shielded()`` (ray_ckpt's own calls: a save's copy, a restore, a commit) nothing is
  raised asynchronously; a ``fire`` meanwhile raises ``PeerLost`` as the outermost shielded
  block exits, so ray_ckpt's state is never cut mid-update. A shielded block that begins after
  a ``fire`` of this arm raises ``PeerLost`` before its work (so a function that swallowed one
  cannot save into the lost generation).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator

from ray_ckpt.errors import PeerLost


def raise_in_thread(thread_id: int, error: type[BaseException] | None) -> None:
    """Have ``error`` raised in thread ``thread_id`` at its next Python operation; None
    withdraws one not yet raised."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), None if error is None else ctypes.py_object(error)
    )


class Interrupts:
    """One worker process's interrupts of its training function (see the module docstring).
    Thread-safe. ``raise_in`` is how an exception reaches a thread (a fake in tests)."""

    def __init__(self, raise_in: Callable[[int, type[BaseException] | None], None] = raise_in_thread) -> None:
        self._raise_in = raise_in
        self._lock = threading.Lock()
        self._thread: int | None = None
        self._shield_depth = 0
        self._pending = False
        self.fired = False

    def arm(self) -> None:
        """The calling thread is about to run the training function."""
        with self._lock:
            self._thread = threading.get_ident()
            self._shield_depth = 0
            self._pending = False
            self.fired = False

    def disarm(self) -> None:
        """The training function returned or raised; a ``PeerLost`` not yet raised is withdrawn."""
        with self._lock:
            if self._thread is not None and self.fired and not self._pending:
                self._raise_in(self._thread, None)
            self._thread = None
            self._pending = False

    def fire(self) -> bool:
        """Interrupt the armed thread (now, or as its shielded block exits). Returns whether a
        ``PeerLost`` is on its way: False outside the function or after a first ``fire``."""
        with self._lock:
            if self._thread is None or self.fired:
                return False
            self.fired = True
            if self._shield_depth > 0:
                self._pending = True
            else:
                self._raise_in(self._thread, PeerLost)
            return True

    @contextlib.contextmanager
    def shielded(self) -> Iterator[None]:
        """A block of ray_ckpt's own work in the training function's thread: no ``PeerLost``
        lands inside it; one fired meanwhile is raised as the outermost block exits. Another
        thread's block is not shielded (nothing is raised into it anyway)."""
        with self._lock:
            me = threading.get_ident()
            mine = self._thread == me
            # fired before the outermost block began: raised here, before any of its work
            late = mine and self.fired and self._shield_depth == 0
            if late and not self._pending:
                self._raise_in(me, None)  # withdrawn, not to land inside the block
            if late:
                self._pending = False
            elif mine:
                self._shield_depth += 1
        if late:
            raise PeerLost()
        try:
            yield
        finally:
            if mine:
                with self._lock:
                    self._shield_depth -= 1
                    deliver = self._shield_depth == 0 and self._pending
                    if deliver:
                        self._pending = False
                if deliver:
                    raise PeerLost()
