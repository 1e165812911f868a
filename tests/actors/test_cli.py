"""The ray-ckpt command line against a real local Ray head (one process, one node)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest
import ray
from support import pace

from ray_ckpt.tools.cli import format_status, main, parse_bytes
from ray_ckpt.transport import naming

BUDGET = 64 << 20


@pytest.fixture(scope="module")
def local_ray() -> Iterator[str]:
    """A one-node Ray head in this process, shared by the module's tests (each works in a
    namespace of its own), with a RAY_TMPDIR of its own; yields its GCS address."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", tempfile.mkdtemp(prefix="rck"))
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        try:
            yield str(ray.get_runtime_context().gcs_address)
        finally:
            ray.shutdown()


@pytest.fixture
def namespace() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"


def service_actors(namespace: str) -> list[str]:
    return [
        entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True) if entry["namespace"] == namespace
    ]


def test_no_cluster_at_address_fails_fast(ray_tmpdir: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert not ray.is_initialized()
    address = f"127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    assert main(["status", "--address", address]) == 1
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert err.startswith(f"ray-ckpt: error: no Ray cluster at {address}")
    assert len(err.strip().splitlines()) == 1
    assert not ray.is_initialized()


def test_start_status_stop(
    local_ray: str, namespace: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    common = ["--address", local_ray, "--namespace", namespace]
    caplog.set_level(logging.INFO, logger="ray_ckpt.service")
    assert main(["start", *common, "--budget-bytes", str(BUDGET)]) == 0
    out = capsys.readouterr().out
    assert "1 store(s)" in out
    assert "64.0 MiB" in out
    # the default code's margin on 1 node is information: a job warns at its first save, for its own code
    margins = [r for r in caplog.records if r.name == "ray_ckpt.service" and "survives 0 node loss" in r.getMessage()]
    assert [r.levelno for r in margins] == [logging.INFO]

    assert main(["status", "--json", *common]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["namespace"] == namespace
    assert report["registry"] == "alive"
    node_id = ray.get_runtime_context().get_node_id()
    assert set(report["nodes"]) == {node_id}
    store = report["nodes"][node_id]
    assert store["budget_bytes"] == BUDGET
    assert store["used_bytes"] == 0
    assert store["shards"] == 0
    assert report["jobs"] == {}

    assert main(["status", *common]) == 0
    table = capsys.readouterr().out
    assert node_id[:12] in table
    assert "64.0" in table
    assert "no jobs have checkpoints" in table

    # start is idempotent: the store keeps its budget and the user is told so
    assert main(["start", *common, "--budget-bytes", "128MiB"]) == 0
    captured = capsys.readouterr()
    assert "64.0 MiB" in captured.out
    assert "kept their budget" in captured.err

    assert main(["stop", *common]) == 0
    assert "removed 1 store(s) and the registry" in capsys.readouterr().out
    assert service_actors(namespace) == []
    with pytest.raises(ValueError):
        naming.registry_handle(namespace)

    # stopping again is harmless
    assert main(["stop", *common]) == 0
    assert "nothing to stop" in capsys.readouterr().out


def test_status_without_service_fails_with_one_line(
    local_ray: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra in ([], ["--json"]):
        assert main(["status", *extra, "--address", local_ray, "--namespace", namespace]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1
        assert lines[0].startswith("ray-ckpt: error: no ray_ckpt service is running in namespace")
        assert namespace in lines[0]
        assert "ray-ckpt start" in lines[0]
        assert "Traceback" not in captured.err


def test_ray_ckpt_error_is_one_line(local_ray: str, namespace: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["start", "--address", local_ray, "--namespace", namespace, "--budget-fraction", "2"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.strip() == "ray-ckpt: error: store_budget_fraction must be in (0, 0.9], got 2.0"
    assert service_actors(namespace) == []


def save_one_step(job: str, namespace: str) -> None:
    """Commit step 0 of ``job`` (one rank, RS(1,1): both shards fit on the one node)."""
    import torch

    from ray_ckpt import CheckpointConfig, Checkpointer

    ckpt = Checkpointer(
        job=job, rank=0, world_size=1, config=CheckpointConfig(data_shards=1, parity_shards=1), namespace=namespace
    )
    try:
        ckpt.save(0, {"w": torch.arange(1000, dtype=torch.float32)}).wait(timeout_s=pace.bound(60))
    finally:
        ckpt.close()


def test_drop_removes_one_job_and_leaves_the_others(
    local_ray: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--address", local_ray, "--namespace", namespace]
    assert main(["start", *common, "--budget-bytes", str(BUDGET)]) == 0
    for job in ("doomed", "kept"):
        save_one_step(job, namespace)
    capsys.readouterr()

    assert main(["drop", "doomed", *common]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == (
        f"dropped job 'doomed' in namespace {namespace!r}: its checkpoints are gone from the registry and stores"
    )
    assert captured.err == ""
    assert main(["status", "--json", *common]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["jobs"]) == {"kept"}
    assert report["jobs"]["kept"]["committed_steps"] == [0]
    (store,) = report["nodes"].values()
    assert set(store["jobs"]) == {"kept"}

    # an unknown job (or one dropped already) is one line naming it, status 1
    assert main(["drop", "doomed", *common]) == 1
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ray-ckpt: error: job 'doomed' has no checkpoints")
    assert "Traceback" not in captured.err and captured.out == ""
    assert main(["stop", *common]) == 0


def test_drop_without_service_fails_with_one_line(
    local_ray: str, namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["drop", "any", "--address", local_ray, "--namespace", namespace]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"ray-ckpt: error: no ray_ckpt registry in namespace {namespace!r}")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_cli_process_connects_by_address(local_ray: str, namespace: str) -> None:
    """The real entry point, in its own process, connecting through --address."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    common = ["--address", local_ray, "--namespace", namespace]
    command = [sys.executable, "-m", "ray_ckpt.tools.cli"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *args, *common], capture_output=True, text=True, timeout=pace.bound(120), env=env, check=False
        )

    started = run("start", "--budget-bytes", "32MiB")
    assert started.returncode == 0, started.stderr
    status = run("status", "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert [n["budget_bytes"] for n in report["nodes"].values()] == [32 << 20]
    stopped = run("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert service_actors(namespace) == []


def test_help_lists_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("start", "status", "stop", "drop", "kill-node", "dashboard"):
        assert command in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1048576", 1 << 20), ("512MiB", 512 << 20), ("1.5GiB", 3 << 29), ("2g", 2 << 30), ("64 KiB", 64 << 10)],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


def test_status_text_marks_degraded_and_lost_protection() -> None:
    """A job whose latest step survives fewer node losses than parity_shards reads DEGRADED;
    a full one shows its number only; a lost one says so."""
    report = {
        "namespace": "ns",
        "registry": "alive",
        "nodes": {},
        "jobs": {
            name: {
                "world_size": 2,
                "committed_steps": [4],
                "latest_committed": 4,
                "staged": {},
                "protection": protection,
                "full_protection": 2,
            }
            for name, protection in (("full", 2), ("shrunk", 1), ("lost", -1))
        },
    }
    rows = {line.split()[0]: line for line in format_status(report).splitlines() if line.split()[:1]}
    assert "DEGRADED" not in rows["full"] and " 2 " in rows["full"]
    assert "1 of 2, DEGRADED" in rows["shrunk"]
    assert "LOST" in rows["lost"]
