"""A node kill by a NodeCrasher actor on the victim: the path a kill from another host takes on a
real cluster (on a simulated cluster, ``ray_ckpt.tools.chaos`` kills from the calling process)."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from support.sim_cluster import SimCluster

from ray_ckpt.tools import chaos, faults
from ray_ckpt.tools.faults import NodeCrash
from ray_ckpt.transport import naming

pytestmark = pytest.mark.cluster


@pytest.mark.nodes(1)
def test_kill_node_through_a_crasher_actor(sim_cluster: SimCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    def not_from_here(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("local=False must leave the kill to the crasher on the victim")

    monkeypatch.setattr(faults, "kill_tree", not_from_here)
    victim = sim_cluster.node_id(0)
    result = chaos.kill_node(victim, namespace=sim_cluster.namespace, local=False, wait_dead_s=30)
    assert result.node_id == victim and result.dead_time is not None
    assert victim not in naming.alive_node_ids()
    raylet = sim_cluster.workers[0].all_processes["raylet"][0].process
    assert raylet.wait(timeout=10) == -signal.SIGKILL


@pytest.mark.nodes(1)
def test_a_local_victim_needs_no_crasher(sim_cluster: SimCluster) -> None:
    victim = sim_cluster.node_id(0)
    armed = NodeCrash().arm([victim], namespace=sim_cluster.namespace)
    assert armed[victim].handle is None and armed[victim].raylet is not None
    assert sim_cluster.workers[0].all_processes["raylet"][0].process.pid == armed[victim].raylet.pid
