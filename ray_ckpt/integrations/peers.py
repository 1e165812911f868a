"""What the storage integrations need of ray_ckpt, as two small protocols, and their
implementation over one rank's ``Checkpointer``.

``PeerSteps`` saves this rank's part of a step and opens committed steps; a ``SavedStep``
reads any old rank's snapshot layout (its header's tree) and byte spans of its payload.
Offsets are payload-relative, as in ``snapshot.TensorRef``: where the payload starts in a
rank's blob is the reader's business. Unit tests stand a fake in for both.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from ray_ckpt import reshard
from ray_ckpt.core.forwarded import Forwarded
from ray_ckpt.errors import ConfigError, NoCheckpointError
from ray_ckpt.ranges import RangeReader

if TYPE_CHECKING:
    from ray_ckpt.checkpointer import Checkpointer

Spans = list[tuple[int, int]]


@runtime_checkable
class SavedStep(Protocol):
    """One committed step, open for reading."""

    @property
    def world_size(self) -> int:
        """How many ranks saved the step (old ranks are 0 .. world_size - 1)."""
        ...

    def layouts(self, ranks: Iterable[int]) -> dict[int, Any]:
        """Each of these old ranks' state tree, tensors as ``snapshot.TensorRef`` (read at once)."""
        ...

    def read(self, rank: int, spans: Spans, into: list[np.ndarray | None] | None = None) -> list[np.ndarray]:
        """Payload bytes ``[start, stop)`` of old rank ``rank``, per span; with ``into``, span i
        lands in ``into[i]`` (a writable uint8 array of its size, or None)."""
        ...


@runtime_checkable
class PeerSteps(Protocol):
    """This rank's side of a job's checkpoints in peer memory."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def save(self, step: int, state: dict[str, Any], *, last: bool) -> None:
        """Save ``state`` as this rank's part of ``step``; return once it is staged, or with
        ``last`` (every other rank staged already) once the step committed."""
        ...

    def latest_step(self) -> int | None:
        """The newest committed step, or None."""
        ...

    def open(self, step: int) -> SavedStep:
        """The committed ``step`` for reading; NoCheckpointError when it is not committed."""
        ...

    def loaded(self, step: int, read_bytes: int, phases_s: dict[str, float]) -> None:
        """This rank loaded its state of ``step``, reading ``read_bytes`` in ``phases_s``
        (locate, fetch, decode, load): record it as the rank's restore. Never raises."""
        ...


class CheckpointerPeers:
    """``PeerSteps`` over one rank's ray_ckpt ``Checkpointer`` (``of`` gives one per
    Checkpointer). Its calls into the Checkpointer, which is not thread-safe, hold one lock,
    so a DCP save on an ``async_save`` thread and a load on the training thread take turns;
    waiting for a stage or a commit happens outside the lock."""

    _by_checkpointer: ClassVar[weakref.WeakKeyDictionary[Any, CheckpointerPeers]] = weakref.WeakKeyDictionary()
    _made: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer
        self._lock = threading.Lock()

    @classmethod
    def of(cls, checkpointer: Checkpointer) -> CheckpointerPeers:
        """The one ``CheckpointerPeers`` of ``checkpointer`` (so writers and readers share its lock)."""
        with cls._made:
            found = cls._by_checkpointer.get(checkpointer)
            if found is None:
                found = cls._by_checkpointer[checkpointer] = cls(checkpointer)
            return found

    rank = Forwarded[int]("checkpointer")
    world_size = Forwarded[int]("checkpointer")

    def save(self, step: int, state: dict[str, Any], *, last: bool) -> None:
        with self._lock:
            handle = self.checkpointer.save(step, state)
        if handle.skipped:
            reason = getattr(handle, "skip_reason", None) or "skipped"
            raise ConfigError(
                f"rank {self.rank}: the Checkpointer skipped step {step} ({reason}), so the DCP save cannot commit. "
                "A DCP save saves every step it is given: use a Checkpointer with on_busy='wait' and without "
                "every=, and call dcp.save on the steps you want saved",
                step=step,
                reason=reason,
            )
        if last:
            handle.wait()
        else:
            handle.staged()

    def latest_step(self) -> int | None:
        with self._lock:
            return self.checkpointer.latest_step()

    def open(self, step: int) -> SavedStep:
        with self._lock:
            return ReaderStep(self.checkpointer.range_readers(step))

    def loaded(self, step: int, read_bytes: int, phases_s: dict[str, float]) -> None:
        with self._lock:
            self.checkpointer.record_load(step, "peers", read_bytes, phases_s)


class ReaderStep:
    """``SavedStep`` over a ``RangeReader`` per old rank: each rank's header is read once (a
    lost data shard's bytes decoded from parity, as in any restore), spans are shifted by
    where its payload starts."""

    def __init__(self, readers: dict[int, RangeReader]) -> None:
        self._readers = readers
        self._trees: dict[int, Any] = {}
        self._payload_offsets: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def world_size(self) -> int:
        return len(self._readers)

    @property
    def fetched_bytes(self) -> int:
        """Bytes read from peer memory so far (headers included)."""
        return sum(reader.fetched_bytes for reader in self._readers.values())

    def layouts(self, ranks: Iterable[int]) -> dict[int, Any]:
        wanted = sorted(set(ranks))
        for rank in wanted:
            if rank not in self._readers:
                raise NoCheckpointError(
                    f"old rank {rank} did not save this step (it was saved by ranks 0..{self.world_size - 1})",
                    rank=rank,
                )
        with self._lock:
            missing = [rank for rank in wanted if rank not in self._trees]
            if missing:
                for rank, old in zip(missing, reshard.read_old_ranks([self._readers[r] for r in missing]), strict=True):
                    self._trees[rank], self._payload_offsets[rank] = old.tree, old.payload_offset
            return {rank: self._trees[rank] for rank in wanted}

    def read(self, rank: int, spans: Spans, into: list[np.ndarray | None] | None = None) -> list[np.ndarray]:
        self.layouts([rank])
        base = self._payload_offsets[rank]
        return self._readers[rank].read([(base + start, base + stop) for start, stop in spans], into)
