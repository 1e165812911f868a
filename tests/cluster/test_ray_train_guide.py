"""docs/ray-train.md runs as written: its code blocks, in order, on a simulated cluster.

The python blocks share one namespace (as one Python session would); the bash blocks run as
shell commands in between, in the same folder, against the same cluster. The guide's job is an
experiment named 'team/exp1', so this also proves that a name with '/' works end to end and
that the ``job=`` override reads another run's state.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest

from ray_ckpt import _ray_compat
from ray_ckpt.core import events, timeline
from ray_ckpt.testing import SimulatedCluster
from ray_ckpt.tools import quiet

pytestmark = pytest.mark.cluster

GUIDE = pathlib.Path(__file__).parents[2] / "docs" / "ray-train.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks() -> list[tuple[str, str]]:
    """(language, code) of every fenced block of the guide, in order."""
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(GUIDE.read_text())]


def test_the_guide_has_only_blocks_this_test_runs() -> None:
    found = blocks()
    assert found and {language for language, _ in found} <= {"python", "bash"}, found
    assert sum(language == "python" for language, _ in found) >= 5


@pytest.mark.timeout(600)
def test_every_block_of_the_guide_runs_and_the_job_recovers(
    ray_tmpdir: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guide's job (DDP, 2 workers, RS(2,1), experiment 'team/exp1') loses the node of
    rank 1 after step 3: Ray Train restarts it, it resumes from peer memory and finishes; the
    events file is where the guide put it, its timeline has that recovery with every phase;
    the CLI blocks succeed; the evaluation run reads the job's last step through ``job=``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")  # fast restarts (see the guide)
    # the guide connects (ray.init()) and starts the service itself
    cluster = SimulatedCluster(
        4,
        connect=False,
        start_service=False,
        head_object_store_bytes=200 << 20,
        worker_object_store_bytes=150 << 20,
    )
    monkeypatch.setenv("RAY_ADDRESS", cluster.address)  # the guide's ray.init() connects here
    bin_dir = str(pathlib.Path(sys.executable).parent)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")  # ray-ckpt
    namespace: dict[str, Any] = {"__name__": "ray_train_guide"}  # not importable: pickled by value
    # the guide quiets its driver (ray_ckpt.tools.quiet): this process's later tests get it back
    for name in quiet.RAY_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    printer = _ray_compat.driver_printer()
    try:
        for index, (language, code) in enumerate(blocks()):
            if language == "python":
                exec(compile(code, f"{GUIDE.name} block {index}", "exec"), namespace)
            else:
                run = subprocess.run(["bash", "-euo", "pipefail", "-c", code], capture_output=True, text=True)
                assert run.returncode == 0, (code, run.stdout, run.stderr)
        assert namespace["result"].error is None
        job = namespace["JOB"]
        assert job == "team%2Fexp1"
        recorded = events.read(tmp_path / "events.jsonl")
        kills = [e for e in recorded if e["kind"] == "kill"]
        assert len(kills) == 1, kills
        recoveries = [r for r in timeline.recoveries(recorded) if r.kill_time is not None]
        assert len(recoveries) == 1, recoveries
        recovery = recoveries[0]
        assert recovery.job == job and not recovery.failed and recovery.step >= 3
        assert set(recovery.sources) == {"0", "1"}
        assert set(recovery.sources.values()) <= {"local", "peers"}, recovery
        assert recovery.mode == "restart"
        in_place_only = {"replace", "rendezvous"}
        assert all(recovery.phases_s[p] is None for p in in_place_only), recovery
        assert all(s is not None for p, s in recovery.phases_s.items() if p not in in_place_only), recovery
        # the evaluation run (job=JOB, another experiment name) restored the job's last step
        last = namespace["trainer"].train_loop_config["steps"] - 1
        evaluated = [e for e in recorded if e["kind"] == "restore" and e.get("job") == job and e["step"] == last]
        assert len({e["attempt"] for e in evaluated}) == 1 and len(evaluated) == 2, evaluated
        assert (tmp_path / "report.html").stat().st_size > 0
    finally:
        if printer is not None:
            _ray_compat.set_driver_printer(printer)
        cluster.shutdown()  # disconnects this process too
