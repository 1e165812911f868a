"""A cluster that shrinks below k+m stores: saves go on with degraded placement, the protection
reported is the real one, and full spreading returns when nodes rejoin; world-size changes and
dropping a job."""

from __future__ import annotations

import time

import pytest
import ray
from support import pace
from support.cluster_ranks import digest, make_state, on_node, rank_checkpointer, restore_rank, save_steps
from support.sim_cluster import SimCluster

import ray_ckpt
from ray_ckpt import service, settings
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.errors import ConfigError, NoCheckpointError
from ray_ckpt.transport import naming

pytestmark = pytest.mark.cluster


def wait_for_stores(namespace: str, count: int, timeout_s: float = pace.bound(60.0)) -> None:
    """Wait until ``count`` alive nodes run a store (the registry starts them by itself)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = naming.alive_node_ids()
        if len(naming.store_node_ids(namespace) & alive) == count:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{count} stores did not come up within {timeout_s}s")


def job_status(namespace: str, job: str) -> dict:
    return service.status(namespace=namespace)["jobs"][job]


@pytest.mark.nodes(3)
def test_a_shrinking_cluster_keeps_saving_with_real_protection_and_recovers_full_spread(
    sim_cluster: SimCluster,
) -> None:
    """RS(2,2) on 4 stores, then 3, 2 and 1 after hard kills: every save succeeds; the
    protection reported (status, the save's own, its event) is computed from the real
    placement; a step saved on 2 stores (protection 1) survives losing one of them bit-exact;
    after nodes are added, stores start by themselves and a new step is fully protected."""
    namespace, job = sim_cluster.namespace, "shrinking"
    config = ray_ckpt.CheckpointConfig(data_shards=2, parity_shards=2, local_copy=False)
    ckpt = Checkpointer(job=job, rank=0, world_size=1, config=config, namespace=namespace)
    expected = {}

    def save(step: int) -> None:
        expected[step] = make_state(0, step, 20_000)
        with settings.override(RAY_CKPT_SAVE_EVENT_EVERY=1):  # every save sends its event
            ckpt.save(step, expected[step]).wait(timeout_s=pace.bound(60))

    save(0)
    assert ckpt.last_protection == 2
    assert job_status(namespace, job)["protection"] == 2
    sim_cluster.kill([sim_cluster.node_id(0)])
    save(1)  # 4 shards on 3 stores: one node holds two
    assert ckpt.last_protection == 1
    status = job_status(namespace, job)
    assert (status["latest_committed"], status["protection"], status["full_protection"]) == (1, 1, 2)
    sim_cluster.kill([sim_cluster.node_id(0)])
    save(2)  # 2 stores: two shards each
    assert ckpt.last_protection == 1
    sim_cluster.kill([sim_cluster.node_id(0)])  # step 2 loses half its shards: k=2 remain
    restored = ray_ckpt.read(job, namespace=namespace)  # a reader: a restore would supersede ckpt
    assert restored is not None and (restored.step, restored.source) == (2, "peers")
    assert digest(restored.state) == digest(expected[2])
    save(3)  # the head's store alone: the job goes on, unprotected
    assert ckpt.last_protection == 0
    sim_cluster.add_workers(3)
    wait_for_stores(namespace, 4)
    save(4)
    assert ckpt.last_protection == 2
    assert job_status(namespace, job)["protection"] == 2
    _, events = ray.get(naming.registry_handle(namespace).events.remote(0))
    saved = {e["step"]: e["protection"] for e in events if e["kind"] == "save" and e["job"] == job}
    assert saved == {0: 2, 1: 1, 2: 1, 3: 0, 4: 2}
    ckpt.close()
    restored = ray.get(
        restore_rank.options(scheduling_strategy=on_node(sim_cluster.node_id(2))).remote(
            namespace, job, 0, 1, config.to_dict()
        )
    )
    assert (restored["step"], restored["source"]) == (4, "peers")
    assert restored["digest"] == digest(expected[4])


@ray.remote(num_cpus=1, max_retries=0)
def _restore_into(namespace: str, job: str, rank: int, world_size: int, config: dict) -> Exception | None:
    """``restore(into=...)`` of a plain state at ``world_size``; the error it raised, if any."""
    with rank_checkpointer(namespace, job, rank, world_size, config) as checkpointer:
        try:
            checkpointer.restore(into=make_state(rank, 0, 1000))
        except Exception as error:
            return error
    return None


@pytest.mark.nodes(3)
def test_a_world_size_change_fails_the_same_way_on_every_rank_and_drop_removes_one_job(
    sim_cluster: SimCluster,
) -> None:
    """A step saved by 2 ranks: restoring with 3 or 1 ranks raises the same ConfigError on every
    rank, naming the saved size and the ways out; with ``into=`` the plain per-rank state is
    refused as not reshardable, naming its keys; nothing is lost (2 ranks still restore it);
    ``ray_ckpt.drop`` then removes that job from the registry and the stores, and only it."""
    namespace = sim_cluster.namespace
    code = {"data_shards": 2, "parity_shards": 1}
    for job in ("resized", "other"):
        ray.get(
            [
                save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(r))).remote(
                    namespace, job, r, 2, [0], code, 1000
                )
                for r in range(2)
            ]
        )
    for world_size in (3, 1):
        pending = [
            restore_rank.options(scheduling_strategy=on_node(sim_cluster.node_id(r))).remote(
                namespace, "resized", r, world_size, code
            )
            for r in range(world_size)
        ]
        messages = set()
        for ref in pending:
            with pytest.raises(ray.exceptions.RayTaskError) as raised:
                ray.get(ref)
            cause = raised.value.cause
            assert isinstance(cause, ConfigError)
            assert (cause.saved_world_size, cause.world_size) == (2, world_size)
            messages.add(str(cause))
        assert len(messages) == 1
        message = messages.pop()
        assert "saved by 2 rank(s)" in message and f"world size {world_size}" in message
        assert "ray-ckpt drop resized" in message and "new job name" in message
    refused = ray.get([_restore_into.remote(namespace, "resized", r, 3, code) for r in range(3)])
    for cause in refused:  # per-rank plain state, restored into another world size with into=
        assert isinstance(cause, ConfigError) and "cannot be resharded" in str(cause)
        assert "restore at world size 2" in str(cause) and "DTensors" in str(cause)
        assert "state['model']['w']" in cause.keys
    kept = ray.get([restore_rank.remote(namespace, "resized", r, 2, code) for r in range(2)])
    assert [r["digest"] for r in kept] == [digest(make_state(r, 0, 1000)) for r in range(2)]
    ray_ckpt.service.drop("resized", namespace=namespace)
    status = service.status(namespace=namespace)
    assert set(status["jobs"]) == {"other"}
    assert all("resized" not in node.get("jobs", {}) for node in status["nodes"].values())
    assert all(node["shards"] > 0 for node in status["nodes"].values() if "other" in node.get("jobs", {}))
    with pytest.raises(NoCheckpointError, match="resized"):
        ray_ckpt.service.drop("resized", namespace=namespace)
