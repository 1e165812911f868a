"""How many warm spares each free node keeps (as many as the run has ranks on one node, as many
as fit), how many are counted as waiting, and which nodes a renewal tops up: with the raylet,
the GCS notes and the prestart call faked."""

from __future__ import annotations

import time

import pytest

from ray_ckpt.core.nodes import RayNode
from ray_ckpt.train import inplace_controller
from ray_ckpt.train.inplace_controller import WorkerFacts, _fits, _spares_per_node, _spares_waiting, _WarmSpares


def test_a_free_node_keeps_as_many_spares_as_the_run_has_ranks_on_one_node() -> None:
    assert _spares_per_node({}) == 1
    assert _spares_per_node({0: "a", 1: "b"}) == 1
    assert _spares_per_node({0: "a", 1: "a", 2: "b", 3: "b", 4: "b"}) == 3


def test_only_as_many_spares_as_fit_the_node() -> None:
    assert _fits({"CPU": 4.0, "memory": 1e9}, {"CPU": 1.0}) == 4
    assert _fits({"CPU": 4.0, "GPU": 2.0}, {"CPU": 1.0, "GPU": 1.0}) == 2
    assert _fits({"CPU": 4.0}, {"CPU": 1.0, "GPU": 1.0}) == 0
    assert _fits({"CPU": 4.0}, {}) == 1


class FakeRay:
    """The GCS notes, the raylets' worker lists and the prestart calls of ``_ray_compat``."""

    def __init__(self) -> None:
        self.notes: dict[str, tuple[float, int]] = {}
        self.workers: dict[str, dict[int, bool] | None] = {}  # node -> pid -> idle
        self.warmed: dict[str, set[int]] = {}
        self.prestarted: list[tuple[str, int]] = []

    def warm_spare_started(self, job: str, env: str, node: str) -> tuple[float, int] | None:
        return self.notes.get(node)

    def mark_warm_spare(self, job: str, env: str, node: str, started: float | None, count: int = 1) -> None:
        if started is None:
            self.notes.pop(node, None)
        else:
            self.notes[node] = (started, count)

    def job_workers(self, address: str, job: str) -> dict[int, bool] | None:
        return self.workers.get(address.split(":")[0], {})

    def warm_processes(self, job: str, node: str) -> set[int]:
        return set(self.warmed.get(node, set()))

    def forget_warm_processes(self, job: str, node: str, pids: set[int]) -> None:
        self.warmed[node] = self.warmed.get(node, set()) - pids

    def prestart_worker(self, address: str, env: str, job: str, keep_alive_s: int, count: int = 1) -> bool:
        self.prestarted.append((address.split(":")[0], count))
        return True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeRay:
    fake = FakeRay()
    for name in (
        "warm_spare_started",
        "mark_warm_spare",
        "job_workers",
        "warm_processes",
        "forget_warm_processes",
        "prestart_worker",
    ):
        monkeypatch.setattr(inplace_controller._ray_compat, name, getattr(fake, name))
    return fake


def test_waiting_spares_are_the_noted_count_while_starting_then_the_idle_warmed_processes(fake: FakeRay) -> None:
    assert _spares_waiting("j", "e", "n", "n:1", 600.0) == 0
    fake.notes["n"] = (time.time(), 2)
    assert _spares_waiting("j", "e", "n", "n:1", 600.0) == 2  # just started: trusted
    fake.notes["n"] = (time.time() - inplace_controller.SPARE_START_S - 1, 2)
    fake.workers["n"] = {10: True, 11: False, 12: True}  # 11 took an actor; 13 is gone
    fake.warmed["n"] = {10, 11, 13}
    assert _spares_waiting("j", "e", "n", "n:1", 600.0) == 1
    assert fake.warmed["n"] == {10, 11}  # the note of the gone process is dropped
    fake.workers["n"] = None  # the raylet cannot be asked: the note, while it is fresh enough
    assert _spares_waiting("j", "e", "n", "n:1", 600.0) == 2
    assert _spares_waiting("j", "e", "n", "n:1", 100.0) == 0


def _nodes(*specs: tuple[str, float]) -> list[RayNode]:
    return [RayNode(node, alive=True, address=node, raylet_port=1, resources={"CPU": cpus}) for node, cpus in specs]


def test_a_renewal_tops_up_short_nodes_first_then_fills_new_ones_up_to_the_nodes_wanted(
    fake: FakeRay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        inplace_controller.naming,
        "alive_nodes",
        lambda: _nodes(("busy", 4.0), ("short", 4.0), ("full", 4.0), ("new", 4.0), ("tiny", 1.0)),
    )
    spares = _WarmSpares()
    spares.workers = {0: "busy", 1: "busy"}  # two ranks per node: free nodes keep two spares
    spares._facts = WorkerFacts(rank=0, node_id="busy", runtime_env="e", job_id="j", resources={"CPU": 1.0})
    spares._wanted = 3
    old = time.time() - inplace_controller.SPARE_START_S - 1
    fake.notes.update(short=(old, 2), full=(old, 2))
    fake.workers.update(short={20: True}, full={30: True, 31: True})
    fake.warmed.update(short={20}, full={30, 31})
    spares._start_spares()
    assert fake.prestarted == [("short", 1), ("new", 2)]  # "full" counts as one of the 3 nodes, "tiny" is left
    assert fake.notes["new"][1] == 2 and fake.notes["short"][1] == 2
    fake.prestarted.clear()
    spares._start_spares()  # everything just noted as starting: nothing more
    assert fake.prestarted == []


def test_a_workers_facts_cross_to_the_controller_as_they_were_told() -> None:
    facts = WorkerFacts(rank=3, node_id="n1", runtime_env='{"env_vars": {}}', job_id="01000000", resources={"CPU": 1.0})
    assert WorkerFacts.from_wire(facts.to_wire()) == facts


def test_a_nodes_raylet_address_is_read_from_rays_record() -> None:
    """Where a spare is asked for: Ray's NodeManagerAddress and NodeManagerPort, or None."""
    node = RayNode.from_ray({"NodeID": "n", "Alive": True, "NodeManagerAddress": "10.0.0.2", "NodeManagerPort": 6000})
    assert node.raylet_address == "10.0.0.2:6000"
    assert RayNode.from_ray({"NodeID": "m", "Alive": True, "NodeManagerAddress": "10.0.0.3"}).raylet_address is None
