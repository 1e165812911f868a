"""Warm spares stay one per node and job, however often they are renewed: on a node of several
CPUs Ray keeps an idle worker past its keep-alive, so a renewal that starts a new spare beside
a waiting one piles them up."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Iterator

import pace
import psutil
import pytest
import ray
from ray.runtime_env import RuntimeEnv

from ray_ckpt import _ray_compat
from ray_ckpt.testing import SimulatedCluster
from ray_ckpt.train import inplace

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


def spare_processes() -> list[psutil.Process]:
    """This machine's idle worker processes started with in-place recovery's warm-up hook."""
    found = []
    for process in psutil.process_iter():
        try:
            hooked = process.environ().get(_ray_compat.SETUP_HOOK_ENV_VAR) == inplace.WARM_HOOK
            if hooked and process.cmdline()[:1] == ["ray::IDLE"]:
                found.append(process)
        except (psutil.Error, OSError):
            continue
    return found


def test_renewals_keep_one_spare_per_node_and_replace_one_that_died(four_cpu_node: SimulatedCluster) -> None:
    runtime = ray.get_runtime_context()
    spares = inplace._WarmSpares()
    spares._facts = {
        "runtime_env": RuntimeEnv(env_vars={_ray_compat.SETUP_HOOK_ENV_VAR: inplace.WARM_HOOK}).serialize(),
        "job_id": runtime.get_job_id(),
        "resources": {"CPU": 1.0},
    }
    spares._wanted, spares._keep_alive_s = 1, KEEP_ALIVE_S
    node = four_cpu_node.node_id(0)
    env, job = spares._facts["runtime_env"], spares._facts["job_id"]

    spares._start_spares()
    first = _ray_compat.warm_spare(job, env, node)
    assert first is not None and first.pid is not None, "the new spare's process was not identified"
    for _ in range(4):  # each renewal after the last one's keep-alive ran out
        time.sleep(KEEP_ALIVE_S + 0.5)
        spares._start_spares()
        assert [p.pid for p in spare_processes()] == [first.pid]
    assert _ray_compat.warm_spare(job, env, node) == first

    os.kill(first.pid, signal.SIGKILL)  # the spare is gone: a renewal starts one once its raylet knows
    deadline = time.monotonic() + pace.bound(30)
    while (second := _ray_compat.warm_spare(job, env, node)) == first:
        assert time.monotonic() < deadline, "no new spare replaced the killed one"
        time.sleep(0.5)
        spares._start_spares()
    assert second is not None and second.pid not in (None, first.pid)
    assert [p.pid for p in spare_processes()] == [second.pid]
