"""Resharding under Ray Train: an FSDP2 job saved by 4 workers goes on with 2 after a node that
held a needed data shard was killed, and an elastic run (num_workers=(2, 4)) shrinks after a node
kill and grows back; every restore reshards from peer memory into the new sharding and equals
the saved weights bit for bit."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from support.sim_cluster import SimCluster

import ray_ckpt
from ray_ckpt.transport.registry_client import RegistryClient

pytestmark = pytest.mark.cluster

CHECKPOINT = {"data_shards": 2, "parity_shards": 1}


@pytest.mark.nodes(5)
def test_an_fsdp2_job_saved_by_4_workers_resumes_at_2_bit_exact_after_a_shard_holder_dies(
    train_cluster: SimCluster, train_example: Any
) -> None:
    example = train_example
    storage = tempfile.mkdtemp()

    def run(workers: int, steps: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        events = tempfile.mkdtemp()
        final = example.run(
            name="resized",
            storage_path=storage,
            events_dir=events,
            steps=steps,
            workers=workers,
            checkpoint=CHECKPOINT,
            step_sleep_s=0.0,
            fsdp2=True,
        )
        return final, example.read_restores(events)

    saved_by_4, _ = run(4, 3)
    # a worker node holding a data shard of step 2 (its bytes are then decoded from parity)
    records = RegistryClient(ray_ckpt.settings.namespace()).locate("resized", 2)
    workers = {str(n.node_id) for n in train_cluster.workers}
    victim = next(r.nodes[i] for r in records.values() for i in range(2) if r.nodes[i] in workers)
    train_cluster.kill([victim])

    _, restores = run(2, 5)
    assert {r["rank"]: (r["restored_step"], r["from_world_size"]) for r in restores} == {0: (2, 4), 1: (2, 4)}
    assert {r["restored_digest"] for r in restores} == {saved_by_4["params_digest"]}


@pytest.mark.nodes(4)
def test_an_elastic_fsdp2_run_shrinks_after_a_node_kill_and_grows_back_resharding_bit_exact(
    train_cluster: SimCluster, train_example: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ScalingConfig(num_workers=(2, 4)) on exactly 4 one-CPU nodes (``run_elastic``): after
    step 4 a node with a rank is killed and there is no spare, so Ray Train restarts the run at
    3 workers, which restore resharded from 4 ranks; a node is added back, Ray Train grows the
    run to 4 workers, which reshard from 3. Every restore equals, bit for bit, the step the
    previous group saved, and the run completes. Ray Train sees each change as soon as Ray
    does (``refresh_view``), and gives up a start at the old size after 4 s."""
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "4")
    report = train_example.run_elastic(cluster=train_cluster, refresh_view=True)
    sizes = report["sizes"]
    assert sizes[0] == 4 and 3 in sizes[1:] and sizes[-1] == 4, report
    assert {(r["to"], r["from"]) for r in report["reshards"]} >= {(3, 4), (4, 3)}, report
    assert all(r["bit_exact"] for r in report["reshards"]), report
