"""Batched commits through the relay tree, with a registry restart or a relay's death in the
middle: no step committed twice, none lost.

Two ranks per node stage through their node's store, which batches them and passes them up the
relay tree (``ray_ckpt.core.relay``). This module's stores form a chain (RAY_CKPT_RELAY_FANIN=1: one
child per store), the deepest tree 4 stores can form, so every store but the last is a relay.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from support import pace
from support.cluster_ranks import SAVERS, digest, make_state, on_node, rank_checkpointer, restore_rank
from support.sim_cluster import SimCluster

from ray_ckpt.transport import naming
from ray_ckpt.transport.registry_client import RegistryClient

pytestmark = [pytest.mark.cluster, pytest.mark.node_env]
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

CODE = {"data_shards": 2, "parity_shards": 1, "local_copy": False, "keep_committed": 2}
JOB = "batched"
RANKS_PER_NODE = 2
STEPS = 24


@pytest.fixture(scope="module", autouse=True)
def chain_of_relays() -> Iterator[None]:
    """Set before the module's cluster starts, so its registry draws the tree with fan-in 1."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_CKPT_RELAY_FANIN", "1")
        yield


@ray.remote(num_cpus=0, max_retries=0)
def save_and_wait(namespace: str, job: str, rank: int, world_size: int, steps: int, wait_s: float) -> list[int]:
    """Save steps 0..steps-1 as one rank (of the worker group ``SAVERS``), waiting up to
    ``wait_s`` for each commit; the steps this rank saw commit."""
    seen = []
    with rank_checkpointer(namespace, job, rank, world_size, CODE, SAVERS) as checkpointer:
        for step in range(steps):
            checkpointer.save(step, make_state(rank, step, 2_000)).wait(timeout_s=wait_s)
            seen.append(step)
    return seen


class CommitWatch:
    """The newest committed step as the registry reports it, sampled every 20 ms in a thread."""

    def __init__(self, client: RegistryClient) -> None:
        self.seen: list[int] = []
        self._client = client
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                latest = self._client.latest_committed(JOB)
            except Exception:
                latest = None
            if latest is not None:
                self.seen.append(latest)
            time.sleep(0.02)

    def wait_for(self, step: int, timeout_s: float = pace.bound(120)) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.seen or self.seen[-1] < step:
            if time.monotonic() > deadline:
                pytest.fail(f"step {step} did not commit within {timeout_s} s (seen {self.seen[-5:]})")
            time.sleep(0.01)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return self.seen


@pytest.fixture
def commit_watch(sim_cluster: SimCluster) -> Iterator[CommitWatch]:
    """A CommitWatch on the test's job, stopped before the cluster is given back even when the
    test fails: a thread still calling Ray while the driver disconnects ends the whole process."""
    watch = CommitWatch(RegistryClient(sim_cluster.namespace))
    try:
        yield watch
    finally:
        watch.stop()


def start_ranks(sim_cluster: SimCluster) -> tuple[int, list[Any]]:
    world_size = RANKS_PER_NODE * len(sim_cluster.workers)
    ranks = [
        save_and_wait.options(scheduling_strategy=on_node(sim_cluster.node_id(rank // RANKS_PER_NODE))).remote(
            sim_cluster.namespace, JOB, rank, world_size, STEPS, pace.bound(120)
        )
        for rank in range(world_size)
    ]
    return world_size, ranks


def check_every_step_committed_once(
    sim_cluster: SimCluster, client: RegistryClient, world_size: int, results: list[Any], seen: list[int]
) -> None:
    """Every rank saw each of its saves commit, the newest commit never went back, the stores'
    marks reached the last step, and every rank restores it bit-exact."""
    namespace = sim_cluster.namespace
    assert results == [list(range(STEPS))] * world_size
    assert seen == sorted(seen), "a committed step was lost: the newest commit went back"
    assert client.call("committed_steps", JOB) == [STEPS - 2, STEPS - 1]
    marks = [ray.get(h.holdings.remote())["committed"].get(JOB) for h in naming.store_handles(namespace).values()]
    assert max(m for m in marks if m is not None) == STEPS - 1
    restored: list[dict[str, Any]] = ray.get(
        [restore_rank.remote(namespace, JOB, rank, world_size, CODE) for rank in range(world_size)]
    )
    assert [r["step"] for r in restored] == [STEPS - 1] * world_size
    assert [r["digest"] for r in restored] == [digest(make_state(r, STEPS - 1, 2_000)) for r in range(world_size)]


@pytest.mark.nodes(3)
def test_a_registry_killed_during_batched_commits_loses_no_step_and_commits_none_twice(
    sim_cluster: SimCluster, commit_watch: CommitWatch
) -> None:
    """Six ranks (two per node, batched by their store) save 24 steps, each waiting for its commit;
    the registry is killed mid-run. Every save still commits (a retried batch is acknowledged,
    never refused as an old step), the newest committed step seen never goes back (no commit
    lost), the stores' commit marks end at the last step, and every rank restores it bit-exact."""
    namespace = sim_cluster.namespace
    client = RegistryClient(namespace)
    watch = commit_watch
    world_size, ranks = start_ranks(sim_cluster)
    watch.wait_for(4)
    registry = naming.registry_handle(namespace)
    pid_of = lambda _actor: os.getpid()  # noqa: E731 (a lambda ships by value)
    old_pid = ray.get(registry.__ray_call__.remote(pid_of))
    ray.kill(registry, no_restart=False)  # stages of the next steps are in flight
    results = ray.get(ranks, timeout=pace.bound(300))
    seen = watch.stop()
    assert ray.get(naming.registry_handle(namespace).__ray_call__.remote(pid_of)) != old_pid
    check_every_step_committed_once(sim_cluster, client, world_size, results, seen)


@pytest.mark.nodes(3)
def test_a_relay_killed_during_batched_commits_loses_no_step_and_commits_none_twice(
    sim_cluster: SimCluster, commit_watch: CommitWatch
) -> None:
    """Six ranks save 24 steps through a chain of relay stores; the second store of the chain
    (a relay with a child) is killed mid-run. Its child and its node's ranks stage with the
    registry directly until the next commit draws the tree again, and the registry starts a
    new store on that node: every save commits, once, and every rank restores bit-exact. The
    last commits drew the chain again without the dead store (the new one joins with the
    commit after it registered), and every store below which a store sent took relay calls."""
    namespace = sim_cluster.namespace
    client = RegistryClient(namespace)
    watch = commit_watch
    world_size, ranks = start_ranks(sim_cluster)
    watch.wait_for(4)
    chain = sorted(naming.store_node_ids(namespace))
    assert len(chain) == 4  # the head's store and three workers'
    ray.kill(naming.store_handles(namespace, [chain[1]])[chain[1]], no_restart=True)
    results = ray.get(ranks, timeout=pace.bound(300))
    seen = watch.stop()
    check_every_step_committed_once(sim_cluster, client, world_size, results, seen)
    stats = {node: ray.get(h.stats.remote()) for node, h in naming.store_handles(namespace).items()}
    drawn = [chain[0], *(node for node in sorted(stats) if stats[node]["parent"] is not None)]
    assert chain[2] in drawn and chain[3] in drawn, {n: s["parent"] for n, s in stats.items()}
    assert [stats[node]["parent"] for node in drawn] == [None, *drawn[:-1]]
    # a store relays when a store below it sent (the head's store has no ranks to send); the
    # killed store's successor may have had no child yet
    below = {node: any(stats[d]["relay_sends"] for d in drawn[i + 1 :]) for i, node in enumerate(drawn)}
    relays = [node for node in drawn if below[node] and node != chain[1]]
    assert relays and all(stats[node]["relayed"] > 0 for node in relays), {
        n: (s["parent"], s["relayed"], s["relay_sends"]) for n, s in stats.items()
    }
