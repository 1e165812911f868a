"""DTensor leaves: FSDP2 and 2-D mesh states snapshot as local shard plus layout, restore as
SavedShard and load into a fresh state dict bit-exact; mismatches and unsupported placements
fail clearly and change nothing."""

from __future__ import annotations

import itertools
import pathlib
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import torch
import torch.distributed as dist
from support.fsdp_model import fsdp_model
from support.gloo_ranks import spawn_ranks
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

from ray_ckpt.core import dtensor
from ray_ckpt.core import snapshot as snap
from ray_ckpt.errors import ConfigError, LayoutChangedError, SnapshotFormatError, UnsupportedLeafError


@pytest.mark.parametrize(
    ("shape", "mesh", "placements"),
    [
        ((7, 5), (4,), (("S", 0),)),
        ((3,), (4,), (("S", 0),)),
        ((7, 5), (2, 2), (("S", 1), ("S", 0))),
        ((7, 5), (2, 2), (("S", 0), ("S", 0))),
        ((7, 5), (2, 3), (("R",), ("S", 0))),
        ((0, 4), (3,), (("S", 0),)),
    ],
)
def test_blocks_of_a_mesh_tile_the_global_tensor_once_per_replica(
    shape: tuple[int, ...], mesh: tuple[int, ...], placements: tuple[Any, ...]
) -> None:
    replicas = 1
    for placement, count in zip(placements, mesh, strict=True):
        replicas *= count if placement[0] == "R" else 1
    covered = torch.zeros(shape, dtype=torch.int64)
    for coordinate in itertools.product(*(range(n) for n in mesh)):
        size, start = dtensor.block(shape, mesh, placements, coordinate)
        covered[tuple(slice(s, s + n) for s, n in zip(start, size, strict=True))] += 1
    assert bool((covered == replicas).all())


def test_blocks_match_torch_chunking() -> None:
    """The layouts measured from torch (4 ranks, FSDP2 and distribute_tensor on a 2x2 mesh)."""
    assert [dtensor.block((5, 3), (4,), (("S", 0),), (c,)) for c in range(4)] == [
        ((2, 3), (0, 0)),
        ((2, 3), (2, 0)),
        ((1, 3), (4, 0)),
        ((0, 3), (5, 0)),
    ]
    assert [dtensor.block((7, 5), (2, 2), (("S", 1), ("S", 0)), c) for c in ((0, 0), (0, 1), (1, 0), (1, 1))] == [
        ((4, 3), (0, 0)),
        ((3, 3), (4, 0)),
        ((4, 2), (0, 3)),
        ((3, 2), (4, 3)),
    ]


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A 1-rank gloo process group in this process, destroyed afterwards."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def roundtrip(state: Any) -> Any:
    header, payload = snap.snapshot(state)
    return snap.restore(header, payload)


def local_values(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    flat: dict[str, torch.Tensor] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, torch.Tensor):
            flat[path] = (node.to_local() if dtensor.is_dtensor(node) else node).detach().clone()
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}/{key}")

    walk(state, "")
    return flat


def test_fsdp2_model_and_adam_restore_bit_exact_into_a_fresh_state_dict(one_rank: None) -> None:
    model, optim = fsdp_model(0)
    saved_model, saved_optim = get_state_dict(model, optim)
    header, payload = snap.snapshot({"model": saved_model, "optim": saved_optim})
    assert msgpack.unpackb(header, raw=False, strict_map_key=False)["version"] == 2
    before = local_values({"model": saved_model, "optim": saved_optim})

    restored = snap.restore(header, payload)
    shard = restored["model"]["0.weight"]
    assert isinstance(shard, dtensor.SavedShard)
    assert (shard.global_shape, shard.placements, shard.mesh_shape) == ((5, 6), (("S", 0),), (1,))

    other, other_optim = fsdp_model(1)
    target_model, target_optim = get_state_dict(other, other_optim)
    merged = dtensor.load_into(restored, {"model": target_model, "optim": target_optim})
    assert merged["model"]["0.weight"] is target_model["0.weight"]
    after = local_values(merged)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    # the model's own parameters were filled: its outputs are the saved model's
    x = torch.randn(3, 6)
    assert torch.equal(model(x), other(x))
    assert merged["optim"]["param_groups"] == saved_optim["param_groups"]


def test_a_layout_mismatch_names_the_key_and_changes_nothing(one_rank: None) -> None:
    model, _ = fsdp_model(0)
    restored = roundtrip({"model": model.state_dict()})
    mesh = init_device_mesh("cpu", (1,))
    target = {
        "model": {
            "0.weight": distribute_tensor(torch.zeros(5, 6), mesh, [Replicate()]),
            "0.bias": distribute_tensor(torch.zeros(5), mesh, [Shard(0)]),
        }
    }
    with pytest.raises(ConfigError, match=r"state\['model'\]\['0.weight'\].*placements") as info:
        dtensor.load_into(restored, target)
    assert info.value.details["key_path"] == "state['model']['0.weight']"
    assert isinstance(info.value, LayoutChangedError)  # only the sharding differs: a restore reshards
    assert bool((target["model"]["0.bias"].to_local() == 0).all())  # checked before any copy

    other_shape = {"model": {"0.weight": distribute_tensor(torch.zeros(6, 6), mesh, [Shard(0)])}}
    with pytest.raises(ConfigError, match="global shape") as info:
        dtensor.load_into(restored, other_shape)
    assert not isinstance(info.value, LayoutChangedError)  # another tensor: no sharding fits it

    plain = {"model": {"0.weight": torch.zeros(5, 6)}}
    with pytest.raises(ConfigError, match="saved as a DTensor"):
        dtensor.load_into(restored, plain)
    assert bool((plain["model"]["0.weight"] == 0).all())


def test_a_plain_tensor_of_another_shape_is_refused_and_missing_places_keep_the_saved_value() -> None:
    restored = roundtrip({"a": torch.ones(2, 3), "b": torch.arange(4), "n": 7})
    target_a = torch.zeros(2, 3)
    merged = dtensor.load_into(restored, {"a": target_a})
    assert merged["a"] is target_a and bool((target_a == 1).all())
    assert torch.equal(merged["b"], torch.arange(4)) and merged["n"] == 7
    wrong = torch.zeros(3, 2)
    with pytest.raises(ConfigError, match=r"state\['a'\]: saved torch.float32 \(2, 3\)"):
        dtensor.load_into(restored, {"a": wrong})


def test_partial_placements_are_refused_naming_the_key(one_rank: None) -> None:
    mesh = init_device_mesh("cpu", (1,))
    partial = DTensor.from_local(torch.ones(4), mesh, [Partial()])
    with pytest.raises(UnsupportedLeafError, match=r"state\['grad'\].*placement P\(sum\) is not supported"):
        snap.build_layout({"grad": partial})


def test_a_plain_state_still_writes_version_1_and_a_version_1_header_with_a_dtensor_node_is_refused() -> None:
    header, payload = snap.snapshot({"w": torch.ones(2)})
    meta = msgpack.unpackb(header, raw=False, strict_map_key=False)
    assert meta["version"] == 1
    meta["tree"] = ["D", {"local": 0, "shape": [2], "placements": [["R"]], "mesh": [1], "mesh_dims": None,
                          "coordinate": [0], "offsets": [0]}]  # fmt: skip
    with pytest.raises(SnapshotFormatError, match="'D'"):
        snap.restore(msgpack.packb(meta, use_bin_type=True), payload)
    meta["version"] = 2
    shard = snap.restore(msgpack.packb(meta, use_bin_type=True), payload)
    assert isinstance(shard, dtensor.SavedShard) and torch.equal(shard.local, torch.ones(2))
    meta["tree"][1]["offsets"] = [1]
    with pytest.raises(SnapshotFormatError, match="not its block"):
        snap.restore(msgpack.packb(meta, use_bin_type=True), payload)


def _four_ranks(rank: int, world: int, results: Any) -> None:
    model, optim = fsdp_model(0)
    state = dict(zip(("model", "optim"), get_state_dict(model, optim), strict=True))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(5)
    state["tp"] = distribute_tensor(torch.randn(7, 5), mesh, [Shard(1), Shard(0)])
    state["hsdp"] = distribute_tensor(torch.randn(9, 2), mesh, [Replicate(), Shard(0)])
    full = {k: state[k].full_tensor() for k in ("tp", "hsdp")}
    full["weight"] = state["model"]["2.weight"].full_tensor()
    full["exp_avg"] = state["optim"]["state"]["2.weight"]["exp_avg"].full_tensor()
    restored = roundtrip(state)

    other, other_optim = fsdp_model(3)
    target = dict(zip(("model", "optim"), get_state_dict(other, other_optim), strict=True))
    target["tp"] = distribute_tensor(torch.zeros(7, 5), mesh, [Shard(1), Shard(0)])
    target["hsdp"] = distribute_tensor(torch.zeros(9, 2), mesh, [Replicate(), Shard(0)])
    merged = dtensor.load_into(restored, target)
    again = {k: merged[k].full_tensor() for k in ("tp", "hsdp")}
    again["weight"] = other.state_dict()["2.weight"].full_tensor()
    again["exp_avg"] = merged["optim"]["state"]["2.weight"]["exp_avg"].full_tensor()
    results.put((rank, all(torch.equal(full[k], again[k]) for k in full), restored["tp"].coordinate))


def test_four_ranks_fsdp2_and_a_2d_mesh_restore_every_global_tensor_bit_exact(tmp_path: pathlib.Path) -> None:
    outcome = spawn_ranks(4, str(tmp_path / "store"), _four_ranks)
    assert outcome == [(0, True, (0, 0)), (1, True, (0, 1)), (2, True, (1, 0)), (3, True, (1, 1))]
