"""Checkpointer behaviour on a simulated cluster: crashes mid-save, local copies, backups."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest
import ray
from support import pace
from support.cluster_ranks import (
    SAVERS,
    TrainingRank,
    digest,
    linear_state,
    make_state,
    on_node,
    rank_checkpointer,
    restore_rank,
    save_steps,
    shard_nodes,
)
from support.sim_cluster import SimCluster

import ray_ckpt
from ray_ckpt import backup
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.errors import StoreFullError
from ray_ckpt.transport import naming

pytestmark = pytest.mark.cluster

JOB = "job-b"
OPERATIONS = pathlib.Path(__file__).parents[2] / "docs" / "operations.md"


@ray.remote(num_cpus=1, max_retries=0)
def save_then_crash(namespace: str, job: str, rank: int, world_size: int, step: int, config: dict) -> None:
    """Start saving ``step`` (as a rank of the worker group ``save_steps`` saves with) and kill
    this process while the save runs in the background."""
    checkpointer = rank_checkpointer(namespace, job, rank, world_size, config, SAVERS)
    checkpointer.save(step, make_state(rank, step))
    os._exit(1)


@pytest.mark.nodes(6)
def test_a_crash_during_a_save_restores_the_previous_step(sim_cluster: SimCluster) -> None:
    """Rank 1's process dies in the middle of saving step 2: step 1 stays the latest, every
    rank restores it bit-exact, and the torn step is never visible."""
    code = {"data_shards": 2, "parity_shards": 1}
    ray.get(
        [
            save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(r))).remote(
                sim_cluster.namespace, JOB, r, 2, [0, 1], code, 50_000
            )
            for r in range(2)
        ]
    )
    ray.get(
        save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(0))).remote(
            sim_cluster.namespace, JOB, 0, 2, [2], code, 50_000
        )
    )
    with pytest.raises(ray.exceptions.WorkerCrashedError):
        ray.get(
            save_then_crash.options(scheduling_strategy=on_node(sim_cluster.node_id(1))).remote(
                sim_cluster.namespace, JOB, 1, 2, 2, code
            )
        )
    registry = naming.registry_handle(sim_cluster.namespace)
    assert ray.get(registry.latest_committed.remote(JOB)) == 1
    _, records = ray.get(registry.events.remote(0))
    saves = [r for r in records if r["kind"] == "save" and r.get("job") == JOB]
    assert saves and all(r["returned"] <= r["time"] for r in saves)  # save() returned before the commit
    results = ray.get([restore_rank.remote(sim_cluster.namespace, JOB, r, 2, code) for r in range(2)])
    assert [r["step"] for r in results] == [1, 1]
    assert [r["digest"] for r in results] == [digest(make_state(r, 1)) for r in range(2)]


@pytest.mark.nodes(5)
def test_a_process_restarted_on_the_same_node_restores_from_its_local_copy(sim_cluster: SimCluster) -> None:
    """A fresh process on the rank's own node restores from the local copy (no network);
    the same rank on another node restores from peers."""
    code = {"data_shards": 2, "parity_shards": 1}
    node = sim_cluster.node_id(0)
    ray.get(
        save_steps.options(scheduling_strategy=on_node(node)).remote(
            sim_cluster.namespace, JOB, 0, 1, [0, 1], code, 50_000
        )
    )
    same = ray.get(
        restore_rank.options(scheduling_strategy=on_node(node)).remote(sim_cluster.namespace, JOB, 0, 1, code)
    )
    other = ray.get(
        restore_rank.options(scheduling_strategy=on_node(sim_cluster.node_id(1))).remote(
            sim_cluster.namespace, JOB, 0, 1, code
        )
    )
    assert (same["step"], same["source"]) == (1, "local")
    assert (other["step"], other["source"]) == (1, "peers")
    assert same["digest"] == other["digest"] == digest(make_state(0, 1))


@pytest.mark.nodes(6)
def test_losing_more_than_m_shards_falls_back_to_the_newest_backup_on_every_rank(sim_cluster: SimCluster) -> None:
    """With more than m shards of one rank gone, every rank (even those whose shards survive)
    restores the same newest complete backup step, bit-exact, and says so."""
    storage = tempfile.mkdtemp(prefix="rckbackup")
    code = {"data_shards": 2, "parity_shards": 1, "backup_every": 2, "backup_uri": storage, "local_copy": False}
    ray.get(
        [
            save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(r))).remote(
                sim_cluster.namespace, JOB, r, 2, [0, 1, 2, 3], code, 50_000
            )
            for r in range(2)
        ]
    )
    assert backup.complete_steps(storage, JOB) == [0, 2]
    placement = shard_nodes(sim_cluster.namespace, JOB, 3)
    sim_cluster.kill(sim_cluster.worker_holders(placement[0], 2))
    results = ray.get([restore_rank.remote(sim_cluster.namespace, JOB, r, 2, code) for r in range(2)])
    assert [(r["step"], r["source"]) for r in results] == [(2, "backup"), (2, "backup")]
    assert [r["digest"] for r in results] == [digest(make_state(r, 2)) for r in range(2)]
    step, state = backup.load(storage, JOB, rank=1)
    assert step == 2 and digest(state) == digest(make_state(1, 2))


@pytest.mark.nodes(6)
def test_a_background_save_error_surfaces_on_the_next_call(sim_cluster: SimCluster) -> None:
    """A save whose background scatter fails (the stores filled up after it was accepted)
    raises StoreFullError on the next save, on wait and on close, never silently; the
    committed step stays restorable."""
    config = ray_ckpt.CheckpointConfig(data_shards=4, parity_shards=2, local_copy=False)
    checkpointer = Checkpointer(job=JOB, rank=0, world_size=1, config=config, namespace=sim_cluster.namespace)
    checkpointer.save(0, make_state(0, 0, 100)).wait(timeout_s=pace.bound(60))
    for store in naming.store_handles(sim_cluster.namespace).values():
        ray.get(store.set_budget.remote(1))  # below what step 0 holds: every further put fails
    checkpointer.save(1, make_state(0, 1, 100))
    with pytest.raises(StoreFullError, match="budget"):
        checkpointer.save(2, make_state(0, 2, 100))
    handle = checkpointer.save(3, make_state(0, 3, 100))
    with pytest.raises(StoreFullError):
        handle.wait(timeout_s=pace.bound(60))
    with pytest.raises(StoreFullError):
        checkpointer.close()
    with Checkpointer(job=JOB, rank=0, world_size=1, config=config, namespace=sim_cluster.namespace) as fresh:
        restored = fresh.restore()
    assert restored is not None and restored.step == 0
    assert digest(restored.state) == digest(make_state(0, 0, 100))


@pytest.mark.nodes(6)
def test_a_node_dying_during_a_restore_is_routed_around(sim_cluster: SimCluster) -> None:
    """A node holding a data shard is hard-killed while ranks restore (the kill lands before or
    during the fetch): the restore uses the remaining shards and is still bit-exact."""
    code = {"data_shards": 2, "parity_shards": 2, "local_copy": False}
    size = 8_000_000  # 32 MB of float32 per rank, so the fetch takes a while
    ray.get(
        [
            save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(r))).remote(
                sim_cluster.namespace, JOB, r, 2, [0], code, size
            )
            for r in range(2)
        ]
    )
    placement = shard_nodes(sim_cluster.namespace, JOB, 0)
    victim = sim_cluster.worker_holders(placement[0], 1, indices=[0, 1])
    survivors = [n for n in range(len(sim_cluster.workers)) if sim_cluster.node_id(n) not in victim]
    pending = [
        restore_rank.options(scheduling_strategy=on_node(sim_cluster.node_id(survivors[r]))).remote(
            sim_cluster.namespace, JOB, r, 2, code
        )
        for r in range(2)
    ]
    time.sleep(0.5)  # the restores are running
    sim_cluster.kill(victim)
    results = ray.get(pending)
    assert [r["step"] for r in results] == [0, 0]
    assert [r["digest"] for r in results] == [digest(make_state(r, 0, size)) for r in range(2)]


def _store_pid(store: object) -> int:
    return int(ray.get(store.__ray_call__.remote(lambda self: os.getpid()), timeout=30))  # type: ignore[attr-defined]


@pytest.mark.nodes(6)
def test_stores_frozen_during_a_restore_cost_no_committed_step(sim_cluster: SimCluster) -> None:
    """Two ranks committed steps 1 and 2 (RS(2,1)); every store holding the job is frozen
    (SIGSTOP) while a new group restores with a 5 s peer timeout. That restore fails, but a slow
    store is not a dead one: the error says the stores did not answer (ShardsUnreachableError)
    and step 2 is not given up. The stores are continued, and the next group restores step 2
    bit-exact."""
    code = {"data_shards": 2, "parity_shards": 1, "local_copy": False}
    ray.get(
        [
            save_steps.options(scheduling_strategy=on_node(sim_cluster.node_id(r))).remote(
                sim_cluster.namespace, JOB, r, 2, [1, 2], code, 50_000
            )
            for r in range(2)
        ]
    )
    registry = naming.registry_handle(sim_cluster.namespace)
    assert ray.get(registry.latest_committed.remote(JOB)) == 2
    holders = {node for rank in shard_nodes(sim_cluster.namespace, JOB, 2).values() for node in rank.values()}
    pids = [_store_pid(store) for store in naming.store_handles(sim_cluster.namespace, sorted(holders)).values()]
    assert len(pids) == len(holders)
    fast = {"env_vars": {"RAY_CKPT_PEER_TIMEOUT_S": "5"}}
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        frozen = [
            restore_rank.options(runtime_env=fast).remote(sim_cluster.namespace, JOB, r, 2, code) for r in range(2)
        ]
        errors = []
        for pending in frozen:
            with pytest.raises(ray.exceptions.RayTaskError) as raised:
                ray.get(pending, timeout=pace.bound(120))
            errors.append(str(raised.value))
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    assert any("ShardsUnreachableError" in error for error in errors), errors
    assert not any("InsufficientShardsError" in error for error in errors), errors
    assert ray.get(registry.latest_committed.remote(JOB)) == 2
    results = ray.get([restore_rank.remote(sim_cluster.namespace, JOB, r, 2, code) for r in range(2)])
    assert [(r["step"], r["source"]) for r in results] == [(2, "peers"), (2, "peers")]
    assert [r["digest"] for r in results] == [digest(make_state(r, 2)) for r in range(2)]


def operations_block(heading: str) -> str:
    """The python block of operations.md's section ``heading``."""
    section = OPERATIONS.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    return str(block)


@pytest.mark.nodes(4)
def test_a_driver_reads_a_running_jobs_weights_and_the_job_goes_on(sim_cluster: SimCluster) -> None:
    """Two ranks restored and committed steps 0 and 1, their Checkpointers open: the driver's
    ``ray_ckpt.read`` gives each rank's step 1 bit-exact, and operations.md's "Watching a job's
    weights", run as written in another driver, loads it into its model. The registry's view of
    the job is as before, and the job's next save commits under its own attempt (a restore
    there would have superseded it); the next read gives that step."""
    namespace, job = sim_cluster.namespace, "my-run"
    config = {"data_shards": 2, "parity_shards": 1}
    ranks = [
        TrainingRank.options(scheduling_strategy=on_node(sim_cluster.node_id(r))).remote(namespace, job, r, 2, config)
        for r in range(2)
    ]

    def save(step: int) -> list[str | None]:
        return ray.get([rank.save.remote(step) for rank in ranks], timeout=pace.bound(120))

    attempts = save(0)
    assert save(1) == attempts and None not in attempts
    registry = naming.registry_handle(namespace)
    before = ray.get(registry.jobs.remote())
    for rank in range(2):
        read = ray_ckpt.read(job, rank=rank, namespace=namespace)
        assert read is not None and (read.step, read.source) == (1, "peers")
        assert digest(read.state) == digest(linear_state(rank, 1))
    env = {**os.environ, "RAY_ADDRESS": sim_cluster.address, "RAY_CKPT_NAMESPACE": namespace}
    run = subprocess.run(
        [sys.executable, "-c", operations_block("Watching a job's weights")],
        env=env,
        capture_output=True,
        text=True,
        timeout=pace.bound(180),
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "evaluating step 1" in run.stdout
    assert ray.get(registry.jobs.remote()) == before
    assert save(2) == attempts  # not superseded: a StaleAttemptError would fail the save
    latest = ray_ckpt.read(job, namespace=namespace)
    assert latest is not None and latest.step == 2 and digest(latest.state) == digest(linear_state(0, 2))
    for rank in ranks:
        ray.kill(rank, no_restart=True)
