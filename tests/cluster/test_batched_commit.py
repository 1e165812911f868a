"""A registry restart in the middle of batched commits: no step committed twice, none lost.

Two ranks per node stage through their node's store, which batches them into one registry
call; the registry actor is killed (and restarted by Ray) while saves are in flight.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import pytest
import ray
from conftest import SimCluster
from sim import digest, make_state, on_node, restore_rank

import ray_ckpt
from ray_ckpt import naming
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.registry_client import RegistryClient

pytestmark = pytest.mark.cluster
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CODE = {"data_shards": 2, "parity_shards": 1, "local_copy": False, "keep_committed": 2}
JOB = "batched"
RANKS_PER_NODE = 2
STEPS = 24


@ray.remote(num_cpus=0, max_retries=0)
def save_and_wait(namespace: str, job: str, rank: int, world_size: int, steps: int) -> list[int]:
    """Save steps 0..steps-1 as one rank, waiting for each commit; the steps this rank saw commit."""
    seen = []
    with Checkpointer(
        job=job, rank=rank, world_size=world_size, config=ray_ckpt.CheckpointConfig(**CODE), namespace=namespace
    ) as checkpointer:
        for step in range(steps):
            checkpointer.save(step, make_state(rank, step, 2_000)).wait(timeout_s=120)
            seen.append(step)
    return seen


@pytest.mark.nodes(3)
def test_a_registry_killed_during_batched_commits_loses_no_step_and_commits_none_twice(sim_cluster: SimCluster) -> None:
    """Six ranks (two per node, batched by their store) save 24 steps, each waiting for its commit;
    the registry is killed mid-run. Every save still commits (a retried batch is acknowledged,
    never refused as an old step), the newest committed step seen never goes back (no commit
    lost), the stores' commit marks end at the last step, and every rank restores it bit-exact."""
    namespace = sim_cluster.namespace
    world_size = RANKS_PER_NODE * len(sim_cluster.workers)
    client = RegistryClient(namespace)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:  # the newest committed step, as the registry reports it, over time
        while not stop.is_set():
            try:
                latest = client.latest_committed(JOB)
            except Exception:
                latest = None
            if latest is not None:
                seen.append(latest)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    ranks = [
        save_and_wait.options(scheduling_strategy=on_node(sim_cluster.node_id(rank // RANKS_PER_NODE))).remote(
            namespace, JOB, rank, world_size, STEPS
        )
        for rank in range(world_size)
    ]
    deadline = time.monotonic() + 120
    while not seen or seen[-1] < 4:
        if time.monotonic() > deadline:
            pytest.fail(f"no commit within 120 s (seen {seen[-5:]})")
        time.sleep(0.01)
    registry = naming.registry_handle(namespace)
    pid_of = lambda _actor: os.getpid()  # noqa: E731 (a lambda ships by value)
    old_pid = ray.get(registry.__ray_call__.remote(pid_of))
    ray.kill(registry, no_restart=False)  # stages of the next steps are in flight
    results = ray.get(ranks, timeout=300)
    stop.set()
    watcher.join()
    assert results == [list(range(STEPS))] * world_size
    assert ray.get(naming.registry_handle(namespace).__ray_call__.remote(pid_of)) != old_pid
    assert seen == sorted(seen), "a committed step was lost: the newest commit went back"
    assert client.call("committed_steps", JOB) == [STEPS - 2, STEPS - 1]
    marks = [ray.get(h.holdings.remote())["committed"].get(JOB) for h in naming.store_handles(namespace).values()]
    assert max(m for m in marks if m is not None) == STEPS - 1
    restored: list[dict[str, Any]] = ray.get(
        [restore_rank.remote(namespace, JOB, rank, world_size, CODE) for rank in range(world_size)]
    )
    assert [r["step"] for r in restored] == [STEPS - 1] * world_size
    assert [r["digest"] for r in restored] == [digest(make_state(r, STEPS - 1, 2_000)) for r in range(world_size)]
