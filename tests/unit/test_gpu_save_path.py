"""The GPU save path: CUDA tensors go into a pinned host buffer by non-blocking copies, the
background waits on the event, and the coded blob decodes to the state bit-exact. Runs where a
CUDA device is present; skipped elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.save_pipelines import lone_pipeline

from ray_ckpt.core import blob, snapshot
from ray_ckpt.restore import load
from ray_ckpt.save import SavePipeline
from ray_ckpt.testing import digest

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def pipeline(k: int, m: int) -> SavePipeline:
    """A pipeline for the blocking part only: snapshot() uses none of its collaborators."""
    return lone_pipeline("gpu", node_id="here", data_shards=k, parity_shards=m)


@pytest.mark.parametrize(("k", "m"), [(4, 2), (2, 1), (3, 0)])
def test_cuda_state_snapshots_into_pinned_memory_and_decodes_bit_exact(k: int, m: int) -> None:
    """Mixed-dtype CUDA tensors (and a CPU one), written while the GPU keeps working on the same
    stream: after the event, losing any m shards still decodes to the state bit-exact."""
    generator = torch.Generator(device="cuda").manual_seed(7)
    state = {
        "w": torch.randn(1 << 20, device="cuda", generator=generator),
        "h": torch.randn(4099, device="cuda", generator=generator).to(torch.bfloat16),
        "i": torch.arange(1000, device="cuda", dtype=torch.int64),
        "cpu": torch.arange(10, dtype=torch.float64),
        "step": 3,
    }
    expected = digest({key: v.cpu() if isinstance(v, torch.Tensor) else v for key, v in state.items()})
    saver = pipeline(k, m)
    buffer, size, copied = saver.snapshot(snapshot.build_layout(state))
    assert len(copied) == 1 and saver._buffer.is_pinned()  # one device: one event
    state["w"].mul_(0)  # queued after the copies on the same stream: must not reach the snapshot
    copied[0].synchronize()
    shard_size = buffer.size // k
    data = [buffer[i * shard_size : (i + 1) * shard_size] for i in range(k)]
    shards = data + saver.code.encode_parity(data)
    survivors = {i: s.copy() for i, s in enumerate(shards) if i >= m}  # the first m shards are lost
    out = np.empty(shard_size * k, dtype=np.uint8)
    saver.code.decode_into(survivors, out)
    assert blob.split(out[:size])[1].size > 0
    assert digest(load(out[:size])) == expected


def test_a_cpu_save_after_a_cuda_save_reuses_the_pinned_buffer() -> None:
    """The buffer stays pinned once a CUDA state needed it; a CPU state then needs no event."""
    saver = pipeline(2, 1)
    saver.snapshot(snapshot.build_layout({"w": torch.ones(1000, device="cuda")}))
    _, _, copied = saver.snapshot(snapshot.build_layout({"w": torch.ones(100)}))
    assert copied == [] and saver._buffer.is_pinned()
