"""Simulated multi-node clusters for the cluster tests: ``ray_ckpt.testing.SimulatedCluster``."""

from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import tempfile
import time
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pace
import psutil
import pytest
import ray
import scripts_under_test
import sim

from ray_ckpt import _ray_compat, service
from ray_ckpt.testing import SimulatedCluster
from ray_ckpt.train import inplace
from ray_ckpt.transport import naming

# Ranks run as Ray tasks defined in sim.py; workers cannot import the tests folder.
ray.cloudpickle.register_pickle_by_value(sim)


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


class ClusterPool:
    """One module's simulated cluster, handed to its tests in turn.

    Starting a cluster of N nodes costs about 20 s here, most of a cluster test. Each test gets
    the same Ray nodes with a clean slate: the previous test's ray_ckpt service (registry and
    stores, with their checkpoints) is killed, its driver disconnected (which ends its tasks and
    actors), the live workers topped up or cut down to the count the test asks for, and a new
    namespace with a new service. A test that failed takes the cluster with it, so the next
    test starts on a fresh one."""

    def __init__(self) -> None:
        self.cluster: SimCluster | None = None

    def take(self, count: int) -> SimCluster:
        """The cluster with ``count`` live workers and a fresh service in a new namespace."""
        namespace = f"test-{uuid.uuid4().hex[:8]}"
        if self.cluster is not None:
            try:
                return self._reuse(self.cluster, count, namespace)
            except Exception:
                self.close()
        self.cluster = SimCluster(count, namespace=namespace, **CLUSTER_ARGS)
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
        _wait_alive(count + 1)
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


def _wait_alive(nodes: int, timeout_s: float = pace.bound(60.0)) -> None:
    """Wait until Ray counts exactly ``nodes`` alive nodes (removed ones declared dead)."""
    deadline = time.monotonic() + timeout_s
    while len(naming.alive_nodes()) != nodes:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ray did not settle on {nodes} alive nodes within {timeout_s} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster_pool() -> Iterator[ClusterPool]:
    """The module's shared cluster (own RAY_TMPDIR), stopped after its last test."""
    pool = ClusterPool()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", tempfile.mkdtemp(prefix="rck"))
        try:
            yield pool
        finally:
            pool.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the test (``rep_setup``, ``rep_call``) for its fixtures; a
    failed test's report gets what its cluster's recovery logged (``ray_log_excerpt``)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    if report.when == "call" and report.failed:
        excerpt = ray_log_excerpt(pathlib.Path(os.environ.get("RAY_TMPDIR", "")))
        if excerpt:
            report.sections.append(("what Ray Train and ray_ckpt logged", excerpt))
    return report


_RECOVERY_LINE = re.compile(
    r"^rank \d+: |InPlaceRecoveryError|Replacing failing|replica groups|restarting the worker group|Error:"
)


def ray_log_excerpt(ray_tmpdir: pathlib.Path, limit: int = 60) -> str:
    """The last session's lines about failures and recoveries from the workers and the
    controller (every actor's stderr, then Ray Train's controller log), at most the last
    ``limit``: what a failed recovery test needs to tell why it fell back or failed, in the
    report CI keeps."""
    logs = ray_tmpdir / "ray" / "session_latest" / "logs"
    lines = [
        f"{path.name[-9:-4]}: {line[:300]}"
        for path in sorted(logs.glob("worker-*.err"))
        for line in path.read_text(errors="replace").splitlines()
        if _RECOVERY_LINE.search(line)
    ]
    for path in sorted(logs.glob("train/ray-train-app-controller-*.log")):  # JSON lines
        for raw in path.read_text(errors="replace").splitlines():
            try:
                message = str(json.loads(raw).get("message", ""))
            except (ValueError, AttributeError):
                continue
            if _RECOVERY_LINE.search(message) or message.startswith("[FailurePolicy]"):
                lines.append(f"controller: {' | '.join(message.splitlines()[:6])[:400]}")
    return "\n".join(lines[-limit:])


@pytest.fixture
def sim_cluster(cluster_pool: ClusterPool, request: pytest.FixtureRequest) -> Iterator[SimCluster]:
    """A head with no CPUs plus N one-CPU workers (N from @pytest.mark.nodes(N), default 7),
    the ray_ckpt service started on all of them with a 256 MiB budget per store, in a namespace
    of this test's own. The nodes are the module's (see ClusterPool)."""
    marker = request.node.get_closest_marker("nodes")
    cluster = cluster_pool.take(marker.args[0] if marker else 7)
    try:
        yield cluster
    finally:
        failed = any(getattr(getattr(request.node, f"rep_{when}", None), "failed", False) for when in ("setup", "call"))
        cluster_pool.give_back(failed)


def idle_warm_spares(since: float) -> collections.Counter[str]:
    """How many processes started after ``since`` with in-place recovery's warm-up hook sit idle
    and warm on each node: Ray titles an idle worker ``ray::IDLE`` as soon as it connects,
    before the hook's imports, so a process counts once its CPU time stands still for half a
    second (its parent is its node's raylet)."""
    sockets = {str(n["RayletSocketName"]): str(n["NodeID"]) for n in ray.nodes() if n.get("Alive")}
    idle: dict[psutil.Process, tuple[str, float]] = {}
    for process in psutil.process_iter():
        try:
            if process.environ().get(_ray_compat.SETUP_HOOK_ENV_VAR) != inplace.WARM_HOOK:
                continue
            parent = process.parent()
            if process.cmdline()[:1] != ["ray::IDLE"] or parent is None or process.create_time() < since:
                continue
            raylet = next(a.split("=", 1)[1] for a in parent.cmdline() if a.startswith("--raylet_socket_name="))
            if raylet in sockets:
                idle[process] = (sockets[raylet], sum(process.cpu_times()[:2]))
        except (psutil.Error, OSError, StopIteration):
            continue
    time.sleep(0.5)
    nodes: collections.Counter[str] = collections.Counter()
    for process, (node, cpu_s) in idle.items():
        try:
            if sum(process.cpu_times()[:2]) - cpu_s < 0.02:
                nodes[node] += 1
        except psutil.Error:
            continue
    return nodes


@pytest.fixture
def train_example(train_example_module: ModuleType) -> Iterator[ModuleType]:
    """scripts/train_example.py as a module, with its ``ABANDONED`` event clear for this test
    (a test that set it at its end must not stop the next test's fault threads) and set after."""
    train_example_module.ABANDONED.clear()
    yield train_example_module
    train_example_module.ABANDONED.set()


def load_script(name: str) -> Any:
    """scripts/<name>.py as a module, pickled by value (workers cannot import scripts/)."""
    return scripts_under_test.load_script(name, by_value=True)


@pytest.fixture(scope="session")
def train_example_module() -> ModuleType:
    """scripts/train_example.py as a module (``load_script``)."""
    loaded: ModuleType = load_script("train_example")
    return loaded
