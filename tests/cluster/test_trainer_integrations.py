"""The trainer integrations under Ray Train (their examples in scripts/), the node of rank 1
hard-killed mid-run: Hugging Face's Trainer with PeerMemoryCallback (killed at step 8, resumed
from step 5), and Lightning with PeerMemoryCheckpointIO and SaveToPeers (killed in the second
epoch at step 17, 10 steps an epoch, resumed from step 15). Each run resumes from peer memory
and ends with final parameters, optimizer state and scheduler state equal, bit for bit, to an
uninterrupted run's, which goes on beside it on 2 workers of its own and is never restarted."""

from __future__ import annotations

import pytest
from support.scripts_under_test import load_script
from support.sim_cluster import SimCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


@pytest.mark.nodes(5)
@pytest.mark.parametrize(
    "script, framework, steps, kill_at",
    [("hf_example", "transformers", 20, 8), ("lightning_example", "lightning", 24, 17)],
)
def test_a_run_that_loses_a_node_resumes_from_peers_bit_exact(
    script: str, framework: str, steps: int, kill_at: int, train_cluster: SimCluster
) -> None:
    pytest.importorskip(framework)
    example = load_script(script, by_value=True)
    report = example.run_example(steps=steps, kill_at=kill_at, nodes=5, cluster=train_cluster, overlap=True)
    assert len(report["killed"]) == 1, report["killed"]
    assert report["error"] is None, report["error"]
    assert report["resumed"]["step"] == steps
    assert report["reference_attempts"] == 1
    assert report["equal"], "the resumed run's final state differs from the uninterrupted run's"
