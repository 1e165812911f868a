"""The Ray Train Checkpointer under a drain notice, without Ray: every step is saved whatever
``every`` says, new shards avoid the draining nodes, and a rank on a draining node hands its
place over (in place) or holds (full restarts) only at a step every rank saves (one ``every``
saves anyway, or any once a step ``every`` skips committed after the notice), once it
committed; otherwise it trains on."""

from __future__ import annotations

import types
from typing import Any

import pytest

from ray_ckpt.core.generations import DrainNotice
from ray_ckpt.errors import CommitTimeoutError, HandedOver
from ray_ckpt.train import checkpointer as train_checkpointer
from ray_ckpt.train import inplace

NOTICE = DrainNotice(ranks=(2,), nodes=("drained",), deadline=None)


class Handle:
    def __init__(self, step: int, commits: bool) -> None:
        self.step, self.skipped, self.commits, self.waited = step, False, commits, False

    def wait(self, timeout_s: float | None = None) -> None:
        self.waited = True
        if not self.commits:
            raise CommitTimeoutError("not yet", job="j", step=self.step, missing_ranks=[0])


class Registry:
    def __init__(self) -> None:
        self.latest: int | None = None

    def latest_committed(self, job: str) -> int | None:
        return self.latest


def checkpointer(rank: int, notices: list[DrainNotice | None], commits: bool = True, every: int = 5) -> Any:
    """A Ray Train Checkpointer of ``rank`` saving every ``every`` steps, whose saves record
    (step, forced) and whose drain notice is ``notices[0]`` (a list the test changes)."""
    ckpt = train_checkpointer.Checkpointer.__new__(train_checkpointer.Checkpointer)
    ckpt._drain_first, ckpt._held, ckpt.forced_step = None, False, None
    ckpt._forced_since_notice, ckpt._every_rank_forces = set(), False
    ckpt._saves = types.SimpleNamespace(avoid=frozenset())
    ckpt._registry = Registry()
    ckpt.config = types.SimpleNamespace(commit_timeout_s=30.0)
    ckpt.identity = types.SimpleNamespace(rank=rank, job="j")
    ckpt.saved = []

    def save(step: int, state: Any, force: bool) -> Handle:
        ckpt.saved.append((step, force))
        if step % every and force:  # what the base class notes of a step saved only because forced
            ckpt.forced_step = step
        return Handle(step, commits)

    ckpt._save = save
    ckpt._drain_notice = lambda: notices[0]
    return ckpt


@pytest.fixture
def in_place(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """An in-place run's worker: the handovers the coordinator took."""
    taken: list[str] = []
    monkeypatch.setattr(inplace, "current_attempt", lambda: "run.g1")
    monkeypatch.setattr(inplace, "hand_over", lambda: taken.append("handed") or HandedOver("rank 2: handed over"))
    return taken


def test_without_a_notice_saves_go_as_asked(in_place: list[str]) -> None:
    ckpt = checkpointer(2, [None])
    ckpt.save(1, {})
    assert ckpt.saved == [(1, False)] and ckpt._saves.avoid == frozenset()


def test_a_draining_rank_hands_over_once_a_step_every_skips_committed_after_the_notice(in_place: list[str]) -> None:
    notices: list[DrainNotice | None] = [NOTICE]
    ckpt = checkpointer(2, notices)
    ckpt.save(6, {})  # the first step after the notice: saved, forced, nothing more
    assert ckpt.saved == [(6, True)] and ckpt._saves.avoid == {"drained"} and in_place == []
    ckpt._registry.latest = 5  # a step every rank saves anyway: no sign that the others force
    ckpt.save(7, {})
    assert in_place == []
    ckpt._registry.latest = 7  # a step ``every`` skips committed: every rank saves each step
    with pytest.raises(HandedOver):
        ckpt.save(8, {})  # step 8 commits, then the handover
    assert in_place == ["handed"] and ckpt.saved[-1] == (8, True)


def test_a_draining_rank_hands_over_at_a_step_every_saves_anyway(in_place: list[str]) -> None:
    ckpt = checkpointer(2, [NOTICE])
    ckpt.save(9, {})
    assert in_place == []
    with pytest.raises(HandedOver):
        ckpt.save(10, {})  # due by ``every``: every rank saves it, with or without the notice
    assert in_place == ["handed"]


def test_only_stores_on_draining_nodes_change_where_shards_go_not_which_steps_are_saved(in_place: list[str]) -> None:
    ckpt = checkpointer(0, [DrainNotice(ranks=(), nodes=("stores-only",), deadline=None)])
    ckpt.save(7, {})
    assert ckpt.saved == [(7, False)] and ckpt._saves.avoid == {"stores-only"}


def test_a_peer_of_the_draining_rank_saves_every_step_and_never_hands_over(in_place: list[str]) -> None:
    notices: list[DrainNotice | None] = [NOTICE]
    ckpt = checkpointer(0, notices)
    ckpt._registry.latest = 100
    for step in (7, 8, 9):
        ckpt.save(step, {})
    assert ckpt.saved == [(7, True), (8, True), (9, True)] and in_place == []
    notices[0] = None  # the replacement trains elsewhere: the notice is gone
    ckpt.save(10, {})
    assert ckpt.saved[-1] == (10, False) and ckpt._saves.avoid == frozenset()


def test_a_step_that_does_not_commit_in_time_is_tried_again_at_the_next(in_place: list[str]) -> None:
    ckpt = checkpointer(2, [NOTICE], commits=False)
    assert ckpt.save(10, {}).waited and in_place == []


def test_without_in_place_the_draining_rank_holds_instead_of_handing_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inplace, "current_attempt", lambda: None)
    held: list[int] = []
    ckpt = checkpointer(2, [NOTICE])
    ckpt._hold = lambda step, notice: held.append(step)
    ckpt.save(7, {})
    ckpt._registry.latest = 7
    ckpt.save(8, {})
    assert held == [8] and ckpt.saved == [(7, True), (8, True)]


def test_without_in_place_the_draining_rank_trains_on_until_the_deadline_is_a_few_steps_away(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 10 s deadline and 1 s steps: the draining rank saves every step and trains on while the
    deadline is more than HOLD_STEPS steps plus DRAIN_MARGIN_S away, then holds at the next
    committed step (the restart resumes from it: no step redone, little of the window idle)."""
    clock = [100.0]
    monkeypatch.setattr(
        train_checkpointer, "time", types.SimpleNamespace(time=lambda: clock[0], monotonic=lambda: clock[0])
    )
    monkeypatch.setattr(inplace, "current_attempt", lambda: None)
    notice = DrainNotice(ranks=(2,), nodes=("drained",), deadline=110.0)
    held: list[int] = []
    ckpt = checkpointer(2, [notice])
    ckpt._registry.latest = 0  # a committed step saved only because of the notice: every rank saves each step
    ckpt._every_rank_forces = True
    ckpt._hold = lambda step, notice: held.append(step)
    for step in range(1, 10):
        if held:
            break
        ckpt.save(step, {})
        clock[0] += 1.0  # the step and its save took 1 s
    margin = train_checkpointer.DRAIN_MARGIN_S + train_checkpointer.HOLD_STEPS * 1.0
    assert held == [int(110.0 - margin) - 100 + 1]  # the first step saved with the deadline <= margin away
    assert all(force for _, force in ckpt.saved)
