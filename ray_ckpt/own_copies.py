"""The newest saved step a process still holds in a save pipeline's host buffer, for a
rollback in the same process: an in-place survivor's restore, with no store and no socket.

A save's snapshot buffer holds the step's blob (what its local copy in this node's store
holds) until the pipeline's next snapshot overwrites it. ``SavePipeline`` notes the blob once
the step is staged (``note``), forgets it before it writes the buffer again (``forget``) and
when its checkpointer closes (``drop``); a checkpointer abandoned by a failed worker group
gives its buffer up instead (``orphan``), so that the next run of the training function in
this process restores from it. ``take`` hands the blob out once: the buffer itself when no
pipeline writes it any more, else a copy made under the lock the next overwrite waits for.
The restorer checks what it takes against the registry's checksum of the local copy, as it
checks the store's. At most one blob per (job, rank) is held.

``OwnCopies`` keeps them; the process's one instance is part of its ``ProcessCopies``
(``ray_ckpt.process_copies``), which the checkpointer hands to its save pipeline and restorer.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from ray_ckpt.core import hostmem


@dataclasses.dataclass
class _Held:
    step: int
    writer: str
    blob: np.ndarray  # a view of the owner's buffer
    owner: object | None  # the pipeline still writing that buffer; None once it gave it up


class OwnCopies:
    """The blobs a process's save buffers still hold, by (job, rank). Thread-safe: a save's
    background thread notes what a restore on another thread takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[tuple[str, int], _Held] = {}  # (job, rank) -> the newest blob noted

    def note(self, job: str, rank: int, step: int, writer: str, blob: np.ndarray, owner: object) -> None:
        """``owner``'s buffer holds ``step`` of ``job``/``rank``, saved by ``writer``, as ``blob``."""
        with self._lock:
            self._held[(job, rank)] = _Held(step, writer, blob, owner)

    def forget(self, job: str, rank: int) -> None:
        """A buffer of ``job``/``rank`` is about to be written: nothing held for it may be taken
        any more. Returns once no ``take`` copies from it."""
        with self._lock:
            self._held.pop((job, rank), None)

    def orphan(self, owner: object) -> None:
        """``owner`` writes its buffers no more (an abandoned checkpointer): what it noted stays,
        to be taken without a copy."""
        with self._lock:
            for held in self._held.values():
                if held.owner is owner:
                    held.owner = None

    def drop(self, owner: object) -> None:
        """``owner`` closed: what it noted is no longer held (its memory is freed)."""
        with self._lock:
            for key in [key for key, held in self._held.items() if held.owner is owner]:
                del self._held[key]

    def take(self, job: str, rank: int, step: int, writer: str) -> np.ndarray | None:
        """``step`` of ``job``/``rank`` as ``writer`` saved it, if this process holds it (what was
        held is no longer held either way): writable bytes the caller owns."""
        with self._lock:
            held = self._held.pop((job, rank), None)
            if held is None or held.step != step or held.writer != writer:
                return None
            if held.owner is None and held.blob.flags.writeable:
                return held.blob
            copy = hostmem.allocate(held.blob.size)
            copy[:] = held.blob
            return copy
