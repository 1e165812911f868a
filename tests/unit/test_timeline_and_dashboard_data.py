"""The dashboard's data (what /api/data serves) from a recorded events file; no Ray, no browser."""

from __future__ import annotations

import json
import pathlib
import urllib.request

import pytest
import recorded_events

from ray_ckpt import events, timeline
from ray_ckpt.dashboard import data as dashboard_data
from ray_ckpt.dashboard import server


@pytest.fixture
def events_file(tmp_path: pathlib.Path) -> pathlib.Path:
    return recorded_events.write(tmp_path / "events-ray_ckpt.jsonl")


def test_one_recovery_per_failure_with_the_recorded_phases(events_file: pathlib.Path) -> None:
    data = dashboard_data.build(events.read(events_file))
    assert data["live"] is False
    assert data["phases"] == list(timeline.PHASES)
    assert len(data["recoveries"]) == len(recorded_events.EXPECTED) == 2
    for got, want in zip(data["recoveries"], recorded_events.EXPECTED):
        assert got["job"] == recorded_events.JOB
        assert got["attempt"] == want["attempt"]
        assert got["kill_time"] == pytest.approx(want["kill_time"])
        assert got["killed_nodes"] == want["killed_nodes"]
        assert got["step"] == want["step"]
        assert got["steps_lost"] == want["steps_lost"]
        assert set(got["phases_s"]) == set(timeline.PHASES)
        for phase, seconds in want["phases_s"].items():
            assert got["phases_s"][phase] == pytest.approx(seconds, abs=1e-6), phase
        assert got["time_to_resume_s"] == pytest.approx(want["time_to_resume_s"], abs=1e-6)
        assert got["phases_total_s"] == pytest.approx(sum(want["phases_s"].values()), abs=1e-6)
        assert got["other_s"] == pytest.approx(max(0.0, got["time_to_resume_s"] - got["phases_total_s"]), abs=1e-9)
    # the same records as timeline.recoveries, plus the dashboard's own fields
    for got, plain in zip(data["recoveries"], timeline.recoveries(events.read(events_file))):
        assert {k: got[k] for k in plain} == plain


def test_series_and_summary(events_file: pathlib.Path) -> None:
    records = events.read(events_file)
    data = dashboard_data.build(records)
    summary = data["summary"]
    assert summary["kills"] == 4  # three node kills (two failures) and one store-only kill
    assert summary["node_deaths"] == 3
    assert summary["recoveries"] == 2
    assert summary["restores"] == 12
    assert summary["jobs"] == [recorded_events.JOB]
    assert [k["mode"] for k in data["kills"]] == ["node", "node", "node", "store"]
    # time to resume over time: one point per recovery, at its kill time
    assert [p["value"] for p in data["time_to_resume"]] == pytest.approx([8.3, 9.3])
    assert [p["time"] for p in data["time_to_resume"]] == pytest.approx(
        [r["kill_time"] for r in recorded_events.EXPECTED]
    )
    # save stall: every recorded save, with its blocking phase
    saves = [e for e in records if e["kind"] == "save"]
    assert len(data["save_stall"]) == len(saves) == 4 * 4 + 3 * 4 + 2 * 4
    by_key = {(s["attempt"], s["rank"], s["step"]): s["blocking_s"] for s in data["save_stall"]}
    for save in saves:
        assert by_key[(save["attempt"], save["rank"], save["step"])] == save["phases_s"]["blocking"]
    # live-only parts are absent without a cluster (the page says "live cluster needed")
    assert data["memory"] is None and data["placement"] is None and data["protection"] is None
    json.dumps(data, allow_nan=False)  # JSON as served


def test_no_events_and_broken_lines(tmp_path: pathlib.Path) -> None:
    empty = dashboard_data.build([])
    assert empty["recoveries"] == [] and empty["time_to_resume"] == [] and empty["save_stall"] == []
    path = recorded_events.write(tmp_path / "events.jsonl")
    with path.open("a") as out:
        out.write('{"kind": "save", "job": "gpt-small", "ti')  # cut by a crash
    assert len(dashboard_data.build(events.read(path))["recoveries"]) == 2


def test_live_part_placement_memory_protection() -> None:
    nodes = recorded_events.NODES
    meta = {"data_shards": 2, "parity_shards": 1}
    ranks = {
        0: {"metas": {0: meta, 1: meta, 2: meta}, "nodes": {0: nodes[1], 1: nodes[2], 2: nodes[3]}, "local": None},
        1: {
            "metas": {0: meta, 1: meta, 2: meta},
            "nodes": {0: nodes[2], 1: nodes[3], 2: nodes[4]},
            "local": meta,
            "local_node": nodes[1],
        },
    }
    alive = [nodes[1], nodes[3], nodes[4]]  # node 2 died
    status = {
        "namespace": "ns",
        "registry": "alive",
        "nodes": {
            n: {"node_id": n, "used_bytes": 10, "budget_bytes": 100, "shards": 2, "jobs": {"j": 10}} for n in alive
        },
        "jobs": {"j": {"committed_steps": [4, 5], "latest_committed": 5, "protection": 0, "world_size": 2}},
    }
    data = dashboard_data.build(
        [], {"status": status, "alive": alive, "placements": {"j": {"step": 5, "ranks": ranks}}}
    )
    assert data["live"] is True
    assert [m["node_id"] for m in data["memory"]] == sorted(alive)
    assert data["protection"]["j"]["value"] == 0
    placement = data["placement"]["j"]
    assert placement["step"] == 5 and placement["data_shards"] == 2 and placement["parity_shards"] == 1
    assert placement["protection"] == 0  # each rank has 2 live shards of 3, k = 2
    assert placement["nodes"][-1] == {"node_id": nodes[2], "alive": False}  # dead nodes last
    lost = [(c["rank"], c["indices"]) for c in placement["cells"] if c["lost"]]
    assert lost == [(0, [1]), (1, [0])]
    local = [c for c in placement["cells"] if c["local"]]
    assert [(c["rank"], c["node_id"], c["indices"]) for c in local] == [(1, nodes[1], [])]


def test_export_is_one_self_contained_file(events_file: pathlib.Path, tmp_path: pathlib.Path) -> None:
    dashboard = server.Dashboard(server.EventFiles([str(events_file)]))
    page = server.export_html(dashboard.data())
    assert "window.RAY_CKPT_DATA = " in page
    assert 'src="static/' not in page and 'href="static/' not in page  # JS and CSS inlined
    assert "<style>" in page and "function renderRecoveries" in page
    start = page.index("window.RAY_CKPT_DATA = ") + len("window.RAY_CKPT_DATA = ")
    inlined = json.loads(page[start : page.index(";</script>", start)])
    assert len(inlined["recoveries"]) == 2


def test_server_routes(events_file: pathlib.Path) -> None:
    httpd = server.serve_in_thread(server.Dashboard(server.EventFiles([str(events_file)])))
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        page = urllib.request.urlopen(f"{base}/", timeout=10).read().decode()
        assert 'id="errors"' in page and "static/app.js" in page
        for name in ("app.js", "style.css"):
            assert urllib.request.urlopen(f"{base}/static/{name}", timeout=10).status == 200
        data = json.loads(urllib.request.urlopen(f"{base}/api/data", timeout=10).read())
        assert len(data["recoveries"]) == 2 and data["sources"] == [events_file.name]
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/static/../server.py", timeout=10)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_missing_events_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(server.DashboardError, match="no events file"):
        server.EventFiles([str(tmp_path / "nope.jsonl")])
