"""In-place recovery under TorchTrainer (gloo, real hard node kills): survivors keep their
processes and restore from their local copy, replacements restore from peers, and every run
ends bit-identical to an uninterrupted one."""

from __future__ import annotations

import os
import pathlib
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest
import ray
from support import pace
from support.warm_spares import idle_warm_spares

import ray_ckpt
from ray_ckpt import _ray_compat
from ray_ckpt.core import timeline
from ray_ckpt.core.protection import rank_protection
from ray_ckpt.testing import SimulatedCluster
from ray_ckpt.transport.registry_client import RegistryClient

pytestmark = pytest.mark.cluster

STEPS = 24
CHECKPOINT = {"data_shards": 2, "parity_shards": 2}  # survives the two nodes lost at once below
HANG_TIMEOUT_S = 3.0
COMPUTE_S = 7.0  # the long step of the interrupt test (times the pace): far longer than any detection
# Warm spares a run keeps (InPlaceRecovery's default is 8, one per free node): as many as a test
# loses nodes at once. Spares on every free node of this cluster would import torch on
# this machine's two cores before each run trains; the spares' own test asks for every node.
SPARES = 2


class InPlaceClusters:
    """The module's cluster of 6 one-CPU nodes (each test adds as many as it kills) and the
    uninterrupted runs' digests (keyed as in ``reference_digest``, computed outside Ray), handed
    to the tests in turn. A test that failed, or a cluster that lost a node nobody removed, is
    replaced by a fresh cluster before the next test, so one failure reports one failure.
    ``start_s``: how long a new Ray worker process that imports torch took to start on this
    machine (``measure_start``), the unit of the bounds that depend on its speed."""

    def __init__(self, example: Any) -> None:
        self.example = example
        self.sim: SimulatedCluster | None = None
        self.references: dict[Any, str] = {}
        self.start_s = 0.0
        self.broken = False

    def take(self) -> tuple[SimulatedCluster, Any, dict[Any, str]]:
        if self.sim is not None and (self.broken or not self._healthy(self.sim)):
            self.close()
        if self.sim is None:
            os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rckinplace")
            self.sim = SimulatedCluster(6, store_budget_bytes=256 << 20)
            self.broken = False
            self.start_s = measure_start()
        return self.sim, self.example, self.references

    @staticmethod
    def _healthy(sim: SimulatedCluster) -> bool:
        try:
            alive = {str(n["NodeID"]) for n in ray.nodes() if n.get("Alive")}
        except Exception:
            return False
        return {str(n.node_id) for n in sim.workers} <= alive

    def close(self) -> None:
        if self.sim is not None:
            self.sim.shutdown()
            self.sim = None


@ray.remote(num_cpus=0)
class _StartProbe:
    def ready(self) -> bool:
        import torch  # noqa: F401  (what a training worker's start imports first)

        return True


def measure_start() -> float:
    """Seconds from asking Ray for a new actor to its answer from a process that imported torch:
    one worker start on this machine as it is loaded now."""
    began = time.monotonic()
    probe = _StartProbe.remote()  # type: ignore[attr-defined]
    ray.get(probe.ready.remote(), timeout=pace.bound(120))
    ray.kill(probe)
    return time.monotonic() - began


@pytest.fixture(scope="module")
def clusters(train_example_module: Any) -> Iterator[InPlaceClusters]:
    previous = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")}
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.5"
    pool = InPlaceClusters(train_example_module)
    try:
        yield pool
    finally:
        pool.close()
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def cluster(
    clusters: InPlaceClusters, request: pytest.FixtureRequest
) -> Iterator[tuple[SimulatedCluster, Any, dict[Any, str]]]:
    """The module's cluster, the example module and the reference digests (see
    ``InPlaceClusters``); a failed test marks the cluster for replacement."""
    yield clusters.take()
    if any(getattr(getattr(request.node, f"rep_{when}", None), "failed", False) for when in ("setup", "call")):
        clusters.broken = True


def run_with(
    cluster: tuple[SimulatedCluster, Any, dict[Any, str]],
    name: str,
    workers: int,
    faults: Callable[[str], None],
    in_place: dict[str, Any] | None,
    step_sleep_s: float = 0.15,
    **job: Any,
) -> dict[str, Any]:
    """Run job ``name`` in place (``in_place`` None: with Ray Train's full restarts) with
    ``faults(events_dir)`` on a thread; the report. ``job``: more of the example's ``run``
    arguments."""
    _, example, _ = cluster
    client = RegistryClient(ray_ckpt.settings.namespace())
    events = tempfile.mkdtemp()
    failures: list[BaseException] = []

    def inject() -> None:
        try:
            faults(events)
        except BaseException as error:  # surfaced by the test
            failures.append(error)

    thread = threading.Thread(target=inject, daemon=True)
    example.ABANDONED.clear()
    thread.start()
    try:
        final = example.run(
            name=name,
            storage_path=tempfile.mkdtemp(),
            events_dir=events,
            steps=STEPS,
            workers=workers,
            checkpoint=job.pop("checkpoint", CHECKPOINT),
            step_sleep_s=step_sleep_s,
            max_failures=8,
            in_place=None if in_place is None else {"warm_spares": SPARES, **in_place},
            **job,
        )
    finally:
        example.ABANDONED.set()  # a fault thread still waiting stops before the cluster goes
        thread.join(timeout=pace.bound(30))
    assert not failures, failures
    return {
        "events": events,
        "computes": example.read_computes(events),
        "restores": example.read_restores(events),
        "bit_exact": final["params_digest"] == reference_digest(cluster, workers),
        "recoveries": [r for r in timeline.recoveries(client.events()[1]) if r.job == name],
        "rejoins": [e for e in client.events()[1] if e["kind"] == "rejoin" and e["job"] == name],
    }


def by_attempt(restores: list[dict[str, Any]]) -> list[dict[int, dict[str, Any]]]:
    """The restore records grouped per attempt, in order, as {rank: record}."""
    groups: dict[str, dict[int, dict[str, Any]]] = {}
    for record in restores:
        groups.setdefault(record["attempt"], {})[record["rank"]] = record
    return list(groups.values())


def test_a_replacement_starts_in_a_warm_spare_once_the_spares_are_up(cluster: Any, clusters: InPlaceClusters) -> None:
    """2 ranks; the node of rank 1 is killed once every node with room for a worker and none of
    the run's has a warm spare sitting idle (torch and Ray Train imported). The replacement
    starts in one of them, a process that had warmed up before the kill; the survivor keeps its
    process; the final weights are bit-identical. First in this module: each test is a job of
    its own, and idle workers of earlier jobs on a one-CPU node keep Ray from starting a spare
    there until it reaps them. The spares of 5 nodes warm up one after another on this
    machine's few cores: the ranks wait between steps (the example's pause file) until they are
    up and the kill is done. Each spare costs about one worker start (``clusters.start_s``,
    measured on this machine), so the wait for them is bounded by a multiple of it."""
    sim, example, _ = cluster
    sim.add_workers(1)
    killed: list[float] = []
    started = time.time()  # spares left by earlier runs do not count

    def faults(events: str) -> None:
        example.wait_committed("warm", 2)
        pause = pathlib.Path(events) / example.PAUSE_FILE
        pause.touch()
        try:
            busy = {example.rank_node("warm", rank) for rank in (0, 1)}
            alive = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1]
            spare = {str(n["NodeID"]) for n in alive} - busy
            bound_s = max(pace.bound(180.0), 4 * len(spare) * clusters.start_s)
            deadline = time.monotonic() + bound_s
            while not spare <= set(idle_warm_spares(started)):
                if example.ABANDONED.is_set():
                    raise RuntimeError("the run ended while its spares were awaited")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"not all {len(spare)} spare nodes had a warm spare within {bound_s:.0f} s")
            killed.append(time.time())
            example.remove_node(sim, example.rank_node("warm", 1))
        finally:
            pause.unlink()

    report = run_with(cluster, "warm", 2, faults, {"warm_spares": 16})  # every spare node
    assert killed, "the run ended before every spare node had a warm spare"
    first, second = by_attempt(report["restores"])[:2]
    assert second[0]["pid"] == first[0]["pid"], report
    (replacement,) = [r for r in report["rejoins"] if r["role"] == "replacement"]
    assert replacement["warmed"] is not None and replacement["warmed"] < killed[0], (replacement, killed)
    assert report["bit_exact"]


def test_a_node_kill_and_then_a_worker_crash_in_long_computes_replace_only_rank_1(cluster: Any) -> None:
    """3 ranks; step 6 computes for 7 s first (times the machine's pace), each time it runs.

    Half a second after step 5 committed (every rank is in that compute), rank 1's node is
    killed: ranks 0 and 2 are interrupted (``PeerLost``) long before their compute could end,
    keep their pids and restore from local, rank 1's replacement restores from peers, and the
    timeline records an in-place recovery with its phases (but its first step, which the next
    fault cuts short).

    Half a second into the rerun of step 6, the replacement's worker process is killed
    (SIGKILL; its node lives, so no raylet goes and Ray's node table says nothing). Each
    survivor holds one end of a gloo pair with it, dialed or accepted, and sees it close: the
    coordinator names rank 1 by that connection ("silent after its connection closed", not the
    half-second "silent after a closed connection" nor the 3 s "silent"), and the survivors
    keep their processes again: a second in-place recovery. The job ends bit-identical."""
    sim, example, _ = cluster
    sim.add_workers(1)
    killed: list[float] = []

    def faults(events: str) -> None:
        example.wait_committed("single", 5)
        time.sleep(0.5)
        (lost_pid,) = [r["pid"] for r in example.read_restores(events) if r["rank"] == 1]
        killed.append(time.time())
        example.remove_node(sim, example.rank_node("single", 1))
        deadline = time.monotonic() + pace.bound(120)
        while not (reruns := [c for c in example.read_computes(events) if c["rank"] == 1 and c["pid"] != lost_pid]):
            if example.ABANDONED.is_set() or time.monotonic() > deadline:
                raise TimeoutError("rank 1's replacement did not begin step 6")
            time.sleep(0.05)
        time.sleep(0.5)
        killed.append(time.time())
        os.kill(reruns[0]["pid"], signal.SIGKILL)

    report = run_with(cluster, "single", 3, faults, {}, compute_step=6, compute_s=pace.bound(COMPUTE_S))
    assert len(killed) == 2, killed
    attempts = by_attempt(report["restores"])
    assert len(attempts) == 3, attempts  # two failures, two recoveries
    first, second, third = attempts
    assert {r: first[r]["restored_step"] for r in first} == dict.fromkeys(range(3))
    for survivor in (0, 2):
        assert first[survivor]["pid"] == second[survivor]["pid"] == third[survivor]["pid"], attempts
    assert len({first[1]["pid"], second[1]["pid"], third[1]["pid"]}) == 3, attempts
    assert (second[0]["source"], second[1]["source"], second[2]["source"]) == ("local", "peers", "local")
    assert report["bit_exact"]
    recoveries = report["recoveries"]
    assert [(r.mode, set(r.survivor_pids)) for r in recoveries] == [("in_place", {"0", "2"})] * 2, recoveries
    # every phase recorded; the first recovery has no first step: the second fault cut it short
    assert all(recoveries[0].phases_s[p] is not None for p in ("replace", "rendezvous", "fetch")), recoveries
    assert all(recoveries[1].phases_s[p] is not None for p in ("replace", "rendezvous", "fetch", "first_step"))
    # the ranks' beats and joins went to their nodes' stores, which merged them on the way up
    stores = [s for s in ray_ckpt.status()["nodes"].values() if "error" not in s]
    assert sum(s["coordinator_calls"] for s in stores) >= sum(s["coordinator_sends"] for s in stores) > 0, stores
    survivors = {g: [e for e in report["rejoins"] if e["role"] == "survivor" and e["generation"] == g] for g in (2, 3)}
    assert [sorted(e["rank"] for e in survivors[g]) for g in (2, 3)] == [[0, 2], [0, 2]], report["rejoins"]
    for rejoin in survivors[2]:  # the compute it was in when the node died: the newest begun before
        (compute, *_) = [
            c
            for c in reversed(report["computes"])
            if (c["rank"], c["pid"]) == (rejoin["rank"], rejoin["pid"]) and c["started"] < killed[0]
        ]
        assert killed[0] < rejoin["detected"] < compute["started"] + compute["seconds"] / 2, (compute, killed, rejoin)
    lost = [e["lost"] for e in survivors[3]]
    assert all(found == [[1, "silent after its connection closed"]] for found in lost), lost


def test_four_fsdp2_ranks_sharded_per_layer_recover_in_place_with_every_survivor_kept(cluster: Any) -> None:
    """FSDP2 over 4 ranks, each Linear and the root an FSDP unit (all-gathers and reduce-
    scatters in every step, on subgroups of the mesh; parameters and Adam's moments are
    DTensors, restored with ``restore(into=...)``): rank 2's node is killed 0-0.2 s after step
    4 committed, anywhere in a step. Its neighbours' collectives fail; a survivor blocked in a
    collective with a rank that left for the next generation is woken (the leaving ranks and the
    round's heartbeat close their gloo connections) instead of waiting out its timeout. All
    three survivors keep their processes and restore their shards from their local copies, the
    replacement from peers; one failure is one in-place recovery, and the final weights are
    bit-identical to an uninterrupted run's."""
    sim, example, _ = cluster
    sim.add_workers(1)

    def faults(events: str) -> None:
        example.wait_committed("fsdp4", 4)
        time.sleep(random.Random(4).uniform(0.0, 0.2))
        example.remove_node(sim, example.rank_node("fsdp4", 2))

    client = RegistryClient(ray_ckpt.settings.namespace())
    events = tempfile.mkdtemp()
    thread = threading.Thread(target=faults, args=(events,), daemon=True)
    example.ABANDONED.clear()
    thread.start()
    try:
        final = example.run(
            name="fsdp4",
            storage_path=tempfile.mkdtemp(),
            events_dir=events,
            steps=STEPS,
            workers=4,
            checkpoint=CHECKPOINT,
            step_sleep_s=0.15,
            max_failures=8,
            in_place={"warm_spares": SPARES},
            fsdp2=True,
            fsdp2_per_layer=True,
        )
    finally:
        example.ABANDONED.set()  # a fault thread still waiting stops before the cluster goes
        thread.join(timeout=pace.bound(30))
    groups = by_attempt(example.read_restores(events))
    assert len(groups) == 2, groups  # one failure, one recovery
    first, second = groups
    kept = [rank for rank in (0, 1, 3) if second[rank]["pid"] == first[rank]["pid"]]
    assert kept == [0, 1, 3], groups
    assert [second[rank]["source"] for rank in range(4)] == ["local", "local", "peers", "local"], groups
    assert all(second[rank]["restored_step"] >= 4 for rank in range(4)), groups
    assert final["params_digest"] == reference_digest(cluster, 4, "per_layer")
    rejoins = [e for e in client.events()[1] if e["kind"] == "rejoin" and e["job"] == "fsdp4"]
    assert len({e["generation"] for e in rejoins}) == 1, rejoins


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not; one gone between two looks neither)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def reference_digest(cluster: tuple[SimulatedCluster, Any, dict[Any, str]], workers: int, fsdp2: str = "") -> str:
    """The uninterrupted run's digest at ``workers`` ranks (``fsdp2``: "" for DDP, "per_layer"
    for FSDP2 per layer), computed once, outside Ray, on first use."""
    _, example, references = cluster
    key: Any = workers if not fsdp2 else f"fsdp2-{workers}-{fsdp2}"
    if key not in references:
        references[key] = example.uninterrupted_digest(
            steps=STEPS, workers=workers, fsdp2=bool(fsdp2), fsdp2_per_layer=fsdp2 == "per_layer"
        )
    return str(references[key])


def drain_at_step(sim: SimulatedCluster, example: Any, job: str, step: int, drained: dict[str, Any]) -> Any:
    """Faults for ``run_with``: once ``step`` committed, Ray is told that rank 2's node drains
    with a 10 s deadline (the call ``ray drain-node`` makes); at the deadline the node is
    killed. ``drained`` gets the node, the notice's time, the deadline and the kill's time."""

    def faults(events: str) -> None:
        example.wait_committed(job, step)
        node = example.rank_node(job, 2)
        deadline = time.time() + 10.0
        assert _ray_compat.drain_node(node, deadline, "a test's preemption notice") is None
        drained.update(node=node, notice=time.time(), deadline=deadline)
        time.sleep(max(0.0, deadline - time.time()))
        drained["killed"] = time.time()
        if any(str(n.node_id) == node for n in sim.workers):
            example.remove_node(sim, node)

    return faults


def test_a_drained_node_hands_its_rank_over_with_no_step_redone_and_no_protection_lost(cluster: Any) -> None:
    """4 ranks saving every 5th step; after step 4 committed, Ray is told that rank 2's node
    drains with a 10 s deadline (a preemption notice, the call ``ray drain-node`` makes), and
    the node is killed at the deadline. Every rank saves each step from the notice on, no new
    shard goes to the draining node, and rank 2 hands its place over once a step saved after
    the notice committed: its replacement restores that very step from peers, the survivors keep
    their processes and restore it from their local copies, so no step is trained twice, all
    before the deadline. After the kill the newest committed step still survives as many node
    losses as parity shards, and the final weights are bit-identical."""
    sim, example, _ = cluster
    sim.add_workers(1)
    drained: dict[str, Any] = {}
    faults = drain_at_step(sim, example, "drain", 4, drained)
    every_5 = {**CHECKPOINT, "every": 5, "keep_committed": 16}  # the handover's step is kept to be looked at
    report = run_with(cluster, "drain", 4, faults, {}, checkpoint=every_5, log_steps=True)
    assert drained.get("killed"), "the run ended before the node's deadline"
    groups = by_attempt(report["restores"])
    assert len(groups) == 2, groups  # one planned loss, one handover
    first, second = groups
    assert [rank for rank in (0, 1, 3) if second[rank]["pid"] == first[rank]["pid"]] == [0, 1, 3], groups
    assert second[2]["pid"] != first[2]["pid"] and second[2]["node_id"] != drained["node"]
    assert (second[0]["source"], second[2]["source"]) == ("local", "peers")
    handed = second[0]["restored_step"]
    steps = example.read_steps(report["events"])
    ends = [(s["rank"], s["step"]) for s in steps]
    assert len(ends) == len(set(ends)), "a step was trained twice"
    assert max(s["step"] for s in steps if s["rank"] == 2 and s["pid"] == first[2]["pid"]) == handed - 1
    (recovery,) = report["recoveries"]
    assert recovery.mode == "in_place"
    (rejoin,) = [r for r in report["rejoins"] if r["role"] == "replacement"]
    assert [list(lost) for lost in rejoin["lost"]] == [[2, "drained"]], rejoin
    survivors = [r for r in report["rejoins"] if r["role"] == "survivor"]
    stall = max(r["ready"] - r["detected"] for r in survivors)
    begun = min(r["detected"] for r in survivors)
    assert begun < drained["deadline"], (survivors, drained)  # handed over before the node's deadline
    phases = {
        k: round(rejoin[k] - begun, 2) for k in ("process_started", "warmed", "worker_started", "joined", "ready")
    }
    after = begun - drained["notice"]
    print(f"handover at step {handed}, {after:.2f} s after the notice: survivors stalled {stall:.2f} s;")
    print(f"the replacement's moments from the handover: {phases}")
    client = RegistryClient(ray_ckpt.settings.namespace())
    latest = client.latest_committed("drain")
    alive = {str(n["NodeID"]) for n in ray.nodes() if n.get("Alive")}
    for step in (handed, latest):
        located = client.locate("drain", step)
        for rank, entry in located.items():
            nodes = list(entry.nodes.values())
            assert drained["node"] not in nodes, (step, rank, nodes)
            assert rank_protection(nodes, CHECKPOINT["data_shards"], alive) == CHECKPOINT["parity_shards"], nodes
    assert report["bit_exact"]


def test_without_in_place_a_drain_costs_no_step_the_restart_resumes_from_the_step_saved_after_the_notice(
    cluster: Any,
) -> None:
    """The same drain under Ray Train's full restarts (no ``InPlaceRecovery``): Ray Train's
    preemption watcher tells every worker; every rank saves each step from then on, and rank 2
    trains on until the deadline is a few steps away, then holds at a committed step until Ray
    Train restarts the workers at the deadline. They restore that step, so no step is trained
    twice; bit-identical."""
    sim, example, _ = cluster
    reference_digest(cluster, 4)
    sim.add_workers(1)
    drained: dict[str, Any] = {}
    faults = drain_at_step(sim, example, "drain_restart", 4, drained)
    every_5 = {**CHECKPOINT, "every": 5}
    # Ray Train's watcher asks every 5 s: steps slow enough that the notice comes mid-run
    report = run_with(cluster, "drain_restart", 4, faults, None, checkpoint=every_5, log_steps=True, step_sleep_s=0.5)
    assert drained.get("killed"), "the run ended before the node's deadline"
    groups = by_attempt(report["restores"])
    assert len(groups) == 2, groups  # one planned loss, one restart
    second = groups[1]
    assert second[0]["restored_step"] > 4, groups  # a step saved after the notice
    ends = [(s["rank"], s["step"]) for s in example.read_steps(report["events"])]
    assert len(ends) == len(set(ends)), "a step was trained twice"
    assert all(record["node_id"] != drained["node"] for record in second.values())
    assert report["bit_exact"]


def test_two_kills_in_sequence_and_a_kill_during_a_recovery_end_bit_exact(cluster: Any) -> None:
    """Rank 2's node is killed after step 4 (recovered in place: ranks 0 and 1 keep their
    processes); after step 10, with the ranks held between steps, rank 1's node, and 0.3 s
    later, as Ray starts replacing it, rank 2's new node. Ray cannot replace a worker while
    another survivor dies under it: the controller then restarts the whole group (ray_ckpt's
    fallback) or replaces both, depending on when it sees the second death. Either way every
    restore comes from memory and the final weights are bit-identical."""
    sim, example, _ = cluster
    sim.add_workers(3)

    def faults(events: str) -> None:
        example.wait_committed("sequence", 4)
        example.remove_node(sim, example.rank_node("sequence", 2))
        example.wait_committed("sequence", 10)
        pause = pathlib.Path(events) / example.PAUSE_FILE
        pause.touch()  # the ranks wait between steps: the run cannot end before both kills, however slow they are
        try:
            example.remove_node(sim, example.rank_node("sequence", 1))
            time.sleep(0.3)
            example.remove_node(sim, example.rank_node("sequence", 2))
        finally:
            pause.unlink()

    report = run_with(cluster, "sequence", 3, faults, {"timeout_s": pace.bound(90)})
    attempts = by_attempt(report["restores"])
    assert len(attempts) >= 3
    first, second = attempts[0], attempts[1]
    assert second[0]["pid"] == first[0]["pid"] and second[1]["pid"] == first[1]["pid"]
    assert all(r["source"] in ("local", "peers") for a in attempts[1:] for r in a.values())
    assert report["bit_exact"]


def test_a_survivor_lost_while_it_waits_falls_back_to_new_workers_that_restore_from_peers(cluster: Any) -> None:
    """2 ranks: rank 1's node is killed, and 0.75 s later, while rank 0 waits for the
    replacement, rank 0's node. No process survives, so every rank restarts in a new worker and
    restores from peers; the run ends bit-identical. No warm spares: a replacement started in
    one can join within the gap (0.5-1 s here), and then it survives the second kill; a cold
    one takes a worker start (over 2 s here), so the second kill lands while rank 0 waits."""
    sim, example, _ = cluster
    sim.add_workers(2)

    def faults(events: str) -> None:
        example.wait_committed("fallback", 4)
        survivor = example.rank_node("fallback", 0)
        example.remove_node(sim, example.rank_node("fallback", 1))
        time.sleep(0.75)
        example.remove_node(sim, survivor)

    report = run_with(cluster, "fallback", 2, faults, {"timeout_s": pace.bound(60), "warm_spares": 0})
    attempts = by_attempt(report["restores"])
    first, last = attempts[0], attempts[-1]
    assert all(last[r]["pid"] != first[r]["pid"] for r in (0, 1)), attempts
    assert {last[r]["source"] for r in (0, 1)} == {"peers"}, attempts
    assert report["bit_exact"]


def test_a_hung_peer_is_killed_within_the_bound_and_a_rank_that_finishes_first_is_not(
    cluster: Any, clusters: InPlaceClusters
) -> None:
    """Rank 1's worker is stopped with SIGSTOP after step 4: once silent for hang_timeout_s it
    is killed (within hang_timeout_s plus the watcher's tick and a kill task on its node, which
    may start a Ray worker process there: at most two worker starts as measured on this machine,
    ``clusters.start_s``, and at least 3 s at its pace), Ray replaces it, and rank 0 recovers in
    place. After training, rank 0 works four hang bounds longer than rank 1 (a final
    evaluation): rank 1's function returned and its beats stopped on purpose, so it is not
    killed as hung; the fit succeeds after that one recovery, bit-identical."""
    example = cluster[1]
    hung: dict[str, float] = {}

    def faults(events: str) -> None:
        example.wait_committed("hung", 4)
        pid = next(r["pid"] for r in example.read_restores(events) if r["rank"] == 1)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        while _running(pid):
            if time.monotonic() - stopped > 60:
                os.kill(pid, signal.SIGCONT)
                raise TimeoutError("the stopped worker was not killed within 60 s")
            time.sleep(0.05)
        hung["killed_after_s"] = time.monotonic() - stopped

    report = run_with(
        cluster,
        "hung",
        2,
        faults,
        {"timeout_s": pace.bound(60), "hang_timeout_s": HANG_TIMEOUT_S},
        rank0_after_s=4 * HANG_TIMEOUT_S,
    )
    kill_s = max(pace.bound(3.0), 2 * clusters.start_s)
    assert HANG_TIMEOUT_S * 0.75 <= hung["killed_after_s"] <= HANG_TIMEOUT_S + kill_s, (hung, kill_s)
    attempts = by_attempt(report["restores"])
    # one recovery, the hang's: each function started once per attempt, none killed at the end
    assert len(attempts) == 2 and len(report["restores"]) == 4, attempts
    assert len(report["recoveries"]) == 1, report["recoveries"]
    first, second = attempts
    assert second[0]["pid"] == first[0]["pid"] and second[0]["source"] == "local", attempts
    # the node lived: Ray starts the replacement in the same bundle there, next to its local copy
    assert second[1]["pid"] != first[1]["pid"] and second[1]["source"] in ("local", "peers"), attempts
    assert report["bit_exact"]
