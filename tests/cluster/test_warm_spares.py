"""Warm spares do not pile up: however often the run renews them, a node holds one warm spare
of the job (two for the few seconds a renewal takes), and one after the run ends."""

from __future__ import annotations

import pathlib
import tempfile
import threading
import time
from typing import Any

import psutil
import pytest
import ray

from ray_ckpt import _ray_compat
from ray_ckpt.testing import SimulatedCluster
from ray_ckpt.train import inplace

pytestmark = pytest.mark.cluster

KEEP_ALIVE_S = 20.0  # the run starts a new spare on the free node every 10 s


def spares_per_node() -> dict[str, set[int]]:
    """node id -> the pids of its idle worker processes started with in-place recovery's
    warm-up hook (warming up or waiting): the job's warm spares."""
    raylets = {str(n["RayletSocketName"]): str(n["NodeID"]) for n in ray.nodes() if n.get("Alive")}
    found: dict[str, set[int]] = {}
    for process in psutil.process_iter():
        try:
            if process.cmdline()[:1] != ["ray::IDLE"]:
                continue
            if process.environ().get(_ray_compat.SETUP_HOOK_ENV_VAR) != inplace.WARM_HOOK:
                continue
            parent = process.parent()
            if parent is None:
                continue
            raylet = next(a.split("=", 1)[1] for a in parent.cmdline() if a.startswith("--raylet_socket_name="))
            if raylet in raylets:
                found.setdefault(raylets[raylet], set()).add(process.pid)
        except (psutil.Error, OSError, StopIteration):
            continue
    return found


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("ray_tmpdir")
def test_renewed_warm_spares_leave_one_per_node_during_and_after_the_run(
    train_example: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 ranks packed on one four-CPU node, the other four-CPU node free: Ray would keep up to
    four idle workers there, so renewed spares would pile up if the replaced ones stayed. The
    ranks wait between steps (the example's pause file) through several renewals: the free
    node never holds more than two spare processes (a renewal's new one warming while the old
    one leaves) and, once they settle after the run, one."""
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    with SimulatedCluster(2, worker_cpus=4, store_budget_bytes=128 << 20):
        events = tempfile.mkdtemp()
        samples: list[dict[str, set[int]]] = []
        failures: list[BaseException] = []

        def hold_and_watch() -> None:
            pause = pathlib.Path(events) / train_example.PAUSE_FILE
            try:
                train_example.wait_committed("spares", 2)
                pause.touch()
                until = time.monotonic() + 2.5 * KEEP_ALIVE_S
                while time.monotonic() < until:
                    samples.append(spares_per_node())
                    time.sleep(0.5)
            except BaseException as error:  # surfaced by the test
                failures.append(error)
            finally:
                pause.unlink(missing_ok=True)

        thread = threading.Thread(target=hold_and_watch, daemon=True)
        thread.start()
        train_example.run(
            name="spares",
            storage_path=tempfile.mkdtemp(),
            events_dir=events,
            steps=6,
            workers=2,
            checkpoint={"data_shards": 1, "parity_shards": 1},
            step_sleep_s=0.0,
            in_place={"warm_spares": 1, "warm_keep_alive_s": KEEP_ALIVE_S},
        )
        thread.join(timeout=60)
        assert not failures, failures
        seen: dict[str, set[int]] = {}
        for sample in samples:
            for node, pids in sample.items():
                seen.setdefault(node, set()).update(pids)
        assert seen and max(len(pids) for pids in seen.values()) >= 3, seen  # the run renewed them
        assert max(len(pids) for sample in samples for pids in sample.values()) <= 2, samples
        time.sleep(inplace.SPARE_GRACE_S + 2 * inplace.SPARE_CHECK_S)
        settled = spares_per_node()
        assert all(len(pids) == 1 for pids in settled.values()), settled
