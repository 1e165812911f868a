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
``ReadsAhead`` keeps the reads; the process's one instance is part of its ``ProcessCopies``
(``ray_ckpt.process_copies``), which the worker begins them with and the restorer is handed.

What is read and not claimed yet is bounded: blobs held for at most RAY_CKPT_PREFETCH_MAX_AGE_S
after they were read, and together at most RAY_CKPT_PREFETCH_MAX_BYTES (past it the oldest is
dropped first; a blob larger than that alone is not held). A dropped read is as if none was
begun: its restore reads for itself. Once every read was claimed or dropped, nothing of the
generation's reads is left here.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from ray_ckpt import settings

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


class ReadsAhead:
    """The reads a process began ahead of its restores, by (attempt, rank) and job, and the
    blobs they hold unclaimed. Thread-safe: reads run on their own threads, claims on the
    restoring one. The process's one instance is part of its ``ProcessCopies``
    (``ray_ckpt.process_copies``): the in-place worker begins and clears its reads, the
    checkpointer's restorer claims them."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._begun: dict[tuple[str, int], Future[dict[str, Read]]] = {}  # (attempt, rank) -> its reads by job
        # the blobs read and not claimed yet, oldest first: (attempt, rank, job) -> (when read, monotonic; bytes)
        self._held: dict[tuple[str, int, str], tuple[float, int]] = {}

    def begin(
        self, attempt: str, rank: int, jobs: Callable[[], list[str]], read: Callable[[str], Planned | None]
    ) -> None:
        """Begin, on a daemon thread, ``read(job)`` for each of ``jobs()``, one after another, for
        the restores of ``rank`` under ``attempt`` to claim; the thread then drops what is not
        claimed once it is RAY_CKPT_PREFETCH_MAX_AGE_S old."""
        listed: Future[dict[str, Read]] = Future()
        with self._lock:
            self._begun[(attempt, rank)] = listed

        def run() -> None:
            try:
                reads = {job: Read(job, Future()) for job in jobs()}
            except Exception as error:
                listed.set_exception(error)
                return
            listed.set_result(reads)
            for job, one in list(reads.items()):
                try:
                    planned = read(job)
                except Exception as error:
                    one.done.set_exception(error)
                    continue
                one.done.set_result(planned)
                if planned is not None:
                    self._hold((attempt, rank, job), reads, one, int(planned[2].nbytes))
            self._expire((attempt, rank), listed)

        threading.Thread(target=run, name=f"ray_ckpt-prefetch-{rank}", daemon=True).start()

    def claim(self, job: str, attempt: str | None, rank: int, timeout_s: float = 10.0) -> Read | None:
        """The read begun for ``job``'s restore of ``rank`` under ``attempt``, once; None when none
        was begun (or the jobs could not be listed within ``timeout_s``, or it was dropped)."""
        if attempt is None:
            return None
        with self._lock:
            listed = self._begun.get((attempt, rank))
        if listed is None:
            return None
        try:
            reads = listed.result(timeout=timeout_s)
        except Exception as error:
            logger.info("listing the run's jobs for an early read failed: %s", error)
            return None
        with self._lock:
            self._held.pop((attempt, rank, job), None)
            self._lock.notify_all()
            return reads.pop(job, None)

    def clear(self) -> None:
        """Drop every read (a new generation forms: its restores plan anew)."""
        with self._lock:
            self._begun.clear()
            self._held.clear()
            self._lock.notify_all()

    def held_bytes(self) -> int:
        """The bytes of the blobs read ahead and not claimed yet."""
        with self._lock:
            return sum(size for _, size in self._held.values())

    def _hold(self, key: tuple[str, int, str], reads: dict[str, Read], one: Read, size: int) -> None:
        """Hold ``one``'s blob (``size`` bytes) for its restore, unless it was claimed meanwhile;
        then keep the held blobs within RAY_CKPT_PREFETCH_MAX_BYTES, dropping the oldest first."""
        with self._lock:
            if reads.get(key[2]) is not one:  # claimed already (or cleared): its restore has it
                return
            limit = settings.prefetch_max_bytes()
            self._held[key] = (time.monotonic(), size)
            if size > limit:
                self._drop(key, f"{size} bytes, more than RAY_CKPT_PREFETCH_MAX_BYTES={limit}")
                return
            while sum(held for _, held in self._held.values()) > limit:
                self._drop(next(iter(self._held)), f"the oldest read past RAY_CKPT_PREFETCH_MAX_BYTES={limit}")

    def _expire(self, begun: tuple[str, int], listed: Future[dict[str, Read]]) -> None:
        """Drop ``begun``'s blobs as they get RAY_CKPT_PREFETCH_MAX_AGE_S old unclaimed; once none
        is held, forget its reads (a failed one holds its error, and with it the read's frames)."""
        with self._lock:
            while self._begun.get(begun) is listed:
                mine = [(at, key) for key, (at, _) in self._held.items() if key[:2] == begun]
                if not mine:
                    del self._begun[begun]
                    return
                at, oldest = min(mine)
                left = at + settings.prefetch_max_age_s() - time.monotonic()
                if left <= 0:
                    self._drop(
                        oldest, f"not claimed within RAY_CKPT_PREFETCH_MAX_AGE_S={settings.prefetch_max_age_s():g}"
                    )
                else:
                    self._lock.wait(left)

    def _drop(self, key: tuple[str, int, str], why: str) -> None:
        """Forget the read of ``key`` (holding the lock): its restore reads for itself."""
        self._held.pop(key, None)
        listed = self._begun.get(key[:2])
        if listed is not None and listed.done() and listed.exception() is None:
            listed.result().pop(key[2], None)
        logger.info("job %r: the state read ahead for rank %d is dropped: %s", key[2], key[1], why)
