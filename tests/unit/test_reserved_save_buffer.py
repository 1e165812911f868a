"""A save buffer mapped ahead (``SavePipeline.reserve``): after a restore the checkpointer
maps the next snapshot's buffer on a background thread, so an incarnation's first save copies
into mapped pages instead of mapping them while the training loop waits."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from support.save_pipelines import lone_pipeline

from ray_ckpt.core import blob, snapshot
from ray_ckpt.save import SavePipeline

STATE = {"w": torch.arange(300_000, dtype=torch.float32)}  # above hostmem's smallest mapped buffer


def pipeline() -> SavePipeline:
    return lone_pipeline("reserve", data_shards=2, parity_shards=1)


def blob_size(state: Any) -> int:
    layout = snapshot.build_layout(state)
    return blob.blob_size(len(layout.header), layout.payload_size)


@pytest.mark.parametrize("padded", [False, True], ids=["blob-size", "padded-size"])
def test_the_first_snapshot_after_a_reserve_writes_into_the_reserved_buffer_bit_exact(padded: bool) -> None:
    """A restore knows the blob's size (from a held blob) or its padded size (from shards)."""
    saves = pipeline()
    size = blob_size(STATE)
    saves.reserve(saves.code.shard_size(size) * saves.code.data_shards if padded else size)
    reserved = saves._reserved
    assert reserved is not None
    mapped = reserved.result(timeout=30)
    buffer, size, _ = saves.snapshot(snapshot.build_layout(STATE))
    assert np.shares_memory(buffer, mapped), "the reserved pages were used"
    assert torch.equal(snapshot.restore(*blob.split(buffer[:size]))["w"], STATE["w"])
    assert saves._reserved is None, "taken once"


def test_a_reserve_too_small_for_the_state_is_dropped_and_the_snapshot_maps_its_own() -> None:
    saves = pipeline()
    saves.reserve(blob_size(STATE) - saves.code.data_shards)
    reserved = saves._reserved
    assert reserved is not None
    mapped = reserved.result(timeout=30)
    buffer, size, _ = saves.snapshot(snapshot.build_layout(STATE))
    assert not np.shares_memory(buffer, mapped) and saves._reserved is None
    assert torch.equal(snapshot.restore(*blob.split(buffer[:size]))["w"], STATE["w"])


def test_a_pipeline_whose_buffer_is_large_enough_reserves_nothing() -> None:
    saves = pipeline()
    saves.snapshot(snapshot.build_layout(STATE))
    saves.reserve(blob_size(STATE))
    assert saves._reserved is None
    saves.release()
    saves.reserve(blob_size(STATE))
    assert saves._reserved is not None, "released buffers are mapped again"
