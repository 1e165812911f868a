"""A replacement's restore from peers, begun as soon as its in-place generation formed.

A replacement rank restores its whole state from peers, and its training function calls
``restore()`` only after it built its model (in a real job also wrapped it for FSDP and built
the optimizer). So the in-place worker begins that read when the generation formed (``begin``):
on a thread, it asks the registry which jobs the run checkpoints (the jobs with an attempt of
the run's generations) and reads this rank's blob of each job's planned step from peers, as
``Restorer.read_planned`` does: the plan is the attempt's, decided once for every rank, and the
shards are checked and decoded as in any restore. The first restore of the job in this process
``claim``\\s the read, once, and uses the blob only for the step and record it restores itself
(``Read.blob_of``), else reads as usual. ``clear`` drops every read, at the next generation. A
read changes nothing in the registry or the stores; one that fails or is not used costs the read.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ray_ckpt.core.wire import RankRecord

logger = logging.getLogger(__name__)

Planned = tuple[int, "RankRecord", np.ndarray]  # (step, this rank's record of it, its blob)


@dataclasses.dataclass(frozen=True)
class Read:
    """One job's read, begun by ``begin``: it ends with a ``Planned`` or None (nothing to read)."""

    job: str
    done: Future[Planned | None]

    def blob_of(self, step: int, record: RankRecord, timeout_s: float) -> np.ndarray | None:
        """The blob read, once the read ended (waiting at most ``timeout_s``), if it is of
        ``step`` and ``record``; None otherwise, or if the read failed or did not end."""
        try:
            planned = self.done.result(timeout=timeout_s)
        except Exception as error:  # a failed or slow read: the restore reads for itself
            logger.info("job %r: the read begun at the generation's start is not used: %s", self.job, error)
            return None
        if planned is None or planned[0] != step or planned[1] != record:
            return None
        return planned[2]


_lock = threading.Lock()
_begun: dict[tuple[str, int], Future[dict[str, Read]]] = {}  # (attempt, rank) -> its reads by job


def begin(attempt: str, rank: int, jobs: Callable[[], list[str]], read: Callable[[str], Planned | None]) -> None:
    """Begin, on a daemon thread, ``read(job)`` for each of ``jobs()``, one after another, for
    the restores of ``rank`` under ``attempt`` to claim."""
    listed: Future[dict[str, Read]] = Future()
    with _lock:
        _begun[(attempt, rank)] = listed

    def run() -> None:
        try:
            reads = {job: Read(job, Future()) for job in jobs()}
        except Exception as error:
            listed.set_exception(error)
            return
        listed.set_result(reads)
        for job, one in list(reads.items()):
            try:
                one.done.set_result(read(job))
            except Exception as error:
                one.done.set_exception(error)

    threading.Thread(target=run, name=f"ray_ckpt-prefetch-{rank}", daemon=True).start()


def claim(job: str, attempt: str | None, rank: int, timeout_s: float = 10.0) -> Read | None:
    """The read begun for ``job``'s restore of ``rank`` under ``attempt``, once; None when none
    was begun (or the jobs could not be listed within ``timeout_s``)."""
    if attempt is None:
        return None
    with _lock:
        listed = _begun.get((attempt, rank))
    if listed is None:
        return None
    try:
        reads = listed.result(timeout=timeout_s)
    except Exception as error:
        logger.info("listing the run's jobs for an early read failed: %s", error)
        return None
    with _lock:
        return reads.pop(job, None)


def clear() -> None:
    """Drop every read (a new generation forms: its restores plan anew)."""
    with _lock:
        _begun.clear()
