"""CoordinatorRelay: the calls of one run, op and key that meet in a store go up as one, each
caller gets the results of its own entries; other runs, ops or keys never mix; errors reach
every caller of the call that failed."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from ray_ckpt.core.coordinator_relay import OPS, CoordinatorRelay


class Up:
    """The call up: records each (run, target, op, key, entries); the first blocks until released."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, str, tuple[Any, ...], list[Any]]] = []
        self.release = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, run: str, target: Any, op: str, key: tuple[Any, ...], entries: list[Any]) -> list[Any]:
        with self.lock:
            self.sent.append((run, target, op, key, list(entries)))
            first = len(self.sent) == 1
        if first:
            self.release.wait(5)
        return [(op, key, entry) for entry in entries]


def wait_for_first(up: Up) -> None:
    deadline = time.monotonic() + 5
    while not up.sent and time.monotonic() < deadline:
        time.sleep(0.001)


def test_calls_that_meet_go_up_as_one_and_each_caller_gets_its_own_results() -> None:
    up = Up()
    relay = CoordinatorRelay(up)
    with ThreadPoolExecutor(9) as pool:
        first = pool.submit(relay.submit, "run", "coord", "beat", (), ["r0"])
        wait_for_first(up)
        rest = [pool.submit(relay.submit, "run", "coord", "beat", (), [f"r{i}a", f"r{i}b"]) for i in range(1, 9)]
        time.sleep(0.1)  # they queue behind the call in flight
        up.release.set()
        assert first.result(5) == [("beat", (), "r0")]
        for i, future in enumerate(rest, start=1):
            assert future.result(5) == [("beat", (), f"r{i}a"), ("beat", (), f"r{i}b")]
    assert len(up.sent) == 2 and relay.sends == 2
    assert sorted(up.sent[1][4]) == sorted(e for i in range(1, 9) for e in (f"r{i}a", f"r{i}b"))


def test_runs_ops_and_keys_never_merge() -> None:
    up = Up()
    up.release.set()
    relay = CoordinatorRelay(up)
    calls = [("a", "beat", ()), ("b", "beat", ()), ("a", "join", ()), ("a", "await", (3,)), ("a", "await", (4,))]
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(relay.submit, run, f"coord-{run}", op, key, [op]) for run, op, key in calls]
        assert [f.result(5) for f in futures] == [[(op, key, op)] for _, op, key in calls]
    assert sorted((run, target, op, key) for run, target, op, key, _ in up.sent) == sorted(
        (run, f"coord-{run}", op, key) for run, op, key in calls
    )


def test_an_error_up_reaches_every_caller_of_that_call() -> None:
    def up(run: str, target: Any, op: str, key: tuple[Any, ...], entries: list[Any]) -> list[Any]:
        raise ConnectionError("parent and coordinator gone")

    relay = CoordinatorRelay(up)
    with pytest.raises(ConnectionError, match="coordinator gone"):
        relay.submit("run", "coord", "join", (), ["m"])


def test_a_call_up_with_the_wrong_number_of_results_is_an_error_not_a_wrong_answer() -> None:
    relay = CoordinatorRelay(lambda run, target, op, key, entries: [True])
    with pytest.raises(RuntimeError, match="2 entries got 1 results"):
        relay.submit("run", "coord", "beat", (), ["m1", "m2"])


def test_an_unknown_op_is_refused_with_the_ops_there_are() -> None:
    relay = CoordinatorRelay(lambda run, target, op, key, entries: list(entries))
    with pytest.raises(ValueError, match="unknown coordinator op 'leave'") as raised:
        relay.submit("run", "coord", "leave", (), ["m"])
    for op in OPS:
        assert op in str(raised.value)


def test_calls_of_one_run_to_two_coordinators_never_share_a_batch() -> None:
    """Calls of one run queued behind calls in flight, some naming coordinator A and some B (a
    probe's, or the run's next controller's, under the same run id): each batch goes to the
    coordinator its callers named, with their entries only, and each caller gets its own
    coordinator's results."""
    sent: list[tuple[Any, list[Any]]] = []
    release = threading.Event()

    def up(run: str, target: Any, op: str, key: tuple[Any, ...], entries: list[Any]) -> list[Any]:
        sent.append((target, list(entries)))
        release.wait(5)
        return [f"{target} answers {entry}" for entry in entries]

    relay = CoordinatorRelay(up)
    with ThreadPoolExecutor(8) as pool:
        first = [pool.submit(relay.submit, "run", target, "beat", (), [f"{target}0"]) for target in "AB"]
        deadline = time.monotonic() + 5
        while len(sent) < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        queued = {
            f"{t}{i}": pool.submit(relay.submit, "run", t, "beat", (), [f"{t}{i}"]) for i, t in enumerate("ABABAB", 1)
        }
        time.sleep(0.1)  # they queue behind the calls in flight
        release.set()
        assert [f.result(5) for f in first] == [["A answers A0"], ["B answers B0"]]
        assert {entry: f.result(5) for entry, f in queued.items()} == {e: [f"{e[0]} answers {e}"] for e in queued}
    assert sorted((target, sorted(entries)) for target, entries in sent) == [
        ("A", ["A0"]),
        ("A", ["A1", "A3", "A5"]),
        ("B", ["B0"]),
        ("B", ["B2", "B4", "B6"]),
    ]


def test_coordinators_are_told_apart_by_their_name_and_the_call_goes_to_a_callers_target() -> None:
    """``identify`` names a coordinator: two copies of one handle merge, and the batch goes to
    one of them; nothing of the handle is kept once its calls are answered."""

    class Handle:
        def __init__(self, actor: str) -> None:
            self.actor = actor

    up = Up()
    relay = CoordinatorRelay(up, identify=lambda handle: handle.actor)
    copies = [Handle("coordinator-1"), Handle("coordinator-1")]
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(relay.submit, "run", copies[0], "join", (), ["m0"])
        wait_for_first(up)
        rest = [pool.submit(relay.submit, "run", copy, "join", (), [f"m{i}"]) for i, copy in enumerate(copies, 1)]
        time.sleep(0.1)
        up.release.set()
        assert [f.result(5) for f in [first, *rest]] == [[("join", (), f"m{i}")] for i in range(3)]
    assert len(up.sent) == 2 and up.sent[1][1] in copies
    assert relay.batchers == [("run", "coordinator-1", "join", ())]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_store_keeps_at_most_max_batchers_dropping_the_least_recently_used_first() -> None:
    """Runs come and go: the batchers kept never exceed the bound, the least recently used go
    first, and a run whose batcher was dropped still gets its calls answered (with a new one)."""
    clock = Clock()
    relay = CoordinatorRelay(lambda run, target, op, key, entries: list(entries), max_batchers=4, clock=clock)
    for i in range(10):
        clock.now += 1
        assert relay.submit(f"run-{i}", "coord", "beat", (), [i]) == [i]
        assert len(relay.batchers) <= 4
        if i >= 3:
            relay.submit("run-0", "coord", "beat", (), ["kept"])  # run 0 keeps beating
    assert [run for run, *_ in relay.batchers] == ["run-7", "run-8", "run-9", "run-0"]
    assert relay.submit("run-1", "coord", "beat", (), ["back"]) == ["back"]
    assert [run for run, *_ in relay.batchers] == ["run-8", "run-9", "run-0", "run-1"]
    assert relay.sends == 10 + 7 + 1


def test_a_batcher_no_call_used_for_idle_s_is_dropped_at_the_next_call() -> None:
    """An ended run's batchers (and a past generation's) go once idle for ``idle_s``; those in use stay."""
    clock = Clock()
    relay = CoordinatorRelay(lambda run, target, op, key, entries: list(entries), idle_s=60.0, clock=clock)
    relay.submit("ended", "coord", "beat", (), ["m"])
    relay.submit("ended", "coord", "await", (3,), ["m"])
    relay.submit("running", "coord", "beat", (), ["m"])
    clock.now = 30.0
    relay.submit("running", "coord", "beat", (), ["m"])
    assert len(relay.batchers) == 3
    clock.now = 61.0
    relay.submit("running", "coord", "beat", (), ["m"])
    assert relay.batchers == [("running", "coord", "beat", ())]
    with pytest.raises(ValueError, match="idle_s"):
        CoordinatorRelay(lambda *call: [], idle_s=0)
