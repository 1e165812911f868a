"""The cluster tests' simulated cluster (``ray_ckpt.testing.SimulatedCluster`` plus the lookup
of shard holders that picks victims) and the pool that hands one module's cluster to its tests
in turn (the ``sim_cluster`` fixture, tests/cluster/conftest.py)."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from typing import Any

import ray

from ray_ckpt import service
from ray_ckpt.testing import SimulatedCluster
from ray_ckpt.transport import naming
from support import pace


class SimCluster(SimulatedCluster):
    """The harness's cluster, plus the shard-holder lookup the tests pick victims with."""

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


def _ray_ckpt_env() -> dict[str, str]:
    """The RAY_CKPT_* settings in this process's environment: a node started now passes them
    to every process it starts (the service's actors, the ranks' workers)."""
    return {key: value for key, value in os.environ.items() if key.startswith("RAY_CKPT_")}


class ClusterPool:
    """A simulated cluster, handed to tests in turn (the modules' that use ``sim_cluster``).

    Starting a cluster of N nodes costs about 20 s here, most of a cluster test. Each test gets
    the same Ray nodes with a clean slate: the previous test's ray_ckpt service (registry and
    stores, with their checkpoints) is killed, its driver disconnected (which ends its tasks and
    actors), the live workers topped up or cut down to the count the test asks for, and a new
    namespace with a new service. A test that failed takes the cluster with it, so the next
    test starts on a fresh one; so does a test whose RAY_CKPT_* settings differ from those the
    cluster was started with (its nodes hand those to every process they start). Each cluster
    gets a Ray temp dir of its own."""

    def __init__(self) -> None:
        self.cluster: SimCluster | None = None
        self._env: dict[str, str] = {}
        self.tmpdir = ""  # the cluster's Ray temp dir

    def take(self, count: int, namespace: str | None = None) -> SimCluster:
        """The cluster with ``count`` live workers and a fresh service in a new namespace
        (``namespace``: in that one, which no other test's service may still hold)."""
        namespace = namespace or f"test-{uuid.uuid4().hex[:8]}"
        if self.cluster is not None and self._env != _ray_ckpt_env():
            self.close()
        if self.cluster is not None:
            try:
                return self._reuse(self.cluster, count, namespace)
            except Exception:
                self.close()
        previous = os.environ.get("RAY_TMPDIR")
        self.tmpdir = os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rck")
        try:
            self.cluster = SimCluster(count, namespace=namespace, **CLUSTER_ARGS)
        finally:
            if previous is None:
                os.environ.pop("RAY_TMPDIR", None)
            else:
                os.environ["RAY_TMPDIR"] = previous
        self._env = _ray_ckpt_env()
        return self.cluster

    def _reuse(self, cluster: SimCluster, count: int, namespace: str) -> SimCluster:
        ray.init(address=cluster.address, namespace=namespace, log_to_driver=False)
        alive = naming.alive_node_ids()
        for node in list(cluster.cluster.worker_nodes):  # killed behind the Cluster's back (chaos)
            if str(node.node_id) not in alive:
                cluster.cluster.remove_node(node, allow_graceful=False)
        cluster.workers = [node for node in cluster.workers if str(node.node_id) in alive]
        for node in cluster.workers[count:]:  # a hard kill: Ray declares it dead within seconds
            cluster.cluster.remove_node(node, allow_graceful=False)
            cluster.workers.remove(node)
        if len(cluster.workers) < count:
            cluster.add_workers(count - len(cluster.workers))
        wait_alive(count + 1)
        wait_namespace_free(namespace)
        cluster.namespace = namespace
        cluster.start_service(CLUSTER_ARGS["store_budget_bytes"])
        return cluster

    def give_back(self, failed: bool) -> None:
        """End the test's use: drop its service and driver; on failure, the whole cluster."""
        if self.cluster is None:
            return
        if failed or not ray.is_initialized():
            self.close()
            return
        try:
            service.shutdown(namespace=self.cluster.namespace)
        finally:
            ray.shutdown()

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None


CLUSTER_ARGS: dict[str, Any] = {
    "store_budget_bytes": 256 << 20,
    "head_object_store_bytes": 200 << 20,
    "worker_object_store_bytes": 150 << 20,
}


def wait_namespace_free(namespace: str, timeout_s: float = pace.bound(30.0)) -> None:
    """Wait until no named actor is left in ``namespace`` (the service a test before shut down
    there, whose names Ray frees once their actors are dead): a service started there must be
    new, not a dying one handed back by name."""
    deadline = time.monotonic() + timeout_s
    while any(a["namespace"] == namespace for a in ray.util.list_named_actors(all_namespaces=True)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"named actors stayed in namespace {namespace!r} for {timeout_s:.0f} s")
        time.sleep(0.1)


def wait_alive(nodes: int, timeout_s: float = pace.bound(60.0)) -> None:
    """Wait until Ray counts exactly ``nodes`` alive nodes (removed ones declared dead)."""
    deadline = time.monotonic() + timeout_s
    while len(naming.alive_nodes()) != nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray did not settle on {nodes} alive nodes within {timeout_s} s")
        time.sleep(0.2)
