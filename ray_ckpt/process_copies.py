"""What a process keeps between its restores: its own save buffers' copies and the reads begun ahead.

A restore may find its step without asking any store: an in-place survivor in the blob its own
save buffer still holds (``OwnCopies``, ``ray_ckpt.own_copies``), a replacement in the read its
worker began as the generation formed (``ReadsAhead``, ``ray_ckpt.prefetch``). Both outlive
the checkpointers of one run of the training function, so they belong to the process:
``ProcessCopies`` holds the two, and ``THIS_PROCESS`` is the one the process owns. The
``Checkpointer`` hands it to its save pipeline and restorer, and the in-place worker begins its
reads in it; a restorer reaches nothing else of the process (tests hand theirs their own).
"""

from __future__ import annotations

import dataclasses

from ray_ckpt.own_copies import OwnCopies
from ray_ckpt.prefetch import ReadsAhead


@dataclasses.dataclass(frozen=True)
class ProcessCopies:
    """One process's ``own_copies`` (the blobs its save buffers still hold) and
    ``reads_ahead`` (the reads begun ahead of its restores). Thread-safe, as each part is."""

    own_copies: OwnCopies = dataclasses.field(default_factory=OwnCopies)
    reads_ahead: ReadsAhead = dataclasses.field(default_factory=ReadsAhead)


THIS_PROCESS = ProcessCopies()
"""The process's own: what its checkpointers and its in-place worker share."""
