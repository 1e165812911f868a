"""Ray Train integration: a TorchTrainer job survives a hard node kill, bit-exact."""

from __future__ import annotations

from typing import Any

import pytest
from support.sim_cluster import SimCluster

pytestmark = pytest.mark.cluster


@pytest.mark.nodes(5)
def test_torch_trainer_job_recovers_from_a_node_kill_bit_exact(train_cluster: SimCluster, train_example: Any) -> None:
    """The example job (DDP over gloo, 2 workers) with the default CheckpointConfig, RS(4,2),
    on exactly k+m = 6 store nodes (a head and 5 workers): after the node of rank 1 is
    hard-killed, Ray Train restarts the group, every rank restores the newest committed step
    from memory, the job goes on saving on the 5 stores left (protection 1 of 2, reported by
    status) and finishes with parameters equal to an uninterrupted run's, bit for bit."""
    report = train_example.run_with_kill(
        steps=16, workers=2, nodes=5, kill_at_step=5, checkpoint={}, cluster=train_cluster
    )
    killed_step = report["killed"]["latest_committed"]
    restores = report["restores"]
    first, second = (
        {r["attempt"] for r in restores if r["restored_step"] is None},
        {r["attempt"] for r in restores if r["restored_step"] is not None},
    )
    assert len(first) == 1 and len(second) >= 1, restores
    after_kill = [r for r in restores if r["restored_step"] is not None]
    assert sorted(r["rank"] for r in after_kill[-2:]) == [0, 1]
    assert all(r["source"] in ("local", "peers") for r in after_kill)
    assert all(r["restored_step"] >= killed_step for r in after_kill)
    assert report["bit_exact"], (report["reference_digest"], report["final_digest"])
    final = report["final_status"]
    assert final["latest_committed"] == 15
    assert (final["protection"], final["full_protection"]) == (1, 2)
