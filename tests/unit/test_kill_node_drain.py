"""``ray-ckpt kill-node --drain S``: a planned loss. The CLI hands the victims and the deadline to
``chaos.drain_then_inject``, which arms every victim first (nothing new starts on a draining
node), tells Ray each one drains, records the notice, and strikes at the deadline; a drain Ray
refuses strikes nothing. No Ray: the GCS calls, the registry and the fault are stand-ins."""

from __future__ import annotations

from typing import Any

import pytest

from ray_ckpt.errors import CliError, ConfigError
from ray_ckpt.tools import chaos, cli, faults

NODE = "n" * 56


def kill_node(*options: str) -> int:
    args = cli.build_parser().parse_args(["kill-node", *options, "--json"])
    return int(args.handler(args))


def test_the_cli_drains_then_kills_the_named_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(cli, "resolve_node", lambda text: text)
    monkeypatch.setattr(cli.naming, "head_node_id", lambda: "h" * 56)
    monkeypatch.setattr(
        cli.chaos, "drain_then_inject", lambda fault, victims, drain_s, **kw: calls.append((victims, drain_s)) or []
    )
    monkeypatch.setattr(cli.chaos, "inject", lambda *args, **kw: calls.append(("inject",)) or [])
    assert kill_node("--node", NODE, "--drain", "10") == 0
    assert calls == [([NODE], 10.0)]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--mtbf", "5", "--drain", "10"), "--drain goes with --node or --random"),
        (("--node", NODE, "--drain", "0"), "--drain must be > 0"),
    ],
)
def test_a_drain_without_victims_or_deadline_is_refused(options: tuple[str, ...], says: str) -> None:
    with pytest.raises(CliError, match=says):
        kill_node(*options)


class Fault(faults.Fault):
    """Records what happens to it, in order, with the times the fake clock shows."""

    mode = "node"

    def __init__(self, log: list[tuple[str, float]], clock: list[float]) -> None:
        self.log, self.clock = log, clock

    def check(self, node_ids: list[str], *, namespace: str, allow_head: bool) -> None:
        self.log.append(("check", self.clock[0]))

    def arm(self, node_ids: list[str], *, namespace: str, timeout_s: float = 0.0) -> dict[str, faults.Armed]:
        self.log.append(("arm", self.clock[0]))
        return {n: faults.Armed(n, "h") for n in node_ids}

    def disarm(self, armed: Any) -> None:
        self.log.append(("disarm", self.clock[0]))

    def fire(self, armed: list[faults.Armed]) -> dict[str, float]:
        self.log.append(("fire", self.clock[0]))
        return {a.node_id: self.clock[0] for a in armed}

    def gone(self, node_ids: set[str], *, namespace: str) -> set[str]:
        return set(node_ids)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, float]], list[float], list[dict[str, Any]]]:
    log: list[tuple[str, float]] = []
    clock = [1000.0]
    recorded: list[dict[str, Any]] = []
    monkeypatch.setattr(chaos.service, "_require_ray", lambda: None)
    monkeypatch.setattr(chaos.time, "time", lambda: clock[0])
    monkeypatch.setattr(chaos.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(chaos, "_registry", lambda namespace: object())
    monkeypatch.setattr(chaos, "_record", lambda registry, record: recorded.append(record) or True)
    return log, clock, recorded


def test_victims_are_armed_before_the_drain_and_struck_at_its_deadline(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, clock, recorded = world
    drained: list[tuple[str, float]] = []
    monkeypatch.setattr(
        chaos._ray_compat, "drain_node", lambda node, deadline, message: drained.append((node, deadline))
    )
    results = chaos.drain_then_inject(Fault(log, clock), [NODE], 10.0, namespace="ns", wait_dead_s=5.0)
    assert [what for what, _ in log] == ["check", "arm", "fire"]
    assert drained == [(NODE, 1010.0)] and dict(log)["fire"] == 1010.0
    assert [(r["kind"], r["mode"], r["deadline"]) for r in recorded[:1]] == [("kill", "drain", 1010.0)]
    assert [(r.node_id, r.mode, r.kill_time) for r in results] == [(NODE, "node", 1010.0)]


def test_a_drain_ray_refuses_strikes_nothing(world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log, clock, _ = world
    monkeypatch.setattr(chaos._ray_compat, "drain_node", lambda node, deadline, message: "not a node Ray knows")
    with pytest.raises(ConfigError, match=r"Ray did not accept the drain of node n+: not a node Ray knows"):
        chaos.drain_then_inject(Fault(log, clock), [NODE], 10.0, namespace="ns")
    assert [what for what, _ in log] == ["check", "arm", "disarm"]


def test_a_node_declared_dead_before_its_deadline_is_struck_and_said_so(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An in-place run declares the drained node dead once its ranks handed over: the strike
    still comes at the deadline, and the result says the node was gone before it."""
    log, clock, _ = world
    monkeypatch.setattr(chaos._ray_compat, "drain_node", lambda node, deadline, message: None)
    (result,) = chaos.drain_then_inject(Fault(log, clock), [NODE], 10.0, namespace="ns", wait_dead_s=5.0)
    assert [what for what, _ in log] == ["check", "arm", "fire"]
    assert result.details == {"gone_before_kill": True}


def test_a_node_still_alive_at_its_deadline_is_reported_as_killed(world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log, clock, _ = world
    monkeypatch.setattr(chaos._ray_compat, "drain_node", lambda node, deadline, message: None)
    fault = Fault(log, clock)
    fired: list[bool] = []
    monkeypatch.setattr(fault, "fire", lambda armed: fired.append(True) or {a.node_id: clock[0] for a in armed})
    monkeypatch.setattr(fault, "gone", lambda node_ids, namespace: set(node_ids) if fired else set())
    (result,) = chaos.drain_then_inject(fault, [NODE], 10.0, namespace="ns", wait_dead_s=5.0)
    assert result.details == {} and result.dead_time == 1010.0


def test_the_cli_says_a_handed_over_node_was_declared_dead_before_the_kill(capsys: pytest.CaptureFixture[str]) -> None:
    from ray_ckpt.core.wire import KillResult

    gone = KillResult(NODE, 1010.0, "node", dead_time=1010.02, details={"gone_before_kill": True})
    cli._kill_progress("dead", gone)
    cli._kill_progress("dead", KillResult(NODE, 1010.0, "node", dead_time=1012.5))
    before, after = capsys.readouterr().out.splitlines()
    assert "declared dead before the kill" in before and "after the kill" not in before
    assert "declared dead by Ray" in after and "2.50s after the kill" in after
