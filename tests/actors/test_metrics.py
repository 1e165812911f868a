"""ray_ckpt's Ray metrics on a real one-node Ray head: a save and a restore show up at the node's
Prometheus endpoint (Ray prefixes our ``ckpt_*`` names with ``ray_``)."""

from __future__ import annotations

import re
import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
import ray
import torch
from support import pace

import ray_ckpt
from ray_ckpt import CheckpointConfig
from ray_ckpt.transport import metrics

BUDGET = 64 << 20
_SERIES = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def metrics_port(ray_tmpdir: str) -> Iterator[int]:
    """A one-node Ray head in this process exporting metrics on a free port (every second)."""
    port = _free_port()
    ray.init(
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        _metrics_export_port=port,
        _system_config={"metrics_report_interval_ms": 1000},
    )
    try:
        yield port
    finally:
        ray.shutdown()


def _scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=pace.bound(5)).read().decode()
    series = []
    for line in text.splitlines():
        match = _SERIES.match(line)
        if match and not line.startswith("#"):
            labels = dict(_LABEL.findall(match["labels"] or ""))
            series.append((match["name"], labels, float(match["value"])))
    return series


def _wait_for(
    port: int, wanted: dict[str, dict[str, str]], timeout_s: float = pace.bound(45.0)
) -> list[tuple[str, dict, float]]:
    """Scrape until every wanted series name has a sample with the wanted labels."""
    deadline = time.monotonic() + timeout_s
    missing: list[str] = list(wanted)
    series: list[tuple[str, dict, float]] = []
    while time.monotonic() < deadline:
        try:
            series = _scrape(port)
        except OSError:  # the metrics agent is still starting
            series = []
        missing = [
            name
            for name, labels in wanted.items()
            if not any(n == name and all(got.get(k) == v for k, v in labels.items()) for n, got, _ in series)
        ]
        if not missing:
            return series
        time.sleep(1.0)
    ours = sorted({n for n, _, _ in series if n.startswith("ray_ckpt_")})
    pytest.fail(f"metrics {missing} did not appear within {timeout_s:.0f}s; ray_ckpt series seen: {ours}")


def _value(series: list[tuple[str, dict, float]], name: str, **labels: str) -> float:
    values = [v for n, got, v in series if n == name and all(got.get(k) == x for k, x in labels.items())]
    assert values, f"no {name} with {labels}"
    return max(values)


def test_save_and_restore_are_exported(metrics_port: int) -> None:
    namespace = f"metrics-{uuid.uuid4().hex[:8]}"
    job = f"job-{uuid.uuid4().hex[:6]}"
    ray_ckpt.start(store_budget_bytes=BUDGET, namespace=namespace)
    node_id = ray.get_runtime_context().get_node_id()
    config = CheckpointConfig(data_shards=1, parity_shards=0, local_copy=True)
    state = {"w": torch.arange(4096, dtype=torch.float32)}
    saver = ray_ckpt.Checkpointer(job=job, rank=0, world_size=1, config=config, namespace=namespace)
    saver.save(0, state).wait(timeout_s=pace.bound(60))
    saver.close()
    restorer = ray_ckpt.Checkpointer(job=job, rank=0, world_size=1, config=config, namespace=namespace)
    restored = restorer.restore()
    restorer.close()
    assert restored is not None and restored.step == 0
    assert torch.equal(restored.state["w"], state["w"])

    series = _wait_for(
        metrics_port,
        {
            "ray_ckpt_save_blocking_seconds_count": {"ckpt_job": job, "node_id": node_id},
            "ray_ckpt_save_phase_seconds_count": {"ckpt_job": job, "phase": "scatter"},
            "ray_ckpt_restore_phase_seconds_count": {"ckpt_job": job, "phase": "load"},
            "ray_ckpt_restores_total": {"ckpt_job": job, "source": restored.source},
            "ray_ckpt_committed_step": {"ckpt_job": job},
            "ray_ckpt_protection": {"ckpt_job": job},
            "ray_ckpt_store_used_bytes": {"node_id": node_id},
            "ray_ckpt_store_budget_bytes": {"node_id": node_id},
        },
    )
    assert _value(series, "ray_ckpt_save_blocking_seconds_count", ckpt_job=job) >= 1
    assert _value(series, "ray_ckpt_save_blocking_seconds_sum", ckpt_job=job) > 0
    assert _value(series, "ray_ckpt_restore_phase_seconds_count", ckpt_job=job, phase="load") >= 1
    assert _value(series, "ray_ckpt_committed_step", ckpt_job=job) == 0
    assert _value(series, "ray_ckpt_protection", ckpt_job=job) == 0  # k=1, m=0: one more failure may lose it
    assert _value(series, "ray_ckpt_store_budget_bytes", node_id=node_id) == BUDGET
    assert _value(series, "ray_ckpt_store_used_bytes", node_id=node_id) > 0
    # every exported ray_ckpt series is one we define
    defined = set()
    for d in metrics.DEFINITIONS:
        base = "ray_" + d.name
        defined |= {base + s for s in ("_bucket", "_sum", "_count")} if d.kind == "histogram" else {base}
    exported = {n for n, _, _ in series if n.startswith("ray_ckpt_")}
    assert exported <= defined, exported - defined
    ray_ckpt.shutdown(namespace=namespace)


def test_metrics_never_raise() -> None:
    metrics.observe_event({"kind": "save", "phases_s": {"blocking": "not a number"}})
    metrics.observe_event({"kind": "restore", "step": "x"})
    metrics.observe_event({})
    metrics.observe_store({"no": "node id"})
    metrics.observe_job("job", None, None)
    metrics.observe_committed("job", 1, {0: {"metas": {}, "nodes": {}}})
    assert metrics.protection({}) is None
