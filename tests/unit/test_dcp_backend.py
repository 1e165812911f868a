"""The DCP storage backend without Ray: real ``dcp.save`` / ``dcp.async_save`` / ``dcp.load``
against a folder standing in for peer memory (tests/support/dcp_peers.py: real snapshot blobs, coded
RS(2, 1), read through the real ReaderStep and RangeReader). Round trips are bit-exact and equal
DCP's own FileSystemReader's; a 2-rank save driven through DCP's planner by hand shows the
two-phase commit (nothing loads before ``finish``); FSDP2 + Adam saved by 2 gloo ranks loads
into 1 (plain tensors) and into 3 ranks with a dead node; the errors name what to change; a
crafted step (metadata or a value that would run code when unpickled) is refused and runs nothing."""

from __future__ import annotations

import io
import pathlib
import pickle
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from support.dcp_peers import FolderPeers
from support.fsdp_model import fsdp_model
from support.gloo_ranks import spawn_ranks
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import WriteItem, WriteItemType
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from ray_ckpt.errors import ConfigError, DcpMetadataError, SnapshotFormatError
from ray_ckpt.integrations.dcp import FORMAT, PeerMemoryReader, PeerMemoryWriter, PeerSpan, item_key, step_of


@pytest.fixture(autouse=True)
def _no_single_process_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def rich_state(seed: int) -> dict[str, Any]:
    """Tensors of several dtypes (a 0-d, an empty and a non-contiguous one), nested dicts, a
    list, plain values and a BytesIO: DCP saves the non-tensors as bytes items. A BytesIO is no
    type torch.load(weights_only=True) allows by default: its loads run under ``BYTES_IO_ALLOWED``."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {
            "w": torch.randn(6, 5, generator=generator),
            "half": torch.randn(7, generator=generator).to(torch.bfloat16),
            "ids": torch.randint(0, 1 << 40, (9,), generator=generator),
            "mask": torch.rand(4, generator=generator) > 0.5,
            "t": torch.randn(3, 4, generator=generator).t(),
        },
        "scalar": torch.tensor(float(seed)),
        "empty": torch.empty(0, 3),
        "opt": {"param_groups": [{"lr": 0.1 * seed, "betas": (0.9, 0.99)}], "step": seed},
        "name": f"run-{seed}",
        "blob": io.BytesIO(bytes(range(seed, seed + 20))),
    }


def bytes_io_allowed() -> Any:
    """What a user with a BytesIO in the state does: allow the type for torch's weights-only loader."""
    return torch.serialization.safe_globals([io.BytesIO])


def zeros_like(state: Any) -> Any:
    """A load target of ``state``'s shape: tensors zeroed (contiguous), other values None."""
    if isinstance(state, dict):
        return {k: zeros_like(v) for k, v in state.items()}
    if isinstance(state, list):
        return [zeros_like(v) for v in state]
    if isinstance(state, torch.Tensor):
        return torch.zeros(state.shape, dtype=state.dtype)
    return None


def assert_same(got: Any, expected: Any, path: str = "state") -> None:
    """Bit-exact: tensors byte for byte, with their dtype and shape; BytesIO by content."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and set(got) == set(expected), path
        for key in expected:
            assert_same(got[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), path
        for position, (one, other) in enumerate(zip(got, expected, strict=True)):
            assert_same(one, other, f"{path}[{position}]")
    elif isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and (got.dtype, got.shape) == (expected.dtype, expected.shape), path
        assert got.reshape(-1).view(torch.uint8).tolist() == expected.reshape(-1).view(torch.uint8).tolist(), path
    elif isinstance(expected, io.BytesIO):
        assert isinstance(got, io.BytesIO) and got.getvalue() == expected.getvalue(), path
    else:
        assert got == expected, path


def test_a_state_round_trips_bit_exact_and_equals_what_dcp_loads_from_disk(tmp_path: pathlib.Path) -> None:
    state = rich_state(3)
    peers = FolderPeers(tmp_path / "peers", 0, 1)
    dcp.save(state, storage_writer=PeerMemoryWriter(peers), checkpoint_id=12)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "disk")))
    from_peers, from_disk = zeros_like(state), zeros_like(state)
    with bytes_io_allowed():
        dcp.load(from_peers, storage_reader=PeerMemoryReader(peers))
    dcp.load(from_disk, storage_reader=dcp.FileSystemReader(str(tmp_path / "disk")))
    assert_same(from_peers, state)
    assert_same(from_peers, from_disk)


def test_async_save_writes_on_its_thread_and_a_later_save_is_the_one_loaded(tmp_path: pathlib.Path) -> None:
    peers = FolderPeers(tmp_path, 0, 1)
    writer = PeerMemoryWriter(peers)
    first = dcp.async_save(rich_state(1), storage_writer=writer, checkpoint_id=1)
    first.result(timeout=120)  # type: ignore[union-attr]
    second = dcp.async_save(rich_state(2), storage_writer=writer, checkpoint_id="2")
    second.result(timeout=120)  # type: ignore[union-attr]
    latest, older = zeros_like(rich_state(0)), zeros_like(rich_state(0))
    reader = PeerMemoryReader(peers)
    with bytes_io_allowed():
        dcp.load(latest, storage_reader=PeerMemoryReader(peers))
        dcp.load(older, storage_reader=reader, checkpoint_id=1)
    assert reader.loaded_step == 1
    assert_same(latest, rich_state(2))
    assert_same(older, rich_state(1))


def test_a_load_reads_only_the_bytes_of_the_items_it_asks_for(tmp_path: pathlib.Path) -> None:
    big, small = torch.randn(256, 64), torch.randn(4, 8)
    peers = FolderPeers(tmp_path, 0, 1)
    dcp.save({"big": big, "small": small}, storage_writer=PeerMemoryWriter(peers, checkpoint_id=4))
    target = {"small": torch.zeros(4, 8)}
    reader = PeerMemoryReader(peers)
    dcp.load(target, storage_reader=reader)
    assert torch.equal(target["small"], small)
    assert reader.fetched_bytes == small.nbytes
    # the load is recorded as this rank's restore: its step, the bytes it read, every phase
    ((step, read, phases),) = peers.loads
    assert (step, read) == (4, small.nbytes)
    assert set(phases) == {"locate", "fetch", "decode", "load"} and all(t >= 0 for t in phases.values())


def save_by_hand(states: list[dict[str, Any]], writers: list[PeerMemoryWriter], step: int) -> Any:
    """What dcp.save does on ``len(states)`` ranks (rank 0 coordinates), without a process
    group: plans, the global plan, every rank's write_data. Returns (metadata, results) for
    the coordinator's ``finish``, which is left to the caller."""
    planners = [DefaultSavePlanner() for _ in states]
    local = []
    for rank, (planner, writer, state) in enumerate(zip(planners, writers, states, strict=True)):
        writer.reset(step)
        planner.set_up_planner(state_dict=state, storage_meta=writer.storage_meta(), is_coordinator=rank == 0)
        writer.set_up_storage_writer(rank == 0, rank=rank)
        local.append(writer.prepare_local_plan(planner.create_local_plan()))
    plans, metadata = planners[0].create_global_plan(local)
    plans = writers[0].prepare_global_plan(plans)
    results = []
    for planner, writer, plan in zip(planners, writers, plans, strict=True):
        written = writer.write_data(planner.finish_plan(plan), planner)
        written.wait()
        results.append(written.value())
    return metadata, results


def test_two_ranks_commit_only_when_the_coordinator_finishes_and_load_into_one(tmp_path: pathlib.Path) -> None:
    shared = torch.arange(10.0)
    states = [{"shared": shared, "a": torch.randn(3, 3)}, {"shared": shared, "b": torch.randn(2, 5), "n": 7}]
    peers = [FolderPeers(tmp_path, rank, 2) for rank in range(2)]
    writers = [PeerMemoryWriter(p) for p in peers]
    metadata, results = save_by_hand(states, writers, step=3)
    assert isinstance(metadata, Metadata)
    assert (tmp_path / "step-3" / "rank-1.bin").exists()  # the other rank saved in write_data
    assert not (tmp_path / "step-3" / "rank-0.bin").exists()  # the coordinator holds its part
    assert peers[0].latest_step() is None
    with pytest.raises(CheckpointException, match="no DCP checkpoint to load"):
        dcp.load({"a": torch.zeros(3, 3)}, storage_reader=PeerMemoryReader(FolderPeers(tmp_path, 0, 1)))
    with pytest.raises(CheckpointException, match="step 3 is not committed"):
        dcp.load({"a": torch.zeros(3, 3)}, storage_reader=PeerMemoryReader(FolderPeers(tmp_path, 0, 1), 3))
    spans = [r.storage_data for rank_results in results for r in rank_results]
    assert all(isinstance(s, PeerSpan) and s.step == 3 for s in spans)
    assert sorted(s.key.split("|")[1] for s in spans).count("shared") == 1  # DCP wrote it once

    writers[0].finish(metadata, results)
    assert peers[0].latest_step() == 3
    target = {"shared": torch.zeros(10), "a": torch.zeros(3, 3), "b": torch.zeros(2, 5), "n": 0}
    dcp.load(target, storage_reader=PeerMemoryReader(FolderPeers(tmp_path, 0, 1)))
    assert_same(target, {"shared": shared, "a": states[0]["a"], "b": states[1]["b"], "n": 7})


def test_a_coordinator_that_fails_in_finish_leaves_the_step_uncommitted(tmp_path: pathlib.Path) -> None:
    good = {"w": torch.randn(5)}
    dcp.save(good, storage_writer=PeerMemoryWriter(FolderPeers(tmp_path, 0, 1)), checkpoint_id=1)
    with pytest.raises(CheckpointException, match="died in finish"):
        dying = PeerMemoryWriter(FolderPeers(tmp_path, 0, 1, fail_last=True))
        dcp.save({"w": torch.randn(5)}, storage_writer=dying, checkpoint_id=2)
    peers = FolderPeers(tmp_path, 0, 1)
    with pytest.raises(CheckpointException, match="step 2 is not committed"):
        dcp.load({"w": torch.zeros(5)}, storage_reader=PeerMemoryReader(peers), checkpoint_id=2)
    target = {"w": torch.zeros(5)}
    dcp.load(target, storage_reader=PeerMemoryReader(peers))
    assert torch.equal(target["w"], good["w"])


@pytest.mark.parametrize("bad", ["abc", "1.5", "/ckpt/step-3", "", -1, True, 2.0, 2**63, None])
def test_a_checkpoint_id_that_is_not_a_step_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="checkpoint_id"):
        step_of(bad)
    assert not PeerMemoryWriter.validate_checkpoint_id(bad)


def test_a_checkpoint_id_is_an_int_or_a_str_of_one() -> None:
    assert [step_of(3), step_of("120"), step_of(" 7 ")] == [3, 120, 7]
    assert PeerMemoryReader.validate_checkpoint_id("9")


def test_save_errors_name_what_to_change(tmp_path: pathlib.Path) -> None:
    state = {"w": torch.randn(3)}
    with pytest.raises(CheckpointException, match="pass checkpoint_id="):
        dcp.save(state, storage_writer=PeerMemoryWriter(FolderPeers(tmp_path, 0, 1)))
    with pytest.raises(CheckpointException, match="world_size 2"):
        dcp.save(state, storage_writer=PeerMemoryWriter(FolderPeers(tmp_path, 0, 2)), checkpoint_id=1)
    with pytest.raises(CheckpointException, match="DCP rank 0 saves through the Checkpointer of ray_ckpt rank 1"):
        dcp.save(state, storage_writer=PeerMemoryWriter(FolderPeers(tmp_path, 1, 2)), checkpoint_id=1)
    with pytest.raises(ConfigError, match="Checkpointer"):
        PeerMemoryWriter(object())
    with pytest.raises(ConfigError, match=r"AsyncCheckpointerType\.THREAD"):
        pickle.dumps(PeerMemoryWriter(FolderPeers(tmp_path, 0, 1)))
    with pytest.raises(ConfigError, match=r"AsyncCheckpointerType\.THREAD"):
        pickle.dumps(PeerMemoryReader(FolderPeers(tmp_path, 0, 1)))
    assert FolderPeers(tmp_path, 0, 1).latest_step() is None  # nothing of these saves committed


def test_load_errors_name_what_to_change(tmp_path: pathlib.Path) -> None:
    peers = FolderPeers(tmp_path, 0, 1)
    with pytest.raises(CheckpointException, match="nothing is committed"):
        dcp.load({"w": torch.zeros(3)}, storage_reader=PeerMemoryReader(peers))
    peers.save(5, {"w": torch.randn(3)}, last=True)  # a plain Checkpointer.save of the same job
    with pytest.raises(CheckpointException, match="not saved through PeerMemoryWriter"):
        dcp.load({"w": torch.zeros(3)}, storage_reader=PeerMemoryReader(peers))


class RunsCode:
    """An object whose unpickling runs code: it creates the file ``marker``."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"import pathlib; pathlib.Path({str(self.marker)!r}).touch()",))


def refused(caught: pytest.ExceptionInfo[CheckpointException]) -> BaseException:
    """The error the one rank of a failed dcp.load raised in its read."""
    (error, _), *_ = caught.value.failures.values()
    return error


def test_a_pickle_in_place_of_the_metadata_is_refused_and_runs_nothing(tmp_path: pathlib.Path) -> None:
    proof, marker = tmp_path / "proof", tmp_path / "ran"
    pickle.loads(pickle.dumps(RunsCode(proof)))
    assert proof.exists()  # the payload runs code wherever it is unpickled
    payload = torch.frombuffer(bytearray(pickle.dumps(RunsCode(marker))), dtype=torch.uint8)
    peers = FolderPeers(tmp_path / "peers", 0, 1)
    peers.save(5, {"format": FORMAT, "coordinator": 0, "items": {}, "metadata": payload}, last=True)
    with pytest.raises(DcpMetadataError, match="step 5's DCP metadata is malformed: the payload is not msgpack"):
        PeerMemoryReader(peers).read_metadata()
    with pytest.raises(CheckpointException, match="step 5's DCP metadata is malformed"):
        dcp.load({"w": torch.zeros(3)}, storage_reader=PeerMemoryReader(peers))
    peers.save(6, {"format": "ray_ckpt.dcp/1", "coordinator": 0, "items": {}, "metadata": payload}, last=True)
    with pytest.raises(CheckpointException, match="step 6 was saved by an older ray_ckpt, which pickled"):
        dcp.load({"w": torch.zeros(3)}, storage_reader=PeerMemoryReader(peers))  # an older writer's step
    assert not marker.exists()


class ValuesThatRunCode(DefaultSavePlanner):
    """A save planner whose every non-tensor value is a torch.save that runs code when loaded."""

    def __init__(self, marker: pathlib.Path) -> None:
        super().__init__()
        self.marker = marker

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:
        if write_item.type != WriteItemType.BYTE_IO:
            return super().transform_object(write_item, object)
        out = io.BytesIO()
        torch.save(RunsCode(self.marker), out)
        return out


def test_a_value_that_runs_code_when_unpickled_is_refused_and_runs_nothing(tmp_path: pathlib.Path) -> None:
    state = {"w": torch.randn(3), "note": "hello"}
    from_disk = tmp_path / "ran-from-disk"
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp_path / "disk")), planner=ValuesThatRunCode(from_disk))
    dcp.load({"w": torch.zeros(3), "note": None}, storage_reader=dcp.FileSystemReader(str(tmp_path / "disk")))
    assert from_disk.exists()  # DCP's load planner unpickles the bytes its storage reader hands it

    from_peers = tmp_path / "ran-from-peers"
    peers = FolderPeers(tmp_path / "peers", 0, 1)
    dcp.save(state, storage_writer=PeerMemoryWriter(peers), planner=ValuesThatRunCode(from_peers), checkpoint_id=3)
    target = {"w": torch.zeros(3), "note": None}
    refusal = r"step 3: DCP's value 'note' is not one torch\.load\(weights_only=True\) loads"
    with pytest.raises(CheckpointException, match=refusal) as caught:
        dcp.load(target, storage_reader=PeerMemoryReader(peers))
    assert type(refused(caught)) is SnapshotFormatError and "GLOBAL exec was not an allowed global" in str(caught.value)
    assert not from_peers.exists() and target["note"] is None


def test_a_value_of_a_type_torch_does_not_allow_loads_once_the_type_is_allowed(tmp_path: pathlib.Path) -> None:
    peers = FolderPeers(tmp_path, 0, 1)
    dcp.save(rich_state(4), storage_writer=PeerMemoryWriter(peers), checkpoint_id=4)
    target = zeros_like(rich_state(4))
    with pytest.raises(CheckpointException, match=r"'blob' .* GLOBAL _io\.BytesIO was not an allowed global"):
        dcp.load(target, storage_reader=PeerMemoryReader(peers))
    with bytes_io_allowed():
        dcp.load(target, storage_reader=PeerMemoryReader(peers))
    assert_same(target, rich_state(4))


def test_write_results_name_the_rank_key_and_span_of_each_item(tmp_path: pathlib.Path) -> None:
    state = {"a": torch.randn(4), "b": {"c": torch.randn(2, 2)}}
    writers = [PeerMemoryWriter(FolderPeers(tmp_path, 0, 1))]
    _, results = save_by_hand([state], writers, step=8)
    by_fqn: dict[str, WriteResult] = {r.index.fqn: r for r in results[0]}
    assert set(by_fqn) == {"a", "b.c"}
    span = by_fqn["b.c"].storage_data
    assert (span.step, span.rank, span.key, span.nbytes, span.dtype, span.shape) == (
        8, 0, item_key(by_fqn["b.c"].index), 16, "float32", (2, 2),
    )  # fmt: skip
    assert span.key == "0,0|b.c"


# ---- FSDP2 + Adam saved by 2 gloo ranks, loaded by 1 and by 3 ----------------------------------------------


def sharded(world: int, seed: int, zero: bool = False) -> tuple[dict[str, Any], torch.nn.Module]:
    """The FSDP2 model and Adam of ``world`` ranks, and a [10, 7] table sharded on columns."""
    model, optim = fsdp_model(seed)
    torch.manual_seed(seed)
    table = torch.zeros(10, 7) if zero else torch.randn(10, 7)
    model_state, optim_state = get_state_dict(model, optim)
    if zero:
        for value in [*model_state.values(), *(v for m in optim_state["state"].values() for v in m.values())]:
            (value.to_local() if hasattr(value, "to_local") else value).zero_()
    mesh = init_device_mesh("cpu", (world,))
    return {"model": model_state, "optim": optim_state, "table": distribute_tensor(table, mesh, [Shard(1)])}, model


def full(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Every global tensor (gathered: a collective)."""
    out = {"table": state["table"].full_tensor()}
    out.update({f"model.{k}": v.full_tensor() for k, v in state["model"].items()})
    for fqn, moments in state["optim"]["state"].items():
        for name, value in moments.items():
            out[f"optim.{fqn}.{name}"] = value.full_tensor() if hasattr(value, "full_tensor") else value.clone()
    return out


def _save_rank(rank: int, world: int, results: Any, folder: pathlib.Path) -> None:
    state, _ = sharded(world, seed=0)
    dcp.save(state, storage_writer=PeerMemoryWriter(FolderPeers(folder, rank, world)), checkpoint_id=6)
    expected = full(state)
    if rank == 0:
        torch.save(expected, folder / "full.pt")
    results.put(rank)


def _load_rank(rank: int, world: int, results: Any, folder: pathlib.Path) -> None:
    target, model = sharded(world, seed=9, zero=True)
    dcp.load(target, storage_reader=PeerMemoryReader(FolderPeers(folder, rank, world, dead={"r0n0", "r1n1"})))
    got, expected = full(target), torch.load(folder / "full.pt")
    same = sorted(k for k in expected if torch.equal(got[k], expected[k]))
    weight = model.state_dict()["2.weight"].full_tensor()  # DCP loaded into the model's own DTensors
    results.put((rank, same == sorted(expected), torch.equal(weight, expected["model.2.weight"])))


def spawn(world: int, folder: pathlib.Path, work: Any) -> list[Any]:
    return spawn_ranks(world, str(folder / f"group-{world}-{work.__name__}"), work, folder)


@pytest.fixture(scope="module")
def saved_by_two(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("dcp2")
    assert spawn(2, folder, _save_rank) == [0, 1]
    return folder


def test_fsdp2_saved_by_two_ranks_loads_into_one_process_as_plain_tensors(saved_by_two: pathlib.Path) -> None:
    assert not dist.is_initialized()
    expected = torch.load(saved_by_two / "full.pt")
    target = {
        "model": {k.removeprefix("model."): torch.zeros_like(v) for k, v in expected.items() if k.startswith("model.")},
        "table": torch.zeros(10, 7),
    }
    dcp.load(target, storage_reader=PeerMemoryReader(FolderPeers(saved_by_two, 0, 1)), checkpoint_id=6)
    assert torch.equal(target["table"], expected["table"])
    assert all(torch.equal(v, expected[f"model.{k}"]) for k, v in target["model"].items())


def test_fsdp2_saved_by_two_ranks_loads_into_three_with_two_nodes_lost(saved_by_two: pathlib.Path) -> None:
    assert spawn(3, saved_by_two, _load_rank) == [(rank, True, True) for rank in range(3)]


class SkippingCheckpointer:
    """A Checkpointer whose every save is skipped, as with every= on a step not due."""

    rank, world_size = 0, 1

    def save(self, step: int, state: Any) -> Any:
        return type("Handle", (), {"skipped": True, "skip_reason": "not due"})()

    def range_readers(self, step: int) -> dict[int, Any]:
        return {}


def test_a_checkpointer_is_wrapped_once_and_a_skipped_save_fails_the_dcp_save() -> None:
    ckpt = SkippingCheckpointer()
    writer, reader = PeerMemoryWriter(ckpt), PeerMemoryReader(ckpt)
    assert writer.peers is reader.peers  # one lock for the Checkpointer
    with pytest.raises(CheckpointException, match=r"skipped step 4 \(not due\)"):
        dcp.save({"w": torch.randn(3)}, storage_writer=writer, checkpoint_id=4)
