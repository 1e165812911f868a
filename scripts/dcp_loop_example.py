"""A training loop of one's own that checkpoints through torch.distributed.checkpoint into peer
memory, under Ray Train, a node hard-killed.

Two Ray Train workers train an MLP sharded with FSDP2 (Adam), saving with ``dcp.save`` into peer
memory every 5 steps (RS(2, 2)) and saying which steps they trained in between
(``Checkpointer.note_step``); a resume loads the newest committed step with ``dcp.load``. The
run is done twice on a simulated cluster: uninterrupted, and with the node of rank 1 killed once
step ``--kill-at`` is reached, recovered by Ray Train's restart of the worker group or, with
``--in-place``, in place (the survivor keeps its process and loads from its own node's copy,
the replacement from peers). Rank 0 of each run writes the full model and optimizer state;
they are compared bit for bit.

    python scripts/dcp_loop_example.py [--steps 30] [--kill-at 12] [--in-place]
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import kill_and_compare
import torch

import ray_ckpt

CHECKPOINT = {"data_shards": 2, "parity_shards": 2}  # m = 2: the tests kill two runs at once, a node each
EVERY = 5  # steps between dcp.save calls


def train_func(config: dict[str, Any]) -> None:
    import ray.train
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ray_ckpt.integrations.dcp import PeerMemoryReader, PeerMemoryWriter

    torch.set_num_threads(1)
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ckpt = ray_ckpt.train.Checkpointer(ray_ckpt.CheckpointConfig(**CHECKPOINT))
    writer, reader = PeerMemoryWriter(ckpt), PeerMemoryReader(ckpt)

    def train_step(step: int) -> None:
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step * world + rank))
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
        optim.step()
        optim.zero_grad()

    start = 1
    if ckpt.latest_step() is not None:  # a resume: the newest committed step
        train_step(0)  # Adam's state exists only after a step: make it, then load over it
        model_state, optim_state = get_state_dict(model, optim)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, storage_reader=reader)
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = reader.loaded_step + 1
    for step in range(start, config["steps"] + 1):
        train_step(step)
        if step % EVERY == 0:
            model_state, optim_state = get_state_dict(model, optim)
            state = {"model": model_state, "optim": optim_state}
            dcp.save(state, storage_writer=writer, checkpoint_id=step)
        else:
            ckpt.note_step(step)  # trained, not saved: a failure makes the job train it again
        time.sleep(config["step_s"])
        if rank == 1 and step == config["kill_at"] and config["mark"]:
            pathlib.Path(config["mark"]).write_text(ray.get_runtime_context().get_node_id())
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optim_state = get_state_dict(model, optim, options=full)
    ckpt.close()
    if rank == 0:
        torch.save({"model": model_state, "optimizer": optim_state, "step": config["steps"]}, config["out"])


run_example = kill_and_compare.example(train_func, "dcp-loop")


if __name__ == "__main__":
    kill_and_compare.main(__doc__, run_example)
