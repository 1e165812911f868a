"""A small FSDP2 model with Adam for the DTensor tests (needs a process group)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def fsdp_model(seed: int, mesh_shape: tuple[int, ...] | None = None) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A fully_shard-ed 2-layer MLP and its Adam, one step taken (moments are DTensors); on a
    1-D mesh of every rank, or ``mesh_shape`` (2-D: HSDP, replicated on the first dimension)."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    shape = mesh_shape or (dist.get_world_size(),)
    names = ("replicate", "shard") if len(shape) == 2 else None  # HSDP needs its dimensions named
    fully_shard(model, mesh=init_device_mesh("cpu", shape, mesh_dim_names=names))
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 6)).sum().backward()
    optim.step()
    optim.zero_grad()
    return model, optim
