"""The torch.distributed internals in-place recovery aborts process groups through: this fails
when a torch upgrade moves them."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from ray_ckpt.train import _torch_compat, process_groups


def test_this_torch_is_one_the_registry_was_verified_on() -> None:
    """Upgrading torch past the tested range fails here: re-run this file, then widen TESTED_TORCH."""
    assert _torch_compat.tested(), _torch_compat.TESTED_TORCH


@pytest.fixture
def world_of_one(tmp_path: pathlib.Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_every_group_of_the_process_is_listed_oldest_first(world_of_one: None) -> None:
    """WORLD and the subgroups made after it, as a device mesh makes them (through new_group)."""
    first, second = dist.new_group([0]), dist.new_group([0])
    assert _torch_compat.process_groups() == [dist.group.WORLD, first, second]
    assert not any(g is None for g in _torch_compat.process_groups())


def test_real_groups_are_all_aborted_and_the_world_can_still_be_destroyed(world_of_one: None) -> None:
    subgroup = dist.new_group([0])
    assert process_groups.abort_all() == [subgroup, dist.group.WORLD]
    dist.destroy_process_group()
    assert _torch_compat.process_groups() == []


def test_no_process_group_lists_and_aborts_nothing() -> None:
    assert not dist.is_initialized()
    assert _torch_compat.process_groups() == []
    assert process_groups.abort_all() == []
