"""Ranks of the cluster tests as Ray tasks and actors: deterministic states, saves, restores,
shard lookups; ``digest`` (from ``ray_ckpt.testing``) compares restored states.

Registered with Ray's pickler by value on import: Ray workers cannot import the tests folder."""

from __future__ import annotations

import sys
from typing import Any

import ray
import torch
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import ray_ckpt
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.testing import digest
from ray_ckpt.transport import naming

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


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


def rank_checkpointer(
    namespace: str,
    job: str,
    rank: int,
    world_size: int,
    config: dict[str, Any],
    attempt: str | None = None,
    *,
    sockets_closed: bool = False,
) -> Checkpointer:
    """One rank's ``Checkpointer`` on the test's service; ``config`` holds ``CheckpointConfig``'s
    keywords (a dict crosses to a Ray task as is). ``sockets_closed``: every store's socket is
    unreachable to it (``close_every_socket``), so its shards go through Ray."""
    checkpointer = Checkpointer(
        job=job,
        rank=rank,
        world_size=world_size,
        config=ray_ckpt.CheckpointConfig(**config),
        namespace=namespace,
        attempt=attempt,
    )
    if sockets_closed:
        try:
            close_every_socket(checkpointer, namespace, job)
        except BaseException:
            checkpointer.close()
            raise
    return checkpointer


SAVERS = "savers"
"""The attempt of the ranks a test saves with (``save_steps``): without one, a rank that saves
without restoring first is refused where there is more than one rank."""


@ray.remote(num_cpus=1, max_retries=0)
def save_steps(
    namespace: str,
    job: str,
    rank: int,
    world_size: int,
    steps: list[int],
    config: dict[str, Any],
    size: int,
    attempt: str = SAVERS,
) -> str:
    """Save make_state(rank, s) for each step as one rank would, without restoring first, as a
    rank of the worker group ``attempt`` (every call of a test, unless told; a restore by the
    test's ranks opens another attempt, which supersedes it); returns the rank's node id."""
    with rank_checkpointer(namespace, job, rank, world_size, config, attempt) as checkpointer:
        for step in steps:
            handle = checkpointer.save(step, make_state(rank, step, size))
        handle.staged(timeout_s=60)
    return ray.get_runtime_context().get_node_id()


def linear_state(rank: int, step: int) -> dict[str, Any]:
    """A state whose "model" loads into ``torch.nn.Linear(8, 1)``, the model of operations.md's
    "Watching a job's weights"."""
    generator = torch.Generator().manual_seed(rank * 1000 + step)
    model = {"weight": torch.randn(1, 8, generator=generator), "bias": torch.randn(1, generator=generator)}
    return {"model": model, "rest": make_state(rank, step, 20_000)}


@ray.remote(num_cpus=1, max_restarts=0)
class TrainingRank:
    """One rank of a running job: it restores once, then saves the steps it is told, its
    Checkpointer open between calls."""

    def __init__(self, namespace: str, job: str, rank: int, world_size: int, config: dict) -> None:
        self.rank = rank
        self.checkpointer = rank_checkpointer(namespace, job, rank, world_size, config)
        self.checkpointer.restore()

    def save(self, step: int) -> str | None:
        """Save ``step`` and wait for its commit; this rank's attempt."""
        self.checkpointer.save(step, linear_state(self.rank, step)).wait(timeout_s=120)
        return self.checkpointer.attempt


@ray.remote(num_cpus=1, max_retries=0)
def restore_rank(namespace: str, job: str, rank: int, world_size: int, config: dict[str, Any]) -> dict[str, Any]:
    """Restore one rank in a fresh process; returns step, source, digest and phases."""
    with rank_checkpointer(namespace, job, rank, world_size, config) as checkpointer:
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
