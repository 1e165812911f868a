"""A folder standing in for ray_ckpt's peer memory in the DCP backend's tests (no Ray).

``FolderPeers`` is a ``PeerSteps``: a save writes the rank's blob (prefix, snapshot header,
payload) as a file, and a step commits once every rank of its world wrote one, as the
registry's commit does. Opening a step codes every rank's blob RS(K, M) into shards held by
fake stores on nodes ``r{rank}n{index}``; reads go through the real ``ReaderStep`` and
``RangeReader``, so a ``dead`` node's data shard is decoded from parity as in a restore.
Spawned ranks share the folder.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable
from concurrent.futures import Future
from typing import Any

import numpy as np

from ray_ckpt.core import blob, snapshot
from ray_ckpt.core.checksum import checksum
from ray_ckpt.core.codec import ReedSolomon
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.wire import FoundRanges, RankRecord
from ray_ckpt.errors import CommitTimeoutError, NoCheckpointError
from ray_ckpt.integrations.peers import ReaderStep
from ray_ckpt.ranges import RangeReader

K, M = 2, 1


class FolderPeers:
    """Rank ``rank`` of ``world_size`` over ``folder``. ``fail_last``: the save that would
    commit a step fails before writing (a coordinator that dies in ``finish``); ``dead``:
    nodes whose shards are gone when a step is opened; ``reads``: every (rank, span) read;
    ``loads``: every load's (step, bytes read, phases)."""

    def __init__(
        self, folder: pathlib.Path, rank: int, world_size: int, *, fail_last: bool = False, dead: Iterable[str] = ()
    ) -> None:
        self.folder, self._rank, self._world_size = folder, rank, world_size
        self.fail_last, self.dead = fail_last, set(dead)
        self.reads: list[tuple[int, int, int]] = []
        self.loads: list[tuple[int, int, dict[str, float]]] = []

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def _step_folder(self, step: int) -> pathlib.Path:
        return self.folder / f"step-{step}"

    def save(self, step: int, state: dict[str, Any], *, last: bool) -> None:
        if last and self.fail_last:
            raise RuntimeError("the coordinator died in finish")
        header, payload = snapshot.snapshot(state)
        data = np.zeros(blob.blob_size(len(header), payload.size), dtype=np.uint8)
        data[blob.write_prefix(data, header) :] = payload
        folder = self._step_folder(step)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "world").write_text(str(self.world_size))
        partial = folder / f"rank-{self.rank}.tmp"
        partial.write_bytes(data.tobytes())
        partial.rename(folder / f"rank-{self.rank}.bin")
        if last and not self.committed(step):
            raise CommitTimeoutError(f"step {step} did not commit: ranks are missing", step=step)

    def committed(self, step: int) -> bool:
        folder = self._step_folder(step)
        if not (folder / "world").exists():
            return False
        world = int((folder / "world").read_text())
        return all((folder / f"rank-{r}.bin").exists() for r in range(world))

    def latest_step(self) -> int | None:
        steps = [int(p.name.split("-")[1]) for p in self.folder.glob("step-*")]
        done = [s for s in steps if self.committed(s)]
        return max(done) if done else None

    def loaded(self, step: int, read_bytes: int, phases_s: dict[str, float]) -> None:
        self.loads.append((step, read_bytes, phases_s))

    def open(self, step: int) -> ReaderStep:
        if not self.committed(step):
            raise NoCheckpointError(f"step {step} is not committed", step=step)
        folder = self._step_folder(step)
        stores = CodedStores(self, step, [folder / f"rank-{r}.bin" for r in range(int((folder / "world").read_text()))])
        return ReaderStep(
            {
                r: RangeReader(stores, record, job="j", step=step, rank=r, node_id="here", timeout_s=lambda: 5.0)
                for r, record in stores.records.items()
            }
        )


class CodedStores:
    """Each rank's blob coded RS(K, M), shard i of rank r on node ``r{r}n{i}``: a ``RangeSource``."""

    def __init__(self, peers: FolderPeers, step: int, blobs: list[pathlib.Path]) -> None:
        self.peers = peers
        self.records: dict[int, RankRecord] = {}
        self.held: dict[tuple[str, int], tuple[ShardMeta, np.ndarray]] = {}
        code = ReedSolomon(K, M)
        for rank, path in enumerate(blobs):
            body = np.frombuffer(path.read_bytes(), dtype=np.uint8)
            padded = np.zeros(code.shard_size(body.size) * K, dtype=np.uint8)
            padded[: body.size] = body
            metas, nodes = {}, {}
            for index, shard in enumerate(code.encode(padded)):
                meta = ShardMeta(
                    job="j", step=step, rank=rank, index=index, world_size=len(blobs), data_shards=K,
                    parity_shards=M, payload_size=body.size, shard_size=shard.size, checksum=checksum(shard),
                )  # fmt: skip
                node = f"r{rank}n{index}"
                self.held[(node, rank)] = (meta, shard)
                metas[index], nodes[index] = meta, node
            self.records[rank] = RankRecord(metas, nodes)

    def live(self, node_ids: Any) -> set[str]:
        return {n for n in node_ids if n not in self.peers.dead}

    def get_ranges(self, node_id: str, address: ShardAddress, ranges: Any, into: Any = None) -> Future[Any]:
        future: Future[Any] = Future()
        meta, shard = self.held[(node_id, address.rank)]
        self.peers.reads.extend((address.rank, a, b) for a, b in ranges)
        future.set_result(FoundRanges(meta, True, tuple(shard[a:b] for a, b in ranges)))
        return future
