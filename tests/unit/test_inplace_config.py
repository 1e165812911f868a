"""InPlaceRecovery without a cluster: its arguments, which errors count as a lost peer, the
fallback when Ray lacks the replica-group path, the wrapper used without its config, and the
wrapper giving a recurring or too frequent error to Ray Train instead of re-running forever."""

from __future__ import annotations

import os
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch.distributed as dist

from ray_ckpt import _ray_compat, settings
from ray_ckpt.core import events
from ray_ckpt.core.generations import JoinReply, JoinStatus, Member
from ray_ckpt.errors import CommitTimeoutError, ConfigError, HandedOver, InPlaceRecoveryError
from ray_ckpt.train import inplace, inplace_controller, inplace_worker
from ray_ckpt.train.inplace import InPlaceRecovery, is_peer_failure


@pytest.mark.parametrize("name", ["timeout_s", "hang_timeout_s", "collective_timeout_s"])
@pytest.mark.parametrize("value", [0, -1, "10", True, None])
def test_bad_timeouts_are_refused_naming_the_argument(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=name):
        InPlaceRecovery(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1, "10", True, None])
def test_a_bad_wait_for_the_spares_is_refused_and_0_means_no_wait(value: object) -> None:
    with pytest.raises(ConfigError, match="await_spares_s"):
        InPlaceRecovery(await_spares_s=value)  # type: ignore[arg-type]
    assert InPlaceRecovery(await_spares_s=0).settings.await_spares_s == 0.0
    assert InPlaceRecovery().settings.await_spares_s == 15.0


@pytest.mark.parametrize("value", [-1, 1.5, "2", True, None])
def test_a_bad_warm_spare_count_is_refused(value: object) -> None:
    with pytest.raises(ConfigError, match="warm_spares"):
        InPlaceRecovery(warm_spares=value)  # type: ignore[arg-type]


def test_warm_up_imports_what_a_worker_needs_at_a_lower_priority_the_worker_takes_back() -> None:
    """The setup hook of warm spares imports the modules named and says when it was done; where
    the process may renice back, it does so at WARM_NICENESS more, and becoming a worker
    restores its niceness. What the imports made is frozen out of the collector's walks, so a
    survivor's collection in a recovery (``_teardown``) does not walk it with the GIL held."""
    import gc
    import sys

    before = os.nice(0)
    renices = inplace_worker._may_renice()
    try:
        inplace.warm_up()
        assert all(module in sys.modules for module in inplace_worker.WARM_MODULES)
        assert inplace_worker.PROCESS.warmed_at is not None
        assert gc.get_freeze_count() > 100_000, gc.get_freeze_count()  # torch's and Ray's modules'
        # a process already at a low priority (the unit tests run at nice 10) stops at 19
        assert os.nice(0) == min(19, before + (inplace_worker.WARM_NICENESS if renices else 0))
    finally:
        inplace_worker._take_priority_back()
        gc.unfreeze()  # this test's process goes on with other tests
    assert os.nice(0) == before


def test_it_is_a_torch_config_whose_process_groups_use_the_collective_timeout() -> None:
    from ray.train.torch import TorchConfig

    recovery = InPlaceRecovery(collective_timeout_s=42, backend="gloo")
    assert isinstance(recovery, TorchConfig) and recovery.timeout_s == 42 and recovery.backend == "gloo"
    assert recovery.backend_cls.has_replica_groups is True


def test_collective_and_commit_errors_count_as_a_lost_peer_and_others_do_not() -> None:
    assert is_peer_failure(dist.DistBackendError("whatever"))
    assert is_peer_failure(RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer"))
    assert is_peer_failure(CommitTimeoutError("step 3 did not commit"))
    assert not is_peer_failure(RuntimeError("shape mismatch in matmul"))
    assert not is_peer_failure(ValueError("Connection closed"))


def test_without_the_replica_group_path_the_backend_restarts_the_whole_group(monkeypatch: pytest.MonkeyPatch) -> None:
    missing = _ray_compat.ReplicaGroups(None, None, "Ray lacks ReplicaGroup")
    monkeypatch.setattr(_ray_compat, "replica_groups", lambda: missing)
    inplace_controller._backend_class.cache_clear()
    try:
        assert inplace_controller._backend_class().has_replica_groups is False
    finally:
        inplace_controller._backend_class.cache_clear()


def test_the_wrapped_function_without_its_config_says_what_to_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inplace_worker.PROCESS, "role", None)
    wrapped = InPlaceRecovery().wrap(lambda config: None)
    with pytest.raises(ConfigError, match="torch_config=recovery"):
        wrapped({})


# ---- the wrapper's re-runs -----------------------------------------------------------------

GLOO_LIKE = "gloo: connection timed out while reading the dataset shard (Broken pipe)"


class FakeCheckpointer:
    """What the wrapper reads of a tracked Checkpointer: the newest step saved, and abandon."""

    def __init__(self) -> None:
        self._last_step: int | None = None

    def abandon(self) -> None:
        pass


class Job:
    """A training function that restores the newest committed step, saves every step, and
    raises ``error`` at step ``failing``; it stops the test after ``limit`` runs."""

    def __init__(self, failing: int, error: Exception, limit: int = 30) -> None:
        self.failing, self.error, self.limit = failing, error, limit
        self.committed: int | None = None
        self.runs = 0

    def __call__(self) -> None:
        self.runs += 1
        if self.runs > self.limit:
            raise AssertionError(f"the wrapper ran the training function {self.runs} times")
        ckpt = FakeCheckpointer()
        inplace.track(ckpt)
        start = 0 if self.committed is None else self.committed + 1
        for step in range(start, self.failing + 1):
            if step == self.failing:
                raise self.error
            ckpt._last_step = self.committed = step


def worker(replaced: Callable[[], list[int]]) -> inplace_worker._Worker:
    """A _Worker without Ray: its rendezvous answers with ``replaced()`` ranks."""
    w = inplace_worker._Worker.__new__(inplace_worker._Worker)
    role_settings = inplace_worker._Settings(120.0, 10.0, 300.0, "gloo")
    w.role = inplace_worker._Role(coordinator=None, epoch=1, generation=None, attempt=None, settings=role_settings)  # type: ignore[arg-type]
    w.settings, w.rank, w._beating = role_settings, 0, threading.Event()
    w._raylet = os.getppid()
    w._start_heartbeat = lambda: None  # type: ignore[method-assign]

    def rejoin(*, role: str, detected_at: float | None, torn_down_at: float | None = None) -> list[int]:
        return replaced()

    w._rejoin = rejoin  # type: ignore[assignment, method-assign]
    return w


def test_a_deterministic_error_that_reads_like_gloo_goes_to_ray_train_at_its_second_occurrence() -> None:
    """Rank 0 raises a gloo-like RuntimeError at step 3 every time; every process is still there
    after the recovery: the second run fails at step 3 again and its error is raised, noted."""
    job = Job(failing=3, error=RuntimeError(GLOO_LIKE))
    assert is_peer_failure(job.error)
    with pytest.raises(RuntimeError, match="gloo: connection timed out") as raised:
        worker(lambda: []).run(job, ())
    assert job.runs == 2
    assert any("not recovered in place" in note for note in getattr(raised.value, "__notes__", []))


def test_a_peer_lost_every_time_is_recovered_from_up_to_the_bound() -> None:
    """Each recovery replaced rank 1 (a real loss): the wrapper re-runs, but only
    RAY_CKPT_INPLACE_MAX_RECOVERIES times; the next failure goes to Ray Train."""
    job = Job(failing=3, error=RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer"))
    with settings.override(RAY_CKPT_INPLACE_MAX_RECOVERIES=4), pytest.raises(RuntimeError, match="Connection closed"):
        worker(lambda: [1]).run(job, ())
    assert job.runs == 5


def test_an_error_that_is_not_a_lost_peer_is_raised_at_once() -> None:
    job = Job(failing=3, error=ValueError("bad batch"))
    with pytest.raises(ValueError, match="bad batch"):
        worker(lambda: []).run(job, ())
    assert job.runs == 1


def test_a_recovered_run_returns_the_functions_result() -> None:
    """One real loss at step 3, then the re-run passes it: the wrapper returns the result."""
    runs: list[int] = []

    def train() -> Any:
        runs.append(1)
        if len(runs) == 1:
            raise dist.DistBackendError("peer gone")
        return "done"

    assert worker(lambda: [1]).run(train, ()) == "done" and len(runs) == 2


class Answers:
    """A coordinator client whose every join gets ``reply``."""

    def __init__(self, reply: JoinReply) -> None:
        self.reply = reply

    def join(self, member: Member, timeout_s: float) -> JoinReply:
        return self.reply


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (JoinReply(JoinStatus.TIMEOUT, missing=(2,)), r"ranks \[2\] did not join the next generation within"),
        (JoinReply(JoinStatus.SUPERSEDED), "a full restart of the worker group overtook"),
    ],
)
def test_a_join_that_ran_out_or_was_overtaken_gives_the_recovery_up(reply: JoinReply, says: str) -> None:
    """The coordinator's typed reply decides: TIMEOUT names the missing ranks (also as
    ``missing_ranks``), SUPERSEDED says a full restart came first; both raise
    InPlaceRecoveryError for Ray Train to restart the workers."""
    w = worker(lambda: [])
    w.role.coordinator = Answers(reply)  # type: ignore[assignment]
    w.member = Member(rank=0, incarnation="a0", node_id="n0", pid=1000, host="h", epoch=1)
    with pytest.raises(InPlaceRecoveryError, match=says) as raised:
        inplace_worker._Worker._rejoin(w, role="survivor", detected_at=None)
    assert getattr(raised.value, "missing_ranks", None) == (list(reply.missing) or None)


class Sleeps:
    """``time`` for the worker module, whose ``sleep`` records instead of sleeping."""

    def __init__(self) -> None:
        self.slept: list[float] = []
        self.time, self.monotonic = time.time, time.monotonic

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_a_worker_whose_node_is_going_waits_for_its_end_instead_of_rejoining(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its raylet is gone (its parent process changed) when its collective fails: it neither
    rejoins nor raises the error as the job's; it waits ``timeout_s`` for Ray to end it, and
    only a process still alive then raises InPlaceRecoveryError."""
    sleeps = Sleeps()
    monkeypatch.setattr(inplace_worker, "time", sleeps)
    rejoined: list[int] = []
    w = worker(lambda: rejoined.append(1) or [])  # type: ignore[func-returns-value]
    w._raylet = -1  # not this process's parent: the raylet is gone

    def train() -> None:
        raise dist.DistBackendError("peer gone")

    with pytest.raises(InPlaceRecoveryError, match=r"node is going \(its raylet is gone\) but the process lived on"):
        w.run(train, ())
    assert rejoined == [1], "only its first join, as the replacement it starts as"
    assert sleeps.slept == [w.settings.timeout_s]


def test_a_rank_that_handed_its_place_over_tears_its_generation_down_and_waits_for_its_node_to_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``HandedOver`` out of the training function (its node drains and a step saved after the
    notice committed): the rank neither rejoins nor raises the error as the job's; its peers'
    collectives fail at once (teardown), and it waits ``timeout_s`` for its node to be declared
    dead, raising InPlaceRecoveryError only if it is still alive then."""
    sleeps = Sleeps()
    monkeypatch.setattr(inplace_worker, "time", sleeps)
    rejoined: list[int] = []
    torn_down: list[int] = []
    w = worker(lambda: rejoined.append(1) or [])  # type: ignore[func-returns-value]
    w.role.generation = 1  # a full start's worker: no join before its first run
    for field in ("generation", "attempt"):  # what the run sets in the process's state, given back after
        monkeypatch.setattr(inplace_worker.PROCESS, field, None)
    w._teardown = lambda: torn_down.append(1)  # type: ignore[method-assign]
    w.backend = "gloo"
    monkeypatch.setattr(w.role, "coordinator", types.SimpleNamespace(register=lambda member, generation: True))
    w.member = Member(rank=0, incarnation="a0", node_id="n0", pid=1000, host="h", epoch=1)

    def train() -> None:
        raise HandedOver("rank 0: its node drains; it handed its place over")

    with pytest.raises(InPlaceRecoveryError, match=r"node is going \(rank 0: its node drains"):
        w.run(train, ())
    assert rejoined == [] and torn_down == [1]
    assert sleeps.slept == [w.settings.timeout_s]


def test_a_join_refused_because_the_node_is_going_waits_for_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps = Sleeps()
    monkeypatch.setattr(inplace_worker, "time", sleeps)
    w = worker(lambda: [])
    w._raylet = -1  # not this process's parent: the raylet is gone
    w.role.coordinator = Answers(JoinReply(JoinStatus.DOOMED))  # type: ignore[assignment]
    w.member = Member(rank=0, incarnation="a0", node_id="n0", pid=1000, host="h", epoch=1)
    with pytest.raises(InPlaceRecoveryError, match="raylet is gone"):
        inplace_worker._Worker._rejoin(w, role="survivor", detected_at=None)
    assert sleeps.slept == [w.settings.timeout_s]


def test_a_join_refused_to_a_worker_whose_node_lives_ends_it_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run took it for lost while its node did not answer (a link that flapped, a healed
    partition) and replaces it; its raylet lives, so it does not wait ``timeout_s`` for an end
    that never comes (the survivors would give up meanwhile): it raises at once, and Ray Train
    replaces it."""
    sleeps = Sleeps()
    monkeypatch.setattr(inplace_worker, "time", sleeps)
    w = worker(lambda: [])
    w._raylet = None  # its raylet is its parent still (or it has none): not orphaned
    w.role.coordinator = Answers(JoinReply(JoinStatus.DOOMED))  # type: ignore[assignment]
    w.member = Member(rank=0, incarnation="a0", node_id="n0", pid=1000, host="h", epoch=1)
    with pytest.raises(InPlaceRecoveryError, match="took this worker for lost while its node did not answer"):
        inplace_worker._Worker._rejoin(w, role="survivor", detected_at=None)
    assert sleeps.slept == []


def test_only_a_raylet_parent_is_watched_for_the_nodes_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker started by anything but a raylet (here: pytest's parent) is never taken for
    orphaned when that parent exits; Ray's workers are the raylet's children."""
    assert inplace_worker._raylet_parent() is None
    w = worker(lambda: [])
    w._raylet = None
    assert not w._orphaned()

    class Raylet:
        def __init__(self, pid: int) -> None:
            self.pid = pid

        def name(self) -> str:
            return "raylet"

    monkeypatch.setattr(inplace_worker.psutil, "Process", Raylet)
    assert inplace_worker._raylet_parent() == os.getppid()


def test_a_rejoin_is_recorded_with_the_fields_and_order_its_event_always_had() -> None:
    """``Rejoin.to_wire`` is the ``rejoin`` event's fields, in the order dashboards and tests
    read them, ``lost`` as [rank, reason] lists; the event is well formed."""
    rejoin = inplace_worker.Rejoin(
        role="survivor",
        generation=2,
        pid=100,
        process_started=1.0,
        warmed=None,
        worker_started=2.0,
        detected=3.0,
        torn_down=3.5,
        joined=4.0,
        round_started=3.9,
        formed=4.2,
        lost=((1, "node dead"),),
        ready=4.5,
    )
    fields = rejoin.to_wire()
    assert list(fields) == [
        "role",
        "generation",
        "pid",
        "process_started",
        "warmed",
        "worker_started",
        "detected",
        "torn_down",
        "joined",
        "round_started",
        "formed",
        "lost",
        "ready",
    ]
    assert fields["lost"] == [[1, "node dead"]] and fields["role"] == "survivor" and fields["ready"] == 4.5
    events.check(events.event("rejoin", job="j", rank=0, attempt="run.g2", node_id="n0", **fields))
