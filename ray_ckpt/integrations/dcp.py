"""A torch.distributed.checkpoint (DCP) storage backend over ray_ckpt's peer memory.

``dcp.save(state, storage_writer=PeerMemoryWriter(ckpt), checkpoint_id=step)`` (or
``dcp.async_save``) keeps a DCP checkpoint in the erasure-coded host memory of peer nodes, and
``dcp.load(state, storage_reader=PeerMemoryReader(ckpt))`` reads it back at any world size or
mesh, DCP's planner deciding who reads which chunk. ``ckpt`` is this rank's ray_ckpt
``Checkpointer`` (``ray_ckpt.train.Checkpointer()`` under Ray Train); docs/dcp.md is the guide.

- **checkpoint_id** is the ray_ckpt step: an int in [0, 2**63), or a str of one; steps must
  increase from save to save. Loading without one loads the newest committed step.
- **What a rank saves** (one ray_ckpt state per step): ``{"format": FORMAT, "coordinator":
  the ray_ckpt rank of DCP's coordinator, "items": {item key: tensor}}``, and on the
  coordinator also ``"metadata"``: DCP's global ``Metadata`` as a uint8 tensor of its msgpack
  encoding (``ray_ckpt.integrations.dcp_metadata``: explicit, versioned, no pickle).
  Each ``WriteItem`` is one entry of ``items`` under ``item_key(index)``: a tensor chunk as
  itself, a ``BytesIO`` item as a uint8 tensor of its bytes. Its ``WriteResult.storage_data``
  is a ``PeerSpan``: the step, the old rank, the key and the chunk's byte span in that rank's
  payload, so any rank of any later world reads exactly that span.
- **Two-phase commit, as DCP's.** Every rank but the coordinator saves its items in
  ``write_data`` and returns once they are staged; the coordinator holds its items until
  ``finish`` (DCP calls it only after every rank's ``write_data`` succeeded) and saves them with
  the Metadata, which stages the step's last rank: ray_ckpt commits the step then, and
  ``finish`` returns once it did. A step whose ``finish`` never ran never commits, so it is
  never loaded (NoCheckpointError names the committed steps).
- **Reads** go through ``RangeReader``, as the resharded restore's: a lost data shard's
  bytes are decoded from parity.
- **Nothing read from peer memory is unpickled.** The Metadata is decoded and validated
  field by field (DcpMetadataError); a bytes item (a non-tensor value, which DCP's planners
  ``torch.save``) is loaded with ``torch.load(weights_only=True)`` and saved again before the
  planner's ``load_bytes`` sees it, since DCP's default planner unpickles what it is given.

The backend reaches ray_ckpt only through ``ray_ckpt.integrations.peers.PeerSteps``; pass one
(a fake in tests) instead of a Checkpointer. ``async_save`` must use its default thread
executor (``AsyncCheckpointerType.THREAD``): a Checkpointer cannot move to another process.
"""

from __future__ import annotations

import dataclasses
import io
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ray_ckpt.core.shard import check_step
from ray_ckpt.core.snapshot import TensorRef, build_layout, read_layout
from ray_ckpt.errors import ConfigError, NoCheckpointError, RayCkptError, SnapshotFormatError
from ray_ckpt.integrations.dcp_metadata import PeerSpan, decode_metadata, dtype_name, encode_metadata
from ray_ckpt.integrations.peers import CheckpointerPeers, PeerSteps, SavedStep
from ray_ckpt.reshard import as_tensor, row_major_strides

__all__ = ["FORMAT", "PeerMemoryReader", "PeerMemoryWriter", "PeerSpan", "item_key", "step_of"]

FORMAT = "ray_ckpt.dcp/2"  # the "format" entry of every rank's state
_PICKLED_FORMAT = "ray_ckpt.dcp/1"  # an older ray_ckpt's, whose metadata is pickled: never read


def step_of(checkpoint_id: Any) -> int:
    """The ray_ckpt step a DCP ``checkpoint_id`` names: an int in [0, 2**63) or a str of one
    (``"120"``); ConfigError for anything else (a path, a float, a bool)."""
    step: Any = checkpoint_id
    if isinstance(checkpoint_id, str):
        text = checkpoint_id.strip()
        step = int(text) if text.isascii() and text.isdigit() else None
    if not isinstance(step, int) or isinstance(step, bool):
        raise ConfigError(
            f"checkpoint_id must be a ray_ckpt step: an int >= 0 or a str of one (e.g. checkpoint_id=120), "
            f"got {checkpoint_id!r}; a path belongs to DCP's FileSystemWriter/FileSystemReader",
            checkpoint_id=repr(checkpoint_id),
        )
    try:
        check_step(step)
    except RayCkptError as error:
        raise ConfigError(f"checkpoint_id {checkpoint_id!r}: {error}", checkpoint_id=repr(checkpoint_id)) from None
    return step


def item_key(index: MetadataIndex) -> str:
    """The stable key of a DCP item in a rank's ``items``: ``"<offsets>|<fqn>"``, offsets
    comma-separated for a tensor chunk (empty for a 0-d tensor), ``-`` for a bytes item.
    The offsets field holds no ``|``, so distinct indices give distinct keys."""
    offsets = "-" if index.offset is None else ",".join(str(int(o)) for o in index.offset)
    return f"{offsets}|{index.fqn}"


@dataclasses.dataclass(frozen=True)
class _PlanStep:
    """What the coordinator puts in every rank's plan (``storage_data``): the step, and the
    ray_ckpt rank whose state holds the Metadata."""

    step: int
    coordinator: int


def _as_peers(target: Any) -> PeerSteps:
    if isinstance(target, PeerSteps):
        return target
    if callable(getattr(target, "range_readers", None)) and callable(getattr(target, "save", None)):
        return CheckpointerPeers.of(target)
    raise ConfigError(
        f"expected this rank's ray_ckpt Checkpointer (ray_ckpt.train.Checkpointer() under Ray Train) or a "
        f"ray_ckpt.integrations.peers.PeerSteps, got {type(target).__name__}"
    )


def _refuse_pickling(obj: Any) -> Any:
    raise ConfigError(
        f"{type(obj).__name__} cannot be sent to another process (it drives this process's Checkpointer): "
        "call dcp.async_save with its default async_checkpointer_type=AsyncCheckpointerType.THREAD"
    )


def _done(value: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(value)
    return future


class PeerMemoryWriter(StorageWriter):
    """DCP's ``StorageWriter`` into ray_ckpt's peer memory (module docstring: the layout and
    the commit). ``checkpointer``: this rank's Checkpointer (or a ``PeerSteps``), whose rank
    must be DCP's rank and whose world size DCP's; ``checkpoint_id``: the step, unless
    ``dcp.save`` passes one. ``dcp.save`` returns once the step committed on every rank. One
    save at a time per writer: wait for an ``async_save``'s future before the next one."""

    def __init__(self, checkpointer: Any, checkpoint_id: int | str | None = None) -> None:
        super().__init__()
        self.peers = _as_peers(checkpointer)
        self.step: int | None = None if checkpoint_id is None else step_of(checkpoint_id)
        self._is_coordinator = False
        self._held: dict[int, dict[str, Any]] = {}  # the coordinator's states, by step, until finish
        self._held_lock = threading.Lock()

    __reduce__ = _refuse_pickling

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """A new save; ``checkpoint_id`` (DCP passes it only when given) is its step."""
        if checkpoint_id is not None:
            self.step = step_of(checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Checks that DCP's rank (passed by DCP as ``rank``) is the Checkpointer's."""
        rank = kwargs.get("rank")
        if rank is not None and rank != self.peers.rank:
            raise ConfigError(
                f"DCP rank {rank} saves through the Checkpointer of ray_ckpt rank {self.peers.rank}: build each "
                "rank's writer from its own Checkpointer, whose rank is the rank in DCP's process group"
            )
        self._is_coordinator = is_coordinator

    def storage_meta(self) -> StorageMeta | None:
        return None if self.step is None else StorageMeta(checkpoint_id=str(self.step))

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self._require_step()
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Every rank's plan gets the step and the coordinator's rank; ConfigError when DCP's
        world is not the Checkpointer's (a step commits only when all its ranks staged it)."""
        if len(plans) != self.peers.world_size:
            raise ConfigError(
                f"DCP saves with {len(plans)} rank(s) but the ray_ckpt Checkpointer has world_size "
                f"{self.peers.world_size}: the step would never commit. Save with a process group of every "
                "rank of the job (no process_group subset, no no_dist at world_size > 1)"
            )
        chosen = _PlanStep(self._require_step(), self.peers.rank)
        return [dataclasses.replace(plan, storage_data=chosen) for plan in plans]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Resolve this rank's items into one state; save it (other ranks) or hold it until
        ``finish`` (the coordinator). Returns the items' ``PeerSpan``s."""
        chosen = plan.storage_data
        if not isinstance(chosen, _PlanStep):
            raise ConfigError("the save plan carries no step: PeerMemoryWriter must write on every rank of the save")
        if self.step is not None and chosen.step != self.step:
            raise ConfigError(
                f"rank {self.peers.rank} was given checkpoint_id {self.step} but the coordinator saves step "
                f"{chosen.step}: pass the same checkpoint_id on every rank"
            )
        items: dict[str, torch.Tensor] = {}
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                if not isinstance(data, io.BytesIO):
                    raise ConfigError(f"{item.index.fqn}: the planner resolved a bytes item to {type(data).__name__}")
                items[item_key(item.index)] = _bytes_tensor(data.getvalue())
            elif isinstance(data, torch.Tensor):
                items[item_key(item.index)] = data.detach()
            else:
                raise ConfigError(f"{item.index.fqn}: the planner resolved a tensor item to {type(data).__name__}")
        state: dict[str, Any] = {"format": FORMAT, "coordinator": chosen.coordinator, "items": items}
        saved = read_layout(build_layout(state).header)["items"]
        results = []
        for item in plan.items:
            key = item_key(item.index)
            ref: TensorRef = saved[key]
            dtype = dtype_name(ref.dtype)
            span = PeerSpan(chosen.step, self.peers.rank, key, ref.offset, ref.nbytes, dtype, tuple(ref.shape))
            results.append(WriteResult(index=item.index, size_in_bytes=ref.nbytes, storage_data=span))
        if self._is_coordinator:
            with self._held_lock:
                self._held[chosen.step] = state
        else:
            self.peers.save(chosen.step, state, last=False)
        return _done(results)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The commit (coordinator only, after every rank's write_data): the Metadata, with
        every item's ``PeerSpan`` as its ``storage_data``, is saved with the coordinator's
        items; returns once ray_ckpt committed the step."""
        spans = {result.index: result.storage_data for rank_results in results for result in rank_results}
        steps = {span.step for span in spans.values() if isinstance(span, PeerSpan)}
        if len(steps) > 1 or any(not isinstance(span, PeerSpan) for span in spans.values()):
            raise ConfigError(f"the write results come from several saves or another writer (steps {sorted(steps)})")
        with self._held_lock:
            step = steps.pop() if steps else max(self._held, default=None)
            if step is None or step not in self._held:
                raise ConfigError(f"finish without this coordinator's write_data of step {step}")
            state = self._held.pop(step)
            for older in [s for s in self._held if s < step]:  # saves whose finish never came
                del self._held[older]
        metadata.storage_data = spans
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta(checkpoint_id=str(step))
        state["metadata"] = _bytes_tensor(encode_metadata(metadata))
        self.peers.save(step, state, last=True)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether ``checkpoint_id`` names a step (an int, or a str of one)."""
        try:
            step_of(checkpoint_id)
        except ConfigError:
            return False
        return True

    def _require_step(self) -> int:
        if self.step is None:
            raise ConfigError(
                "no step to save: pass checkpoint_id=<step> to dcp.save / dcp.async_save (or to PeerMemoryWriter)"
            )
        return self.step


class PeerMemoryReader(StorageReader):
    """DCP's ``StorageReader`` from ray_ckpt's peer memory, at any world size or mesh.
    ``checkpointer``: this rank's Checkpointer (or a ``PeerSteps``), of the same job as the
    saving run's; ``checkpoint_id``: the step, unless ``dcp.load`` passes one; neither loads
    the newest committed step (every rank asks on its own: pass the step when saves may be
    committing meanwhile). ``read_data`` reads each item's bytes from the old rank that wrote
    it, ``threads`` old ranks at a time. ``loaded_step``: the step the last load read."""

    def __init__(self, checkpointer: Any, checkpoint_id: int | str | None = None, *, threads: int = 8) -> None:
        super().__init__()
        self.peers = _as_peers(checkpointer)
        self.step: int | None = None if checkpoint_id is None else step_of(checkpoint_id)
        self.threads = threads
        self.fetched_bytes = 0  # what the last load read from peer memory
        self.loaded_step: int | None = None
        self._opened: tuple[int, SavedStep] | None = None
        self._spans: dict[MetadataIndex, Any] = {}
        self._began = 0.0  # when the load began (``read_metadata``; perf_counter)

    __reduce__ = _refuse_pickling

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.step = step_of(checkpoint_id)
        self._opened = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The Metadata saved with the step (from the coordinator's state), decoded without
        pickle. NoCheckpointError when the step is not committed (its ``finish`` never ran) or
        nothing is; SnapshotFormatError when the step was not saved through PeerMemoryWriter,
        DcpMetadataError (a SnapshotFormatError) when its metadata is malformed."""
        self._began = time.perf_counter()
        step = self.step if self.step is not None else self.peers.latest_step()
        if step is None:
            raise NoCheckpointError("nothing is committed in peer memory for this job: no DCP checkpoint to load")
        saved = self.peers.open(step)
        first = self._checked(saved.layouts([0])[0], step, 0)
        coordinator = first["coordinator"]
        if not isinstance(coordinator, int) or not 0 <= coordinator < saved.world_size:
            raise SnapshotFormatError(f"step {step}: rank 0's state names no coordinator rank ({coordinator!r})")
        if coordinator != 0:
            first = self._checked(saved.layouts([coordinator])[coordinator], step, coordinator)
        ref = first.get("metadata")
        if not isinstance(ref, TensorRef) or ref.dtype != torch.uint8:
            raise SnapshotFormatError(f"step {step}: coordinator rank {coordinator}'s state holds no DCP metadata")
        raw = saved.read(coordinator, [(ref.offset, ref.offset + ref.nbytes)])[0]
        metadata = decode_metadata(raw.tobytes(), step)  # validated msgpack, never unpickled
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta(checkpoint_id=str(step))
        self._opened = (step, saved)
        self.loaded_step = step
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not isinstance(metadata.storage_data, dict):
            raise SnapshotFormatError("the metadata holds no storage data: it was not saved by PeerMemoryWriter")
        self._spans = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Every rank's plan carries the coordinator's step, which each rank checks is its own."""
        step, _ = self._require_opened()
        return [dataclasses.replace(plan, storage_data=step) for plan in plans]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """For each item, the one byte span of its old rank's payload that covers it (exactly
        its bytes when its part of the chunk is one run of them), read from peer memory, the old
        ranks in parallel; tensors land straight in the planner's targets where they can, and
        are copied otherwise (converting dtype or device as DCP's own reader does)."""
        step, saved = self._require_opened()
        if plan.storage_data is not None and plan.storage_data != step:
            raise ConfigError(
                f"this rank read the metadata of step {step} but the coordinator loads step {plan.storage_data}: "
                "pass the same checkpoint_id on every rank"
            )
        by_rank: dict[int, list[tuple[ReadItem, PeerSpan]]] = {}
        for item in plan.items:
            span = self._spans.get(item.storage_index)
            if not isinstance(span, PeerSpan) or span.step != step:
                raise SnapshotFormatError(f"step {step}: the metadata has no span of {item.storage_index}")
            by_rank.setdefault(span.rank, []).append((item, span))
        trees = saved.layouts(by_rank)
        reads: dict[int, tuple[list[tuple[int, int]], list[np.ndarray | None]]] = {}
        finish: list[tuple[int, int, Callable[[np.ndarray], None]]] = []
        for rank, pairs in sorted(by_rank.items()):
            saved_items = self._checked(trees[rank], step, rank)["items"]
            spans, into = reads.setdefault(rank, ([], []))
            for item, span in pairs:
                ref = saved_items.get(span.key)
                if not span.matches(ref):
                    raise SnapshotFormatError(
                        f"step {step} rank {rank}: {span.key!r} is not where the metadata says it is"
                    )
                planned = _plan_item(item, span, ref.dtype, planner)
                if planned is None:
                    continue
                (start, stop), land, done = planned
                spans.append((start, stop))
                into.append(land)
                finish.append((rank, len(spans) - 1, done))
        before = _fetched(saved)
        busy = [rank for rank, (spans, _) in reads.items() if spans]
        fetching = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, min(self.threads, len(busy)))) as pool:
            got = dict(zip(busy, pool.map(lambda r: saved.read(r, reads[r][0], reads[r][1]), busy), strict=True))
        landing = time.perf_counter()
        with torch.no_grad():
            for rank, position, done in finish:
                done(got[rank][position])
        self.fetched_bytes = _fetched(saved) - before
        # a lost data shard's bytes are decoded from parity inside the reads: fetch holds it
        phases = {
            "locate": fetching - (self._began or fetching),
            "fetch": landing - fetching,
            "decode": 0.0,
            "load": time.perf_counter() - landing,
        }
        self.peers.loaded(step, self.fetched_bytes, phases)
        return _done(None)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether ``checkpoint_id`` names a step (an int, or a str of one)."""
        return PeerMemoryWriter.validate_checkpoint_id(checkpoint_id)

    def _require_opened(self) -> tuple[int, SavedStep]:
        if self._opened is None:
            raise ConfigError("read_metadata has not run: load through dcp.load(state, storage_reader=...)")
        return self._opened

    @staticmethod
    def _checked(tree: Any, step: int, rank: int) -> dict[str, Any]:
        if isinstance(tree, dict) and tree.get("format") == _PICKLED_FORMAT:
            raise SnapshotFormatError(
                f"step {step} was saved by an older ray_ckpt, which pickled DCP's metadata; peer data is never "
                "unpickled: save the step again with this ray_ckpt",
                step=step,
                rank=rank,
            )
        if not isinstance(tree, dict) or tree.get("format") != FORMAT or not isinstance(tree.get("items"), dict):
            raise SnapshotFormatError(
                f"step {step} rank {rank} was not saved through PeerMemoryWriter (format {FORMAT!r}); load it "
                "with Checkpointer.restore, or pass the checkpoint_id of a DCP save",
                step=step,
                rank=rank,
            )
        return tree


def _plan_item(
    item: ReadItem, span: PeerSpan, dtype: torch.dtype, planner: LoadPlanner
) -> tuple[tuple[int, int], np.ndarray | None, Callable[[np.ndarray], None]] | None:
    """(the span to read, where it lands or None, what to do with its bytes) for one item
    whose chunk holds ``dtype``; None when there is nothing to read (an empty tensor,
    committed at once)."""
    if item.type == LoadItemType.BYTE_IO:

        def load_bytes(data: np.ndarray) -> None:
            planner.load_bytes(item, _safe_value(data, item, span.step))

        return (span.offset, span.offset + span.nbytes), None, load_bytes
    target = planner.resolve_tensor(item).detach()
    lengths = [int(n) for n in item.lengths]
    if list(target.shape) != lengths:
        raise ConfigError(
            f"{item.dest_index.fqn}: the planner's target has shape {list(target.shape)}, the read {lengths}"
        )
    itemsize = torch.empty(0, dtype=dtype).element_size()
    strides = row_major_strides(span.shape)
    starts = [int(o) for o in item.storage_offsets]
    if any(s < 0 or s + n > d for s, n, d in zip(starts, lengths, span.shape, strict=True)):
        raise SnapshotFormatError(f"{item.storage_index}: the read {starts}+{lengths} leaves the chunk {span.shape}")
    if target.numel() == 0:
        planner.commit_tensor(item, target)
        return None
    first = sum(s * t for s, t in zip(starts, strides, strict=True))
    last = sum((s + n - 1) * t for s, n, t in zip(starts, lengths, strides, strict=True))
    start, stop = span.offset + first * itemsize, span.offset + (last + 1) * itemsize
    one_run = last + 1 - first == target.numel()
    if one_run and target.dtype == dtype and target.device.type == "cpu" and target.is_contiguous():
        land = target.reshape(-1).view(torch.uint8).numpy()

        def landed(_: np.ndarray) -> None:
            planner.commit_tensor(item, target)

        return (start, stop), land, landed

    def copy(data: np.ndarray) -> None:
        values = as_tensor(data, dtype)
        target.copy_(values.view(lengths) if one_run else torch.as_strided(values, lengths, strides))
        planner.commit_tensor(item, target)

    return (start, stop), None, copy


_TORCH_LOAD_NOISE = ("Weights only load failed", "(1) ", "(2) ", "Check the documentation")  # torch's advice


def _safe_value(data: np.ndarray, item: ReadItem, step: int) -> io.BytesIO:
    """A bytes item's value for the planner's ``load_bytes``. DCP's planners ``torch.save``
    each non-tensor value, and DCP's default planner loads it with ``torch.load(weights_only=
    False)``: a pickle from peer memory. So the value is loaded here with torch's weights-only
    unpickler (torch's allow-list, plus what ``torch.serialization.add_safe_globals`` added)
    and saved again: the planner unpickles bytes made in this process, never the peer's.
    SnapshotFormatError names the item and what torch refused."""
    try:
        value = torch.load(io.BytesIO(data.tobytes()), weights_only=True)
    except Exception as error:  # whatever torch's loader refuses, the item is refused
        lines = (line.strip().rpartition("use case: ")[2] for line in str(error).splitlines())
        why = " ".join(line for line in lines if line and not line.startswith(_TORCH_LOAD_NOISE))
        raise SnapshotFormatError(
            f"step {step}: DCP's value {item.storage_index.fqn!r} is not one torch.load(weights_only=True) loads: "
            f"{(why or type(error).__name__).rstrip('.'):.500}. Nothing of it ran. Allow a type of your own with "
            "torch.serialization.add_safe_globals on every rank only if you trust every process that can write "
            "this job's peer memory",
            step=step,
            fqn=item.storage_index.fqn,
        ) from None
    out = io.BytesIO()
    torch.save(value, out)
    out.seek(0)
    return out


def _bytes_tensor(data: bytes) -> torch.Tensor:
    """``data`` as a uint8 tensor of its own memory."""
    return torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())


def _fetched(saved: SavedStep) -> int:
    return int(getattr(saved, "fetched_bytes", 0))
