"""The step a save pipeline still holds in its buffer (``ray_ckpt.own_copies``): noted once
staged with its local copy, forgotten before the buffer is written again and at close, given
up (kept, no longer written) when a failed worker group abandons the checkpointer."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
from support.save_pipelines import lone_pipeline

from ray_ckpt.core import blob, snapshot
from ray_ckpt.core.placement import Node
from ray_ckpt.core.shard import ShardMeta
from ray_ckpt.own_copies import OwnCopies
from ray_ckpt.save import SavePipeline


class Stores:
    def storage_nodes(self, label: Any) -> list[Node]:
        return [Node(name) for name in "abcd"]

    def put(self, node_id: str, meta: ShardMeta, data: np.ndarray, local: bool) -> Future[None]:
        done: Future[None] = Future()
        done.set_result(None)
        return done


def pipeline(job: str, own_copies: OwnCopies, *, local_copy: bool = True) -> SavePipeline:
    return lone_pipeline(
        job, stores=Stores(), own_copies=own_copies, data_shards=2, parity_shards=1, local_copy=local_copy
    )


def save(saves: SavePipeline, step: int) -> bytes:
    """Save ``step`` (snapshot, then the background's part); the blob's bytes."""
    buffer, size, copied = saves.snapshot(snapshot.build_layout({"w": torch.full((1000,), float(step))}))
    saves.complete(step, buffer, size, copied, {}, 0.0)
    return bytes(buffer[:size])


def test_a_staged_step_is_held_until_the_next_snapshot_overwrites_the_buffer() -> None:
    own_copies = OwnCopies()
    saves = pipeline("held", own_copies)
    saved = save(saves, 1)
    held = own_copies.take("held", 0, 1, "w")
    assert held is not None and bytes(held) == saved
    assert not np.shares_memory(held, saves._buffer.numpy()), "a copy: the pipeline writes its buffer again"
    assert snapshot.restore(*blob.split(held))["w"][0] == 1.0
    save(saves, 2)
    saves.snapshot(snapshot.build_layout({"w": torch.zeros(1000)}))  # step 3's snapshot, not staged yet
    assert own_copies.take("held", 0, 2, "w") is None, "the buffer was written again"


def test_a_closed_pipeline_holds_nothing_and_an_abandoned_one_gives_its_buffer_up() -> None:
    own_copies = OwnCopies()
    closed, abandoned = pipeline("closed", own_copies), pipeline("abandoned", own_copies)
    save(closed, 1)
    closed.release()
    assert own_copies.take("closed", 0, 1, "w") is None
    saved = save(abandoned, 1)
    buffer = abandoned._buffer.numpy()
    abandoned.release(keep_for_rollback=True)
    held = own_copies.take("abandoned", 0, 1, "w")
    assert held is not None and bytes(held) == saved and np.shares_memory(held, buffer), "no copy"


def test_without_a_local_copy_nothing_is_held() -> None:
    """The restore checks a held blob against the local copy's checksum: none, nothing to check."""
    own_copies = OwnCopies()
    saves = pipeline("no-local", own_copies, local_copy=False)
    save(saves, 1)
    assert own_copies.take("no-local", 0, 1, "w") is None
