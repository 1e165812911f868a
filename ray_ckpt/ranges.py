"""Ranged reads of one rank's checkpoint blob from peer memory.

A resharding rank needs a few byte ranges of several old ranks' blobs, not whole blobs. The
blob is split into k data shards of ``shard_size`` bytes, so a blob range maps to ranges of
one or more data shards, read from their stores. A data shard that is lost, unreachable or no
longer matches its checksum (the store checks the whole shard; a range cannot be checked on
its own) is an erasure: only the same byte positions are read from k other shards and decoded,
since Reed-Solomon works position by position. When the rank's local copy lies on this node,
the ranges are read from it with no network. A caller may name where each range goes
(``read(ranges, into=...)``): the bytes land there straight from the socket when the store
vouches for them, and are copied there otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import numpy as np

from ray_ckpt.core.codec import ReedSolomon
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.wire import FoundRanges, RankRecord
from ray_ckpt.errors import InsufficientShardsError, ShardsUnreachableError, SnapshotFormatError
from ray_ckpt.transport.direct_reads import Landing

Ranges = list[tuple[int, int]]
Targets = list[np.ndarray | None]  # per range: where its bytes go (None: anywhere)
Ask = tuple[str, ShardAddress, Ranges, Landing | None]  # one read: node, shard, ranges, landing


class RangeSource(Protocol):
    """Where ranges are read from (``StoreDirectory`` in production)."""

    def live(self, node_ids: Any) -> set[str]:
        """Which of these nodes run a store that is alive now."""

    def get_ranges(
        self, node_id: str, address: ShardAddress, ranges: Ranges, into: Landing | None = None
    ) -> Future[FoundRanges | None]:
        """The ranges of the shard (or local copy) at ``address`` in that node's store (None: it
        holds none); the future fails if the store does, and with SnapshotFormatError if the
        store's answer is malformed. A source may put pieces ``into`` the landing's arrays (or
        ignore it)."""


class RangeReader:
    """Byte ranges of rank ``rank``'s blob of ``step`` (described by its registry ``record``).
    ``fetched_bytes`` counts what was read so far (decoding reads k pieces per lost one).
    ``live_nodes``: the nodes with a live store as the caller found them for the readers of
    one restore (one look-up for all; a store that died since fails its read, an erasure);
    None: the source is asked on each read."""

    def __init__(
        self,
        source: RangeSource,
        record: RankRecord,
        *,
        job: str,
        step: int,
        rank: int,
        node_id: str,
        timeout_s: Callable[[], float],
        live_nodes: set[str] | None = None,
    ) -> None:
        self.source, self.record, self.job, self.step, self.rank = source, record, job, step, rank
        self.node_id, self._timeout_s, self._live_nodes = node_id, timeout_s, live_nodes
        self.fetched_bytes = 0

    @property
    def blob_size(self) -> int:
        return self.record.payload_size

    def read(self, ranges: Ranges, into: Targets | None = None) -> list[np.ndarray]:
        """The bytes of each blob range ``[start, stop)``, in order; with ``into``, range i is
        written into ``into[i]`` (a writable uint8 array of its size, or None) and returned as
        it. InsufficientShardsError when fewer than k shards can serve a lost data shard's
        positions (``into`` may then hold some of the bytes)."""
        targets: Targets = [None] * len(ranges) if into is None else list(into)
        if len(targets) != len(ranges):
            raise ValueError(f"{len(ranges)} ranges but {len(targets)} places to put them")
        for (start, stop), target in zip(ranges, targets, strict=True):
            if not 0 <= start <= stop <= self.blob_size:
                raise ValueError(f"blob range [{start}, {stop}) is outside the {self.blob_size}-byte blob")
            if target is not None and target.size != stop - start:
                raise ValueError(f"blob range [{start}, {stop}) cannot go into an array of {target.size} bytes")
        local = self._from_local_copy(ranges, targets)
        if local is not None:
            return local
        size = self.record.shard_size
        pieces: dict[int, Ranges] = {}  # data shard -> ranges inside it
        landing: dict[int, Targets] = {}  # data shard -> where each of them goes
        parts: list[list[tuple[int, int]]] = []  # per requested range: (shard, piece position)
        for (start, stop), target in zip(ranges, targets, strict=True):
            part = []
            cursor = start
            while cursor < stop:
                index, offset = divmod(cursor, size)
                end = min(stop, (index + 1) * size)
                wanted = pieces.setdefault(index, [])
                part.append((index, len(wanted)))
                wanted.append((offset, offset + end - cursor))
                landing.setdefault(index, []).append(None if target is None else target[cursor - start : end - start])
                cursor = end
            parts.append(part)
        got = self._data_pieces(pieces, landing)
        out = []
        for part, target in zip(parts, targets, strict=True):
            if target is not None:
                out.append(target)
                continue
            chunks = [got[index][position] for index, position in part]
            out.append(chunks[0] if len(chunks) == 1 else np.concatenate(chunks) if chunks else np.empty(0, np.uint8))
        return out

    def _from_local_copy(self, ranges: Ranges, targets: Targets) -> list[np.ndarray] | None:
        meta = self.record.local
        if meta is None or self.record.local_node != self.node_id:
            return None
        address = ShardAddress.local_copy(self.job, self.step, self.rank, writer=self.record.first.writer)
        found = self._fetch({0: (self.node_id, address, ranges, Landing(meta.checksum, targets))}).get(0)
        if found is None or found is _UNANSWERED or not self._usable(found, meta):
            return None
        self.fetched_bytes += sum(stop - start for start, stop in ranges)
        return [_put(piece, target) for piece, target in zip(found.pieces, targets, strict=True)]

    def _data_pieces(self, pieces: dict[int, Ranges], landing: dict[int, Targets]) -> dict[int, list[np.ndarray]]:
        nodes = self.record.nodes
        live = self._live_nodes if self._live_nodes is not None else self.source.live({nodes[i] for i in nodes})
        asked: dict[int, Ask] = {
            i: (nodes[i], self._address(i), r, Landing(self.record.metas[i].checksum, landing[i]))
            for i, r in pieces.items()
            if nodes.get(i) in live
        }
        found = self._fetch(asked)
        got: dict[int, list[np.ndarray]] = {}
        for index, wanted in pieces.items():
            answer = found.get(index)
            if answer is not None and answer is not _UNANSWERED and self._usable(answer, self.record.metas[index]):
                got[index] = list(answer.pieces)
                self.fetched_bytes += sum(stop - start for start, stop in wanted)
            else:
                got[index] = self._decode(index, wanted, live, unanswered=answer is _UNANSWERED)
            got[index] = [_put(piece, target) for piece, target in zip(got[index], landing[index], strict=True)]
        return got

    def _decode(self, lost: int, wanted: Ranges, live: set[str], *, unanswered: bool = False) -> list[np.ndarray]:
        """The ``wanted`` ranges of data shard ``lost``, decoded from the same positions of k
        other shards (``unanswered``: ``lost``'s own store is alive but did not answer). Fewer
        than k: ShardsUnreachableError when stores that did not answer could make up k (the step
        is not proven lost), else InsufficientShardsError."""
        k = self.record.data_shards
        candidates = [i for i in sorted(self.record.metas) if i != lost and self.record.nodes[i] in live]
        valid: dict[int, np.ndarray] = {}
        silent = {lost} if unanswered else set()
        while candidates and len(valid) < k:
            batch, candidates = candidates[: k - len(valid)], candidates[k - len(valid) :]
            found = self._fetch({i: (self.record.nodes[i], self._address(i), wanted, None) for i in batch})
            for index in batch:
                answer = found.get(index)
                if answer is _UNANSWERED:
                    silent.add(index)
                elif answer is not None and self._usable(answer, self.record.metas[index]):
                    valid[index] = np.concatenate(answer.pieces) if answer.pieces else np.empty(0, np.uint8)
                    self.fetched_bytes += sum(stop - start for start, stop in wanted)
        if len(valid) < k and silent:
            still = self.source.live({self.record.nodes[i] for i in silent})
            silent = {i for i in silent if self.record.nodes[i] in still}
        if len(valid) < k and len(valid) + len(silent) >= k:
            raise ShardsUnreachableError(
                f"job {self.job!r} rank {self.rank} step {self.step}: data shard {lost} could not be read and "
                f"only {len(valid)} of the {k} shards needed to decode its bytes answered; the stores of "
                f"shards {sorted(silent)} are alive but did not answer in time. The step is kept: the next "
                "attempt reads it again (raise RAY_CKPT_PEER_TIMEOUT_S for stores that pause longer)",
                job=self.job,
                rank=self.rank,
                step=self.step,
                unanswered=sorted(silent),
                needed=k,
                available=len(valid),
            )
        if len(valid) < k:
            raise InsufficientShardsError(
                f"job {self.job!r} rank {self.rank} step {self.step}: data shard {lost} is lost and only "
                f"{len(valid)} of the {k} shards needed to decode its bytes survive",
                job=self.job,
                rank=self.rank,
                step=self.step,
                lost=[lost],
                needed=k,
                available=len(valid),
            )
        code = ReedSolomon(k, self.record.parity_shards)
        rebuilt = code.reconstruct(valid, [lost])[lost] if len(valid[next(iter(valid))]) else np.empty(0, np.uint8)
        out, cursor = [], 0
        for start, stop in wanted:
            out.append(rebuilt[cursor : cursor + stop - start])
            cursor += stop - start
        return out

    def _address(self, index: int) -> ShardAddress:
        """Where coded shard ``index`` of this rank's blob is kept."""
        return ShardAddress(self.job, self.step, self.rank, index, writer=self.record.first.writer)

    def _fetch(self, asks: dict[int, Ask]) -> dict[int, Any]:
        """Answers by key, all asked at once: a ``FoundRanges``; None where the store has no live
        handle, answered that it holds nothing or answered malformed metadata (nothing usable);
        ``_UNANSWERED`` where its call failed or did not end in time (a store that is slow, not
        proven dead)."""
        futures: dict[int, Future[FoundRanges | None]] = {}
        for key, (node_id, address, ranges, into) in asks.items():
            try:
                futures[key] = self.source.get_ranges(node_id, address, ranges, into)
            except KeyError:  # no live store there any more
                continue
        deadline = time.monotonic() + self._timeout_s()
        answers: dict[int, Any] = {}
        for key, future in futures.items():
            try:
                answers[key] = future.result(timeout=max(0.0, deadline - time.monotonic()))
            except SnapshotFormatError:  # the store answered, with nothing usable
                answers[key] = None
            except Exception:  # a dead or slow store is an erasure for this read
                answers[key] = _UNANSWERED
        return answers

    @staticmethod
    def _usable(answer: FoundRanges, expected: ShardMeta) -> bool:
        return bool(answer.intact) and answer.meta == expected


_UNANSWERED: Any = object()  # ``RangeReader._fetch``'s answer for a call that failed or did not end in time


def _put(piece: np.ndarray, target: np.ndarray | None) -> np.ndarray:
    """``piece``, or ``target`` holding its bytes (copied unless it landed there already)."""
    if target is None:
        return piece
    if piece.ctypes.data != target.ctypes.data:
        np.copyto(target, piece)
    return target
