"""Warm spares stay as many per node as the run has ranks on one node, however often they are
renewed: on a node of several CPUs Ray keeps an idle worker past its keep-alive, so a renewal
that started new spares beside waiting ones piled them up (more per renewal)."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator

import psutil
import pytest
import ray
from ray.runtime_env import RuntimeEnv
from support import pace

from ray_ckpt import _ray_compat
from ray_ckpt.testing import SimulatedCluster
from ray_ckpt.train import inplace, inplace_controller

pytestmark = pytest.mark.cluster

KEEP_ALIVE_S = 3.0  # short, so that every renewal below comes after the spare's keep-alive ran out


@pytest.fixture(scope="module")
def four_cpu_node() -> Iterator[SimulatedCluster]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", tempfile.mkdtemp(prefix="rckwarm"))
        sim = SimulatedCluster(1, worker_cpus=4, start_service=False)
        try:
            yield sim
        finally:
            sim.shutdown()


def spare_processes() -> list[int]:
    """The pids of this machine's idle worker processes started with the warm-up hook."""
    found = []
    for process in psutil.process_iter():
        try:
            hooked = process.environ().get(_ray_compat.SETUP_HOOK_ENV_VAR) == inplace.WARM_HOOK
            if hooked and process.cmdline()[:1] == ["ray::IDLE"]:
                found.append(process.pid)
        except (psutil.Error, OSError):
            continue
    return found


def wait_for(what: str, condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + pace.bound(60)
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_renewals_keep_two_spares_for_two_ranks_per_node_and_replace_one_that_died(
    four_cpu_node: SimulatedCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inplace_controller, "SPARE_START_S", KEEP_ALIVE_S)
    runtime = ray.get_runtime_context()
    spares = inplace_controller._WarmSpares()
    spares._facts = inplace_controller.WorkerFacts(
        rank=0,
        node_id="elsewhere",
        runtime_env=RuntimeEnv(env_vars={_ray_compat.SETUP_HOOK_ENV_VAR: inplace.WARM_HOOK}).serialize(),
        job_id=runtime.get_job_id(),
        resources={"CPU": 1.0},
    )
    spares._wanted, spares._keep_alive_s = 1, KEEP_ALIVE_S
    spares.workers = {0: "elsewhere", 1: "elsewhere"}  # the run's two ranks share a node
    node_id = four_cpu_node.node_id(0)
    node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    raylet = f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
    job = spares._facts.job_id

    def two_spares_up() -> bool:  # their processes run and noted themselves after their warm-up
        found = spare_processes()
        return len(found) == 2 and set(found) <= _ray_compat.warm_processes(job, node_id)

    spares._start_spares()
    wait_for("the first two spares did not come up", two_spares_up)
    first = sorted(spare_processes())
    for _ in range(4):  # each renewal after the last one's keep-alive and start grace ran out
        time.sleep(KEEP_ALIVE_S + 0.5)
        spares._start_spares()
        assert sorted(spare_processes()) == first

    os.kill(first[0], signal.SIGKILL)  # a spare is gone: a renewal starts one once its raylet knows
    wait_for(
        "the raylet still lists the killed spare", lambda: first[0] not in (_ray_compat.job_workers(raylet, job) or {})
    )
    spares._start_spares()
    wait_for("no new spare replaced the killed one", two_spares_up)
    now = spare_processes()
    assert first[1] in now and first[0] not in now
    assert first[0] not in _ray_compat.warm_processes(job, node_id), "the killed spare's note was kept"
