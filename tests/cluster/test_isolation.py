"""Isolation: jobs and namespaces do not see or disturb each other; token auth works."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import uuid

import numpy as np
import pytest
import ray
from support import pace
from support.cluster_ranks import digest, make_state, on_node, restore_rank, save_steps
from support.sim_cluster import SimCluster

import ray_ckpt
from ray_ckpt.transport import naming

pytestmark = pytest.mark.cluster

CODE = {"data_shards": 2, "parity_shards": 1, "keep_committed": 1}


@pytest.mark.nodes(4)
def test_one_job_cannot_overwrite_or_evict_another_jobs_shards(sim_cluster: SimCluster) -> None:
    """Job A commits many steps (evicting its own older ones) into the same stores as job B,
    with the same step numbers and ranks: job B's checkpoint stays intact and restorable."""
    ray.get(
        save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(0))).remote(
            sim_cluster.namespace, "job-B", 0, 1, [0, 1], CODE, 20_000
        )
    )
    ray.get(
        save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(0))).remote(
            sim_cluster.namespace, "job-A", 0, 1, list(range(6)), CODE, 20_000
        )
    )
    stores = naming.store_handles(sim_cluster.namespace)
    held = [m for h in stores.values() for m in ray.get(h.holdings.remote())["metas"]]
    assert {m["step"] for m in held if m["job"] == "job-A"} == {5}  # A evicted its own old steps
    assert {m["step"] for m in held if m["job"] == "job-B"} == {1}  # ... and none of B's
    result = ray.get(restore_rank.remote(sim_cluster.namespace, "job-B", 0, 1, CODE))
    assert (result["step"], result["digest"]) == (1, digest(make_state(0, 1, 20_000)))


@pytest.mark.nodes(3)
def test_namespaces_separate_deployments(sim_cluster: SimCluster) -> None:
    """Two deployments in different namespaces keep separate stores and registries: the same
    job name in each holds its own checkpoint."""
    other = f"other-{uuid.uuid4().hex[:6]}"
    ray_ckpt.start(store_budget_bytes=64 << 20, namespace=other)
    try:
        ray.get(
            save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(0))).remote(
                sim_cluster.namespace, "job", 0, 1, [3], CODE, 1_000
            )
        )
        ray.get(
            save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(0))).remote(
                other, "job", 0, 1, [7], CODE, 1_000
            )
        )
        assert ray.get(naming.registry_handle(sim_cluster.namespace).latest_committed.remote("job")) == 3
        assert ray.get(naming.registry_handle(other).latest_committed.remote("job")) == 7
        ours = ray.get(restore_rank.remote(sim_cluster.namespace, "job", 0, 1, CODE))
        theirs = ray.get(restore_rank.remote(other, "job", 0, 1, CODE))
        assert (ours["step"], theirs["step"]) == (3, 7)
    finally:
        ray_ckpt.shutdown(namespace=other)


@pytest.mark.nodes(3)
def test_store_actor_survives_malformed_requests(sim_cluster: SimCluster) -> None:
    """Forged metadata, wrong sizes and junk payloads get errors, never a dead store actor."""
    store = next(iter(naming.store_handles(sim_cluster.namespace).values()))
    good = {
        "job": "j",
        "step": 0,
        "rank": 0,
        "index": 0,
        "world_size": 1,
        "data_shards": 1,
        "parity_shards": 0,
        "payload_size": 4,
        "shard_size": 4,
        "checksum": 0,
        "attempt": "a",
        "writer": "w",
    }
    bad_requests = [
        ({**good, "index": 9}, np.zeros(4, np.uint8)),  # index beyond k+m
        ({**good, "shard_size": 5}, np.zeros(4, np.uint8)),  # inconsistent sizes
        ({**good, "extra": 1}, np.zeros(4, np.uint8)),  # unknown field
        (good, np.zeros(3, np.uint8)),  # payload shorter than declared
        ({**good, "step": -1}, np.zeros(4, np.uint8)),
        ("not a dict", b"junk"),
    ]
    for meta, data in bad_requests:
        with pytest.raises(ray.exceptions.RayTaskError):
            ray.get(store.put.remote(meta, data))
    assert ray.get(store.ready.remote())
    assert ray.get(store.stats.remote())["shards"] == 0


TOKEN_AUTH_SCRIPT = """
import sys, uuid
import ray
from support import cluster_ranks as sim  # registered with Ray's pickler by value
from ray_ckpt.transport import naming
from ray_ckpt.testing import SimulatedCluster
code = {"data_shards": 2, "parity_shards": 1, "keep_committed": 1, "local_copy": False}
simulated = SimulatedCluster(3, store_budget_bytes=64 << 20, namespace="auth")
cluster, workers = simulated.cluster, simulated.workers
try:
    here = sim.on_node(workers[0].node_id)
    ray.get(sim.save_steps.options(scheduling_strategy=here).remote("auth", "job", 0, 1, [0, 1], code, 10_000))
    located = ray.get(naming.registry_handle("auth").locate.remote("job", 1))[0]["nodes"]
    victim = next(w for w in workers[1:] if w.node_id in located.values())
    cluster.remove_node(victim, allow_graceful=False)
    result = ray.get(sim.restore_rank.options(scheduling_strategy=here).remote("auth", "job", 0, 1, code))
    ok = (result["step"], result["digest"]) == (1, sim.digest(sim.make_state(0, 1, 10_000)))
    print("RESTORED", result["step"], result["source"], ok)
    sys.exit(0 if ok else 1)
finally:
    simulated.shutdown()
"""


def test_everything_works_with_token_authentication(ray_tmpdir: str) -> None:
    """With RAY_AUTH_MODE=token (a fresh process, so every Ray component starts with it):
    deploy, save, hard-kill a shard holder and restore bit-exact."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex, "RAY_TMPDIR": ray_tmpdir}
    tests = pathlib.Path(__file__).parents[1]  # the script imports support.cluster_ranks
    done = subprocess.run(
        [sys.executable, "-c", TOKEN_AUTH_SCRIPT],
        cwd=tests,
        env=env,
        capture_output=True,
        text=True,
        timeout=pace.bound(280),
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "RESTORED 1 peers True" in done.stdout
