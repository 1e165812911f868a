"""A small FSDP2 model with Adam for the DTensor tests (needs a process group)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def fsdp_model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A fully_shard-ed 2-layer MLP and its Adam, one step taken (moments are DTensors)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 6)).sum().backward()
    optim.step()
    optim.zero_grad()
    return model, optim
