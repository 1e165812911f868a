"""The DCP backend under Ray Train (scripts/dcp_example.py): an FSDP2 model and Adam saved by 4
workers with ``dcp.save`` into peer memory, RS(2, 2); two worker nodes holding data shards of
the step are hard-killed (m losses); 3 workers load it with ``dcp.load``, resharded by DCP's
planner (3 does not divide 4: every rank reads parts of other ranks' shards), each lost byte
decoded from parity, and every rank's state equals, bit for bit, what DCP's FileSystemReader
loads into the same sharding from a disk checkpoint of the same state. A load into 2 after a
node kill is scripts/bench_dcp.py's (its quick run is a test), and a save by 2 gloo ranks loaded
by 1 and by 3 without Ray Train is tests/unit/test_dcp_backend.py's."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType
from typing import Any

import pytest
import ray
from support.sim_cluster import SimCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def dcp_example() -> ModuleType:
    """scripts/dcp_example.py as a module, pickled by value (workers cannot import scripts/)."""
    path = pathlib.Path(__file__).parents[2] / "scripts" / "dcp_example.py"
    spec = importlib.util.spec_from_file_location("dcp_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["dcp_example"] = module
    spec.loader.exec_module(module)
    ray.cloudpickle.register_pickle_by_value(module)
    return module


@pytest.mark.timeout(600)
@pytest.mark.nodes(5)
def test_fsdp2_saved_by_4_loads_into_3_after_m_node_losses_equal_to_dcp_from_disk(
    train_cluster: SimCluster, dcp_example: Any
) -> None:
    report = dcp_example.run_example(nodes=5, save_workers=4, load_workers=(3,), kill=2, cluster=train_cluster)
    assert len(report["killed"]) == 2, report
    saves = [r for r in report["records"] if "saved_step" in r]
    loads = {(r["world"], r["rank"]): r for r in report["records"] if "equal" in r}
    assert sorted(r["rank"] for r in saves) == [0, 1, 2, 3]
    assert sorted(loads) == [(3, 0), (3, 1), (3, 2)]
    assert all(r["equal"] for r in loads.values()), [r["mismatched"] for r in loads.values()]
    assert all(r["read_bytes"] > 0 for r in loads.values())
    # the load after the kills is a recovery on the timeline (and so on the dashboard), each
    # rank's restore with its phases; nothing was trained after the saved step
    (recovery,) = report["recoveries"]
    assert not recovery["failed"] and recovery["mode"] == "restart", recovery
    assert recovery["step"] == saves[0]["saved_step"] and recovery["steps_lost"] == 0, recovery
    assert recovery["sources"] == {"0": "peers", "1": "peers", "2": "peers"}, recovery
    assert recovery["phases_s"]["fetch"] > 0 and recovery["bytes_moved"] >= sum(r["read_bytes"] for r in loads.values())
