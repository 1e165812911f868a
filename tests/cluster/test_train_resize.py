"""Resharding under Ray Train: an FSDP2 job saved by 4 workers goes on with 2 after a node that
held a needed data shard was killed, and an elastic run (num_workers=(2, 4)) shrinks after a node
kill and grows back; every restore reshards from peer memory into the new sharding and equals
the saved weights bit for bit."""

from __future__ import annotations

import tempfile
import threading
import time
from typing import Any

import pytest

import ray_ckpt
from ray_ckpt.registry_client import RegistryClient
from ray_ckpt.testing import SimulatedCluster

pytestmark = pytest.mark.cluster

CHECKPOINT = {"data_shards": 2, "parity_shards": 1}


def test_an_fsdp2_job_saved_by_4_workers_resumes_at_2_bit_exact_after_a_shard_holder_dies(
    ray_tmpdir: str, train_example: Any
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

    with SimulatedCluster(6, store_budget_bytes=256 << 20) as sim:
        saved_by_4, _ = run(4, 6)
        # a worker node holding a data shard of step 5 (its bytes are then decoded from parity)
        records = RegistryClient(ray_ckpt.settings.namespace()).locate("resized", 5)
        workers = {str(n.node_id) for n in sim.workers}
        victim = next(r.nodes[i] for r in records.values() for i in range(2) if r.nodes[i] in workers)
        sim.kill([victim])

        _, restores = run(2, 10)
        assert {r["rank"]: (r["restored_step"], r["from_world_size"]) for r in restores} == {0: (5, 4), 1: (5, 4)}
        assert {r["restored_digest"] for r in restores} == {saved_by_4["params_digest"]}


def test_an_elastic_fsdp2_run_shrinks_after_a_node_kill_and_grows_back_resharding_bit_exact(
    ray_tmpdir: str, train_example: Any
) -> None:
    """ScalingConfig(num_workers=(2, 4)) on exactly 4 one-CPU nodes: after step 4 a node with a
    rank is killed and there is no spare, so Ray Train restarts the run at 3 workers, which
    restore step >= 4 resharded from 4 ranks; a node is added back, Ray Train grows the run to 4
    workers, which reshard from 3. Every restore equals, bit for bit, the step the previous
    group saved, and the run completes."""
    example = train_example
    events = tempfile.mkdtemp()
    with SimulatedCluster(4, store_budget_bytes=256 << 20) as sim:

        def faults() -> None:
            example.wait_committed("elastic", 4)
            sim.kill([example.rank_node("elastic", 1)])
            deadline = time.monotonic() + 240
            while not any(r["world_size"] == 3 and r["step"] >= 2 for r in example.read_step_digests(events)):
                if time.monotonic() > deadline:
                    raise TimeoutError("the run did not go on at 3 workers")
                time.sleep(0.2)
            sim.add_workers(1)

        # Ray starts a node only from the main thread: the run goes on a thread instead
        failures: list[BaseException] = []
        fit = threading.Thread(
            target=lambda: _catch(
                lambda: example.run(
                    name="elastic",
                    storage_path=tempfile.mkdtemp(),
                    events_dir=events,
                    steps=100,  # long enough at 3 workers for the node added back to be seen
                    workers=(2, 4),
                    checkpoint=CHECKPOINT,
                    step_sleep_s=0.25,
                    max_failures=4,
                    fsdp2=True,
                ),
                failures,
            ),
            daemon=True,
        )
        fit.start()
        faults()
        fit.join(timeout=600)
        assert not fit.is_alive(), "the elastic run did not finish within 600 s"
    assert not failures, failures
    saved = {(r["attempt"], r["step"]): r for r in example.read_step_digests(events)}
    attempts: dict[str, list[dict[str, Any]]] = {}
    for record in example.read_restores(events):
        attempts.setdefault(record["attempt"], []).append(record)
    sizes = [len(records) for records in attempts.values()]
    assert sizes[0] == 4 and 3 in sizes[1:] and sizes[-1] == 4, sizes
    resharded = [records for records in attempts.values() if records[0]["from_world_size"] not in (None, len(records))]
    assert {(len(r), r[0]["from_world_size"]) for r in resharded} >= {(3, 4), (4, 3)}
    for records in resharded:
        step = records[0]["restored_step"]
        by_saver = [
            s
            for (attempt, s_step), s in saved.items()
            if s_step == step and s["world_size"] == records[0]["from_world_size"]
        ]
        assert by_saver and {r["restored_digest"] for r in records} == {by_saver[-1]["digest"]}


def _catch(work: Any, failures: list[BaseException]) -> None:
    try:
        work()
    except BaseException as error:  # surfaced by the test
        failures.append(error)
