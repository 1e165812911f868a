"""The trainer integrations under Ray Train (their examples in scripts/), recovering in place
(the survivor keeps its process) from a hard kill of rank 1's node mid-run: Hugging Face's
Trainer with PeerMemoryCallback (killed at step 8, resumed from step 5), Lightning with
PeerMemoryCheckpointIO and SaveToPeers (killed in the second epoch at step 17, 10 steps an
epoch, resumed from step 15), and a loop of one's own around dcp.save and dcp.load with FSDP2
(killed at step 12, resumed from step 10). Each run resumes from peer memory (the survivor from
its own copy, the replacement from peers) and ends with final parameters, optimizer state and
scheduler state equal, bit for bit, to an uninterrupted run's, which goes on beside it on 2
workers of its own and is never restarted. Each recovery is on the timeline (and so on the
dashboard) as in place, with its kill and the steps it made the job train again: those after the
restored step, saved or not. The same runs recovered by Ray Train's restart of the worker group
are the examples' default (``python scripts/hf_example.py``); the seams' restore in a fresh
process is the replacement's here, and tests/unit/test_hf_integration.py and
test_lightning_integration.py resume whole runs in fresh processes."""

from __future__ import annotations

import pytest
from support.scripts_under_test import load_script
from support.sim_cluster import SimCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]


@pytest.mark.nodes(5)
@pytest.mark.parametrize(
    "script, framework, steps, kill_at",
    [
        ("hf_example", "transformers", 20, 8),
        ("lightning_example", "lightning", 24, 17),
        ("dcp_loop_example", "torch", 20, 12),
    ],
)
def test_a_run_recovers_in_place_from_a_node_kill_bit_exact(
    script: str, framework: str, steps: int, kill_at: int, train_cluster: SimCluster
) -> None:
    pytest.importorskip(framework)
    example = load_script(script, by_value=True)
    report = example.run_example(
        steps=steps, kill_at=kill_at, nodes=5, cluster=train_cluster, overlap=True, modes=("in_place",)
    )
    assert report["reference_attempts"] == 1
    run = report["runs"]["in_place"]
    assert len(run["killed"]) == 1, run["killed"]
    assert run["error"] is None, run["error"]
    assert run["resumed"]["step"] == steps
    assert run["equal"], "the resumed run's final state differs from the uninterrupted run's"
    # the killed rank had reached kill_at and saves are every 5 steps: the steps after the
    # restored one count as trained again (on a busy machine the kill may land after the next
    # save, and then it says fewer)
    (recovery,) = run["recoveries"]
    assert recovery["mode"] == "in_place" and not recovery["failed"], recovery
    assert recovery["steps_lost"] >= kill_at - recovery["step"], recovery
    assert set(recovery["survivor_pids"]) == {"0"} and set(recovery["replacement_pids"]) == {"1"}, recovery
    if script == "hf_example":  # Lightning's one dict is rank 0's on every process; a DCP load reads peer memory
        assert recovery["sources"] == {"0": "local", "1": "peers"}, recovery
    assert list(recovery["killed_nodes"]) == run["killed"] and recovery["time_to_resume_s"] > 0, recovery
