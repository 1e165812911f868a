"""Simulated multi-node clusters (ray.cluster_utils.Cluster) with fast failure detection."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import ray
import sim
from ray.cluster_utils import Cluster

import ray_ckpt
from ray_ckpt import naming

# Ranks run as Ray tasks defined in sim.py; workers cannot import the tests folder.
ray.cloudpickle.register_pickle_by_value(sim)

FAST_FAILURE_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 300,
    "health_check_timeout_ms": 600,
    "health_check_failure_threshold": 3,
}


@dataclass
class SimCluster:
    cluster: Cluster
    workers: list[Any]  # ray.cluster_utils node handles, one CPU each
    namespace: str

    def worker_holders(self, shards: dict[int, str], count: int, indices: list[int] | None = None) -> list[str]:
        """``count`` distinct worker nodes holding the given shard indices (default: any), in
        index order (data shards first); the head node is never a victim."""
        workers = {str(n.node_id) for n in self.workers}
        chosen: list[str] = []
        for index in indices if indices is not None else sorted(shards):
            node_id = shards[index]
            if node_id in workers and node_id not in chosen:
                chosen.append(node_id)
        if len(chosen) < count:
            raise ValueError(f"fewer than {count} worker nodes hold shards {indices}: {shards}")
        return chosen[:count]

    def node_id(self, index: int) -> str:
        return str(self.workers[index].node_id)

    def kill(self, node_ids: list[str]) -> None:
        """Hard-kill the given nodes at once and wait until Ray declares them dead."""
        doomed = [n for n in self.workers if n.node_id in node_ids]
        if len(doomed) != len(set(node_ids)):
            raise ValueError(f"only worker nodes can be killed; {node_ids} includes another node")
        for node in doomed:
            self.cluster.remove_node(node, allow_graceful=False)
            self.workers.remove(node)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            alive = {str(n["NodeID"]) for n in naming.alive_nodes()}
            if not alive & set(node_ids):
                return
            time.sleep(0.2)
        raise TimeoutError(f"nodes {node_ids} were not declared dead")


@pytest.fixture
def sim_cluster(ray_tmpdir: str, request: pytest.FixtureRequest) -> Iterator[SimCluster]:
    """A head with no CPUs plus N one-CPU workers (N from @pytest.mark.nodes(N), default 7),
    the ray_ckpt service started on all of them with a 256 MiB budget per store."""
    marker = request.node.get_closest_marker("nodes")
    count = marker.args[0] if marker else 7
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "_system_config": FAST_FAILURE_DETECTION,
            "object_store_memory": 200 << 20,
        },
    )
    workers = [cluster.add_node(num_cpus=1, object_store_memory=150 << 20) for _ in range(count)]
    cluster.wait_for_nodes()
    namespace = f"test-{uuid.uuid4().hex[:8]}"
    ray.init(address=cluster.address, namespace=namespace, log_to_driver=False)
    ray_ckpt.service.start(store_budget_bytes=256 << 20, namespace=namespace)
    try:
        yield SimCluster(cluster, workers, namespace)
    finally:
        ray.shutdown()
        cluster.shutdown()
