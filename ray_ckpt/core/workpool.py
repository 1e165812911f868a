"""One process-wide thread pool for ray_ckpt's bulk memory work (codec kernels, snapshot copies).

Its tasks are leaves: they never wait on other tasks of the pool, so callers on any thread can
submit and wait without deadlock. The native kernels and torch's ``copy_`` release the GIL, so
the threads run in parallel.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def pool() -> ThreadPoolExecutor:
    """The shared pool (created on first use, one thread per core)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="ray_ckpt-work")
        return _pool


def run_all(tasks: Iterable[Callable[[], object]]) -> None:
    """Run ``tasks`` on the pool and wait for all of them; re-raises the first failure after
    every task has finished (so no task still writes into a caller's buffer)."""
    futures = [pool().submit(task) for task in tasks]
    error: BaseException | None = None
    for future in futures:
        try:
            future.result()
        except BaseException as failure:
            error = error or failure
    if error is not None:
        raise error
