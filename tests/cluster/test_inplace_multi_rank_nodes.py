"""In-place recovery when one node carries several ranks, as a GPU node carries one per GPU: a
hard node kill takes all of them at once, they are replaced together, the other nodes' ranks
keep their processes, and the run ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import pathlib
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import ray
from support import pace
from support.warm_spares import idle_warm_spares

import ray_ckpt
from ray_ckpt.testing import SimulatedCluster
from ray_ckpt.transport.registry_client import RegistryClient

pytestmark = pytest.mark.cluster

STEPS = 16
CHECKPOINT = {"data_shards": 2, "parity_shards": 2}


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_TMPDIR", tempfile.mkdtemp(prefix="rckmulti"))
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")


@pytest.fixture
def example(environment: None, train_example: Any) -> Iterator[Any]:
    yield train_example


@pytest.mark.timeout(900)
@pytest.mark.parametrize("ranks_per_node", [2])  # 4: scripts/fault_campaign.py --in-place --ranks-per-node 4
def test_a_node_carrying_several_ranks_is_lost_and_they_are_replaced_together_in_place(
    example: Any, ranks_per_node: int
) -> None:
    """2 * ``ranks_per_node`` ranks packed on two worker nodes of ``ranks_per_node`` CPUs (Ray
    Train packs them), plus a spare node of the same size; the node of rank 1 is hard-killed
    after step 4 committed. Its ranks are replaced in the spare node in one generation and
    restore from peers, each in one of the spare node's warm spares (the kill waits until
    ``ranks_per_node`` of them sit idle and warm there); every rank on the other node keeps its
    process and restores its local copy; one failure is one in-place recovery; the final weights
    equal an uninterrupted run's."""
    workers = 2 * ranks_per_node
    common: dict[str, Any] = {"steps": STEPS, "workers": workers, "checkpoint": CHECKPOINT}
    reference = example.uninterrupted_digest(steps=STEPS, workers=workers)
    with SimulatedCluster(3, worker_cpus=ranks_per_node, store_budget_bytes=256 << 20) as sim:
        lost: list[int] = []
        killed: list[float] = []
        failures: list[BaseException] = []
        events = tempfile.mkdtemp()
        started = time.time()

        def faults() -> None:
            pause = pathlib.Path(events) / example.PAUSE_FILE
            try:
                example.wait_committed("packed", 4)
                pause.touch()  # the ranks wait between steps while the spare node's spares warm up
                victim = example.rank_node("packed", 1)
                lost.extend(rank for rank in range(workers) if example.rank_node("packed", rank) == victim)
                busy = {example.rank_node("packed", rank) for rank in range(workers)}
                (spare,) = {
                    str(n["NodeID"]) for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU")
                } - busy
                bound_s = pace.bound(180.0)
                deadline = time.monotonic() + bound_s
                while idle_warm_spares(started)[spare] < ranks_per_node:
                    if example.ABANDONED.is_set():
                        raise RuntimeError("the run ended while its spares were awaited")
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"the spare node had not {ranks_per_node} warm spares within {bound_s:.0f} s"
                        )
                killed.append(time.time())
                example.remove_node(sim, victim)
            except BaseException as error:  # surfaced below
                failures.append(error)
            finally:
                pause.unlink(missing_ok=True)

        thread = threading.Thread(target=faults, daemon=True)
        example.ABANDONED.clear()
        thread.start()
        try:
            final = example.run(
                name="packed",
                storage_path=tempfile.mkdtemp(),
                events_dir=events,
                step_sleep_s=0.15,
                max_failures=8,
                in_place={},
                **common,
            )
        finally:
            example.ABANDONED.set()
            thread.join(timeout=pace.bound(30))
        assert not failures, failures
        rejoins = [
            e
            for e in RegistryClient(ray_ckpt.settings.namespace()).events()[1]
            if e["kind"] == "rejoin" and e["job"] == "packed"
        ]
    assert len(lost) == ranks_per_node and 1 in lost, lost
    attempts: dict[str, dict[int, dict[str, Any]]] = {}
    for record in example.read_restores(events):
        attempts.setdefault(record["attempt"], {})[record["rank"]] = record
    assert len(attempts) == 2, attempts  # one failure, one recovery
    first, second = attempts.values()
    kept = sorted(rank for rank in range(workers) if second[rank]["pid"] == first[rank]["pid"])
    pids = [{rank: (r["pid"], r["node_id"][:8], r["source"]) for rank, r in a.items()} for a in (first, second)]
    assert kept == sorted(set(range(workers)) - set(lost)), (lost, pids)
    assert {second[rank]["source"] for rank in lost} == {"peers"}
    assert {second[rank]["source"] for rank in kept} == {"local"}
    replacements = [e for e in rejoins if e["role"] == "replacement"]
    assert sorted(int(e["rank"]) for e in replacements) == sorted(lost), rejoins
    assert all(e["warmed"] is not None and e["warmed"] < killed[0] for e in replacements), (replacements, killed)
    assert final["params_digest"] == reference
