"""``CheckpointConfig.every`` in ``Checkpointer.save``, over a fake save pipeline (no Ray): a step
that is not due returns a skipped handle without looking at the state; under "auto" every step of
the warm-up is saved (a busy rank waits), ranks with different timings save the same steps, and a
new interval is logged as an event."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import torch

from ray_ckpt import CheckpointConfig, ConfigError, TornStepError
from ray_ckpt.checkpointer import Checkpointer
from ray_ckpt.core import events
from ray_ckpt.core.identity import RankIdentity
from ray_ckpt.core.interval import IntervalPolicy

STATE = {"w": torch.zeros(4)}
NOT_A_STATE = object()  # build_layout refuses it: a step that got that far would raise


class FakeSaves:
    """The SavePipeline's part a save touches; ``complete`` waits for ``gate``."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.snapshots: list[int] = []
        self.completed: list[int] = []
        self.commits = True

    def check_placement(self) -> None:
        pass

    def release(self, *, keep_for_rollback: bool = False) -> None:
        pass

    def snapshot(self, layout: Any) -> tuple[np.ndarray, int, list[Any]]:
        self.snapshots.append(len(layout.tensors))
        return np.zeros(8, dtype=np.uint8), 8, []

    def complete(self, step: int, *_: Any) -> bool:
        if not self.gate.wait(30):  # a safety net against a hang, not a timing assert
            raise TimeoutError("the test never opened the gate")
        self.completed.append(step)
        return self.commits  # whether the stage committed the step


class FakeRegistry:
    def record(self, event: dict[str, Any]) -> None:
        events.check(event)
        self.events.append(event)

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.waited: list[int] = []
        self.passed: list[int] = []
        self.settled = "committed"  # what wait_settled answers
        self.latest: int | None = None
        self.reached: list[int] = []  # steps rank 0 said it trained (note_reached)

    def wait_settled(self, job: str, step: int, *, passed: int, **_: Any) -> str:
        self.waited.append(step)
        self.passed.append(passed)
        return self.settled

    def staged_ranks(self, job: str, step: int) -> list[int]:
        return [0]

    def latest_committed(self, job: str) -> int | None:
        return self.latest

    def note_reached(self, job: str, attempt: str | None, step: int) -> None:
        self.reached.append(step)


def wired(config: CheckpointConfig) -> tuple[Checkpointer, FakeSaves, FakeRegistry]:
    """A Checkpointer past its constructor with fakes for the pipeline and the registry."""
    ckpt = object.__new__(Checkpointer)
    saves, registry = FakeSaves(), FakeRegistry()
    ckpt.identity = RankIdentity(job="job", rank=0, world_size=1, attempt="a", node_id="node")
    ckpt.config = config
    ckpt._closed, ckpt._last_step, ckpt._in_flight, ckpt._previous_call = False, None, None, None
    ckpt._reached = None
    ckpt._in_flight_blocking = ckpt._in_flight_since = ckpt._background_ended = 0.0
    ckpt._policy = IntervalPolicy(max_interval_s=600, mtbf_prior_s=3600) if config.every == "auto" else None
    ckpt._saves = saves  # type: ignore[assignment]
    ckpt._registry = registry  # type: ignore[assignment]
    ckpt._background = ThreadPoolExecutor(max_workers=1)
    ckpt._stores = {}  # type: ignore[assignment]
    ckpt.last_save_phases_s = {}
    return ckpt, saves, registry


def test_an_int_saves_only_the_steps_divisible_by_it() -> None:
    ckpt, saves, registry = wired(CheckpointConfig(every=4))
    assert ckpt.interval == 4
    for step in range(1, 9):
        handle = ckpt.save(step, STATE if step % 4 == 0 else NOT_A_STATE)
        assert handle.skipped == (step % 4 != 0), step
        assert handle.skip_reason == (None if step % 4 == 0 else "not due")
        assert ("skipped" in ckpt.last_save_phases_s) == handle.skipped
        handle.wait()  # a skipped handle returns at once
    assert len(saves.snapshots) == 2 and saves.completed == [4, 8]
    assert registry.reached == list(range(1, 9))  # every step said trained, saved or skipped
    ckpt._background.shutdown()


def test_the_default_saves_every_call() -> None:
    ckpt, saves, _ = wired(CheckpointConfig())
    for step in range(3):
        assert not ckpt.save(step, STATE).skipped
        ckpt.wait()
    assert saves.completed == [0, 1, 2]
    ckpt._background.shutdown()


def test_a_step_that_is_not_due_still_checks_the_step_number() -> None:
    ckpt, _, _ = wired(CheckpointConfig(every=4))
    ckpt.save(4, STATE).wait()
    with pytest.raises(ConfigError, match="not newer"):
        ckpt.save(3, NOT_A_STATE)
    ckpt._background.shutdown()


def a_save_that_waits_for_the_gate(ckpt: Checkpointer, saves: FakeSaves, step: int, what: str) -> Any:
    """``ckpt.save(step)`` called on a thread while the running save holds ``saves``' gate: the
    call must still wait 0.3 s later (``what`` names the step if not); then the gate opens and
    the call's handle is returned."""
    returned: list[Any] = []
    caller = threading.Thread(target=lambda: returned.append(ckpt.save(step, STATE)))
    caller.start()
    caller.join(0.3)
    assert caller.is_alive() and returned == [], f"{what} did not wait for the running save"
    saves.gate.set()
    caller.join(30)
    (handle,) = returned
    return handle


def test_auto_saves_every_warm_up_step_waiting_for_a_save_still_running() -> None:
    ckpt, saves, _ = wired(CheckpointConfig(every="auto"))
    saves.gate.clear()
    first = ckpt.save(0, STATE)
    assert not first.skipped
    second = a_save_that_waits_for_the_gate(ckpt, saves, 1, "step 1 of the warm-up")
    assert not second.skipped and saves.completed[:1] == [0]
    ckpt._background.shutdown()


def test_ranks_whose_saves_take_different_times_save_the_same_steps() -> None:
    """Whether a step is due never depends on timing: a rank whose saves are done by its next
    call and one whose saves still run then (it waits) save the same steps through the warm-up
    and after it, as long as they chose the same interval. (A warm-up that skipped busy steps
    left one rank's last saved step unsaved by the other: it never committed.)"""
    quick, _, _ = wired(CheckpointConfig(every="auto"))
    slow, slow_saves, _ = wired(CheckpointConfig(every="auto"))
    saved: dict[str, list[int]] = {"quick": [], "slow": []}
    same_until = 11  # the last step judged while both ranks had the same interval
    for step in range(12):
        handle = quick.save(step, STATE)
        if not handle.skipped:
            handle.staged()  # done before the next call
            saved["quick"].append(step)
        slow_saves.gate.clear()
        opener = threading.Timer(0.02, slow_saves.gate.set)  # still running at the next call
        opener.start()
        if not slow.save(step, STATE).skipped:
            saved["slow"].append(step)
        opener.join()
        if quick.interval != slow.interval:  # measured costs differ: later steps may be judged apart
            same_until = min(same_until, step)
    assert saved["quick"][:4] == saved["slow"][:4] == [0, 1, 2, 3], saved
    agreed = {rank: [s for s in steps if s <= same_until] for rank, steps in saved.items()}
    assert agreed["quick"] == agreed["slow"], (saved, same_until)
    quick._background.shutdown()
    slow._background.shutdown()


def warmed_up(ckpt: Checkpointer) -> int:
    """Save steps one after another (each waited for) until "auto" chose its interval; the
    next step."""
    step = 0
    while ckpt._policy is not None and ckpt._policy.warming_up:
        ckpt.save(step, STATE).wait()
        step += 1
        assert step < 50, "the warm-up never ended"
    return step


def test_after_warm_up_a_rank_still_saving_waits_for_it_on_a_step_of_the_grid() -> None:
    """Every rank saves every step on the grid, so it commits: a rank whose previous save still
    runs waits for it instead of skipping (skipping starved commits at scale)."""
    ckpt, saves, _ = wired(CheckpointConfig(every="auto"))
    step = warmed_up(ckpt)
    interval = ckpt.interval
    first = (step // interval + 1) * interval
    saves.gate.clear()
    assert not ckpt.save(first, STATE).skipped
    following = (first // ckpt.interval + 1) * ckpt.interval  # the interval the first save left
    second = a_save_that_waits_for_the_gate(ckpt, saves, following, "the next step of the grid")
    assert not second.skipped and first in saves.completed
    ckpt._background.shutdown()


def test_wait_waits_for_the_last_saved_step_even_after_a_later_call_collected_its_work() -> None:
    ckpt, _, registry = wired(CheckpointConfig(every="auto"))
    step = warmed_up(ckpt)
    saved = (step // ckpt.interval + 1) * ckpt.interval
    ckpt.save(saved, STATE).staged()
    if ckpt.interval > 1:
        assert ckpt.save(saved + 1, NOT_A_STATE).skip_reason == "not due"  # collects the save's work
    registry.waited.clear()
    ckpt.wait()
    assert registry.waited == [saved]
    assert registry.passed[-1] == (saved + 1 if ckpt.interval > 1 else saved)  # the newest call
    ckpt._background.shutdown()


def test_a_torn_last_step_ends_wait_and_fails_its_handle_with_the_newest_commit_named(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ranks on a longer interval went past this rank's last saved step: ``wait`` (the end of a
    run) returns and says so at INFO; the step's own handle raises TornStepError at once."""
    ckpt, saves, registry = wired(CheckpointConfig(every=2, on_busy="skip"))
    saves.commits = False
    handle = ckpt.save(6, STATE)
    ckpt.save(7, NOT_A_STATE)
    registry.settled, registry.latest = "torn", 4
    with caplog.at_level(logging.INFO, logger="ray_ckpt.checkpointer"):
        ckpt.wait()
    assert "step 6 will never commit" in caplog.text and "newest committed step is 4" in caplog.text
    assert registry.passed == [7]
    with pytest.raises(TornStepError, match="will never commit") as raised:
        handle.wait()
    assert raised.value.step == 6
    ckpt._background.shutdown()


@pytest.mark.parametrize("every", [2, "auto"])
def test_close_tells_the_registry_the_step_a_rank_went_past_where_ranks_may_save_different_steps(
    every: int | str,
) -> None:
    """So that a rank still waiting for a step this one did not save learns it is torn; with a
    fixed interval and on_busy="wait" every rank saves the same steps, and close asks nothing."""
    for on_busy, asked in (("wait", every == "auto"), ("skip", True)):
        ckpt, _, registry = wired(CheckpointConfig(every=every, on_busy=on_busy))  # type: ignore[arg-type]
        ckpt.save(0, STATE).staged()
        ckpt.save(1, STATE if every == "auto" else NOT_A_STATE)
        ckpt.close()
        assert registry.passed == ([1] if asked else []), (every, on_busy)


def test_wait_tells_the_registry_the_step_it_went_past_even_when_its_own_stage_committed() -> None:
    """The rank on the longer interval: its last step committed at its own stage, so its handle
    asks the registry nothing, yet a rank on a shorter interval waits for its note."""
    ckpt, _, registry = wired(CheckpointConfig(every=4, on_busy="skip"))
    ckpt.save(4, STATE).staged()
    for step in (5, 6, 7):
        ckpt.save(step, NOT_A_STATE)
    ckpt.wait()
    assert registry.passed == [7] and registry.waited == [4]
    ckpt._background.shutdown()


def test_a_wait_during_a_save_still_running_goes_past_only_the_steps_before_it() -> None:
    """Its stage may yet come: the rank says it went past the step before the running save."""
    ckpt, saves, registry = wired(CheckpointConfig(every=2))
    saves.commits = False
    first = ckpt.save(2, STATE)
    first.staged()
    saves.gate.clear()
    ckpt.save(4, STATE)
    first.wait()
    assert registry.passed == [3]
    saves.gate.set()
    ckpt.wait()
    assert registry.passed == [3, 4]
    ckpt._background.shutdown()


def test_auto_adapts_after_warm_up_records_the_interval_and_follows_its_grid() -> None:
    ckpt, _, registry = wired(CheckpointConfig(every="auto"))
    step = 0
    while not any(e["kind"] == "interval" for e in registry.events):
        handle = ckpt.save(step, STATE)
        handle.wait()
        step += 1
        assert step < 50, "the warm-up never ended"
    (event,) = [e for e in registry.events if e["kind"] == "interval"]
    interval = ckpt.interval
    assert event["interval"] == interval and interval & (interval - 1) == 0
    assert event["reason"] in ("optimum", "keep-up", "cap") and event["measured"]["step_s"] > 0
    # the next multiple of the interval is saved, a step between two multiples is not
    due = (step // interval + 1) * interval
    if interval > 1:
        assert ckpt.save(due - 1, NOT_A_STATE).skip_reason == "not due"
    handle = ckpt.save(due, STATE)
    assert not handle.skipped or ckpt.interval != interval
    ckpt._background.shutdown()


def test_a_background_error_is_raised_by_a_later_auto_call() -> None:
    ckpt, saves, _ = wired(CheckpointConfig(every="auto"))

    def fail(step: int, *_: Any) -> bool:
        raise RuntimeError("scatter failed")

    saves.complete = fail  # type: ignore[method-assign]
    handle = ckpt.save(0, STATE)
    with pytest.raises(RuntimeError, match="scatter failed"):
        handle.staged()
    with pytest.raises(RuntimeError, match="scatter failed"):
        ckpt.save(1, NOT_A_STATE)
    ckpt._background.shutdown()


@pytest.mark.parametrize("count", [-1, True, 1.0, "2"])
def test_failures_seen_takes_a_count(count: Any) -> None:
    ckpt, _, _ = wired(CheckpointConfig(every="auto"))
    with pytest.raises(ConfigError, match="int >= 0"):
        ckpt.failures_seen(count)
    ckpt.failures_seen(3)
    ckpt._background.shutdown()
