"""Events (in-memory log, JSON-lines files) and recovery timelines assembled from them."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from ray_ckpt import settings
from ray_ckpt.core import events
from ray_ckpt.core.events import EventLog, event
from ray_ckpt.core.nodes import RayNode
from ray_ckpt.core.timeline import PHASES, recoveries
from ray_ckpt.core.wire import StoreStats
from ray_ckpt.errors import ConfigError

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


ONE_FAILURE_PHASES = [  # attempt B's restores in one_failure(), rank 0's and rank 1's
    {"locate": 0.1, "fetch": 2.0, "decode": 0.5, "load": 1.0},
    {"locate": 0.2, "fetch": 1.5, "decode": 0.7, "load": 0.8},
]


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
        restore(30, 0, "B", started=20, steps_lost=1, nbytes=1000, source="peers", phases=ONE_FAILURE_PHASES[0]),
        restore(31, 1, "B", started=21, steps_lost=2, nbytes=2000, source="local", phases=ONE_FAILURE_PHASES[1]),
        save(35, 0, 21, "B"),
        save(36, 1, 21, "B"),
        save(40, 0, 22, "B"),  # a later save: not the first step
    ]


def test_one_failure_gives_one_recovery_with_every_phase() -> None:
    """A kill burst, deaths, a 2-rank restore and first saves give one record with the
    critical-path phases: the restore is the slowest rank's (rank 1 ended last, at 31, having
    begun its restore at 31 - 3.2), and the phases add up to the time to resume."""
    history = one_failure()
    result = recoveries(reversed(history))  # input order does not matter
    assert len(result) == 1
    (record,) = result
    assert record.job == "job" and record.attempt == "B"
    assert record.kill_time == pytest.approx(T0 + 10)
    assert record.killed_nodes == ("n1", "n2")
    assert record.step == 20
    assert set(record.phases_s) == set(PHASES)
    assert record.phases_s == pytest.approx(
        {
            "detect": 15 - 10,  # last node_dead - first kill
            "restart": (31 - 3.2) - 15,  # the slowest rank began its restore - last node_dead
            "replace": None,
            "rendezvous": None,
            "locate": 0.2,  # rank 1's, not the largest of each phase (rank 0's fetch was 2.0)
            "fetch": 1.5,
            "decode": 0.7,
            "load": 0.8,
            "first_step": 36 - 31,  # the last rank's first save - the last restore
        }
    )
    assert record.time_to_resume_s == pytest.approx(36 - 10)
    assert sum(record.phases_s[name] or 0.0 for name in PHASES) == pytest.approx(record.time_to_resume_s)
    assert record.steps_lost == 2
    assert record.bytes_moved == 3000
    assert record.sources == {"0": "peers", "1": "local"}
    assert (record.mode, record.survivor_pids, record.replacement_pids) == ("restart", {}, {})


def rejoin(rank: int, role: str, **times: float) -> dict[str, Any]:
    fields = {name: None if value is None else T0 + value for name, value in times.items()}
    return event(
        "rejoin", time=T0 + times["ready"], job="job", rank=rank, attempt="G2", role=role, pid=100 + rank, **fields
    )


def test_an_in_place_recovery_has_detect_replace_and_rendezvous_phases() -> None:
    """With rejoin events the phases follow the slowest rank: detect ends when the last survivor
    saw its collective fail (not the first), replace when the last replacement started, and
    rendezvous when the slowest rank began its restore; no restart. They add up to the time to
    resume."""
    restore_phases = {"locate": 0.01, "fetch": 0.05, "decode": 0.0, "load": 0.04}
    history = [
        save(1, 0, 10, "G1"),
        save(1.1, 1, 10, "G1"),
        save(1.1, 2, 10, "G1"),
        kill(10, "n1"),
        dead(11.5, "n1"),
        rejoin(0, "survivor", worker_started=0, detected=10.4, joined=10.9, ready=16.2),
        rejoin(2, "survivor", worker_started=0, detected=13.0, joined=13.1, ready=16.2),  # blocked in a collective
        rejoin(1, "replacement", worker_started=16.0, detected=None, joined=16.01, ready=16.3),
        restore(16.5, 0, "G2", started=16.4, step=10, source="local", phases={"locate": 0.01, "fetch": 0.02}),
        restore(16.7, 1, "G2", started=16.4, step=10, source="peers", phases=restore_phases),
        restore(16.6, 2, "G2", started=16.4, step=10, source="local", phases={"locate": 0.01, "fetch": 0.02}),
        save(17, 0, 11, "G2"),
        save(17.2, 1, 11, "G2"),
        save(17.1, 2, 11, "G2"),
    ]
    (record,) = recoveries(history)
    assert record.mode == "in_place"
    assert record.survivor_pids == {"0": 100, "2": 102} and record.replacement_pids == {"1": 101}
    phases = record.phases_s
    assert phases["detect"] == pytest.approx(13.0 - 10)  # the last survivor to leave its step
    assert phases["restart"] is None
    assert phases["replace"] == pytest.approx(16.0 - 13.0)
    assert phases["rendezvous"] == pytest.approx((16.7 - 0.1) - 16.0)  # rank 1 began its restore 0.1 s before its end
    assert {name: phases[name] for name in restore_phases} == pytest.approx(restore_phases)
    assert phases["first_step"] == pytest.approx(17.2 - 16.7)
    assert record.time_to_resume_s == pytest.approx(17.2 - 10)
    assert sum(phases[name] or 0.0 for name in PHASES) == pytest.approx(record.time_to_resume_s)
    assert record.sources == {"0": "local", "1": "peers", "2": "local"}


def test_replacements_up_before_the_last_survivor_left_add_no_replace_time() -> None:
    """A warm spare can run the training function before a survivor blocked in a collective
    leaves it: replace is 0, and the wait is detect's."""
    history = [
        save(1, 0, 10, "G1"),
        kill(10, "n1"),
        rejoin(0, "survivor", worker_started=0, detected=12.0, joined=12.1, ready=12.5),
        rejoin(1, "replacement", worker_started=11.0, detected=None, joined=11.01, ready=12.5),
        restore(13, 0, "G2", started=12.6, step=10, phases={"locate": 0.1, "fetch": 0.1, "decode": 0.1, "load": 0.1}),
        save(14, 0, 11, "G2"),
    ]
    (record,) = recoveries(history)
    assert (record.phases_s["detect"], record.phases_s["replace"]) == pytest.approx((2.0, 0.0))
    assert record.phases_s["rendezvous"] == pytest.approx(12.6 - 12.0)
    assert sum(record.phases_s[name] or 0.0 for name in PHASES) == pytest.approx(record.time_to_resume_s)


def test_an_in_place_recovery_without_a_recorded_kill_still_has_replace_and_rendezvous() -> None:
    """A node removed without the kill tool (no kill event): detect is None, but the survivors'
    detections still time the replacement and the rendezvous."""
    history = [
        save(1, 0, 10, "G1"),
        rejoin(0, "survivor", worker_started=0, detected=10.4, joined=10.9, ready=16.2),
        rejoin(1, "replacement", worker_started=16.0, detected=None, joined=16.01, ready=16.3),
        restore(16.7, 0, "G2", started=16.4, step=10, phases={"locate": 0.1, "fetch": 0.1, "decode": 0.0, "load": 0.0}),
        save(17, 0, 11, "G2"),
    ]
    (record,) = recoveries(history)
    assert record.kill_time is None and record.phases_s["detect"] is None
    assert record.phases_s["replace"] == pytest.approx(16.0 - 10.4)
    assert record.phases_s["rendezvous"] == pytest.approx(16.5 - 16.0)


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
    assert (first.attempt, first.killed_nodes) == ("B", ("n1", "n2"))
    assert (second.attempt, second.killed_nodes, second.step) == ("C", ("n3",), 22)
    assert second.kill_time == pytest.approx(T0 + 100)
    assert second.phases_s["detect"] == pytest.approx(4)
    assert second.phases_s["restart"] == pytest.approx(111 - 104)
    assert second.phases_s["fetch"] == pytest.approx(3.0)
    assert second.phases_s["first_step"] == pytest.approx(121 - 116)
    assert second.time_to_resume_s == pytest.approx(121 - 100)


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
    assert [r.attempt for r in result] == ["B", "C"]  # oldest first
    assert result[0].kill_time == pytest.approx(T0 + 10)
    assert result[1].kill_time is None
    assert result[1].killed_nodes == ()


def test_restore_without_kill_has_no_kill_phases() -> None:
    """With no recorded kill, detect, restart, kill_time and time_to_resume are None; restore phases remain."""
    history = [
        save(1, 0, 10, "A"),
        restore(30, 0, "B", started=20, step=10, phases={"locate": 0.1, "fetch": 0.2, "decode": 0.3, "load": 0.4}),
        save(32, 0, 11, "B"),
    ]
    (record,) = recoveries(history)
    assert record.kill_time is None and record.killed_nodes == ()
    assert record.time_to_resume_s is None
    assert record.phases_s["detect"] is None and record.phases_s["restart"] is None
    assert record.phases_s == pytest.approx(
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
    assert record.phases_s["first_step"] == pytest.approx(1.5)
    assert record.time_to_resume_s == pytest.approx(31.5 - 10)
    (without_returned,) = recoveries([*history, save(40, 0, 11, "B")])  # older events: their time
    assert without_returned.phases_s["first_step"] == pytest.approx(10)


def test_kill_without_node_dead_measures_restart_from_the_kill() -> None:
    """A kill never followed by node_dead (e.g. a store kill) leaves detect None and restart = start - kill."""
    history = [save(0, 0, 10, "A"), kill(10, "s1"), restore(30, 0, "B", started=20, step=10)]
    (record,) = recoveries(history)
    assert record.phases_s["detect"] is None
    assert record.phases_s["restart"] == pytest.approx(10)
    assert record.phases_s["first_step"] is None
    assert record.time_to_resume_s == pytest.approx(30 - 10)  # no first save: ends at the restore


def test_kills_of_another_job_before_this_job_began_are_not_its_failure() -> None:
    """A job's first start is not a recovery from kills that hit an earlier job."""
    history = [kill(1, "n0"), save(5, 0, 0, "X", job="other"), restore(10, 0, "A", started=9, step=-1)]
    assert recoveries(history) == []
    (record,) = recoveries([*history[:2], restore(10, 0, "A", started=9, step=0)])  # restored: counted
    assert record.kill_time is None and record.killed_nodes == ()


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
    assert record.killed_nodes == ("n1", "n2")
    assert record.kill_time == pytest.approx(T0 + 10)


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


def test_a_first_start_from_scratch_is_no_recovery_but_a_restart_from_scratch_after_a_kill_is() -> None:
    """Step -1 (the job started from scratch) counts only after a kill: a first start is not a
    failure, a restart that found no checkpoint after one lost everything."""
    history = [
        restore(1, 0, "A", started=0.5, step=-1, source="scratch"),
        save(3, 0, 0, "A"),
        kill(10, "n1"),
        dead(12, "n1"),
        restore(20, 0, "B", started=15, step=-1, source="scratch"),
        save(22, 0, 0, "B"),
    ]
    (record,) = recoveries(history)
    assert record.attempt == "B" and record.kill_time == T0 + 10 and record.step == -1


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
    assert failed.attempt == "B" and failed.failed is True
    assert failed.error == error and failed.errors == {"0": error, "1": error, "2": error}
    assert failed.step is None and failed.steps_lost is None and failed.time_to_resume_s is None
    assert failed.kill_time == pytest.approx(T0 + 10) and failed.killed_nodes == ("n1",)
    assert failed.phases_s == pytest.approx(
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
    assert resumed.attempt == "C" and resumed.failed is False and resumed.error is None
    assert resumed.errors == {}
    assert resumed.kill_time == pytest.approx(T0 + 10)  # the same failure, resolved by the retry
    assert resumed.time_to_resume_s == pytest.approx(42 - 10)
    assert resumed.phases_s["restart"] == pytest.approx((40 - 1.0) - 12)  # to the start of its restore


def test_a_partly_failed_attempt_is_failed_and_keeps_the_restored_step() -> None:
    """One rank raised, one restored: the attempt failed, with the restored rank's step."""
    history = [
        save(1, 0, 10, "A"),
        restore(20, 0, "B", started=18, step=10, phases={"fetch": 1.0}),
        {**restore(21, 1, "B", started=18, step=None, source=None), "error": "InsufficientShardsError: rank 1"},
        save(25, 0, 11, "B"),
    ]
    (record,) = recoveries(history)
    assert record.failed is True and record.step == 10
    assert record.error == "InsufficientShardsError: rank 1" and list(record.errors) == ["1"]
    assert record.phases_s["fetch"] == pytest.approx(1.0) and record.phases_s["first_step"] is None


# ---- status snapshots -------------------------------------------------------------------


def usage(node_id: str, *, used_bytes: int, budget_bytes: int, shards: int) -> StoreStats:
    """A store's usage as ``ShardStore.stats`` reports it (all of it shard data)."""
    return StoreStats(node_id, budget_bytes, used_bytes, used_bytes, 0, shards, {})


def test_status_event_records_memory_placement_and_protection() -> None:
    """status_event: placement per shard index, local copies, memory of every store, hosts, and
    protection over shards on alive nodes that still have a store."""
    ray_nodes = [
        {"NodeID": "a", "Alive": True, "NodeManagerHostname": "host-a", "NodeManagerAddress": "10.0.0.1"},
        {"NodeID": "b", "Alive": True, "NodeManagerHostname": "host-b", "NodeManagerAddress": "10.0.0.2"},
        {"NodeID": "c", "Alive": False, "NodeManagerHostname": "host-c", "NodeManagerAddress": "10.0.0.3"},
        {"NodeID": "d", "Alive": True, "NodeManagerHostname": "host-d", "NodeManagerAddress": "10.0.0.4"},
    ]
    stores: dict[str, StoreStats | str] = {
        "a": usage("a", used_bytes=10, budget_bytes=100, shards=3),
        "b": usage("b", used_bytes=20, budget_bytes=100, shards=2),
        "d": "GetTimeoutError",
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
        ray_nodes=[RayNode.from_ray(n) for n in ray_nodes],
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
        stores={n: usage(n, used_bytes=1, budget_bytes=9, shards=1) for n in "ab"},
        ray_nodes=[RayNode.from_ray(n) for n in ray_nodes],
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


def test_coalescer_forgets_keys_it_may_run_at_once_again() -> None:
    """It keeps when each key last ran only while that still delays a request: not every key
    (job) it ever ran."""
    coalescer = events.Coalescer(lambda key: None, interval_s=0.05)
    for i in range(100):
        coalescer.request(f"job-{i}")
    assert coalescer.wait_idle(5.0)
    time.sleep(0.1)
    coalescer.request("z")
    assert coalescer.wait_idle(5.0)
    assert list(coalescer._last) == ["z"]


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


# ---- well-formed events, bounded logs -----------------------------------------------------


MALFORMED = [  # (event, the field its error names)
    ({**kill(0, "n1"), "time": "abc"}, "time"),
    ({**kill(0, "n1"), "time": float("nan")}, "time"),
    ({"kind": "kill", "node_id": "n1"}, "time"),
    ({**kill(0, "n1"), "node_id": None}, "node_id"),
    ({**save(1, 0, 10, "A"), "phases_s": {"blocking": "slow"}}, "phases_s"),
    ({**save(1, 0, 10, "A"), "rank": "x"}, "rank"),
    ({**save(1, 0, 10, "A"), "rank": -1}, "rank"),
    ({**save(1, 0, 10, "A"), "rank": True}, "rank"),
    ({**save(1, 0, 10, "A"), "step": "10"}, "step"),
    ({**save(1, 0, 10, "A"), "job": ""}, "job"),
    ({**save(1, 0, 10, "A"), "returned": None}, "returned"),
    ({**restore(4, 0, "B", started=3.5), "started": "soon"}, "started"),
    ({**restore(4, 0, "B", started=3.5), "bytes": 1.5}, "bytes"),
    ({**restore(4, 0, "B", started=3.5), "error": ["boom"]}, "error"),
    (event("rejoin", time=T0, job="job", rank=0, attempt="B", role="survivor", worker_started=T0), "joined"),
    (event("status", time=T0, job="j", step=1, nodes="x"), "nodes"),
    (event("status", time=T0, job="j", step=1, nodes={"a": {"alive": "yes"}}), "nodes.alive"),
    (event("status", time=T0, job="j", step=1, nodes={"a": None}), "nodes"),  # null only in a delta
    (event("status", time=T0, job="j", step=1, placement={"zero": ["a"]}), "placement"),
    (event("status", time=T0, job="j", step=1, placement={"0": "a"}), "placement"),
    (event("status", time=T0, job="j", step=1, local={"0": 3}), "local"),
    ({"kind": "explode", "time": 1.0}, "kind"),
]


@pytest.mark.parametrize(("bad", "field"), MALFORMED, ids=[f"{b['kind']}-{f}" for b, f in MALFORMED])
def test_a_malformed_event_is_refused_naming_its_field_and_nothing_is_recorded(tmp_path, bad, field) -> None:
    """append (what the registry's record calls) raises ConfigError naming the field; the log and its
    file stay as they were, and read()/resolve() skip such an event where one was written anyway."""
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.append(kill(0, "n0"))
    with pytest.raises(ConfigError, match=re.escape(repr(field))) as refused:
        log.append(bad)
    assert refused.value.field == field
    assert isinstance(refused.value, ValueError)  # as append always raised for a non-event
    assert log.since() == (1, [kill(0, "n0")])
    assert events.read(path) == [kill(0, "n0")]
    assert not events.valid(bad) and events.resolve([bad, kill(0, "n0")]) == [kill(0, "n0")]
    with path.open("a") as out:  # written by something else: readers skip it
        out.write(json.dumps(bad) + "\n")
    assert events.read(path) == [kill(0, "n0")]


def test_a_well_formed_event_of_every_kind_passes_the_check() -> None:
    """The events the library sends (with None where a field is optional) are well-formed."""
    rejoin = event(
        "rejoin",
        time=T0,
        job="job",
        rank=1,
        attempt="B",
        role="replacement",
        generation=2,
        pid=7,
        process_started=T0 - 5,
        warmed=None,
        worker_started=T0 - 4,
        detected=None,
        torn_down=None,
        joined=T0 - 1,
        round_started=T0 - 2,
        formed=T0 - 0.5,
        ready=T0,
    )
    failed = event("restore", time=T0, job="job", rank=0, attempt=None, step=None, source=None, error="E: x")
    for record in (*one_failure(), rejoin, failed, snapshot_at(3, 2), {**kill(0, "n"), "extra": [1, {"a": 2}]}):
        events.check(record)


def test_the_registry_refuses_status_events_and_events_larger_than_the_cap_from_callers() -> None:
    """With the registry's arguments (CALLER_KINDS, RAY_CKPT_EVENT_MAX_BYTES) a status event and an
    event whose JSON passes the cap are refused; nothing is recorded."""
    log = EventLog()
    cap = settings.event_max_bytes()
    assert cap == 64 << 10
    big = {**restore(4, 0, "B", started=3.5), "error": "x" * cap}
    with pytest.raises(ConfigError, match="RAY_CKPT_EVENT_MAX_BYTES") as refused:
        log.append(big, max_bytes=cap, kinds=events.CALLER_KINDS)
    assert refused.value.size_bytes > cap
    with pytest.raises(ConfigError, match="status") as refused:
        log.append(snapshot_at(3, 2), max_bytes=cap, kinds=events.CALLER_KINDS)
    assert refused.value.field == "kind"
    with pytest.raises(ConfigError, match="not JSON"):
        log.append({**kill(0, "n"), "extra": float("inf")}, max_bytes=cap, kinds=events.CALLER_KINDS)
    assert log.since() == (0, [])
    with settings.override(RAY_CKPT_EVENT_MAX_BYTES=1 << 20):
        log.append(big, max_bytes=settings.event_max_bytes(), kinds=events.CALLER_KINDS)
    assert log.since() == (1, [big])


def test_the_log_holds_each_event_as_its_json_line_reads_back(tmp_path) -> None:
    """What since() returns equals what read() returns: numpy numbers become numbers, int keys
    strings (a live reader that sorts keys, as the dashboard's de-duplication does, cannot fail)."""
    import numpy as np

    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.append({**save(1, 0, 10, "A"), "bytes": np.int64(7), "extra": {1: "a", "b": np.float32(0.5)}})
    _, held = log.since()
    assert held == events.read(path) == [{**save(1, 0, 10, "A"), "bytes": 7, "extra": {"1": "a", "b": 0.5}}]
    json.dumps(held, sort_keys=True)


def test_the_events_file_rotates_at_its_cap_keeping_the_newest_files(tmp_path) -> None:
    """The file never passes file_max_bytes; it is renamed to .1 (and .1 to .2) and the oldest
    beyond file_keep is deleted; the files, oldest first, hold the newest events in order."""
    path = tmp_path / "events.jsonl"
    log = EventLog(path, file_max_bytes=1000, file_keep=2)
    records = [kill(i, f"node-{i:03d}") for i in range(100)]
    for record in records:
        log.append(record)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["events.jsonl", "events.jsonl.1", "events.jsonl.2"]
    files = [path.with_name("events.jsonl.2"), path.with_name("events.jsonl.1"), path]
    assert all(0 < f.stat().st_size <= 1000 for f in files)
    kept = [record for f in files for record in events.read(f)]
    assert kept == records[-len(kept) :] and len(kept) > 20
    assert log.rotations > 2 and log.since() == (100, records)  # memory holds all: its own cap

    # the settings, read when used; keep 0: no older file
    other = tmp_path / "other" / "events.jsonl"
    with settings.override(RAY_CKPT_EVENTS_FILE_MAX_BYTES=500, RAY_CKPT_EVENTS_FILE_KEEP=0):
        log = EventLog(other)
        for record in records:
            log.append(record)
    assert [p.name for p in other.parent.iterdir()] == ["events.jsonl"]
    assert 0 < other.stat().st_size <= 500 and events.read(other)[-1] == records[-1]


def test_an_existing_file_past_the_cap_is_rotated_at_the_first_append(tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    events.write(path, [kill(i, "old") for i in range(50)])
    log = EventLog(path, file_max_bytes=1000, file_keep=1)
    log.append(kill(99, "new"))
    assert events.read(path) == [kill(99, "new")] and len(events.read(path.with_name("events.jsonl.1"))) == 50


def test_the_in_memory_log_is_capped_by_bytes() -> None:
    """The log keeps the newest events whose JSON fits memory_max_bytes (the newest always), and
    since() keeps numbering events by their append order."""
    records = [kill(i, f"node-{i:03d}") for i in range(100)]
    size = len(json.dumps(records[0], separators=(",", ":"))) + 1
    log = EventLog(memory_max_bytes=10 * size)
    for record in records:
        log.append(record)
    assert log.since(0) == (100, records[-10:])
    assert log.since(95) == (100, records[95:])
    huge = {**kill(100, "n"), "note": "x" * (20 * size)}
    log.append(huge)
    assert log.since(0) == (101, [huge])  # larger than the cap alone: kept, the rest dropped
    with settings.override(RAY_CKPT_EVENTS_MEMORY_MAX_BYTES=3 * size):
        log = EventLog()
        for record in records:
            log.append(record)
        assert log.since(0) == (100, records[-3:])
    assert settings.events_memory_max_bytes() == 16 << 20


def test_recoveries_skip_malformed_events() -> None:
    """Malformed events mixed into a history change no recovery (they would raise in the phases)."""
    clean = recoveries(one_failure())
    assert recoveries([*one_failure(), *(bad for bad, _ in MALFORMED)]) == clean
    assert recoveries([*one_failure(), "junk", None]) == clean  # type: ignore[list-item]


# ---- status snapshots as deltas -----------------------------------------------------------


def node_ids(count: int) -> list[str]:
    return [f"{i:056x}" for i in range(count)]  # Ray node ids are 56 hex digits


def snapshot_at(
    nodes: int,
    ranks: int,
    *,
    step: int = 1,
    t: float = T0,
    used: dict[int, int] | None = None,
    moved: dict[int, int] | None = None,
    dead: frozenset[int] = frozenset(),
    k: int = 4,
    m: int = 2,
) -> dict[str, Any]:
    """A whole status event of a job on ``nodes`` nodes (each with a store), ``ranks`` ranks of RS(k, m):
    rank r's shards on the nodes after its own; ``used`` overrides a node's bytes used, ``moved``
    puts rank r's shard 0 on another node, ``dead`` nodes are dead without a store."""
    ids = node_ids(nodes)
    ray_nodes = [
        {
            "NodeID": node,
            "Alive": i not in dead,
            "NodeManagerHostname": f"worker-{i:04d}.cluster.internal",
            "NodeManagerAddress": f"10.0.{i // 256}.{i % 256}",
        }
        for i, node in enumerate(ids)
    ]
    stores: dict[str, StoreStats | str] = {
        node: usage(node, used_bytes=(used or {}).get(i, 12_345_678_901), budget_bytes=64_000_000_000, shards=24)
        for i, node in enumerate(ids)
        if i not in dead
    }
    shards = {r: {i: ids[(r + 1 + i) % nodes] for i in range(k + m)} for r in range(ranks)}
    for rank, node in (moved or {}).items():
        shards[rank][0] = ids[node]
    return events.status_event(
        "job",
        step,
        world_size=ranks,
        data_shards=k,
        parity_shards=m,
        shards=shards,
        local_nodes={r: ids[r % nodes] for r in range(ranks)},
        stores=stores,
        ray_nodes=[RayNode.from_ray(n) for n in ray_nodes],
        time=t,
    )


def json_size(record: dict[str, Any]) -> int:
    return len(json.dumps(record, separators=(",", ":")))


def test_a_status_event_at_512_nodes_is_a_delta_whose_size_does_not_grow_with_the_nodes() -> None:
    """Measured: a whole snapshot of 512 ranks of RS(4,2) on 512 nodes is about 319 KiB (what
    the registry recorded every second before); the next commit with nothing changed is recorded
    as a delta under 1 KiB, the same size at 64 and at 512 nodes; a delta with a few changes
    grows with the changes only."""
    whole = snapshot_at(512, 512, step=1, t=T0)
    assert json_size(whole) > 300 << 10
    sizes = {}
    for nodes in (64, 512):
        log = EventLog()
        assert log.append_status(snapshot_at(nodes, 512, step=1, t=T0)) == snapshot_at(nodes, 512, step=1, t=T0)
        delta = log.append_status(snapshot_at(nodes, 512, step=2, t=T0 + 1))
        assert delta["base"] == T0 and delta["step"] == 2
        assert delta["placement"] == {} and delta["local"] == {} and delta["nodes"] == {}
        sizes[nodes] = json_size(delta)
    assert sizes[512] < 1 << 10 and abs(sizes[512] - sizes[64]) <= 8
    log = EventLog()
    log.append_status(whole)
    changed = log.append_status(snapshot_at(512, 512, step=2, t=T0 + 1, used={3: 1, 9: 2, 40: 3}, moved={7: 300}))
    assert set(changed["nodes"]) == {node_ids(512)[i] for i in (3, 9, 40)} and list(changed["placement"]) == ["7"]
    assert json_size(changed) < sizes[512] + 4 * 400  # about one row per change


def history() -> list[dict[str, Any]]:
    """Whole snapshots of one job with every kind of change: memory, a moved shard, a node that
    dies (its store gone), comes back, a store error, a lost local copy, a new world size."""
    ids = node_ids(6)
    out = [snapshot_at(6, 4, step=s, t=T0 + s) for s in range(3)]
    out.append(snapshot_at(6, 4, step=3, t=T0 + 3, used={1: 5}, moved={2: 5}))
    out.append(snapshot_at(6, 4, step=4, t=T0 + 4, dead=frozenset({5})))
    errored = snapshot_at(6, 4, step=5, t=T0 + 5)
    errored["nodes"][ids[2]] = {**errored["nodes"][ids[2]], "used_bytes": None, "error": "GetTimeoutError"}
    del errored["local"]["3"]
    out.append(errored)
    out.append(snapshot_at(6, 4, step=6, t=T0 + 6))
    out.append(snapshot_at(6, 3, step=7, t=T0 + 7))  # another world size: whole
    out.append(snapshot_at(6, 3, step=8, t=T0 + 8, used={0: 9}))
    return out


def test_status_deltas_resolve_to_the_whole_snapshots_through_a_file(tmp_path) -> None:
    """Recorded as deltas and read back, the events resolve to exactly the snapshots taken, and
    the dashboard's data from the file is what it is from the whole snapshots."""
    from ray_ckpt.dashboard import data as dashboard_data

    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    whole = history()
    recorded = [log.append_status(snapshot) for snapshot in whole]
    assert [r.get("base") is None for r in recorded] == [True] + [False] * 6 + [True, False]
    assert events.read(path) == recorded
    assert events.resolve(events.read(path)) == whole
    assert events.resolve(reversed(events.read(path))) != whole  # order matters: deltas need their base
    for t in range(len(whole)):  # what the dashboard shows after each snapshot
        got = dashboard_data.build(events.read(path)[: t + 1], now=0.0)
        assert got == dashboard_data.build(whole[: t + 1], now=0.0)


def test_a_status_event_is_whole_when_a_reader_could_not_find_its_base(tmp_path) -> None:
    """Whole after the file rotated (its first line for the job in the new file), after the job's
    whole event left memory, and STATUS_FULL_EVERY_S after the last whole one; a delta stays
    per job."""
    path = tmp_path / "events.jsonl"
    first = snapshot_at(6, 4, step=0, t=T0)
    log = EventLog(path, file_max_bytes=3 * json_size(first))
    assert "base" not in log.append_status(first)
    assert "base" in log.append_status(snapshot_at(6, 4, step=1, t=T0 + 1))
    other = {**snapshot_at(6, 4, step=0, t=T0 + 1.5), "job": "other"}
    assert "base" not in log.append_status(other)  # per job
    for step in range(2, 40):  # the file rotates now and then: the job's next event is whole
        rotations = log.rotations
        recorded = log.append_status(snapshot_at(6, 4, step=step, t=T0 + step))
        if "base" not in recorded and step > 2:
            assert log.rotations == rotations + 1
            break
    else:
        raise AssertionError("the file never rotated")
    opening = events.read(path)[0]  # the new file opens with the job's whole snapshot
    assert opening["kind"] == "status" and "base" not in opening
    assert events.resolve(events.read(path))[-1] == snapshot_at(6, 4, step=step, t=T0 + step)

    log = EventLog(memory_max_bytes=2 * json_size(first))
    log.append_status(first)
    for i in range(3):
        log.append(kill(i, "x" * 40))
    assert "base" in log.append_status(snapshot_at(6, 4, step=1, t=T0 + 1))
    for i in range(200):
        log.append(kill(i, "x" * 40))  # the whole event leaves memory
    assert "base" not in log.append_status(snapshot_at(6, 4, step=2, t=T0 + 2))

    log = EventLog()
    log.append_status(first)
    assert "base" in log.append_status(snapshot_at(6, 4, step=1, t=T0 + events.STATUS_FULL_EVERY_S - 1))
    assert "base" not in log.append_status(snapshot_at(6, 4, step=2, t=T0 + events.STATUS_FULL_EVERY_S))
    with pytest.raises(ConfigError, match="whole"):
        log.append_status({**snapshot_at(6, 4, step=3, t=T0 + 1e4), "base": T0})


def test_the_log_holds_a_jobs_previous_snapshot_only_while_a_delta_could_use_it() -> None:
    """Not one snapshot per job ever seen: a job's is dropped, oldest first, once its whole event
    left memory or is STATUS_FULL_EVERY_S old (its next event is whole then anyway), so what the
    log holds is bounded by the events it holds; recent jobs still get deltas."""
    first = snapshot_at(6, 4, step=0, t=T0)
    log = EventLog(memory_max_bytes=20 * json_size(first))
    for i in range(300):
        log.append_status({**snapshot_at(6, 4, step=0, t=T0 + i * 0.1), "job": f"j{i}"})
        assert len(log._status) <= len(log.since(0)[1]) <= 20
    assert list(log._status) == [f"j{i}" for i in range(300 - len(log._status), 300)]  # the newest jobs
    assert "base" in log.append_status({**snapshot_at(6, 4, step=1, t=T0 + 30), "job": "j299"})
    assert "base" not in log.append_status({**snapshot_at(6, 4, step=1, t=T0 + 30), "job": "j0"})

    log = EventLog()
    log.append_status({**first, "job": "old"})
    log.append_status({**snapshot_at(6, 4, step=0, t=T0 + 1), "job": "recent"})
    log.append(kill(events.STATUS_FULL_EVERY_S, "n"))  # any event ages the snapshots out
    assert list(log._status) == ["recent"]
    assert "base" not in log.append_status({**snapshot_at(6, 4, step=1, t=T0 + 700), "job": "old"})


def test_resolve_skips_deltas_whose_base_is_missing_until_the_next_whole_event() -> None:
    """A file that begins mid-chain (its whole event rotated away) or lost a line: those deltas
    are left out, not applied to the wrong base; the next whole event starts again."""
    log = EventLog()
    whole = history()
    recorded = [log.append_status(snapshot) for snapshot in whole]
    assert events.resolve(recorded[2:]) == whole[7:]  # no base until the world size changed
    assert events.resolve([recorded[0], recorded[1], *recorded[3:]]) == [*whole[:2], *whole[7:]]
    assert events.status_delta(whole[6], whole[7]) is None  # another world size: no delta
