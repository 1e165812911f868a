"""Resharding under Ray Train: an FSDP2 job saved by 4 workers goes on with 2, then with 3,
restoring from peer memory into the new sharding each time, with a node that held a needed data
shard killed before the first resize; the restored weights equal the saved ones bit for bit."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest

import ray_ckpt
from ray_ckpt.registry_client import RegistryClient
from ray_ckpt.testing import SimulatedCluster

pytestmark = pytest.mark.cluster

CHECKPOINT = {"data_shards": 2, "parity_shards": 1}


def test_an_fsdp2_job_resumes_at_2_then_3_workers_bit_exact_after_a_shard_holder_dies(
    ray_tmpdir: str, train_example: Any
) -> None:
    example = train_example
    storage = tempfile.mkdtemp()

    def run(workers: int, steps: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        events = tempfile.mkdtemp()
        final = example.run(
            name="elastic",
            storage_path=storage,
            events_dir=events,
            steps=steps,
            workers=workers,
            checkpoint=CHECKPOINT,
            step_sleep_s=0.0,
            fsdp2=True,
        )
        return final, example.read_restores(events)

    with SimulatedCluster(6, store_budget_bytes=256 << 20) as sim:
        saved_by_4, _ = run(4, 6)
        # a worker node holding a data shard of step 5 (its bytes are then decoded from parity)
        records = RegistryClient(ray_ckpt.settings.namespace()).locate("elastic", 5)
        workers = {str(n.node_id) for n in sim.workers}
        victim = next(r.nodes[i] for r in records.values() for i in range(2) if r.nodes[i] in workers)
        sim.kill([victim])

        saved_by_2, restores = run(2, 10)
        assert {r["rank"]: (r["restored_step"], r["from_world_size"]) for r in restores} == {0: (5, 4), 1: (5, 4)}
        assert {r["restored_digest"] for r in restores} == {saved_by_4["params_digest"]}

        _, restores = run(3, 12)
        assert {r["rank"]: (r["restored_step"], r["from_world_size"]) for r in restores} == {
            0: (9, 2),
            1: (9, 2),
            2: (9, 2),
        }
        assert {r["restored_digest"] for r in restores} == {saved_by_2["params_digest"]}
