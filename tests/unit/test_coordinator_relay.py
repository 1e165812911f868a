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
