"""Resharded restore without Ray: an FSDP2 model with Adam, a column-sharded table and a
replicated tensor saved by 4 ranks (real DTensors, gloo) and restored by 4, 2, 3 and 6 ranks
from fake stores, with a lost data shard and a corrupt one; every global tensor comes back
bit-identical, per-rank values come back per old rank, and per-rank plain state is refused."""

from __future__ import annotations

import pathlib
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from support.fsdp_model import fsdp_model
from support.gloo_ranks import spawn_ranks
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from ray_ckpt import reshard
from ray_ckpt.core import blob, dtensor, snapshot
from ray_ckpt.core.checksum import checksum
from ray_ckpt.core.codec import ReedSolomon
from ray_ckpt.core.identity import RankIdentity
from ray_ckpt.core.shard import ShardAddress, ShardMeta
from ray_ckpt.core.wire import FoundRanges, RankRecord
from ray_ckpt.errors import ConfigError, InsufficientShardsError, LayoutChangedError, ShardsUnreachableError
from ray_ckpt.process_copies import ProcessCopies
from ray_ckpt.ranges import RangeReader
from ray_ckpt.restore import Restored, Restorer, load

K, M, OLD = 2, 1, 4


def sharded_state(
    world: int, seed: int, zero: bool = False, mesh_2d: bool = False
) -> tuple[dict[str, Any], torch.nn.Module]:
    """Rank's state of a ``world``-rank job: FSDP2 model and Adam, a [10, 7] table sharded on
    columns, a replicated vector, a per-rank loader position; ``mesh_2d``: all of it on a
    (2, world / 2) mesh instead (HSDP, the table sharded on rows and columns)."""
    shape = (2, world // 2) if mesh_2d else (world,)
    model, optim = fsdp_model(seed, shape)
    mesh = init_device_mesh("cpu", shape)
    torch.manual_seed(seed)
    table, vector = torch.randn(10, 7), torch.randn(5)
    if zero:
        table, vector = torch.zeros(10, 7), torch.zeros(5)
    model_state, optim_state = get_state_dict(model, optim)
    state = {
        "model": model_state,
        "optim": optim_state,
        "table": distribute_tensor(table, mesh, [Shard(0), Shard(1)] if mesh_2d else [Shard(1)]),
        "vector": distribute_tensor(vector, mesh, [Replicate()] * len(shape)),
        "loader": {"position": dist.get_rank() * 100 + seed},
    }
    return state, model


def full_tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every global tensor (gathered: a collective)."""
    out = {"table": state["table"].full_tensor(), "vector": state["vector"].full_tensor()}
    for key, value in state["model"].items():
        out[f"model/{key}"] = value.full_tensor()
    for fqn, moments in state["optim"]["state"].items():
        for name, value in moments.items():
            out[f"optim/{fqn}/{name}"] = value.full_tensor() if hasattr(value, "full_tensor") else value
    return out


def write_blob(state: Any, path: pathlib.Path) -> None:
    header, payload = snapshot.snapshot(state)
    data = np.zeros(blob.blob_size(len(header), payload.size), dtype=np.uint8)
    offset = blob.write_prefix(data, header)
    data[offset:] = payload
    path.write_bytes(data.tobytes())


class FileStores:
    """Old ranks' blobs (files) coded RS(K, M), shard i of rank r on node ``r{r}n{i}``; ``dead``
    nodes have no store and ``corrupt`` nodes hold a shard with a flipped byte."""

    def __init__(self, folder: pathlib.Path, dead: set[str] = frozenset(), corrupt: set[str] = frozenset()) -> None:
        self.records: dict[int, RankRecord] = {}
        self.held: dict[tuple[str, int], tuple[ShardMeta, np.ndarray]] = {}
        self.dead = set(dead)
        self.silent: set[str] = set()  # alive, but their calls never end
        code = ReedSolomon(K, M)
        for rank in range(OLD):
            body = np.frombuffer((folder / f"old-{rank}.bin").read_bytes(), dtype=np.uint8)
            padded = np.zeros(code.shard_size(body.size) * K, dtype=np.uint8)
            padded[: body.size] = body
            metas, nodes = {}, {}
            for index, shard in enumerate(code.encode(padded)):
                meta = ShardMeta(
                    job="j", step=3, rank=rank, index=index, world_size=OLD, data_shards=K, parity_shards=M,
                    payload_size=body.size, shard_size=shard.size, checksum=checksum(shard),
                )  # fmt: skip
                node = f"r{rank}n{index}"
                if node in corrupt:
                    shard = shard.copy()
                    shard[0] ^= 0xFF
                self.held[(node, rank)] = (meta, shard)
                metas[index], nodes[index] = meta, node
            self.records[rank] = RankRecord(metas, nodes)

    def live(self, node_ids: Any) -> set[str]:
        return {n for n in node_ids if n not in self.dead}

    def get_ranges(self, node_id: str, address: ShardAddress, ranges: Any, into: Any = None) -> Future[Any]:
        """Like a direct read: pieces land ``into`` its arrays when the shard is intact."""
        future: Future[Any] = Future()
        if node_id in self.silent:
            return future
        meta, shard = self.held[(node_id, address.rank)]
        intact = checksum(shard) == meta.checksum
        pieces = [shard[a:b] for a, b in ranges]
        if into is not None and intact and into.checksum == meta.checksum:
            for n, target in enumerate(into.arrays):
                if target is not None:
                    np.copyto(target, pieces[n])
                    pieces[n] = target
        future.set_result(FoundRanges(meta, intact, tuple(pieces)))
        return future

    def readers(self, timeout_s: float = 5.0) -> list[RangeReader]:
        return [
            RangeReader(self, self.records[r], job="j", step=3, rank=r, node_id="here", timeout_s=lambda: timeout_s)
            for r in range(OLD)
        ]


def _save(rank: int, world: int, results: Any, folder: pathlib.Path) -> None:
    state, _ = sharded_state(world, seed=0)
    write_blob(state, folder / f"old-{rank}.bin")
    full = full_tensors(state)
    if rank == 0:
        torch.save(full, folder / "full.pt")
    results.put(rank)


def _restore(rank: int, world: int, results: Any, folder: pathlib.Path, dead: set[str], corrupt: set[str]) -> None:
    target, model = sharded_state(world, seed=7, zero=True)
    stores = FileStores(folder, dead, corrupt)
    readers = stores.readers()
    result = reshard.restore_into(reshard.read_old_ranks(readers), target, rank=rank)
    filled = result.state["table"] is target["table"]
    got = full_tensors(result.state)
    expected = torch.load(folder / "full.pt")
    same = sorted(k for k in expected if torch.equal(expected[k], got[k]))
    positions = {r: v["loader"]["position"] for r, v in result.values_by_rank.items()}
    weight = model.state_dict()["2.weight"].full_tensor()  # the model itself was filled
    results.put((rank, filled and same == sorted(expected), positions, torch.equal(weight, expected["model/2.weight"])))


def _restore_other_mesh(rank: int, world: int, results: Any, folder: pathlib.Path) -> None:
    """As a Checkpointer restores at the saved world size: this rank's own state, as read back
    from peer memory, filled into a state on another mesh, which reshards instead."""
    target, _ = sharded_state(world, seed=7, zero=True, mesh_2d=True)
    stores = FileStores(folder)
    registry = SimpleNamespace(locate=lambda job, step: stores.records)
    restorer = Restorer(
        identity=RankIdentity(job="j", rank=rank, world_size=world, attempt="a", node_id="here"),
        registry=registry, stores=stores, backup=None, copies=ProcessCopies(), background=None,
        timeout_s=lambda: 5.0,
    )  # fmt: skip
    own = Restored(3, load(np.fromfile(folder / f"old-{rank}.bin", dtype=np.uint8)), "peers", {})
    with pytest.raises(LayoutChangedError):
        dtensor.load_into(own.state, target)
    filled = restorer.fill(own, target)
    got, expected = full_tensors(filled.state), torch.load(folder / "full.pt")
    same = sorted(k for k in expected if torch.equal(expected[k], got[k]))
    results.put((rank, filled.from_world_size, filled.state["table"] is target["table"], same == sorted(expected)))


def spawn(world: int, folder: pathlib.Path, work: Any, *args: Any) -> list[Any]:
    return spawn_ranks(world, str(folder / f"group-{world}-{work.__name__}"), work, folder, *args)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("reshard")
    assert spawn(OLD, folder, _save) == list(range(OLD))
    return folder


@pytest.mark.parametrize(
    ("world", "dead", "corrupt"),
    [(4, set(), set()), (2, {"r1n0"}, set()), (3, set(), {"r2n1"}), (6, {"r0n1"}, {"r3n0"})],
)
def test_a_4_rank_fsdp2_state_restores_bit_exact_into_another_world_size(
    saved: pathlib.Path, world: int, dead: set[str], corrupt: set[str]
) -> None:
    outcome = spawn(world, saved, _restore, dead, corrupt)
    positions = {r: r * 100 for r in range(OLD)}
    assert outcome == [(rank, True, positions, True) for rank in range(world)]


def test_a_4_rank_fsdp2_state_restores_bit_exact_into_another_mesh_at_the_same_world_size(saved: pathlib.Path) -> None:
    """Saved on a 1-D mesh of 4, restored by 4 ranks on a (2, 2) mesh (HSDP, a 2-D sharded
    table): filling ``into`` finds another sharding and the restore reshards, bit-identical."""
    assert spawn(OLD, saved, _restore_other_mesh) == [(rank, OLD, True, True) for rank in range(OLD)]


def test_reading_only_the_needed_bytes_and_refusing_per_rank_plain_state(tmp_path: pathlib.Path) -> None:
    """A plain per-rank state saved by 4 ranks cannot be resharded: ConfigError names keys."""
    for rank in range(OLD):
        write_blob({"w": torch.full((3,), float(rank)), "step": 3}, tmp_path / f"old-{rank}.bin")
    readers = FileStores(tmp_path).readers()
    old = reshard.read_old_ranks(readers)
    header_bytes = sum(r.fetched_bytes for r in readers)
    target = {"w": torch.zeros(3)}
    with pytest.raises(ConfigError, match=r"plain per-rank tensors \(state\['w'\]\).*restore at world size 4") as info:
        reshard.restore_into(old, target, rank=0)
    assert info.value.details["keys"] == ["state['w']"]
    assert bool((target["w"] == 0).all())  # nothing was copied
    assert sum(r.fetched_bytes for r in readers) == header_bytes  # nor read


def test_a_range_spanning_data_shards_and_a_lost_shard_decode_only_the_positions_read(tmp_path: pathlib.Path) -> None:
    body = np.random.default_rng(1).integers(0, 256, 1000, dtype=np.uint8)
    for rank in range(OLD):
        path = tmp_path / f"old-{rank}.bin"
        path.write_bytes(body.tobytes())
    stores = FileStores(tmp_path, dead={"r0n0"})
    reader = stores.readers()[0]
    pieces = reader.read([(10, 20), (480, 620), (999, 1000), (5, 5)])
    assert [p.tobytes() for p in pieces] == [body[10:20].tobytes(), body[480:620].tobytes(), body[999:].tobytes(), b""]
    # shard 0 is lost: its 10 + 20 bytes are decoded from the same positions of the 2 others
    assert reader.fetched_bytes == 2 * (10 + 20) + 120 + 1
    with pytest.raises(ValueError, match="outside"):
        reader.read([(0, 1001)])


def test_a_ranged_read_from_stores_that_do_not_answer_is_transient_not_a_loss(tmp_path: pathlib.Path) -> None:
    """Two of rank 0's three stores paused (alive, silent): a ranged read cannot be served, but
    the error is ShardsUnreachableError (the step is not proven lost); the same stores dead is
    InsufficientShardsError."""
    body = np.random.default_rng(2).integers(0, 256, 1000, dtype=np.uint8)
    for rank in range(OLD):
        (tmp_path / f"old-{rank}.bin").write_bytes(body.tobytes())
    stores = FileStores(tmp_path)
    stores.silent |= {"r0n0", "r0n2"}
    with pytest.raises(ShardsUnreachableError):
        stores.readers(timeout_s=0.2)[0].read([(10, 20)])
    stores.dead |= {"r0n0", "r0n2"}
    with pytest.raises(InsufficientShardsError):
        stores.readers(timeout_s=0.2)[0].read([(10, 20)])
