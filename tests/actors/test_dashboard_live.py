"""The dashboard's live data from a real one-node Ray head: memory, shard placement, protection,
hosts and the registry's events (what `ray-ckpt dashboard --address ...` shows), and the status
snapshots the registry records at commits (what an events file alone shows)."""

from __future__ import annotations

import itertools
import json
import pathlib
import time
import uuid
from collections.abc import Iterator

import pytest
import ray
import torch
from support import pace

import ray_ckpt
from ray_ckpt import CheckpointConfig
from ray_ckpt.core import events
from ray_ckpt.dashboard import data as dashboard_data
from ray_ckpt.dashboard import server
from ray_ckpt.tools.cli import main
from ray_ckpt.transport import naming

BUDGET = 64 << 20


@pytest.fixture
def local_ray(ray_tmpdir: str) -> Iterator[str]:
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()


def test_live_data_and_export(local_ray: str, tmp_path: pathlib.Path) -> None:
    namespace = f"dash-{uuid.uuid4().hex[:8]}"
    dashboard = server.Dashboard(live=server.LiveCluster(namespace))
    before = dashboard.data()  # no service yet: empty, not an error
    assert before["live"] is True and before["memory"] == [] and before["protection"] == {}

    ray_ckpt.start(store_budget_bytes=BUDGET, namespace=namespace)
    node_id = ray.get_runtime_context().get_node_id()
    config = CheckpointConfig(data_shards=1, parity_shards=0, local_copy=True)
    ckpt = ray_ckpt.Checkpointer(job="live", rank=0, world_size=1, config=config, namespace=namespace)
    for step in range(3):
        ckpt.save(step, {"w": torch.full((1024,), float(step))}).wait(timeout_s=pace.bound(60))
    ckpt.close()

    dashboard = server.Dashboard(live=server.LiveCluster(namespace))
    data = dashboard.data()
    assert data["error"] is None and data["namespace"] == namespace
    assert [m["node_id"] for m in data["memory"]] == [node_id]
    assert data["memory"][0]["budget_bytes"] == BUDGET and data["memory"][0]["used_bytes"] > 0
    assert data["protection"]["live"]["value"] == 0 and data["protection"]["live"]["latest_committed"] == 2
    placement = data["placement"]["live"]
    assert placement["step"] == 2 and placement["ranks"] == [0]
    assert placement["nodes"] == [{"node_id": node_id, "alive": True, "store": True}]
    assert [(c["rank"], c["indices"], c["local"], c["lost"]) for c in placement["cells"]] == [(0, [0], True, False)]
    assert data["summary"]["saves"] >= 1 and data["save_stall"][0]["job"] == "live"
    (ray_node,) = [n for n in ray.nodes() if n["NodeID"] == node_id]
    assert data["nodes"][node_id]["host"] == ray_node["NodeManagerHostname"]
    assert data["nodes"][node_id]["ranks"] == [{"job": "live", "rank": 0}]

    report = tmp_path / "live.html"
    assert main(["dashboard", "--address", local_ray, "--namespace", namespace, "--export", str(report)]) == 0
    page = report.read_text()
    start = page.index("window.RAY_CKPT_DATA = ") + len("window.RAY_CKPT_DATA = ")
    inlined = json.loads(page[start : page.index(";</script>", start)])
    assert inlined["live"] is True and "live" in inlined["placement"]
    assert ray.is_initialized()  # the CLI did not disconnect a connection it did not make

    # the registry snapshotted the commits (at most one a second, always the newest): the events
    # alone give memory, protection and placement
    registry = naming.registry_handle(namespace)
    deadline = time.monotonic() + 30
    while True:
        _, records = ray.get(registry.events.remote(0))
        # whole snapshots (the registry records most as deltas against the job's previous one)
        snapshots = [e for e in events.resolve(records) if e["kind"] == "status" and e["job"] == "live"]
        if (snapshots and snapshots[-1]["step"] == 2) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert snapshots and snapshots[-1]["step"] == 2, snapshots
    assert 1 <= len(snapshots) <= 3  # at most one per commit
    times = [s["time"] for s in snapshots]
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(times))  # rate-limited per job
    newest = snapshots[-1]
    assert newest["placement"] == {"0": [node_id]} and newest["local"] == {"0": node_id}
    assert newest["protection"] == 0 and (newest["data_shards"], newest["parity_shards"]) == (1, 0)
    assert newest["nodes"][node_id]["budget_bytes"] == BUDGET and newest["nodes"][node_id]["used_bytes"] > 0
    assert newest["nodes"][node_id]["host"] == ray_node["NodeManagerHostname"]
    offline = dashboard_data.build(records)  # as from an events file: no cluster
    assert offline["live"] is False and offline["protection"]["live"]["value"] == 0
    assert offline["placement"]["live"]["step"] == 2 and offline["memory"][0]["node_id"] == node_id
    assert offline["nodes"][node_id]["host"] == ray_node["NodeManagerHostname"]
    ray_ckpt.shutdown(namespace=namespace)
