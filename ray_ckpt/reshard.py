"""Resharded restore: a step saved by N ranks loaded into the caller's state dict at another
world size (elastic training), reading only the bytes this rank's new shards need.

Each old rank's checkpoint header is read first (a few KiB: the tree, every tensor's place in
the payload, each DTensor's layout). Then, for every DTensor of ``into``, this rank's new block
is intersected with the old ranks' blocks; each overlap is read as the one byte span that
holds it in the old rank's payload and copied into place. Of replicated mesh dimensions one
replica is read. Plain tensors and every other value come from one old rank, ``rank % N`` (for
a step saved with data-parallel replicas, any old rank holds the same ones); per-rank values
such as a data loader's position are also handed back for every old rank
(``Resharded.values_by_rank``), so the caller decides. A state without DTensors is per-rank
state and cannot be resharded: ConfigError names its keys.

Everything is planned and checked before a byte is read, so a state that does not fit
changes nothing. Where a new block's part is one run of bytes on both sides (FSDP2's row
shards are), the bytes land in ``into`` straight from the store; the rest is copied into place
after the reads. A read that fails (a step lost beyond its parity) may leave ``into`` part
written, and raises.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from ray_ckpt.core import blob, dtensor, snapshot
from ray_ckpt.core.snapshot import TensorRef
from ray_ckpt.errors import ConfigError
from ray_ckpt.ranges import RangeReader

FIRST_READ = 64 << 10  # the first read of a blob: its prefix and, usually, the whole header


@dataclasses.dataclass
class OldRank:
    """One old rank: its reader, where its payload starts in the blob, its layout tree."""

    rank: int
    reader: RangeReader
    payload_offset: int
    tree: Any


@dataclasses.dataclass(frozen=True)
class Resharded:
    """The filled ``into`` tree, each old rank's non-tensor values (tensors as None), and the
    bytes read against the least the new shards need."""

    state: Any
    values_by_rank: dict[int, Any]
    fetched_bytes: int
    needed_bytes: int


def read_old_ranks(readers: list[RangeReader]) -> list[OldRank]:
    """Every old rank's header (``readers`` in old rank order), read at once."""

    def one(position: int) -> OldRank:
        reader = readers[position]
        first = reader.read([(0, min(FIRST_READ, reader.blob_size))])[0]
        size = blob.header_size(first)
        end = blob.PREFIX_SIZE + size
        header = first[blob.PREFIX_SIZE : end] if end <= first.size else reader.read([(blob.PREFIX_SIZE, end)])[0]
        tree = snapshot.read_layout(header.tobytes())
        return OldRank(position, reader, blob.payload_offset(size), tree)

    with ThreadPoolExecutor(max_workers=min(8, len(readers)), thread_name_prefix="ray_ckpt-headers") as pool:
        return list(pool.map(one, range(len(readers))))


def restore_into(old: list[OldRank], into: Any, *, rank: int) -> Resharded:
    """Fill ``into`` (this rank's state dict in the new layout) from the ``old`` ranks."""
    primary = old[rank % len(old)]
    plan = _Plan(old, primary)
    merged = dtensor.walk(primary.tree, into, plan.leaf)
    if not plan.sharded:
        raise ConfigError(
            f"this step was saved by {len(old)} ranks as plain per-rank tensors ({', '.join(plan.plain[:3])}"
            f"{', ...' if len(plan.plain) > 3 else ''}), which cannot be resharded into another world size: "
            f"restore at world size {len(old)}, or save sharded state as DTensors (FSDP2 fully_shard, or "
            "distribute_tensor) so any world size can load it",
            keys=plan.plain,
        )
    fetched_before = sum(o.reader.fetched_bytes for o in old)
    sources = [o for o in old if plan.reads.get(o.rank)]
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(sources))), thread_name_prefix="ray_ckpt-ranges") as pool:
        pieces = list(pool.map(lambda o: o.reader.read(plan.reads[o.rank], plan.targets[o.rank]), sources))
    data = {o.rank: got for o, got in zip(sources, pieces, strict=True)}
    with torch.no_grad():
        for fill in plan.fills:
            fill(data)
    return Resharded(
        state=merged,
        values_by_rank={o.rank: _values(o.tree) for o in old},
        fetched_bytes=sum(o.reader.fetched_bytes for o in old) - fetched_before,
        needed_bytes=plan.needed,
    )


class _Plan:
    """What to read from which old rank and how to copy it into ``into``, built while walking
    the trees and checking every leaf; nothing is read or written until it is complete."""

    def __init__(self, old: list[OldRank], primary: OldRank) -> None:
        self.old, self.primary = old, primary
        self.reads: dict[int, list[tuple[int, int]]] = {}
        self.targets: dict[int, list[np.ndarray | None]] = {}  # per read: the bytes of ``into`` it lands in
        self.fills: list[Callable[[dict[int, list[np.ndarray]]], None]] = []
        self.sharded = False
        self.plain: list[str] = []
        self.needed = 0

    def read(self, source: OldRank, start: int, stop: int, land: torch.Tensor | None = None) -> tuple[int, int]:
        """Schedule payload bytes ``[start, stop)`` of ``source``, straight into ``land`` (a
        tensor of exactly those bytes) when given; (its rank, position)."""
        wanted = self.reads.setdefault(source.rank, [])
        wanted.append((source.payload_offset + start, source.payload_offset + stop))
        self.targets.setdefault(source.rank, []).append(None if land is None else _bytes_of(land))
        return source.rank, len(wanted) - 1

    def leaf(self, saved: Any, target: Any, keys: tuple[Any, ...]) -> Any:
        """One leaf of the primary's tree (``dtensor.walk``): planned, checked, or passed on."""
        path = dtensor.key_path(keys)
        if isinstance(saved, dtensor.SavedShard):
            self.sharded = True
            return self.shard(saved, target, keys, path)
        if isinstance(saved, TensorRef):
            self.plain.append(path)
            return self.tensor(saved, target, path)
        return saved

    def tensor(self, ref: TensorRef, target: Any, path: str) -> torch.Tensor:
        """A plain tensor, from the primary old rank (into ``target`` when it holds one)."""
        plain = dtensor.plain_target(ref.shape, ref.dtype, target, path)
        out = plain if plain is not None else torch.empty(ref.shape, dtype=ref.dtype)
        self.needed += ref.nbytes
        if not ref.nbytes:
            return out
        if _landable(out):
            self.read(self.primary, ref.offset, ref.offset + ref.nbytes, land=out)
            return out
        source, position = self.read(self.primary, ref.offset, ref.offset + ref.nbytes)

        def fill(data: dict[int, list[np.ndarray]]) -> None:
            out.copy_(as_tensor(data[source][position], ref.dtype).view(ref.shape))

        self.fills.append(fill)
        return out

    def shard(self, saved: dtensor.SavedShard, target: Any, keys: tuple[Any, ...], path: str) -> Any:
        """A DTensor: every overlap of this rank's new block with the old blocks, read and copied."""
        now = dtensor.target_layout(target, path)
        dtype = saved.local.dtype
        if (now.global_shape, now.local.dtype) != (saved.global_shape, dtype):
            raise ConfigError(
                f"{path}: saved {dtype} of global shape {saved.global_shape}, `into` holds {now.local.dtype} of "
                f"global shape {now.global_shape}",
                key_path=path,
            )
        local = now.local
        self.needed += local.numel() * local.element_size()
        for source in self._replica_set(saved, keys, path):
            old_shard = _at(source.tree, keys)
            begin = [max(a, b) for a, b in zip(old_shard.offsets, now.offsets, strict=True)]
            end = [
                min(a + n, b + m)
                for a, n, b, m in zip(old_shard.offsets, old_shard.local.shape, now.offsets, local.shape, strict=True)
            ]
            if all(b < e for b, e in zip(begin, end, strict=True)):
                self._overlap(source, old_shard, begin, end, now, local)
        return target

    def _overlap(
        self,
        source: OldRank,
        old_shard: dtensor.SavedShard,
        begin: list[int],
        end: list[int],
        now: dtensor.SavedShard,
        local: torch.Tensor,
    ) -> None:
        ref: TensorRef = old_shard.local  # type: ignore[assignment]
        size = [e - b for b, e in zip(begin, end, strict=True)]
        strides = row_major_strides(ref.shape)
        start = [b - o for b, o in zip(begin, old_shard.offsets, strict=True)]
        first = sum(s * t for s, t in zip(start, strides, strict=True))
        last = sum((s + n - 1) * t for s, n, t in zip(start, size, strides, strict=True))
        item = ref.dtype.itemsize
        box = tuple(slice(b - o, e - o) for b, e, o in zip(begin, end, now.offsets, strict=True))
        region = local[box]
        if last + 1 - first == region.numel() and _landable(region):  # one run of bytes on both sides
            self.read(source, ref.offset + first * item, ref.offset + (last + 1) * item, land=region)
            return
        key = self.read(source, ref.offset + first * item, ref.offset + (last + 1) * item)

        def fill(data: dict[int, list[np.ndarray]]) -> None:
            span = as_tensor(data[key[0]][key[1]], ref.dtype)
            local[box].copy_(torch.as_strided(span, size, strides))

        self.fills.append(fill)

    def _replica_set(self, saved: dtensor.SavedShard, keys: tuple[Any, ...], path: str) -> list[OldRank]:
        """The old ranks whose blocks tile the tensor once: on each replicated mesh dimension,
        those at the primary's coordinate."""
        replicated = [d for d, p in enumerate(saved.placements) if p[0] == "R"]
        chosen = []
        for source in self.old:
            shard = _at(source.tree, keys)
            if not isinstance(shard, dtensor.SavedShard) or shard.mesh_shape != saved.mesh_shape:
                raise ConfigError(
                    f"{path}: old rank {source.rank} saved it in another layout than old rank "
                    f"{self.primary.rank}; the checkpoint is inconsistent",
                    key_path=path,
                )
            if all(shard.coordinate[d] == saved.coordinate[d] for d in replicated):
                chosen.append(source)
        return chosen


def _at(tree: Any, keys: tuple[Any, ...]) -> Any:
    node = tree
    for key in keys:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _landable(tensor: torch.Tensor) -> bool:
    """Whether fetched bytes can be written straight into ``tensor``'s memory."""
    return tensor.device.type == "cpu" and tensor.is_contiguous() and tensor.numel() > 0


def _bytes_of(tensor: torch.Tensor) -> np.ndarray:
    """A writable uint8 numpy view of a contiguous CPU tensor's bytes."""
    return tensor.detach().reshape(-1).view(torch.uint8).numpy()


def row_major_strides(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return strides[::-1]


def as_tensor(data: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A read-only view of fetched bytes as ``dtype`` (only ever read: torch's warning about
    non-writable arrays does not apply)."""
    if not data.size:
        return torch.empty(0, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(data)).view(dtype)


def _values(tree: Any) -> Any:
    """``tree`` with every tensor (and DTensor shard) replaced by None."""
    return dtensor.walk(
        tree, None, lambda node, _, keys: None if isinstance(node, (TensorRef, dtensor.SavedShard)) else node
    )
