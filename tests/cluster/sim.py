"""Helpers for cluster tests: deterministic states, ranks as Ray tasks, shard lookups; ``digest``
(from ``ray_ckpt.testing``) compares restored states."""

from __future__ import annotations

from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import ray_ckpt
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.testing import digest
from ray_ckpt.transport import naming


def make_state(rank: int, step: int, size: int = 50_000) -> dict[str, Any]:
    """A deterministic optimizer-like state for (rank, step)."""
    generator = torch.Generator().manual_seed(rank * 1000 + step)
    return {
        "model": {
            "w": torch.randn(size, generator=generator),
            "b": torch.arange(7, dtype=torch.int64) + step,
        },
        "optim": {"state": {0: {"exp_avg": torch.randn(100, generator=generator)}}, "lr": 0.1},
        "step": step,
    }


@ray.remote(num_cpus=1, max_retries=0)
def save_steps(
    namespace: str, job: str, rank: int, world_size: int, steps: list[int], config: dict[str, Any], size: int
) -> str:
    """Save make_state(rank, s) for each step as one rank would; returns the rank's node id."""
    with Checkpointer(
        job=job,
        rank=rank,
        world_size=world_size,
        config=ray_ckpt.CheckpointConfig(**config),
        namespace=namespace,
    ) as checkpointer:
        for step in steps:
            handle = checkpointer.save(step, make_state(rank, step, size))
        handle.staged(timeout_s=60)
    return ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=1, max_retries=0)
def restore_rank(namespace: str, job: str, rank: int, world_size: int, config: dict[str, Any]) -> dict[str, Any]:
    """Restore one rank in a fresh process; returns step, source, digest and phases."""
    with Checkpointer(
        job=job,
        rank=rank,
        world_size=world_size,
        config=ray_ckpt.CheckpointConfig(**config),
        namespace=namespace,
    ) as checkpointer:
        restored = checkpointer.restore()
    if restored is None:
        return {"step": None}
    return {"step": restored.step, "source": restored.source, "digest": digest(restored.state)}


def on_node(node_id: str) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def shard_nodes(namespace: str, job: str, step: int) -> dict[int, dict[int, str]]:
    """rank -> {shard index: node id} of a committed step, from the registry."""
    located = ray.get(naming.registry_handle(namespace).locate.remote(job, step))
    return {rank: {int(i): n for i, n in r["nodes"].items()} for rank, r in located.items()}


def close_every_socket(checkpointer: Checkpointer, namespace: str, job: str) -> None:
    """Make every store's socket unreachable to this rank (a firewall that lets only Ray's ports
    through): each store's endpoint points at a port nobody listens on. Here, not in a test
    module: Ray tasks call it, and workers cannot import the tests folder."""
    import socket

    from ray_ckpt.transport.direct_reads import Endpoint

    with socket.socket() as probe:  # a port that was free a moment ago, and is closed now
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    for node_id in naming.store_node_ids(namespace):
        checkpointer._stores._endpoints[node_id] = (job, Endpoint("127.0.0.1", closed, "0" * 64))
