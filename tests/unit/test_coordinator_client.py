"""CoordinatorClient without Ray: every call goes out with its bound (scaled by the run's size,
plus the wait a waiting call asks for), the typed replies come back as they are, and a call the
coordinator does not answer in time is a CoordinatorTimeoutError naming it, not a hang."""

from __future__ import annotations

from typing import Any

import pytest
import ray.exceptions

from ray_ckpt.core.generations import POLL_S, Beat, BeginReply, JoinReply, JoinStatus, Member
from ray_ckpt.errors import CoordinatorTimeoutError, InPlaceRecoveryError
from ray_ckpt.transport import remote
from ray_ckpt.transport.coordinator_client import ANSWER_S, QUEUE_S_PER_RANK, START_S, STORE_MISSES, CoordinatorClient

MEMBER = Member(rank=1, incarnation="a1", node_id="n1", pid=1001, host="h", epoch=1)


class Method:
    def __init__(self, name: str) -> None:
        self.name = name

    def remote(self, *args: Any) -> tuple[str, tuple[Any, ...]]:
        return self.name, args


class Handle:
    """An actor handle whose calls are (method, args) tuples for the fake ``remote.get``."""

    def __getattr__(self, name: str) -> Method:
        return Method(name)


class Coordinator:
    """Answers each call with ``replies[method]`` and notes its bound; raises Ray's timeout for
    the methods in ``silent``."""

    def __init__(self, replies: dict[str, Any], silent: tuple[str, ...] = ()) -> None:
        self.replies, self.silent = replies, silent
        self.calls: list[tuple[str, tuple[Any, ...], float | None]] = []

    def get(self, ref: tuple[str, tuple[Any, ...]], *, timeout: float | None) -> Any:
        method, args = ref
        self.calls.append((method, args, timeout))
        if method in self.silent:
            raise ray.exceptions.GetTimeoutError(f"{method} timed out")
        return self.replies.get(method)


FORMED = JoinReply(JoinStatus.FORMED, generation=6, attempt="r.g6", formed_at=1.0, replaced=(1,))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Coordinator:
    coordinator = Coordinator(
        {
            "begin": BeginReply(epoch=2, generation=5, attempt="r.g5"),
            "epoch": 2,
            "register_many": [True],
            "beat_many": [False],
            "join_many": [(5, None)],
            "await_formed": [FORMED],
            "address_many": ["10.0.0.1:4242"],
        }
    )
    monkeypatch.setattr(remote, "get", coordinator.get)
    return coordinator


def test_every_call_has_its_bound_scaled_by_the_runs_size(fake: Coordinator) -> None:
    client = CoordinatorClient(Handle(), world_size=1000)
    answer = ANSWER_S + 1000 * QUEUE_S_PER_RANK
    assert client.answer_s == pytest.approx(answer)
    assert client.begin(1000) == BeginReply(epoch=2, generation=5, attempt="r.g5")
    assert client.epoch() == 2
    assert client.register(MEMBER, 5) is True
    assert client.beat(Beat(MEMBER), timeout_s=0.25).leave is False
    assert client.join(MEMBER, 12.0) == FORMED
    client.publish(6, "10.0.0.1:4242")
    assert client.address(6, 3.0) == "10.0.0.1:4242"
    bounds = {method: timeout for method, _, timeout in fake.calls}
    assert bounds == pytest.approx(
        {
            "begin": START_S + answer,  # it also waits for the new actor's process
            "epoch": answer,
            "register_many": answer,
            "beat_many": 0.25,  # the caller's: its beat interval
            "join_many": answer,  # answered at once: the waiting is the polls'
            "await_formed": POLL_S + answer,  # a poll waits at most POLL_S in the coordinator
            "publish": answer,
            "address_many": POLL_S + answer,
        }
    )
    args = {method: a for method, a, _ in fake.calls}
    assert args["join_many"] == ([MEMBER.to_wire()],) and args["await_formed"] == (5, [MEMBER.waiting])  # after: 5
    assert args["beat_many"] == ([(MEMBER.to_wire(), False, False, (), None)],) and args["address_many"] == (6, [0])
    assert Member.from_wire(MEMBER.to_wire()) == MEMBER


def test_a_join_polls_until_its_time_is_up_then_gives_up_with_the_coordinators_reply(
    fake: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr("ray_ckpt.transport.coordinator_client.time.monotonic", lambda: clock[0])
    timeout = JoinReply(JoinStatus.TIMEOUT, missing=(2,))
    fake.replies.update(await_formed=[None], give_up=timeout)
    original = fake.get

    def get(ref: tuple[str, tuple[Any, ...]], *, timeout: float | None) -> Any:
        clock[0] += POLL_S if ref[0] == "await_formed" else 0.0  # each poll waits its POLL_S out
        return original(ref, timeout=timeout)

    monkeypatch.setattr(remote, "get", get)
    assert CoordinatorClient(Handle(), world_size=4).join(MEMBER, 3 * POLL_S) == timeout
    assert [method for method, _, _ in fake.calls] == ["join_many"] + ["await_formed"] * 3 + ["give_up"]
    assert fake.calls[-1][1] == (MEMBER, 5)  # gives up the round it joined after generation 5


def test_a_join_refused_at_once_is_the_reply_and_a_superseded_generation_has_no_address(fake: Coordinator) -> None:
    doomed = JoinReply(JoinStatus.DOOMED)
    fake.replies.update(join_many=[(5, doomed)], address_many=[""])
    client = CoordinatorClient(Handle(), world_size=4)
    assert client.join(MEMBER, 60.0) == doomed
    assert client.address(6, 60.0) is None
    assert [method for method, _, _ in fake.calls] == ["join_many", "address_many"]


class Store:
    """A node's store: ``coordinate`` calls are ("coordinate", args) for the fake get."""

    def __init__(self) -> None:
        self.coordinate = Method("coordinate")


def test_through_the_nodes_store_every_per_rank_call_names_the_run_the_coordinator_and_its_op(
    fake: Coordinator,
) -> None:
    fake.replies["coordinate"] = [True]
    client = CoordinatorClient(Handle(), world_size=4, run="run7")
    client.store = Store()
    assert client.register(MEMBER, 5) is True
    ((method, (run, handle, op, key, entries), _),) = fake.calls
    assert (method, run, op, key, entries) == ("coordinate", "run7", "register", [5], [MEMBER.to_wire()])
    assert handle is client.handle
    assert ray.cloudpickle.loads(ray.cloudpickle.dumps(client)).store is None  # each process finds its own


def client_with_a_failing_store(
    fake: Coordinator, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> CoordinatorClient:
    """A client (world size 4) with a node's store whose every call raises ``error``; the
    coordinator's calls are answered as ever."""
    original = fake.get

    def get(ref: tuple[str, tuple[Any, ...]], *, timeout: float | None) -> Any:
        if ref[0] == "coordinate":
            raise error
        return original(ref, timeout=timeout)

    monkeypatch.setattr(remote, "get", get)
    client = CoordinatorClient(Handle(), world_size=4)
    client.store = Store()
    return client


def test_a_store_that_fails_is_dropped_and_the_call_goes_to_the_coordinator(
    fake: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = client_with_a_failing_store(fake, monkeypatch, ray.exceptions.RayActorError())
    assert client.beat(Beat(MEMBER), timeout_s=0.25).leave is False
    assert client.store is None and [method for method, _, _ in fake.calls] == ["beat_many"]


def test_a_call_not_answered_in_time_is_a_coordinator_timeout_naming_it(fake: Coordinator) -> None:
    fake.silent = ("join_many",)
    client = CoordinatorClient(Handle(), world_size=4)
    with pytest.raises(CoordinatorTimeoutError, match="did not answer join_many within") as raised:
        client.join(MEMBER, 5.0)
    assert raised.value.method == "join_many"  # type: ignore[attr-defined]
    assert raised.value.timeout_s == pytest.approx(client.answer_s)  # type: ignore[attr-defined]
    assert isinstance(raised.value, InPlaceRecoveryError) and isinstance(raised.value, TimeoutError)


def test_the_client_travels_with_its_handle_to_the_workers() -> None:
    """The controller hands it to every worker inside the role (Ray pickles it)."""
    back = ray.cloudpickle.loads(ray.cloudpickle.dumps(CoordinatorClient("handle", world_size=8, run="r")))
    assert back.handle == "handle" and back.world_size == 8 and back.run == "r"


def test_a_store_that_stops_answering_is_dropped_after_a_few_calls_and_the_rank_beats_directly(
    fake: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stuck store must not leave the rank silent (taken for lost, killed as hung)."""
    client = client_with_a_failing_store(fake, monkeypatch, ray.exceptions.GetTimeoutError("store stopped"))
    for _ in range(STORE_MISSES):
        with pytest.raises(CoordinatorTimeoutError, match="through this node's store"):
            client.beat(Beat(MEMBER), timeout_s=0.1)
    assert client.store is None
    assert client.beat(Beat(MEMBER), timeout_s=0.1).leave is False and [m for m, _, _ in fake.calls] == ["beat_many"]


def test_asking_whether_the_run_recovers_waits_in_the_coordinator_for_a_change(fake: Coordinator) -> None:
    fake.replies["await_recovery"] = True
    client = CoordinatorClient(Handle(), world_size=8)
    assert client.await_recovery(False) is True
    assert fake.calls[-1] == ("await_recovery", (False,), pytest.approx(POLL_S + client.answer_s))
