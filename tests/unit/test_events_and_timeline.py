"""Events (in-memory log, JSON-lines files) and recovery timelines assembled from them."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from ray_ckpt import events
from ray_ckpt.events import EventLog, event
from ray_ckpt.timeline import PHASES, recoveries

T0 = 1_000.0


def save(t: float, rank: int, step: int, attempt: str, job: str = "job") -> dict[str, Any]:
    return event("save", time=T0 + t, job=job, rank=rank, step=step, attempt=attempt, phases_s={}, bytes=10)


def kill(t: float, node_id: str) -> dict[str, Any]:
    return event("kill", time=T0 + t, node_id=node_id, mode="node", by="test")


def dead(t: float, node_id: str) -> dict[str, Any]:
    return event("node_dead", time=T0 + t, node_id=node_id)


def restore(
    t: float,
    rank: int,
    attempt: str,
    *,
    started: float,
    step: int | None = 20,
    source: str | None = "peers",
    steps_lost: int = 0,
    nbytes: int = 0,
    phases: dict[str, float] | None = None,
    job: str = "job",
) -> dict[str, Any]:
    return event(
        "restore",
        time=T0 + t,
        job=job,
        rank=rank,
        attempt=attempt,
        step=step,
        source=source,
        steps_lost=steps_lost,
        bytes=nbytes,
        started=T0 + started,
        phases_s=phases or {},
    )


# ---- events -----------------------------------------------------------------------------


def test_event_stamps_time_and_rejects_unknown_kinds() -> None:
    """event() stamps the current time unless given one, keeps the fields, and rejects an unknown kind."""
    before = time.time()
    stamped = event("kill", node_id="n1")
    assert stamped["kind"] == "kill" and stamped["node_id"] == "n1"
    assert before <= stamped["time"] <= time.time()
    assert event("node_dead", time=5.0, node_id="n2") == {"kind": "node_dead", "time": 5.0, "node_id": "n2"}
    with pytest.raises(ValueError):
        event("explode", node_id="n1")


def test_event_log_since_returns_sequence_numbers_and_newer_events() -> None:
    """since(n) returns the next sequence number and the events numbered >= n."""
    log = EventLog()
    assert log.since() == (0, [])
    records = [kill(i, f"n{i}") for i in range(3)]
    for record in records:
        log.append(record)
    assert log.since() == (3, records)
    assert log.since(1) == (3, records[1:])
    assert log.since(3) == (3, [])
    assert log.since(7) == (3, [])


def test_event_log_capacity_drops_oldest_and_since_stays_consistent() -> None:
    """Past capacity the oldest events are dropped; since() still numbers events by their append order."""
    log = EventLog(capacity=3)
    records = [kill(i, f"n{i}") for i in range(5)]
    for record in records:
        log.append(record)
    assert log.since(0) == (5, records[2:])  # events 0 and 1 are gone
    assert log.since(2) == (5, records[2:])
    assert log.since(3) == (5, records[3:])
    assert log.since(4) == (5, records[4:])
    assert log.since(5) == (5, [])
    log.append(records[0])
    assert log.since(5) == (6, [records[0]])
    assert log.since(0) == (6, [*records[3:], records[0]])


def test_event_log_rejects_non_events_without_recording_them(tmp_path) -> None:
    """append of an unknown kind or a non-dict raises ValueError and neither the log nor its file changes."""
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.append(kill(0, "n0"))
    for bad in ({"kind": "explode", "time": 1.0}, {"time": 1.0}, ["kill"], "kill"):
        with pytest.raises(ValueError):
            log.append(bad)  # type: ignore[arg-type]
    assert log.since() == (1, [kill(0, "n0")])
    assert events.read(path) == [kill(0, "n0")]


def test_event_log_file_mirror_round_trips_through_read(tmp_path) -> None:
    """Events appended to a log with a path come back from read() equal and in order; the folder is created."""
    path = tmp_path / "deep" / "folder" / "events.jsonl"
    log = EventLog(path)
    records = [
        save(1, 0, 10, "A"),
        kill(2, "n1"),
        dead(3, "n1"),
        restore(4, 0, "B", started=3.5, steps_lost=1, nbytes=7, phases={"locate": 0.5, "fetch": 1.25}),
    ]
    for record in records:
        log.append(record)
    assert events.read(path) == records
    assert len(path.read_text().splitlines()) == len(records)
    log.append(kill(5, "n2"))
    assert events.read(path) == [*records, kill(5, "n2")]
    assert EventLog(path).since() == (0, [])  # a new log does not load the file


def test_write_then_read_round_trips_and_replaces_the_file(tmp_path) -> None:
    """write() replaces the file's content with the given events, which read() returns unchanged."""
    path = tmp_path / "events.jsonl"
    events.write(path, [kill(0, "old")])
    records = [save(1, 0, 1, "A"), dead(2, "n1")]
    events.write(path, records)
    assert events.read(path) == records


def test_read_skips_junk_lines_and_a_truncated_last_line(tmp_path) -> None:
    """read() keeps valid events and skips non-JSON, non-object, unknown-kind, blank and cut-off lines."""
    path = tmp_path / "events.jsonl"
    good = [kill(0, "n0"), dead(1, "n0"), save(2, 0, 3, "A")]
    cut = json.dumps(restore(3, 0, "B", started=2.5))
    lines = [
        json.dumps(good[0]),
        "this is not json",
        "[1, 2, 3]",
        '"kill"',
        "",
        json.dumps({"kind": "explode", "time": 1.0}),
        json.dumps(good[1]),
        "{",
        json.dumps(good[2]),
    ]
    path.write_text("\n".join(lines) + "\n" + cut[: len(cut) // 2])
    assert events.read(path) == good


# ---- recovery timelines -------------------------------------------------------------------


def one_failure() -> list[dict[str, Any]]:
    """Attempt A saves; nodes n1, n2 are killed 0.3 s apart and declared dead; attempt B restores on 2 ranks."""
    return [
        save(1, 0, 10, "A"),
        save(1.1, 1, 10, "A"),
        save(5, 0, 20, "A"),
        save(5.2, 1, 20, "A"),
        kill(10, "n1"),
        kill(10.3, "n2"),
        dead(14, "n1"),
        dead(15, "n2"),
        dead(16, "n-unrelated"),  # not killed by the tool: no part of the detect phase
        restore(
            30,
            0,
            "B",
            started=20,
            steps_lost=1,
            nbytes=1000,
            source="peers",
            phases={"locate": 0.1, "fetch": 2.0, "decode": 0.5, "load": 1.0},
        ),
        restore(
            31,
            1,
            "B",
            started=21,
            steps_lost=2,
            nbytes=2000,
            source="local",
            phases={"locate": 0.2, "fetch": 1.5, "decode": 0.7, "load": 0.8},
        ),
        save(35, 0, 21, "B"),
        save(36, 1, 21, "B"),
        save(40, 0, 22, "B"),  # a later save: not the first step
    ]


def test_one_failure_gives_one_recovery_with_every_phase() -> None:
    """A kill burst, deaths, a 2-rank restore and first saves give one record with the critical-path phases."""
    history = one_failure()
    result = recoveries(reversed(history))  # input order does not matter
    assert len(result) == 1
    (record,) = result
    assert record["job"] == "job" and record["attempt"] == "B"
    assert record["kill_time"] == pytest.approx(T0 + 10)
    assert record["killed_nodes"] == ["n1", "n2"]
    assert record["step"] == 20
    assert set(record["phases_s"]) == set(PHASES)
    assert record["phases_s"] == pytest.approx(
        {
            "detect": 15 - 10,  # last node_dead - first kill
            "restart": 21 - 15,  # newest worker start - last node_dead
            "replace": None,
            "rendezvous": None,
            "locate": 0.2,
            "fetch": 2.0,
            "decode": 0.7,
            "load": 1.0,
            "first_step": 36 - 31,  # the last rank's first save - the last restore
        }
    )
    assert record["time_to_resume_s"] == pytest.approx(36 - 10)
    assert record["steps_lost"] == 2
    assert record["bytes_moved"] == 3000
    assert record["sources"] == {"0": "peers", "1": "local"}
    assert (record["mode"], record["survivor_pids"], record["replacement_pids"]) == ("restart", {}, {})


def rejoin(rank: int, role: str, **times: float) -> dict[str, Any]:
    fields = {name: None if value is None else T0 + value for name, value in times.items()}
    return event(
        "rejoin", time=T0 + times["ready"], job="job", rank=rank, attempt="G2", role=role, pid=100 + rank, **fields
    )


def test_an_in_place_recovery_has_detect_replace_and_rendezvous_phases() -> None:
    """With rejoin events, the survivor's own view is the detect phase, the replacement's start
    the replace phase, and last join -> last process group up the rendezvous; no restart."""
    history = [
        save(1, 0, 10, "G1"),
        save(1.1, 1, 10, "G1"),
        kill(10, "n1"),
        dead(11.5, "n1"),
        rejoin(0, "survivor", worker_started=0, detected=10.4, joined=10.9, ready=16.2),
        rejoin(1, "replacement", worker_started=16.0, detected=None, joined=16.01, ready=16.3),
        restore(16.5, 0, "G2", started=16.4, step=10, source="local", phases={"locate": 0.01, "fetch": 0.02}),
        restore(16.6, 1, "G2", started=16.4, step=10, source="peers", phases={"locate": 0.01, "fetch": 0.05}),
        save(17, 0, 11, "G2"),
        save(17.2, 1, 11, "G2"),
    ]
    (record,) = recoveries(history)
    assert record["mode"] == "in_place"
    assert record["survivor_pids"] == {"0": 100} and record["replacement_pids"] == {"1": 101}
    phases = record["phases_s"]
    assert phases["detect"] == pytest.approx(0.4)
    assert phases["restart"] is None
    assert phases["replace"] == pytest.approx(16.0 - 10.4)
    assert phases["rendezvous"] == pytest.approx(16.4 - 16.01)  # last join -> last checkpointer created
    assert phases["fetch"] == pytest.approx(0.05)
    assert phases["first_step"] == pytest.approx(17.2 - 16.6)
    assert record["time_to_resume_s"] == pytest.approx(17.2 - 10)
    assert record["sources"] == {"0": "local", "1": "peers"}


def test_two_failures_give_two_records_each_with_its_own_kill_burst() -> None:
    """A second failure is a second record, after the first, attributed to its own kill and not the first one."""
    history = [
        *one_failure(),
        kill(100, "n3"),
        dead(104, "n3"),
        restore(115, 0, "C", started=110, step=22, phases={"fetch": 1.0}),
        restore(116, 1, "C", started=111, step=22, phases={"fetch": 3.0}),
        save(120, 0, 23, "C"),
        save(121, 1, 23, "C"),
    ]
    first, second = recoveries(history)
    assert (first["attempt"], first["killed_nodes"]) == ("B", ["n1", "n2"])
    assert (second["attempt"], second["killed_nodes"], second["step"]) == ("C", ["n3"], 22)
    assert second["kill_time"] == pytest.approx(T0 + 100)
    assert second["phases_s"]["detect"] == pytest.approx(4)
    assert second["phases_s"]["restart"] == pytest.approx(111 - 104)
    assert second["phases_s"]["fetch"] == pytest.approx(3.0)
    assert second["phases_s"]["first_step"] == pytest.approx(121 - 116)
    assert second["time_to_resume_s"] == pytest.approx(121 - 100)


def test_a_kill_before_the_previous_recovery_is_not_reused() -> None:
    """A later recovery without a kill of its own does not claim the kill of the previous recovery."""
    history = [
        *one_failure(),
        restore(115, 0, "C", started=110, step=22),
        restore(116, 1, "C", started=111, step=22),
        save(120, 0, 23, "C"),
        save(121, 1, 23, "C"),
    ]
    result = recoveries(history)
    assert [r["attempt"] for r in result] == ["B", "C"]  # oldest first
    assert result[0]["kill_time"] == pytest.approx(T0 + 10)
    assert result[1]["kill_time"] is None
    assert result[1]["killed_nodes"] == []


def test_restore_without_kill_has_no_kill_phases() -> None:
    """With no recorded kill, detect, restart, kill_time and time_to_resume are None; restore phases remain."""
    history = [
        save(1, 0, 10, "A"),
        restore(30, 0, "B", started=20, step=10, phases={"locate": 0.1, "fetch": 0.2, "decode": 0.3, "load": 0.4}),
        save(32, 0, 11, "B"),
    ]
    (record,) = recoveries(history)
    assert record["kill_time"] is None and record["killed_nodes"] == []
    assert record["time_to_resume_s"] is None
    assert record["phases_s"]["detect"] is None and record["phases_s"]["restart"] is None
    assert record["phases_s"] == pytest.approx(
        {
            "detect": None,
            "restart": None,
            "replace": None,
            "rendezvous": None,
            "locate": 0.1,
            "fetch": 0.2,
            "decode": 0.3,
            "load": 0.4,
            "first_step": 2,
        }
    )


def test_first_step_ends_when_the_first_save_returned_not_when_it_committed() -> None:
    """A save event is sent once its step committed; training went on when save() returned."""
    committed_late = {**save(40, 0, 11, "B"), "returned": T0 + 31.5}
    history = [save(1, 0, 10, "A"), kill(10, "n1"), dead(11, "n1"), restore(30, 0, "B", started=20, step=10)]
    (record,) = recoveries([*history, committed_late])
    assert record["phases_s"]["first_step"] == pytest.approx(1.5)
    assert record["time_to_resume_s"] == pytest.approx(31.5 - 10)
    (without_returned,) = recoveries([*history, save(40, 0, 11, "B")])  # older events: their time
    assert without_returned["phases_s"]["first_step"] == pytest.approx(10)


def test_kill_without_node_dead_measures_restart_from_the_kill() -> None:
    """A kill never followed by node_dead (e.g. a store kill) leaves detect None and restart = start - kill."""
    history = [save(0, 0, 10, "A"), kill(10, "s1"), restore(30, 0, "B", started=20, step=10)]
    (record,) = recoveries(history)
    assert record["phases_s"]["detect"] is None
    assert record["phases_s"]["restart"] == pytest.approx(10)
    assert record["phases_s"]["first_step"] is None
    assert record["time_to_resume_s"] == pytest.approx(30 - 10)  # no first save: ends at the restore


def test_kills_of_another_job_before_this_job_began_are_not_its_failure() -> None:
    """A job's first start is not a recovery from kills that hit an earlier job."""
    history = [kill(1, "n0"), save(5, 0, 0, "X", job="other"), restore(10, 0, "A", started=9, step=-1)]
    (record,) = recoveries(history)
    assert record["kill_time"] is None and record["killed_nodes"] == []


def test_kills_more_than_burst_apart_are_separate_bursts() -> None:
    """Only the newest burst of kills (each within BURST_S of the next) before the restart is the failure."""
    history = [
        save(0, 0, 9, "A"),
        kill(1, "n0"),
        kill(10, "n1"),
        kill(11, "n2"),
        restore(30, 0, "B", started=20, step=10),
    ]
    (record,) = recoveries(history)
    assert record["killed_nodes"] == ["n1", "n2"]
    assert record["kill_time"] == pytest.approx(T0 + 10)


def test_fresh_starts_with_no_step_are_not_recoveries() -> None:
    """Restores that found nothing (step None) are not recoveries, kill or no kill."""
    history = [
        restore(1, 0, "A", started=0.5, step=None, source=None),
        restore(1, 1, "A", started=0.5, step=None, source=None),
        save(3, 0, 1, "A"),
        kill(10, "n1"),
        dead(12, "n1"),
        restore(20, 0, "B", started=15, step=None, source=None),
    ]
    assert recoveries(history) == []
    assert recoveries([]) == []


def test_a_restore_that_raised_is_a_failed_recovery_with_its_error() -> None:
    """Restore events with ``error`` make a failed recovery: error per rank, no step, no time to
    resume; the next attempt still answers the same kill, its time to resume counted from it."""
    error = "ConfigError: world size changed from 2 to 3"
    history = [
        save(1, 0, 10, "A"),
        kill(10, "n1"),
        dead(12, "n1"),
        *[
            {**restore(20, rank, "B", started=18, step=None, source=None), "error": error, "steps_lost": None}
            for rank in range(3)
        ],
        restore(40, 0, "C", started=35, step=10, phases={"locate": 0.1, "fetch": 0.2, "decode": 0.3, "load": 0.4}),
        save(42, 0, 11, "C"),
    ]
    failed, resumed = recoveries(history)
    assert failed["attempt"] == "B" and failed["failed"] is True
    assert failed["error"] == error and failed["errors"] == {"0": error, "1": error, "2": error}
    assert failed["step"] is None and failed["steps_lost"] is None and failed["time_to_resume_s"] is None
    assert failed["kill_time"] == pytest.approx(T0 + 10) and failed["killed_nodes"] == ["n1"]
    assert failed["phases_s"] == pytest.approx(
        {
            "detect": 2,
            "restart": 6,
            "replace": None,
            "rendezvous": None,
            "locate": None,
            "fetch": None,
            "decode": None,
            "load": None,
            "first_step": None,
        }
    )
    assert resumed["attempt"] == "C" and resumed["failed"] is False and resumed["error"] is None
    assert resumed["errors"] == {}
    assert resumed["kill_time"] == pytest.approx(T0 + 10)  # the same failure, resolved by the retry
    assert resumed["time_to_resume_s"] == pytest.approx(42 - 10)
    assert resumed["phases_s"]["restart"] == pytest.approx(35 - 12)


def test_a_partly_failed_attempt_is_failed_and_keeps_the_restored_step() -> None:
    """One rank raised, one restored: the attempt failed, with the restored rank's step."""
    history = [
        save(1, 0, 10, "A"),
        restore(20, 0, "B", started=18, step=10, phases={"fetch": 1.0}),
        {**restore(21, 1, "B", started=18, step=None, source=None), "error": "InsufficientShardsError: rank 1"},
        save(25, 0, 11, "B"),
    ]
    (record,) = recoveries(history)
    assert record["failed"] is True and record["step"] == 10
    assert record["error"] == "InsufficientShardsError: rank 1" and list(record["errors"]) == ["1"]
    assert record["phases_s"]["fetch"] == pytest.approx(1.0) and record["phases_s"]["first_step"] is None


# ---- status snapshots -------------------------------------------------------------------


def test_status_event_records_memory_placement_and_protection() -> None:
    """status_event: placement per shard index, local copies, memory of every store, hosts, and
    protection over shards on alive nodes that still have a store."""
    ray_nodes = [
        {"NodeID": "a", "Alive": True, "NodeManagerHostname": "host-a", "NodeManagerAddress": "10.0.0.1"},
        {"NodeID": "b", "Alive": True, "NodeManagerHostname": "host-b", "NodeManagerAddress": "10.0.0.2"},
        {"NodeID": "c", "Alive": False, "NodeManagerHostname": "host-c", "NodeManagerAddress": "10.0.0.3"},
        {"NodeID": "d", "Alive": True, "NodeManagerHostname": "host-d", "NodeManagerAddress": "10.0.0.4"},
    ]
    stores = {
        "a": {"used_bytes": 10, "budget_bytes": 100, "shards": 3},
        "b": {"used_bytes": 20, "budget_bytes": 100, "shards": 2},
        "d": {"error": "GetTimeoutError"},
    }
    record = events.status_event(
        "job",
        7,
        world_size=2,
        data_shards=2,
        parity_shards=2,
        shards={0: {0: "a", 1: "a", 2: "b", 3: "d"}, 1: {0: "b", 1: "c", 2: "a", 3: "d"}},
        local_nodes={0: "a", 1: None},
        stores=stores,
        ray_nodes=ray_nodes,
        time=T0,
    )
    assert record["kind"] == "status" and record["time"] == T0 and record["job"] == "job" and record["step"] == 7
    assert (record["world_size"], record["data_shards"], record["parity_shards"]) == (2, 2, 2)
    assert record["placement"] == {"0": ["a", "a", "b", "d"], "1": ["b", "c", "a", "d"]}
    assert record["local"] == {"0": "a"}
    # rank 0: 4 live shards on a(2), b, d: losing a and then one more leaves 1 < k -> survives 1
    # rank 1: c is dead: 3 live shards on b, a, d -> survives 1
    assert record["protection"] == 1
    nodes = record["nodes"]
    assert set(nodes) == {"a", "b", "c", "d"}  # every store, and c because it holds a shard
    assert nodes["a"] == {
        "host": "host-a",
        "address": "10.0.0.1",
        "alive": True,
        "store": True,
        "used_bytes": 10,
        "budget_bytes": 100,
        "shards": 3,
    }
    assert nodes["c"]["alive"] is False and nodes["c"]["store"] is False and nodes["c"]["host"] == "host-c"
    assert nodes["d"]["error"] == "GetTimeoutError" and nodes["d"]["used_bytes"] is None
    assert json.loads(json.dumps(record)) == record  # JSON as written to the events file


def test_a_large_jobs_status_event_carries_its_summary_not_its_placement() -> None:
    """Above PLACEMENT_MAX_RANKS the registry passes a summary: protection and holders are
    taken from it, there is no placement, and the dashboard shows the protection, no rows."""
    from ray_ckpt.dashboard import data as dashboard_data

    ray_nodes = [{"NodeID": n, "Alive": True, "NodeManagerHostname": f"host-{n}"} for n in "abc"]
    record = events.status_event(
        "big",
        3,
        world_size=events.PLACEMENT_MAX_RANKS + 1,
        data_shards=2,
        parity_shards=1,
        shards=None,
        local_nodes=None,
        stores={n: {"used_bytes": 1, "budget_bytes": 9, "shards": 1} for n in "ab"},
        ray_nodes=ray_nodes,
        summary=(1, {"a", "b", "c"}),
        time=T0,
    )
    assert record["placement"] is None and record["local"] == {} and record["protection"] == 1
    assert set(record["nodes"]) == {"a", "b", "c"} and record["nodes"]["c"]["store"] is False
    shown = dashboard_data.build([record])
    assert shown["placement"]["big"]["unlisted_ranks"] == events.PLACEMENT_MAX_RANKS + 1
    assert shown["placement"]["big"]["cells"] == [] and shown["protection"]["big"]["value"] == 1
    with pytest.raises(ValueError, match="summary"):
        events.status_event(
            "big",
            3,
            world_size=2,
            data_shards=2,
            parity_shards=1,
            shards=None,
            local_nodes=None,
            stores={},
            ray_nodes=[],
        )


def test_status_events_round_trip_through_a_file(tmp_path) -> None:
    """``status`` is a known kind: the log accepts it and read() keeps it."""
    snapshot = event("status", time=T0, job="j", step=1, protection=0, placement={}, local={}, nodes={})
    log = EventLog(tmp_path / "events.jsonl")
    log.append(snapshot)
    assert events.read(tmp_path / "events.jsonl") == [snapshot]


def test_coalescer_runs_each_key_at_most_once_per_interval_and_always_the_last_request() -> None:
    """A burst of requests gives one immediate call and one trailing call per key, the trailing one
    at least interval_s after the first; keys are independent."""
    calls: list[tuple[str, float]] = []
    coalescer = events.Coalescer(lambda key: calls.append((key, time.monotonic())), interval_s=0.3)
    for _ in range(20):
        coalescer.request("a")
        coalescer.request("b")
        time.sleep(0.005)
    assert coalescer.wait_idle(5.0)
    for key in ("a", "b"):
        times = [t for k, t in calls if k == key]
        assert len(times) == 2
        assert times[1] - times[0] >= 0.3 - 1e-3
    coalescer.request("a")  # long after the last call: runs at once
    assert coalescer.wait_idle(5.0)
    assert len([k for k, _ in calls if k == "a"]) == 3


def test_coalescer_survives_a_failing_call() -> None:
    """An exception in the work is logged; later requests still run."""
    seen: list[str] = []

    def work(key: str) -> None:
        seen.append(key)
        if len(seen) == 1:
            raise RuntimeError("boom")

    coalescer = events.Coalescer(work, interval_s=0.0)
    coalescer.request("x")
    assert coalescer.wait_idle(5.0)
    coalescer.request("y")
    assert coalescer.wait_idle(5.0)
    assert seen == ["x", "y"]
