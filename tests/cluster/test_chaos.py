"""The failure simulator (ray_ckpt.tools.chaos, ``ray-ckpt kill-node``) on simulated clusters."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import time

import pytest
import ray
from support import pace
from support.cluster_ranks import on_node, save_steps
from support.sim_cluster import SimCluster

from ray_ckpt.errors import ConfigError
from ray_ckpt.tools import chaos
from ray_ckpt.tools.cli import main
from ray_ckpt.transport import naming

pytestmark = pytest.mark.cluster

CODE = {"data_shards": 2, "parity_shards": 1}
JOB = "chaos-job"
SCRIPT = pathlib.Path(__file__).parents[2] / "scripts" / "kill_nodes.py"


def alive() -> set[str]:
    return naming.alive_node_ids()


def kill_events(sim: SimCluster) -> list[dict]:
    """The registry's kill and node_dead events, in the order it recorded them."""
    _, records = ray.get(naming.registry_handle(sim.namespace).events.remote(0))
    return [e for e in records if e["kind"] in ("kill", "node_dead")]


def raylet_exit_code(sim: SimCluster, node_id: str) -> int | None:
    """The exit status of a simulated node's raylet process (None while it runs)."""
    node = next(n for n in sim.workers if str(n.node_id) == node_id)
    return node.all_processes["raylet"][0].process.poll()


def store_gone(sim: SimCluster, node_id: str, timeout_s: float = pace.bound(10.0)) -> bool:
    deadline = time.monotonic() + timeout_s
    while naming.store_handles(sim.namespace, [node_id]):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def spare_workers(sim: SimCluster) -> list[str]:
    """The worker nodes that do not host the registry. The registry is pinned to the head only
    softly and lands on a worker now and then; killing that node restarts it with an empty
    event log, which these tests read."""
    registry = naming.registry_handle(sim.namespace)
    home = ray.get(registry.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))
    return [str(n.node_id) for n in sim.workers if str(n.node_id) != home]


@ray.remote(num_cpus=0)
def where() -> str:
    return ray.get_runtime_context().get_node_id()


@pytest.mark.nodes(2)
def test_kill_node_crashes_the_node_and_records_kill_then_node_dead(sim_cluster: SimCluster) -> None:
    """The raylet dies of SIGKILL, Ray declares the node dead, its store is gone with it, and
    the registry holds ``kill`` then ``node_dead`` with the returned times."""
    victim = spare_workers(sim_cluster)[0]
    (survivor,) = {sim_cluster.node_id(0), sim_cluster.node_id(1)} - {victim}
    result = chaos.kill_node(victim, namespace=sim_cluster.namespace)
    assert result.node_id == victim and result.mode == "node" and result.recorded
    assert result.kill_time < result.dead_time < result.kill_time + 30
    assert victim not in alive() and survivor in alive()
    assert raylet_exit_code(sim_cluster, victim) == -signal.SIGKILL
    assert store_gone(sim_cluster, victim)
    assert survivor in naming.store_handles(sim_cluster.namespace)
    assert kill_events(sim_cluster) == [
        {"kind": "kill", "time": result.kill_time, "node_id": victim, "mode": "node", "by": chaos.DEFAULT_BY},
        {"kind": "node_dead", "time": result.dead_time, "node_id": victim},
    ]


@pytest.mark.nodes(3)
def test_kill_nodes_kills_two_nodes_at_the_same_moment(sim_cluster: SimCluster) -> None:
    victims = spare_workers(sim_cluster)[:2]
    (survivor,) = {sim_cluster.node_id(i) for i in range(3)} - set(victims)
    results = chaos.kill_nodes(victims, namespace=sim_cluster.namespace)
    assert [r.node_id for r in results] == victims
    kill_times = [r.kill_time for r in results]
    assert max(kill_times) - min(kill_times) < 1.0
    assert not alive() & set(victims) and survivor in alive()
    assert all(raylet_exit_code(sim_cluster, v) == -signal.SIGKILL for v in victims)
    kinds = [(e["kind"], e["node_id"]) for e in kill_events(sim_cluster)]
    assert sorted(kinds[:2]) == sorted(("kill", v) for v in victims)
    assert sorted(kinds[2:]) == sorted(("node_dead", v) for v in victims)


@pytest.mark.nodes(1)
def test_kill_store_only_leaves_the_node_alive_without_its_store(
    sim_cluster: SimCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the CLI (a node id prefix, --store-only): the store dies, the node keeps running
    tasks, and only a ``kill`` event with mode ``store`` is recorded."""
    victim = sim_cluster.node_id(0)
    assert main(["kill-node", "--node", victim[:10], "--store-only", "--namespace", sim_cluster.namespace]) == 0
    out = capsys.readouterr().out
    assert f"killed the ray_ckpt store of node {victim[:12]}" in out
    assert "store is gone" in out
    assert store_gone(sim_cluster, victim, timeout_s=0)
    assert naming.head_node_id() in naming.store_handles(sim_cluster.namespace)
    time.sleep(2)  # longer than the fixture's node failure detection
    assert victim in alive()
    assert raylet_exit_code(sim_cluster, victim) is None
    assert ray.get(where.options(scheduling_strategy=on_node(victim)).remote(), timeout=pace.bound(60)) == victim
    events = kill_events(sim_cluster)
    assert [(e["kind"], e["node_id"], e["mode"]) for e in events] == [("kill", victim, "store")]


@pytest.mark.nodes(3)
def test_kill_loop_kills_distinct_random_nodes_one_after_another(sim_cluster: SimCluster) -> None:
    workers = {sim_cluster.node_id(i) for i in range(3)}
    spared = workers - set(spare_workers(sim_cluster))
    results = chaos.kill_loop(0.3, 2, seed=7, namespace=sim_cluster.namespace, exclude=spared)
    victims = [r.node_id for r in results]
    assert len(set(victims)) == 2 and set(victims) <= workers
    assert results[0].kill_time < results[1].kill_time
    assert all(r.dead_time is not None for r in results)
    assert alive() & workers == workers - set(victims)
    events = kill_events(sim_cluster)
    assert sorted((e["kind"], e["node_id"]) for e in events) == sorted(
        [("kill", v) for v in victims] + [("node_dead", v) for v in victims]
    )
    assert [e["node_id"] for e in events if e["kind"] == "kill"] == victims


@pytest.mark.nodes(3)
def test_kill_during_save_kills_a_shard_holder_of_a_partially_staged_step(sim_cluster: SimCluster) -> None:
    """Two ranks commit step 0; then rank 0 alone saves step 1 (rank 1 never does): the kill
    lands while step 1 is staged by rank 0 only, on a node holding its shards (rank 0's three
    shards avoid its own node, so they are on the head and both other workers); step 0 stays
    the latest committed step."""
    ns, saver = sim_cluster.namespace, sim_cluster.node_id(0)
    ray.get(
        [
            save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(r))).remote(
                ns, JOB, r, 2, [0], CODE, 20_000
            )
            for r in range(2)
        ]
    )
    partial = save_steps.options(scheduling_strategy=on_node(saver)).remote(ns, JOB, 0, 2, [1], CODE, 20_000)
    spared = {saver} | ({sim_cluster.node_id(i) for i in range(3)} - set(spare_workers(sim_cluster)))
    result = chaos.kill_during_save(JOB, namespace=ns, min_step=1, exclude=spared, seed=3, timeout_s=pace.bound(120))
    assert (result.details["step"], result.details["staged_ranks"], result.details["world_size"]) == (1, [0], 2)
    assert result.details["shards_on_victim"] >= 1
    assert result.node_id not in (saver, naming.head_node_id())
    assert result.node_id not in alive()
    assert ray.get(partial, timeout=pace.bound(60)) == saver
    registry = naming.registry_handle(ns)
    assert ray.get(registry.latest_committed.remote(JOB)) == 0
    assert ray.get(registry.staged_ranks.remote(JOB, 1)) == [0]
    assert [e["kind"] for e in kill_events(sim_cluster)] == ["kill", "node_dead"]


@pytest.mark.nodes(1)
def test_the_head_node_and_the_own_node_are_refused_and_never_picked(
    sim_cluster: SimCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    head = naming.head_node_id()
    assert head is not None
    with pytest.raises(ConfigError, match="head node"):
        chaos.kill_node(head, namespace=sim_cluster.namespace)
    # the driver reaches Ray through the head's raylet: even allowed, that kill is refused
    with pytest.raises(ConfigError, match="connected to Ray through"):
        chaos.kill_node(head, namespace=sim_cluster.namespace, allow_head=True)
    assert main(["kill-node", "--node", head[:12], "--namespace", sim_cluster.namespace]) == 1
    assert "is the head node" in capsys.readouterr().err
    assert chaos.pick_nodes(1, seed=0) == [sim_cluster.node_id(0)]
    with pytest.raises(ConfigError, match="only 1 alive node"):
        chaos.pick_nodes(2)
    assert head in alive() and kill_events(sim_cluster) == []


def test_kill_nodes_script_runs_and_rejects_misplaced_options() -> None:
    script = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=pace.bound(60)
    )
    assert script.returncode == 0 and "--during-save JOB" in script.stdout
    with pytest.raises(SystemExit) as exit_info:
        main(["kill-node", "--random", "--node", "abc"])
    assert exit_info.value.code == 2
