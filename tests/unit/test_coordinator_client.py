"""CoordinatorClient without Ray: every call goes out with its bound (scaled by the run's size,
plus the wait a waiting call asks for), the typed replies come back as they are, and a call the
coordinator does not answer in time is a CoordinatorTimeoutError naming it, not a hang."""

from __future__ import annotations

from typing import Any

import pytest
import ray.exceptions

from ray_ckpt.core.generations import BeginReply, JoinReply, JoinStatus, Member
from ray_ckpt.errors import CoordinatorTimeoutError, InPlaceRecoveryError
from ray_ckpt.transport import remote
from ray_ckpt.transport.coordinator_client import ANSWER_S, QUEUE_S_PER_RANK, START_S, CoordinatorClient

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


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Coordinator:
    coordinator = Coordinator(
        {
            "begin": BeginReply(epoch=2, generation=5, attempt="r.g5"),
            "epoch": 2,
            "register": True,
            "beat": False,
            "join": JoinReply(JoinStatus.FORMED, generation=6, attempt="r.g6", formed_at=1.0, replaced=(1,)),
            "address": "10.0.0.1:4242",
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
    assert client.beat(MEMBER, timeout_s=0.25) is False
    joined = client.join(MEMBER, 12.0)
    assert joined.status is JoinStatus.FORMED and joined.replaced == (1,)
    client.publish(6, "10.0.0.1:4242")
    assert client.address(6, 3.0) == "10.0.0.1:4242"
    bounds = {method: timeout for method, _, timeout in fake.calls}
    assert bounds == pytest.approx(
        {
            "begin": START_S + answer,  # it also waits for the new actor's process
            "epoch": answer,
            "register": answer,
            "beat": 0.25,  # the caller's: its beat interval
            "join": 12.0 + answer,  # the wait asked for, plus the answer
            "publish": answer,
            "address": 3.0 + answer,
        }
    )
    assert [args for method, args, _ in fake.calls if method == "join"] == [(MEMBER, 12.0)]


def test_a_call_not_answered_in_time_is_a_coordinator_timeout_naming_it(fake: Coordinator) -> None:
    fake.silent = ("join",)
    client = CoordinatorClient(Handle(), world_size=4)
    with pytest.raises(CoordinatorTimeoutError, match="did not answer join within") as raised:
        client.join(MEMBER, 5.0)
    assert raised.value.method == "join"  # type: ignore[attr-defined]
    assert raised.value.timeout_s == pytest.approx(5.0 + client.answer_s)  # type: ignore[attr-defined]
    assert isinstance(raised.value, InPlaceRecoveryError) and isinstance(raised.value, TimeoutError)


def test_the_client_travels_with_its_handle_to_the_workers() -> None:
    """The controller hands it to every worker inside the role (Ray pickles it)."""
    back = ray.cloudpickle.loads(ray.cloudpickle.dumps(CoordinatorClient("handle", world_size=8)))
    assert back.handle == "handle" and back.world_size == 8
