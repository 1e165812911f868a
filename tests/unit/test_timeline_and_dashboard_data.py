"""The dashboard's data (what /api/data serves) from a recorded events file; no Ray, no browser."""

from __future__ import annotations

import json
import pathlib
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest
from support import recorded_events

from ray_ckpt.core import events, timeline
from ray_ckpt.core.nodes import RayNode
from ray_ckpt.dashboard import data as dashboard_data
from ray_ckpt.dashboard import server


@pytest.fixture
def events_file(tmp_path: pathlib.Path) -> pathlib.Path:
    return recorded_events.write(tmp_path / "events-ray_ckpt.jsonl")


def test_one_recovery_per_failure_with_the_recorded_phases(events_file: pathlib.Path) -> None:
    """Two resumed recoveries with their phases, and the world-size failure as a failed one with its error."""
    data = dashboard_data.build(events.read(events_file))
    assert data["live"] is False
    assert data["phases"] == list(timeline.PHASES)
    assert len(data["recoveries"]) == len(recorded_events.EXPECTED_ALL) == 3
    for got, want in zip(data["recoveries"], recorded_events.EXPECTED_ALL):
        assert got["job"] == recorded_events.JOB
        assert got["attempt"] == want["attempt"]
        assert got["kill_time"] == pytest.approx(want["kill_time"])
        assert got["killed_nodes"] == want["killed_nodes"]
        assert got["step"] == want["step"]
        assert got["steps_lost"] == want["steps_lost"]
        assert got["failed"] is want.get("failed", False)
        assert got["error"] == want.get("error")
        assert set(got["phases_s"]) == set(timeline.PHASES)
        for phase in timeline.PHASES:
            if phase in want["phases_s"]:
                assert got["phases_s"][phase] == pytest.approx(want["phases_s"][phase], abs=1e-6), phase
            else:  # a failed restore measured no restore phase and no first step
                assert got["phases_s"][phase] is None, phase
        assert got["phases_total_s"] == pytest.approx(sum(want["phases_s"].values()), abs=1e-6)
        if want["time_to_resume_s"] is None:
            assert got["time_to_resume_s"] is None and got["other_s"] is None
        else:
            assert got["time_to_resume_s"] == pytest.approx(want["time_to_resume_s"], abs=1e-6)
            assert got["other_s"] == pytest.approx(max(0.0, got["time_to_resume_s"] - got["phases_total_s"]), abs=1e-9)
        restore_phases = [got["phases_s"][p] or 0.0 for p in timeline.RESTORE_PHASES]
        assert got["restore_total_s"] == pytest.approx(sum(restore_phases), abs=1e-9)
    failed = data["recoveries"][2]
    assert failed["errors"] == {str(rank): recorded_events.WORLD_SIZE_ERROR for rank in range(3)}
    # the same records as timeline.recoveries, plus the dashboard's own fields
    for got, recovery in zip(data["recoveries"], timeline.recoveries(events.read(events_file))):
        plain = recovery.as_dict()
        assert {k: got[k] for k in plain} == plain


def test_series_and_summary(events_file: pathlib.Path) -> None:
    records = events.read(events_file)
    data = dashboard_data.build(records)
    summary = data["summary"]
    assert summary["kills"] == 5  # four node kills (three failures) and one store-only kill
    assert summary["node_deaths"] == 4
    assert summary["recoveries"] == 2  # resumed
    assert summary["failed_recoveries"] == 1  # the world-size error is not counted as a recovery
    assert summary["restores"] == 15
    assert summary["status_snapshots"] == 9
    assert summary["jobs"] == [recorded_events.JOB]
    assert [k["mode"] for k in data["kills"]] == ["node", "node", "node", "store", "node"]
    # time to resume over time: one point per resumed recovery, at its kill time
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
    json.dumps(data, allow_nan=False)  # JSON as served


def test_the_newest_interval_every_auto_chose_is_kept_per_job() -> None:
    records = [
        events.event("interval", time=1.0, job="a", rank=0, interval=1, reason="warm-up"),
        events.event("interval", time=2.0, job="b", rank=0, interval=8, reason="keep-up"),
        events.event("interval", time=3.0, job="a", rank=1, interval=16, reason="optimum"),
    ]
    intervals = dashboard_data.build(records)["intervals"]
    assert intervals == {
        "a": {"interval": 16, "reason": "optimum", "rank": 1, "time": 3.0},
        "b": {"interval": 8, "reason": "keep-up", "rank": 0, "time": 2.0},
    }
    assert dashboard_data.build([])["intervals"] == {}


def test_memory_protection_placement_from_the_newest_status_snapshot(events_file: pathlib.Path) -> None:
    """Without a cluster, the newest status event gives memory, protection and placement; shards on
    nodes killed or dead after it (store of node 3, node 2) count as lost."""
    nodes, hosts = recorded_events.NODES, recorded_events.HOSTS
    data = dashboard_data.build(events.read(events_file))
    snapshot_time = recorded_events.T0 + 74.35
    assert data["memory_source"] == {"source": "snapshot", "time": pytest.approx(snapshot_time), "job": "gpt-small"}
    memory = {m["node_id"]: m for m in data["memory"]}
    assert set(memory) == {nodes[i] for i in recorded_events.SURVIVORS}
    assert memory[nodes[0]]["used_bytes"] == 2 * (4 * recorded_events.SHARD_BYTES + 4 * recorded_events.SHARD_BYTES)
    assert memory[nodes[0]]["budget_bytes"] == recorded_events.BUDGET and memory[nodes[0]]["alive"] is True
    assert memory[nodes[3]]["error"] == "killed after the snapshot" and memory[nodes[3]]["used_bytes"] is None
    assert memory[nodes[2]]["alive"] is False

    placement = data["placement"][recorded_events.JOB]
    assert placement["source"] == "snapshot" and placement["step"] == recorded_events.LAST_SNAPSHOT_STEP
    assert (placement["data_shards"], placement["parity_shards"]) == (4, 2)
    assert placement["ranks"] == [0, 1, 2, 3]
    lost = {(c["rank"], c["node_id"]): c["indices"] for c in placement["cells"] if c["lost"]}
    want = {(r, nodes[n]): i for r, by_node in recorded_events.LOST_AFTER_SNAPSHOT.items() for n, i in by_node.items()}
    assert lost == want
    local = sorted((c["rank"], c["node_id"]) for c in placement["cells"] if c["local"])
    assert local == [(0, nodes[0]), (1, nodes[1]), (2, nodes[2]), (3, nodes[3])]
    gone = {n["node_id"]: (n["alive"], n["store"]) for n in placement["nodes"] if not n["store"]}
    assert gone == {nodes[3]: (True, False), nodes[2]: (False, False)}

    protection = data["protection"][recorded_events.JOB]
    assert protection["recorded"] == 1  # when step 60 committed: 6 shards on 5 nodes, one node holds two
    assert protection["value"] == -1  # ranks 1 and 2 kept 3 of their 6 shards (k = 4) after nodes 2 and 3
    assert protection["value"] == placement["protection"]
    assert protection["latest_committed"] == 60 and protection["world_size"] == 4

    # every node with its host, and the ranks that last ran there
    assert {n: info["host"] for n, info in data["nodes"].items()} == dict(zip(nodes, hosts))
    ranks = {n: [(r["job"], r["rank"]) for r in info["ranks"]] for n, info in data["nodes"].items() if info["ranks"]}
    job = recorded_events.JOB
    assert ranks == {nodes[0]: [(job, 0)], nodes[1]: [(job, 1)], nodes[7]: [(job, 2)], nodes[3]: [(job, 3)]}
    assert data["nodes"][nodes[2]]["alive"] is False and data["nodes"][nodes[0]]["alive"] is True


def test_no_snapshot_no_cluster_leaves_memory_protection_placement_empty(events_file: pathlib.Path) -> None:
    """Without status events and without a cluster those parts are None (the page says so)."""
    data = dashboard_data.build([e for e in events.read(events_file) if e["kind"] != "status"])
    assert data["memory"] is None and data["placement"] is None and data["protection"] is None
    assert data["nodes"][recorded_events.NODES[0]]["host"] is None  # no host without a snapshot
    assert len(data["recoveries"]) == 3


def test_no_events_and_broken_lines(tmp_path: pathlib.Path) -> None:
    empty = dashboard_data.build([])
    assert empty["recoveries"] == [] and empty["time_to_resume"] == [] and empty["save_stall"] == []
    path = recorded_events.write(tmp_path / "events.jsonl")
    with path.open("a") as out:
        out.write('{"kind": "save", "job": "gpt-small", "ti')  # cut by a crash
    assert len(dashboard_data.build(events.read(path))["recoveries"]) == 3


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
    ray_nodes = [
        RayNode.from_ray(
            {"NodeID": n, "Alive": n in alive, "NodeManagerHostname": f"host-{i}", "NodeManagerAddress": f"10.1.0.{i}"}
        )
        for i, n in enumerate(nodes)
    ]
    snapshot = recorded_events.records()  # recorded snapshots: the live cluster takes precedence
    data = dashboard_data.build(
        snapshot,
        {"status": status, "alive": alive, "placements": {"j": {"step": 5, "ranks": ranks}}, "ray_nodes": ray_nodes},
    )
    assert data["live"] is True
    assert [m["node_id"] for m in data["memory"]] == sorted(alive)
    assert data["memory_source"]["source"] == "live"
    assert set(data["protection"]) == {"j"} and data["protection"]["j"]["value"] == 0
    assert data["nodes"][nodes[1]]["host"] == "host-1" and data["nodes"][nodes[1]]["address"] == "10.1.0.1"
    assert data["nodes"][nodes[2]]["alive"] is False
    placement = data["placement"]["j"]
    assert placement["step"] == 5 and placement["data_shards"] == 2 and placement["parity_shards"] == 1
    assert placement["protection"] == 0  # each rank has 2 live shards of 3, k = 2
    assert placement["nodes"][-1] == {"node_id": nodes[2], "alive": False, "store": False}  # dead nodes last
    lost = [(c["rank"], c["indices"]) for c in placement["cells"] if c["lost"]]
    assert lost == [(0, [1]), (1, [0])]
    local = [c for c in placement["cells"] if c["local"]]
    assert [(c["rank"], c["node_id"], c["indices"]) for c in local] == [(1, nodes[1], [])]


def test_placement_protection_counts_shards_that_share_a_node() -> None:
    """Two shards of a rank on one node are lost together: protection is ray_ckpt.core.protection's, not live - k."""
    meta = {"data_shards": 2, "parity_shards": 2}
    ranks = {0: {"metas": dict.fromkeys(range(4), meta), "nodes": {0: "a", 1: "a", 2: "b", 3: "c"}, "local": None}}
    result = dashboard_data.placement(7, ranks, {"a", "b", "c"})
    assert result["protection"] == 1  # live shards - k would say 2, but losing "a" costs two shards
    assert dashboard_data.placement(7, ranks, {"b", "c"})["protection"] == 0  # "a" dead: 2 shards left, k = 2
    assert dashboard_data.placement(7, ranks, {"a", "b", "c"}, store_nodes={"b", "c"})["protection"] == 0


def test_export_is_one_self_contained_file(events_file: pathlib.Path, tmp_path: pathlib.Path) -> None:
    dashboard = server.Dashboard(server.EventFiles([str(events_file)]))
    page = server.export_html(dashboard.data())
    assert "window.RAY_CKPT_DATA = " in page
    assert 'src="static/' not in page and 'href="static/' not in page  # JS and CSS inlined
    assert "<style>" in page and "function renderRecoveries" in page
    start = page.index("window.RAY_CKPT_DATA = ") + len("window.RAY_CKPT_DATA = ")
    inlined = json.loads(page[start : page.index(";</script>", start)])
    assert len(inlined["recoveries"]) == 3
    assert inlined["memory"] and inlined["placement"] and inlined["protection"]  # from the status snapshots


def test_server_routes(events_file: pathlib.Path) -> None:
    httpd = server.serve_in_thread(server.Dashboard(server.EventFiles([str(events_file)])))
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        page = urllib.request.urlopen(f"{base}/", timeout=10).read().decode()
        assert 'id="errors"' in page and "static/app.js" in page
        for name in ("app.js", "style.css"):
            assert urllib.request.urlopen(f"{base}/static/{name}", timeout=10).status == 200
        data = json.loads(urllib.request.urlopen(f"{base}/api/data", timeout=10).read())
        assert len(data["recoveries"]) == 3 and data["sources"] == [events_file.name]
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{base}/static/../server.py", timeout=10)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_missing_events_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(server.DashboardError, match="no events file"):
        server.EventFiles([str(tmp_path / "nope.jsonl")])


MALFORMED_LINES = [
    '{"kind": "kill", "time": "abc", "node_id": "n1", "mode": "node", "by": "x"}',
    '{"kind": "status", "time": 1764480100.0, "job": "gpt-small", "step": 70, "nodes": "x"}',
    '{"kind": "save", "time": 1764480100.0, "job": "gpt-small", "rank": 0, "step": 71, "attempt": "a3", '
    '"phases_s": {"blocking": "slow"}, "bytes": 1}',
    '{"kind": "restore", "time": 1764480100.0, "job": "gpt-small", "rank": "x", "attempt": "a9", "step": 3}',
    '{"kind": "rejoin", "time": 1764480100.0, "job": "gpt-small", "rank": 0, "attempt": "a9", "role": "survivor"}',
    '{"kind": "node_dead", "time": 1e400, "node_id": "n1"}',
]


def test_malformed_events_are_skipped_and_api_data_still_answers(events_file: pathlib.Path) -> None:
    """Each malformed line (``"time": "abc"``, ``nodes: "x"``, a non-numeric phase, ...) in the events
    file is skipped: the server's data function and ``/api/data`` answer what the clean file gives."""
    clean = server.Dashboard(server.EventFiles([str(events_file)])).data()
    with events_file.open("a") as out:
        out.write("\n".join(MALFORMED_LINES) + "\n")
    dashboard = server.Dashboard(server.EventFiles([str(events_file)]))
    got = dashboard.data()
    assert {k: v for k, v in got.items() if k != "generated_at"} == {
        k: v for k, v in clean.items() if k != "generated_at"
    }
    # the same events handed over as they come (a live registry's log): skipped too
    raw = [json.loads(line) for line in MALFORMED_LINES if "1e400" not in line]
    handed = dashboard_data.build([*events.read(events_file), *raw, "junk", None], now=0.0)  # type: ignore[list-item]
    assert handed == dashboard_data.build(events.read(events_file), now=0.0)
    httpd = server.serve_in_thread(dashboard)
    try:
        answer = urllib.request.urlopen(f"http://127.0.0.1:{httpd.server_address[1]}/api/data", timeout=10)
        assert answer.status == 200 and len(json.loads(answer.read())["recoveries"]) == 3
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_file_the_registry_recorded_with_status_deltas_shows_what_whole_snapshots_show(
    tmp_path: pathlib.Path,
) -> None:
    """The recorded history, logged as the registry logs it (status snapshots as deltas, the file
    rotated at a cap): the dashboard's data from the files equals that from whole snapshots."""
    records = recorded_events.all_records()
    path = tmp_path / "events.jsonl"
    log = events.EventLog(path, file_max_bytes=8 << 10, file_keep=20)
    for record in records:
        if record["kind"] == "status":
            log.append_status(record)
        else:
            log.append(record)
    files = sorted(tmp_path.iterdir(), key=lambda p: -int(p.suffix[1:]) if p.suffix[1:].isdigit() else 0)
    assert len(files) > 2  # rotated
    written = [e for f in files for e in events.read(f)]
    assert any("base" in e for e in written)
    want = dashboard_data.build(records, now=0.0)
    assert dashboard_data.build(written, now=0.0) == want
    assert server.Dashboard(server.EventFiles([str(f) for f in files])).data()["placement"] == want["placement"]


def logged(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` as the registry logs them, in order: status snapshots mostly as deltas."""
    log = events.EventLog()
    for record in records:
        if record["kind"] == "status":
            log.append_status(record)
        else:
            log.append(record)
    return log.since(0)[1]


def saves(count: int, start: float, every_s: float, job: str = "other") -> list[dict[str, Any]]:
    return [
        events.event(
            "save", time=start + i * every_s, job=job, rank=0, attempt="x", step=i, phases_s={"blocking": 0.01}
        )
        for i in range(count)
    ]


def test_a_window_fed_as_events_arrive_shows_what_build_shows_from_all_of_them() -> None:
    """Fed the registry's log a few events at a time, some of them twice (a file and the live
    registry both had them), the window's data is build's from every event at once."""
    written = logged(recorded_events.all_records())
    assert any("base" in e for e in written)
    window = dashboard_data.EventWindow(max_bytes=None, max_age_s=None)
    start, size = 0, 1
    while start < len(written):
        assert window.add(written[max(0, start - 2) : start + size]) == len(written[start : start + size])
        start, size = start + size, size % 7 + 1
    assert window.data(now=0.0) == dashboard_data.build(written, now=0.0)
    assert len(window) == len(written) and window.data(now=0.0)["window"]["dropped_events"] == 0


def test_the_window_is_bounded_by_bytes_oldest_dropped_first_and_keeps_each_jobs_snapshot() -> None:
    """Past its bytes the window drops its oldest events down to KEEP_FRACTION of the bound and
    shows what build shows from the events it kept, however many came; a status delta it kept
    whose base it dropped is held whole: the job's memory, placement and protection stay."""
    records = recorded_events.records()
    last = [e for e in records if e["kind"] == "status"][-1]
    newest = {**last, "time": recorded_events.T0 + 550.0, "step": last["step"] + 1}  # nothing moved since
    written = logged([*records, *saves(2000, recorded_events.T0 + 100.0, 0.2), newest])
    assert "base" in written[-1]  # a delta against a snapshot 2,000 saves earlier
    window = dashboard_data.EventWindow(max_bytes=100_000, max_age_s=None)
    for start in range(0, len(written), 25):
        window.add(written[start : start + 25])
        assert window.held_bytes <= 100_000
    data = window.data(now=0.0)
    kept = [e for e in written if e["time"] >= data["window"]["oldest_time"]]
    assert 0 < len(window) == len(kept) < 2000 and kept[0]["kind"] == "save"  # only the newest saves, oldest gone
    assert data["window"]["dropped_events"] == len(written) - len(kept)
    assert window.held_bytes >= dashboard_data.KEEP_FRACTION * 100_000 - 1_000  # dropped down to about 3/4
    want = dashboard_data.build([*kept[:-1], newest], now=0.0)  # the delta held whole
    assert {k: v for k, v in data.items() if k != "window"} == {k: v for k, v in want.items() if k != "window"}
    assert data["placement"][recorded_events.JOB]["step"] == newest["step"]
    assert data["summary"]["jobs"] == ["gpt-small", "other"] and data["summary"]["status_snapshots"] == 1


def test_the_window_is_bounded_by_age_against_its_newest_event() -> None:
    """Events older than max_age_s against the newest are dropped (down to KEEP_FRACTION of the
    age), oldest first; an old recorded file alone is not aged out by the clock."""
    hour = 3600.0
    window = dashboard_data.EventWindow(max_bytes=None, max_age_s=hour)
    records = saves(600, recorded_events.T0, 60.0)  # 10 hours, one a minute
    for start in range(0, len(records), 50):
        window.add(records[start : start + 50])
    newest = records[-1]["time"]
    data = window.data(now=0.0)
    assert newest - hour <= data["window"]["oldest_time"] <= newest - dashboard_data.KEEP_FRACTION * hour + 60
    assert data["summary"]["saves"] == len(window) < 61
    assert data["save_stall"][-1]["time"] == newest
    assert window.add(records[:10]) == 0  # already too old: not taken (no trim for a late event)
    assert window.data(now=0.0)["window"] == {**data["window"], "dropped_events": data["window"]["dropped_events"] + 10}


def test_a_poll_checks_and_folds_only_the_new_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """The live dashboard's second poll costs its new events, not the 4,000 it already holds."""
    held = saves(4000, recorded_events.T0, 0.5)
    queue = [held, saves(5, recorded_events.T0 + 5000, 1.0, job="late")]

    class Live:
        def snapshot(self, new_events: Any) -> dict[str, Any]:
            new_events(queue.pop(0) if queue else [])
            return {"status": {}, "alive": [], "placements": {}, "ray_nodes": []}

    checked = []
    real = events.valid
    monkeypatch.setattr(events, "valid", lambda record: checked.append(record) or real(record))
    monkeypatch.setattr(server, "LIVE_MIN_INTERVAL_S", 0.0)
    dashboard = server.Dashboard(live=Live())  # type: ignore[arg-type]
    assert dashboard.data()["summary"]["saves"] == 4000 and len(checked) == 4000
    second = dashboard.data()
    assert second["summary"]["saves"] == 4005 and second["summary"]["jobs"] == ["late", "other"]
    assert len(checked) == 4005 and len(second["save_stall"]) == 4005


def test_event_files_are_read_as_they_grow(tmp_path: pathlib.Path) -> None:
    """Only the lines added since the last read are read; a line still being written waits for
    its newline; a rotated file (a new one at the path) is read from its start."""
    path = tmp_path / "events.jsonl"
    records = saves(6, recorded_events.T0, 1.0)
    events.write(path, records[:3])
    files = server.EventFiles([str(path)])
    assert files.read() == records[:3] and files.read() == []
    line = json.dumps(records[3]) + "\n"
    with path.open("a") as out:
        out.write(line[:20])
        out.flush()
        assert files.read() == []
        out.write(line[20:])
    assert files.read() == [records[3]]
    path.rename(tmp_path / "events.jsonl.1")
    events.write(path, records[4:])
    assert files.read() == records[4:]
    dashboard = server.Dashboard(server.EventFiles([str(tmp_path / "events.jsonl.1"), str(path)]))
    assert dashboard.data()["summary"]["saves"] == 6
    events.write(tmp_path / "events.jsonl.1", records[:4])  # rewritten in place, nothing new: no duplicates
    assert dashboard.data()["summary"]["saves"] == 6


@pytest.mark.parametrize(
    ("host", "answered"),
    [
        ("127.0.0.1:{port}", True),
        ("localhost:{port}", True),
        ("[::1]:{port}", True),
        ("10.2.3.4:{port}", True),  # an address: nothing another site could point at us
        ("dash.example:{port}", True),  # passed with --allow-host
        ("evil.example:{port}", False),
        ("127.0.0.1.evil.example", False),
    ],
)
def test_a_request_for_another_host_name_is_refused(events_file: pathlib.Path, host: str, answered: bool) -> None:
    """DNS rebinding: a page of evil.example whose name now points at 127.0.0.1 gets 403 with a
    body saying why and what to do; IP addresses, localhost and allowed names are answered."""
    dashboard = server.Dashboard(server.EventFiles([str(events_file)]))
    httpd = server.serve_in_thread(dashboard, allowed_hosts=["Dash.Example"])
    port = httpd.server_address[1]
    try:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/data", headers={"Host": host.format(port=port)})
        if answered:
            assert json.loads(urllib.request.urlopen(request, timeout=10).read())["summary"]["saves"] > 0
        else:
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)
            assert refused.value.code == 403
            body = refused.value.read().decode()
            assert "DNS rebinding" in body and "--allow-host" in body and "evil.example" in body
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_names_a_server_answers_to() -> None:
    assert server.host_names("127.0.0.1") == frozenset({"127.0.0.1"})
    assert server.host_names("dash.lan", ["Other.Lan."]) == frozenset({"dash.lan", "other.lan"})
    assert socket.gethostname().lower() in server.host_names("0.0.0.0")  # the name the banner may print
    assert server.host_allowed("anything.example", server.host_names("127.0.0.1", ["*"]))
    assert server.host_allowed(None, server.host_names("127.0.0.1"))  # not a browser
    assert not server.host_allowed("localhost.evil.example:80", server.host_names("127.0.0.1"))
