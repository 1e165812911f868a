"""Simulated multi-node clusters for the cluster tests: ``ray_ckpt.testing.SimulatedCluster``."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import ray
import sim

from ray_ckpt.testing import SimulatedCluster

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


@pytest.fixture
def sim_cluster(ray_tmpdir: str, request: pytest.FixtureRequest) -> Iterator[SimCluster]:
    """A head with no CPUs plus N one-CPU workers (N from @pytest.mark.nodes(N), default 7),
    the ray_ckpt service started on all of them with a 256 MiB budget per store."""
    marker = request.node.get_closest_marker("nodes")
    count = marker.args[0] if marker else 7
    with SimCluster(
        count,
        store_budget_bytes=256 << 20,
        namespace=f"test-{uuid.uuid4().hex[:8]}",
        head_object_store_bytes=200 << 20,
        worker_object_store_bytes=150 << 20,
    ) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def train_example() -> ModuleType:
    """scripts/train_example.py as a module, pickled by value (workers cannot import scripts/)."""
    path = pathlib.Path(__file__).parents[2] / "scripts" / "train_example.py"
    spec = importlib.util.spec_from_file_location("train_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_example"] = module
    spec.loader.exec_module(module)
    ray.cloudpickle.register_pickle_by_value(module)
    loaded: Any = module
    return loaded
