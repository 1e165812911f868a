"""How events map to ray_ckpt's metrics (with recording fakes instead of Ray's metric objects)."""

from __future__ import annotations

import collections
from typing import Any

import pytest
from support import recorded_events
from support.shard_metas import shard_metas

from ray_ckpt.core import timeline
from ray_ckpt.core.wire import RankRecord, StoreStats
from ray_ckpt.transport import metrics


class _Fake:
    def __init__(self, name: str, calls: list[tuple[str, str, float, dict[str, str]]]) -> None:
        self.name = name
        self.calls = calls

    def observe(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("observe", self.name, value, tags))

    def set(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("set", self.name, value, tags))

    def inc(self, value: float, tags: dict[str, str]) -> None:
        self.calls.append(("inc", self.name, value, tags))


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, float, dict[str, str]]]:
    recorded: list[tuple[str, str, float, dict[str, str]]] = []
    monkeypatch.setattr(metrics, "_metrics", {d.name: _Fake(d.name, recorded) for d in metrics.DEFINITIONS})
    monkeypatch.setattr(metrics, "_recoveries", timeline.LiveRecoveries())
    monkeypatch.setattr(metrics, "_store_jobs", {})
    monkeypatch.setattr(metrics, "_gauges", {})
    monkeypatch.setattr(metrics, "_start_refresher", lambda: None)
    return recorded


def _of(calls: list[Any], name: str) -> list[tuple[float, dict[str, str]]]:
    return [(value, tags) for _, n, value, tags in calls if n == name]


def test_definitions_are_consistent() -> None:
    assert len(set(metrics.NAMES)) == len(metrics.NAMES)
    for d in metrics.DEFINITIONS:
        assert d.name.startswith("ckpt_") and not d.name.startswith("ray_")
        assert d.kind in ("counter", "gauge", "histogram")
        assert (d.kind == "counter") == d.name.endswith("_total")
        assert (d.kind == "histogram") == bool(d.boundaries)
        assert all(b > 0 for b in d.boundaries) and list(d.boundaries) == sorted(d.boundaries)
        assert "ckpt_job" in d.tags or "node_id" in d.tags or d.tags == ("kind",)
        assert "job" not in d.tags  # Prometheus' own target label: ours would become exported_job


def test_recorded_events_map_to_metrics(calls: list[Any]) -> None:
    for event in recorded_events.records():
        metrics.observe_event(event)
    job = recorded_events.JOB
    # saves: every recorded save's blocking time, tagged with its job and node
    blocking = _of(calls, "ckpt_save_blocking_seconds")
    saves = [e for e in recorded_events.records() if e["kind"] == "save"]
    assert [v for v, _ in blocking] == [e["phases_s"]["blocking"] for e in saves]
    assert {(t["ckpt_job"], t["node_id"]) for _, t in blocking} == {(job, recorded_events.NODES[r]) for r in range(4)}
    phases = collections.Counter(t["phase"] for _, t in _of(calls, "ckpt_save_phase_seconds"))
    assert phases == {p: len(saves) for p in ("wait_previous", "snapshot", "blocking", "encode", "scatter", "stage")}
    # restores: 8 ranks restored a step (the first attempt's 4 restores found nothing)
    assert len(_of(calls, "ckpt_restores_total")) == 8
    assert collections.Counter(t["phase"] for _, t in _of(calls, "ckpt_restore_phase_seconds")) == {
        p: 8 for p in ("locate", "fetch", "decode", "load")
    }
    # steps lost counted once per recovery, not once per rank
    assert sum(v for v, _ in _of(calls, "ckpt_steps_lost_total")) == 3 + 2
    # kills by mode, node deaths
    kills = _of(calls, "ckpt_kills_total")
    assert collections.Counter(t["mode"] for _, t in kills) == {"node": 3, "store": 1}
    assert len(_of(calls, "ckpt_node_deaths_total")) == 3
    # one time to resume per recovery, as the timeline computes it
    resume = _of(calls, "ckpt_time_to_resume_seconds")
    assert [v for v, _ in resume] == pytest.approx([r["time_to_resume_s"] for r in recorded_events.EXPECTED])
    assert len(_of(calls, "ckpt_recoveries_total")) == 2
    last = {t["phase"]: v for v, t in _of(calls, "ckpt_last_recovery_phase_seconds")[-len(timeline.PHASES) :]}
    expected = dict.fromkeys(timeline.PHASES, 0.0) | recorded_events.EXPECTED[-1]["phases_s"]
    assert last == pytest.approx(expected)  # a phase the recovery did not have reads 0
    assert sorted(t["kind"] for _, t in _of(calls, "ckpt_events_total")) == sorted(
        e["kind"] for e in recorded_events.records()
    )


def test_store_and_job_gauges(calls: list[Any]) -> None:
    metrics.observe_store(
        StoreStats("n1", 1000, used_bytes=300, data_bytes=300, metadata_bytes=0, shards=3, jobs={"a": 200, "b": 100})
    )
    metrics.observe_store(
        StoreStats("n1", 1000, used_bytes=200, data_bytes=200, metadata_bytes=0, shards=2, jobs={"a": 200})
    )
    assert _of(calls, "ckpt_store_used_bytes")[-1] == (200, {"node_id": "n1"})
    assert _of(calls, "ckpt_store_budget_bytes")[-1] == (1000, {"node_id": "n1"})
    # a job the store no longer holds drops to 0 rather than keeping its last value
    assert (0, {"node_id": "n1", "ckpt_job": "b"}) in _of(calls, "ckpt_store_job_bytes")

    metas = dict(enumerate(shard_metas("a", 7, 0, 1, data_shards=2, parity_shards=1)))
    ranks = {0: RankRecord(metas, {0: "n1", 1: "n2", 2: "n3"})}
    metrics.observe_committed("a", 7, ranks)
    assert _of(calls, "ckpt_committed_step")[-1] == (7, {"ckpt_job": "a"})
    assert _of(calls, "ckpt_protection")[-1] == (1, {"ckpt_job": "a"})
    metrics.observe_committed("a", 7, ranks, live_nodes={"n1", "n3"})
    assert _of(calls, "ckpt_protection")[-1] == (0, {"ckpt_job": "a"})
    metrics.observe_backup("a", 123, node_id="n1")
    assert _of(calls, "ckpt_backups_total") == [(1.0, {"ckpt_job": "a", "node_id": "n1"})]
    assert _of(calls, "ckpt_backup_bytes_total") == [(123.0, {"ckpt_job": "a", "node_id": "n1"})]


def test_broken_metric_objects_never_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("metrics backend down")

    monkeypatch.setattr(metrics, "_metrics", {name: Broken() for name in metrics.NAMES})
    monkeypatch.setattr(metrics, "_recoveries", timeline.LiveRecoveries())
    monkeypatch.setattr(metrics, "_gauges", {})
    monkeypatch.setattr(metrics, "_start_refresher", lambda: None)
    for event in recorded_events.records():
        metrics.observe_event(event)
    metrics.observe_store(StoreStats("n", 2, used_bytes=1, data_bytes=1, metadata_bytes=0, shards=1, jobs={}))
    metrics.observe_job("j", 1, 1)
    metrics.observe_backup("j", 1, node_id="n")


def test_the_interval_every_auto_chose_is_a_gauge_per_job(calls: list[Any]) -> None:
    for interval in (4, 16):
        metrics.observe_event({"kind": "interval", "job": "j", "rank": 0, "interval": interval, "reason": "optimum"})
    assert _of(calls, "ckpt_save_interval_steps") == [(4, {"ckpt_job": "j"}), (16, {"ckpt_job": "j"})]
