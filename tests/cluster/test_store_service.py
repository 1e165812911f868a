"""The shard store service on a simulated cluster, with real hard node kills."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import ray
from support import pace
from support.cluster_ranks import SAVERS, make_state, on_node, rank_checkpointer, restore_rank, save_steps, shard_nodes
from support.killed_actors import wait_until_dead
from support.sim_cluster import SimCluster

import ray_ckpt
from ray_ckpt import service
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.core.shard import ShardAddress
from ray_ckpt.errors import InsufficientShardsError, StoreFullError
from ray_ckpt.testing import digest
from ray_ckpt.transport import naming

pytestmark = pytest.mark.cluster

CODE = {"data_shards": 4, "parity_shards": 2, "local_copy": False}  # the peers path
JOB = "job-a"


def save_all(
    sim: SimCluster, steps: list[int], world_size: int = 4, config: dict | None = None, size: int = 50_000
) -> list[str]:
    """Each rank r saves from worker node r; returns the ranks' node ids."""
    config = config or CODE
    return ray.get(
        [
            save_steps.options(scheduling_strategy=on_node(sim.node_id(rank))).remote(
                sim.namespace, JOB, rank, world_size, steps, config, size
            )
            for rank in range(world_size)
        ]
    )


def restore_all(sim: SimCluster, world_size: int = 4) -> list[dict]:
    return ray.get([restore_rank.remote(sim.namespace, JOB, rank, world_size, CODE) for rank in range(world_size)])


def test_two_nodes_killed_at_once_every_rank_restores_bit_exact(sim_cluster: SimCluster) -> None:
    """RS(4,2) over 8 stores: after 2 shard-holding nodes die at once, all 4 ranks restore the
    latest committed step bit-exact from the survivors."""
    save_all(sim_cluster, [0, 1, 2])
    placement = shard_nodes(sim_cluster.namespace, JOB, 2)
    # two worker nodes that hold shards of rank 0, data shards first (a decode is needed)
    victims = sim_cluster.worker_holders(placement[0], 2)
    sim_cluster.kill(victims)
    results = restore_all(sim_cluster)
    assert [r["step"] for r in results] == [2, 2, 2, 2]
    assert all(r["source"] == "peers" for r in results)
    assert [r["digest"] for r in results] == [digest(make_state(rank, 2)) for rank in range(4)]


@pytest.mark.nodes(7)
def test_three_lost_shards_raise_insufficient_shards_naming_rank_step_and_shards(
    sim_cluster: SimCluster,
) -> None:
    """With 3 of a rank's 6 shards gone and no backup, restore raises InsufficientShardsError
    naming the rank, the step and the lost shards, and returns no partial state."""
    save_all(sim_cluster, [0, 1], world_size=2)
    placement = shard_nodes(sim_cluster.namespace, JOB, 1)
    victims = sim_cluster.worker_holders(placement[1], 3)
    lost_indices = {i for i, n in placement[1].items() if n in victims}
    sim_cluster.kill(victims)
    with pytest.raises(InsufficientShardsError) as info:
        ray.get(restore_rank.remote(sim_cluster.namespace, JOB, 1, 2, CODE))
    error = info.value
    assert "rank 1 step 1" in str(error)
    assert lost_indices <= set(error.lost)
    assert (error.rank, error.step) == (1, 1)


@pytest.mark.nodes(6)
def test_a_step_staged_by_only_some_ranks_never_becomes_latest(sim_cluster: SimCluster) -> None:
    """Rank 2 dies before staging step 2: step 1 stays the latest, and restore returns step 1."""
    world = 3
    ray.get(
        [
            save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(r))).remote(
                sim_cluster.namespace, JOB, r, world, [0, 1, 2] if r < 2 else [0, 1], CODE, 50_000
            )
            for r in range(world)
        ]
    )
    registry = naming.registry_handle(sim_cluster.namespace)
    assert ray.get(registry.latest_committed.remote(JOB)) == 1
    assert ray.get(registry.staged_ranks.remote(JOB, 2)) == [0, 1]
    results = restore_all(sim_cluster, world_size=world)
    assert [r["step"] for r in results] == [1, 1, 1]
    assert [r["digest"] for r in results] == [digest(make_state(r, 1)) for r in range(world)]


@pytest.mark.nodes(6)
def test_corrupted_shard_bytes_are_detected_and_routed_around(sim_cluster: SimCluster) -> None:
    """A shard overwritten with flipped bits (metadata intact) fails its checksum and is
    treated as an erasure: restore still returns the exact state."""
    save_all(sim_cluster, [0], world_size=1)
    registry = naming.registry_handle(sim_cluster.namespace)
    located = ray.get(registry.locate.remote(JOB, 0))[0]
    stores = naming.store_handles(sim_cluster.namespace)
    for index in (0, 1):  # corrupt two data shards in place
        store = stores[located["nodes"][index]]
        writer = located["metas"][index]["writer"]
        meta, data = ray.get(store.get.remote(ShardAddress(JOB, 0, 0, index, writer=writer).to_wire()))
        forged = np.array(data, copy=True)
        forged[::997] ^= 0x5A
        ray.get(store.put.remote(meta, forged))
    result = ray.get(restore_rank.remote(sim_cluster.namespace, JOB, 0, 1, CODE))
    assert result["step"] == 0
    assert result["digest"] == digest(make_state(0, 0))


@ray.remote(num_cpus=1, max_retries=0)
def _restore_with_unreachable_sockets(namespace: str, job: str, rank: int, world_size: int) -> dict:
    """Restore one rank as a reader to which every store's socket is closed."""
    with rank_checkpointer(namespace, job, rank, world_size, CODE, sockets_closed=True) as checkpointer:
        restored = checkpointer.restore()
    return {"step": restored.step, "digest": digest(restored.state)}


def _stores_count(namespace: str, counter: str) -> int:
    """The sum of a counter of the stores' stats over every store (``direct_reads``, ``direct_writes``)."""
    handles = naming.store_handles(namespace).values()
    return sum(stats[counter] for stats in ray.get([h.stats.remote() for h in handles], timeout=pace.bound(30)))


def test_restores_read_each_store_through_its_socket_or_through_ray_when_that_is_closed(
    sim_cluster: SimCluster,
) -> None:
    """A peers restore reads its k shards over the other nodes' stores' direct-read sockets
    (the stores count each read); a reader that cannot reach those sockets reads through Ray instead,
    bit-exact, and no store serves it a direct read."""
    save_all(sim_cluster, [0], world_size=2)
    before = _stores_count(sim_cluster.namespace, "direct_reads")
    results = ray.get(  # each rank on its own node, which holds none of its shards (7 nodes >= k+m)
        [
            restore_rank.options(scheduling_strategy=on_node(sim_cluster.node_id(rank))).remote(
                sim_cluster.namespace, JOB, rank, 2, CODE
            )
            for rank in range(2)
        ]
    )
    assert [r["digest"] for r in results] == [digest(make_state(r, 0)) for r in range(2)]
    served = _stores_count(sim_cluster.namespace, "direct_reads")
    assert served - before == 2 * CODE["data_shards"]
    result = ray.get(_restore_with_unreachable_sockets.remote(sim_cluster.namespace, JOB, 1, 2))
    assert result == {"step": 0, "digest": digest(make_state(1, 0))}
    assert _stores_count(sim_cluster.namespace, "direct_reads") == served


@ray.remote(num_cpus=1, max_retries=0)
def _save_with_unreachable_sockets(namespace: str, job: str, rank: int, world_size: int, step: int) -> None:
    """Save one step as a rank (of the worker group ``save_steps`` saves with) to which every
    store's socket is closed: its shards must go through Ray."""
    with rank_checkpointer(namespace, job, rank, world_size, CODE, SAVERS, sockets_closed=True) as checkpointer:
        checkpointer.save(step, make_state(rank, step)).staged(timeout_s=60)


def test_saves_write_each_shard_through_its_stores_socket_or_through_ray_when_that_is_closed(
    sim_cluster: SimCluster,
) -> None:
    """Each rank's k+m shards are written over their stores' sockets (the stores count each
    write); a saver that cannot reach those sockets puts them through Ray instead, no store
    counts a write, and both steps restore bit-exact."""
    save_all(sim_cluster, [0], world_size=2)
    written = _stores_count(sim_cluster.namespace, "direct_writes")
    assert written == 2 * (CODE["data_shards"] + CODE["parity_shards"])
    ray.get(
        [
            _save_with_unreachable_sockets.options(scheduling_strategy=on_node(sim_cluster.node_id(rank))).remote(
                sim_cluster.namespace, JOB, rank, 2, 1
            )
            for rank in range(2)
        ]
    )
    assert _stores_count(sim_cluster.namespace, "direct_writes") == written
    results = restore_all(sim_cluster, world_size=2)
    assert [(r["step"], r["digest"]) for r in results] == [(1, digest(make_state(r, 1))) for r in range(2)]


@pytest.mark.nodes(6)
def test_killed_registry_restarts_with_the_same_view(sim_cluster: SimCluster) -> None:
    """The registry actor killed (and restarted by Ray) rebuilds its view from the stores:
    same committed steps, same locations, and restores still work."""
    save_all(sim_cluster, [0, 1, 2], world_size=2)
    registry = naming.registry_handle(sim_cluster.namespace)
    before = ray.get(registry.jobs.remote())
    located_before = ray.get(registry.locate.remote(JOB, 2))
    pid_of = lambda _actor: __import__("os").getpid()  # noqa: E731 (a lambda ships by value)
    old_pid = ray.get(registry.__ray_call__.remote(pid_of))
    ray.kill(registry, no_restart=False)
    # ray.kill is asynchronous: wait until a new registry process answers, not the dying one.
    for _ in range(100):
        try:
            if (
                ray.get(
                    naming.registry_handle(sim_cluster.namespace).__ray_call__.remote(pid_of), timeout=pace.bound(5)
                )
                != old_pid
            ):
                break
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
        time.sleep(0.1)
    else:
        pytest.fail("the killed registry was not restarted")
    registry = naming.registry_handle(sim_cluster.namespace)
    assert ray.get(registry.jobs.remote()) == before
    assert ray.get(registry.locate.remote(JOB, 2)) == located_before
    results = restore_all(sim_cluster, world_size=2)
    assert [r["digest"] for r in results] == [digest(make_state(r, 2)) for r in range(2)]


@pytest.mark.nodes(6)
def test_a_put_over_budget_fails_cleanly_and_the_store_keeps_serving(sim_cluster: SimCluster) -> None:
    """A save whose shards exceed a store's budget surfaces StoreFullError (naming the budget
    and how to raise it); the committed step stays restorable and the store keeps serving."""
    save_all(sim_cluster, [0], world_size=1)
    for handle in naming.store_handles(sim_cluster.namespace).values():
        ray.get(handle.set_budget.remote(60_000))  # holds step 0's shard, not another
    with pytest.raises(StoreFullError, match="budget"):
        save_all(sim_cluster, [1], world_size=1)
    result = ray.get(restore_rank.remote(sim_cluster.namespace, JOB, 0, 1, CODE))
    assert result["step"] == 0 and result["digest"] == digest(make_state(0, 0))


@pytest.mark.nodes(6)
def test_under_memory_pressure_saves_evict_only_superseded_steps_or_fail_cleanly(sim_cluster: SimCluster) -> None:
    """Stores with room for two steps of a rank: a run of saves goes on by evicting superseded
    steps only, never past any budget. With the node-memory ceiling reached, a save that needs
    new memory fails with StoreFullError naming the ceiling, and the committed step stays
    restorable bit-exact."""
    config = {**CODE, "keep_committed": 1}
    save_all(sim_cluster, [0], world_size=1, config=config)
    stores = naming.store_handles(sim_cluster.namespace)
    per_step = max(ray.get(h.stats.remote())["used_bytes"] for h in stores.values())
    for handle in stores.values():
        ray.get(handle.set_budget.remote(2 * per_step))
    for step in range(1, 6):
        save_all(sim_cluster, [step], world_size=1, config=config)
        for node in service.status(namespace=sim_cluster.namespace)["nodes"].values():
            assert node["used_bytes"] <= node["budget_bytes"]
    registry = naming.registry_handle(sim_cluster.namespace)
    assert ray.get(registry.committed_steps.remote(JOB)) == [5]
    for handle in stores.values():
        ray.get(handle.set_budget.remote(1 << 30))
        ray.get(handle.set_memory_ceiling.remote(0.001))  # the node is "full"
    with pytest.raises(StoreFullError, match="ceiling"):
        save_all(sim_cluster, [6], world_size=1, config=config, size=80_000)
    result = ray.get(restore_rank.remote(sim_cluster.namespace, JOB, 0, 1, config))
    assert result["step"] == 5 and result["digest"] == digest(make_state(0, 5))


@pytest.mark.nodes(6)
def test_peer_memory_per_step_is_k_plus_m_over_k_plus_under_one_percent(sim_cluster: SimCluster) -> None:
    """status(): bytes held for one committed step are (k+m)/k of the payload, with < 1%
    metadata and padding on top."""
    size = 1_000_000  # float32 elements: 4 MB of tensors per rank
    save_all(sim_cluster, [0], world_size=2, config={**CODE, "keep_committed": 1}, size=size)
    status = service.status(namespace=sim_cluster.namespace)
    tensor_bytes = sum(sum(t.numel() * t.element_size() for t in _tensors(make_state(r, 0, size))) for r in range(2))
    used = sum(node["used_bytes"] for node in status["nodes"].values())
    ratio = used / tensor_bytes
    assert 1.5 <= ratio < 1.5 * 1.01, ratio
    assert status["jobs"][JOB]["protection"] == 2


def _tensors(state: object) -> list:
    import torch

    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for v in state.values() for t in _tensors(v)]
    return []


@pytest.mark.nodes(6)
def test_checkpointer_rejects_bad_input_at_the_call_and_loses_nothing(sim_cluster: SimCluster) -> None:
    """Wrong rank/world size, bad steps and unsupported leaves fail at the call with clear
    errors; the committed step stays the latest and restores bit-exact."""
    with pytest.raises(ray_ckpt.ConfigError, match="rank"):
        Checkpointer(job=JOB, rank=4, world_size=4, namespace=sim_cluster.namespace)
    config = ray_ckpt.CheckpointConfig(**CODE)
    checkpointer = Checkpointer(job=JOB, rank=0, world_size=1, config=config, namespace=sim_cluster.namespace)
    with pytest.raises(ray_ckpt.UnsupportedLeafError, match="opt"):
        checkpointer.save(0, {"opt": {1, 2}})
    assert checkpointer.latest_step() is None
    checkpointer.save(3, make_state(0, 3)).wait(timeout_s=pace.bound(60))
    for step, words in [(-1, "step must be"), ("4", "step must be"), (True, "step must be"), (3, "not newer")]:
        with pytest.raises(ray_ckpt.ConfigError, match=words):
            checkpointer.save(step, make_state(0, 9))
    with pytest.raises(ray_ckpt.UnsupportedLeafError, match=r"state\['w'\]\[1\]"):
        checkpointer.save(4, {"w": [1, object()]})
    checkpointer.close()
    assert ray.get(naming.registry_handle(sim_cluster.namespace).committed_steps.remote(JOB)) == [3]
    result = ray.get(restore_rank.remote(sim_cluster.namespace, JOB, 0, 1, CODE))
    assert result["step"] == 3 and result["digest"] == digest(make_state(0, 3))


@ray.remote(num_cpus=1, max_retries=0)
def _save_step(namespace: str, rank: int, world_size: int, step: int, config: dict) -> None:
    """Save make_state(rank, step) as one rank of the worker group "group-1"."""
    with rank_checkpointer(namespace, JOB, rank, world_size, config, "group-1") as checkpointer:
        checkpointer.save(step, make_state(rank, step)).wait(timeout_s=60)


def _steps_held(namespace: str) -> dict[str, set[int]]:
    """node id -> the steps of JOB its store holds shards of."""
    handles = naming.store_handles(namespace)
    holdings = ray.get([h.holdings.remote() for h in handles.values()], timeout=pace.bound(30))
    return {node: {m["step"] for m in held["metas"] if m["job"] == JOB} for node, held in zip(handles, holdings)}


@pytest.mark.nodes(6)
def test_a_commit_announced_to_a_dead_store_still_evicts_at_the_stores_of_nodes_without_ranks(
    sim_cluster: SimCluster,
) -> None:
    """The first store of the registry's list killed between a commit and its announcement (the
    registry's list of stores, cached for up to a second, still names it; here it is held so):
    the announcement passes the dead store over, and the stores of nodes without a rank, which
    learn evictions from commits alone, drop the superseded step's shards and hear the commit."""
    namespace = sim_cluster.namespace
    config = {**CODE, "keep_committed": 1}
    stores = sorted(naming.store_node_ids(namespace))
    first = stores[0]
    rank_nodes = [node for node in (sim_cluster.node_id(i) for i in range(len(sim_cluster.workers))) if node != first]
    rank_nodes = rank_nodes[:2]

    def save(step: int) -> None:
        ray.get(
            [
                _save_step.options(scheduling_strategy=on_node(node)).remote(namespace, rank, 2, step, config)
                for rank, node in enumerate(rank_nodes)
            ]
        )

    def hold_store_list(registry: Any) -> list[str]:  # runs in the registry: its list, looked up now and kept
        registry._handles_at = float("-inf")
        listed = sorted(registry._store_handles())
        registry._handles_at = float("inf")
        return listed

    save(0)
    without_ranks = {node for node, steps in _steps_held(namespace).items() if 0 in steps} - {first, *rank_nodes}
    assert without_ranks  # step 0's shards sit on stores of nodes that run no rank
    registry = naming.registry_handle(namespace)
    assert ray.get(registry.__ray_call__.remote(hold_store_list)) == stores
    doomed = naming.store_handles(namespace, [first])[first]
    ray.kill(doomed, no_restart=True)
    wait_until_dead(doomed.ready.remote, "the killed store")
    save(1)  # commits step 1, announced to the dead store first
    deadline = time.monotonic() + pace.bound(20)
    while any(0 in _steps_held(namespace).get(node, set()) for node in without_ranks):
        if time.monotonic() > deadline:
            pytest.fail(f"stores of nodes without ranks still hold step 0: {_steps_held(namespace)}")
        time.sleep(0.2)
    handles = naming.store_handles(namespace, sorted(without_ranks))
    marks = [held["committed"].get(JOB) for held in ray.get([h.holdings.remote() for h in handles.values()])]
    assert marks == [1] * len(without_ranks)


@ray.remote(num_cpus=0, max_concurrency=8)
class _NamedCoordinator:
    """A coordinator that answers each beat entry with its own name and records its calls; its
    first call takes ``first_call_s``, so the calls after it queue in the store."""

    def __init__(self, name: str, first_call_s: float) -> None:
        self.name, self.first_call_s, self.calls = name, first_call_s, []

    def beat_many(self, entries: list[Any]) -> list[str]:
        self.calls.append(list(entries))
        if len(self.calls) == 1:
            time.sleep(self.first_call_s)
        return [f"{self.name}:{entry}" for entry in entries]

    def recorded(self) -> list[list[Any]]:
        return self.calls


@pytest.mark.nodes(6)
def test_a_store_never_sends_one_coordinators_calls_to_another(sim_cluster: SimCluster) -> None:
    """Calls of one run id through one store, naming two coordinators (a probe's beside the
    run's), while a call of the first is in flight: each entry reaches the coordinator its
    caller named, each caller gets that coordinator's answers, and the calls of one
    coordinator still merge (copies of its handle name one actor)."""
    store = next(iter(naming.store_handles(sim_cluster.namespace).values()))
    run_s, probe = _NamedCoordinator.remote("run", pace.bound(2.0)), _NamedCoordinator.remote("probe", 0.0)
    first = store.coordinate.remote("r", run_s, "beat", [], ["e0"])
    deadline = time.monotonic() + pace.bound(30)
    while not ray.get(run_s.recorded.remote()):  # until the first call is at the run's coordinator
        if time.monotonic() > deadline:
            raise AssertionError("the first call never reached the run's coordinator")
        time.sleep(0.02)
    queued = {
        entry: store.coordinate.remote("r", coordinator, "beat", [], [entry])
        for entry, coordinator in [("e1", run_s), ("p1", probe), ("e2", run_s), ("p2", probe)]
    }
    assert ray.get(first, timeout=pace.bound(30)) == ["run:e0"]
    answers = {entry: ray.get(ref, timeout=pace.bound(30)) for entry, ref in queued.items()}
    assert answers == {e: [f"{'run' if e[0] == 'e' else 'probe'}:{e}"] for e in queued}
    run_calls = ray.get(run_s.recorded.remote())
    assert run_calls[0] == ["e0"] and sorted(e for call in run_calls[1:] for e in call) == ["e1", "e2"]
    assert len(run_calls) == 2, run_calls  # e1 and e2 queued behind e0 and went up as one
    assert sorted(e for call in ray.get(probe.recorded.remote()) for e in call) == ["p1", "p2"]
