"""In place on a full cluster: where a replacement's time goes when no node is free.

4 workers of scripts/train_example.py's job run in place (``InPlaceRecovery``) on exactly 4
one-CPU nodes, so no warm spare has a node to wait on. After step 4 committed, the nodes of
``--kill`` ranks (1, or 1 and 2 at once) are hard-killed, and as many nodes are added back
``--add-after-s`` seconds later, as an autoscaler would. Each failure's replace phase is cut
into its parts from the replacements' ``rejoin`` events and the recovery's timeline:

- ``wait_node``: the kill -> the node added back is alive in Ray's view;
- ``to_process``: the node alive -> the replacement's worker process started;
- ``to_warm``: that process started -> its setup hook had imported what a worker needs
  (``inplace_worker.warm_up``: Ray Train's worker module, torch.distributed, FSDP2, dynamo);
- ``to_function``: -> the training function began (Ray Train's worker set-up);
- ``to_join``: the function began -> it asked to join the generation;
- ``to_ready``: it asked -> the generation formed and its process group was up;

and the recovery's restore and first step, and its time to resume. One table, and JSON with
``--json``::

    python scripts/bench_full_cluster.py [--kill 1 2] [--add-after-s 3.5] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import train_example
from benchutil import add_json_flag, write_json

import ray_ckpt
from ray_ckpt.core import timeline
from ray_ckpt.testing import SimulatedCluster
from ray_ckpt.tools import chaos, quiet
from ray_ckpt.tools.faults import ClusterNodeRemoval
from ray_ckpt.transport.registry_client import RegistryClient

WORKERS = 4
STEPS = 16
KILL_AFTER_STEP = 4
PARTS = ("wait_node", "to_process", "to_warm", "to_function", "to_join", "to_ready")


def strike(sim: SimulatedCluster, ranks: list[int], add_after_s: float, out: dict[str, Any]) -> None:
    """After step ``KILL_AFTER_STEP`` committed: hard-kill the nodes of ``ranks`` at once, then
    add as many nodes back ``add_after_s`` later; ``out`` gets the times."""
    train_example.wait_committed("full", KILL_AFTER_STEP)
    nodes = sorted({train_example.rank_node("full", rank) for rank in ranks})
    out["killed_at"] = time.time()  # hard kills, recorded as ``ray-ckpt kill-node`` records its own
    chaos.inject(ClusterNodeRemoval(sim.cluster), nodes, namespace=sim.namespace, wait_dead_s=None)
    sim.workers[:] = [node for node in sim.workers if str(node.node_id) not in nodes]
    time.sleep(max(0.0, out["killed_at"] + add_after_s - time.time()))
    sim.add_workers(len(nodes))  # returns once Ray lists them alive
    out["alive_at"] = time.time()


def replace_parts(rejoins: list[dict[str, Any]], killed_at: float, alive_at: float) -> dict[str, float]:
    """The replace phase's parts (``PARTS``) of the slowest replacement, in seconds."""
    replacements = [r for r in rejoins if r.get("role") == "replacement"]
    slowest = max(replacements, key=lambda r: float(r["ready"]))
    started = float(slowest["process_started"])
    warmed = started if slowest.get("warmed") is None else float(slowest["warmed"])
    return {
        "wait_node": alive_at - killed_at,
        "to_process": started - alive_at,
        "to_warm": warmed - started,
        "to_function": float(slowest["worker_started"]) - warmed,
        "to_join": float(slowest["joined"]) - float(slowest["worker_started"]),
        "to_ready": float(slowest["ready"]) - float(slowest["joined"]),
    }


def replacement_moments(rejoins: list[dict[str, Any]], killed_at: float) -> list[dict[str, Any]]:
    """Each replacement's moments, in seconds after the kill: its process started, warmed up,
    its training function began, it asked to join, it was ready; by rank."""
    keys = ("process_started", "warmed", "worker_started", "joined", "ready")
    moments = []
    for r in sorted((r for r in rejoins if r.get("role") == "replacement"), key=lambda r: int(r["rank"])):
        moments.append({"rank": int(r["rank"]), **{k: round(float(r[k]) - killed_at, 2) for k in keys if r.get(k)}})
    return moments


def measure(kill: list[int], add_after_s: float) -> dict[str, Any]:
    """One run; the recovery's phases, the replace phase's parts and the bit-exact check."""
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    with SimulatedCluster(WORKERS, store_budget_bytes=512 << 20, logging_level="ERROR") as sim:
        quiet.quiet_driver()
        reference = train_example.uninterrupted_digest(steps=STEPS, workers=WORKERS)
        times: dict[str, Any] = {}
        finals: list[dict[str, Any]] = []
        errors: list[BaseException] = []

        def fit() -> None:
            try:
                finals.append(
                    train_example.run(
                        name="full",
                        storage_path=tempfile.mkdtemp(prefix="rckfull-storage"),
                        events_dir=tempfile.mkdtemp(prefix="rckfull-events"),
                        steps=STEPS,
                        workers=WORKERS,
                        checkpoint={"data_shards": 2, "parity_shards": 2},
                        in_place={"timeout_s": 120.0},
                    )
                )
            except BaseException as error:  # reported below
                errors.append(error)

        job = threading.Thread(target=fit, daemon=True)  # adding nodes needs this process's main thread
        train_example.ABANDONED.clear()
        job.start()
        try:
            strike(sim, kill, add_after_s, times)
            job.join()
        finally:
            train_example.ABANDONED.set()
        if not finals:
            raise RuntimeError(f"the run did not end with rank 0's final record: {errors[0] if errors else 'no error'}")
        final = finals[0]
        _, records = RegistryClient(ray_ckpt.settings.namespace()).events()
    ours = [r for r in records if r.get("job") == "full"]
    recoveries = [r for r in timeline.recoveries(records) if r.job == "full" and r.kill_time is not None]
    if len(recoveries) != 1 or "alive_at" not in times:
        raise RuntimeError(f"expected one recovery after the kill, got {len(recoveries)}")
    (recovery,) = recoveries
    rejoins = [r for r in ours if r["kind"] == "rejoin" and str(r.get("attempt")) == recovery.attempt]
    return {
        "killed_ranks": kill,
        "add_after_s": add_after_s,
        "time_to_resume_s": recovery.time_to_resume_s,
        "phases_s": dict(recovery.phases_s),
        "replace_parts_s": replace_parts(rejoins, times["killed_at"], times["alive_at"]),
        "replacements": replacement_moments(rejoins, times["killed_at"]),
        "warm": dict(recovery.warm_replacements),
        "bit_exact": final["params_digest"] == reference,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kill", type=int, nargs="+", default=[1], help="the ranks whose nodes die at once")
    parser.add_argument("--add-after-s", type=float, default=3.5, help="a node back this long after the kill")
    parser.add_argument("--runs", type=int, default=1, help="runs, each on a fresh cluster (default 1)")
    add_json_flag(parser, "every run's figures")
    args = parser.parse_args(argv)
    if not args.kill or any(not 0 < r < WORKERS for r in args.kill) or len(set(args.kill)) > 2:
        parser.error(f"--kill takes one or two ranks in 1..{WORKERS - 1} (RS(2,2) survives two losses)")
    runs = [measure(sorted(set(args.kill)), args.add_after_s) for _ in range(args.runs)]
    print(f"{WORKERS} workers in place on {WORKERS} one-CPU nodes; nodes of ranks {args.kill} killed after step "
          f"{KILL_AFTER_STEP}, as many added back {args.add_after_s:g} s later ({os.cpu_count()} cores)")  # fmt: skip
    print(f"{'run':>3} {'resume s':>8} {'replace s':>9} " + " ".join(f"{p:>11}" for p in PARTS) + "  bit-exact")
    for i, run in enumerate(runs, 1):
        parts = run["replace_parts_s"]
        replace = run["phases_s"].get("replace")
        print(
            f"{i:>3} {run['time_to_resume_s']:>8.2f} {'-' if replace is None else f'{replace:.2f}':>9} "
            + " ".join(f"{parts[p]:>11.2f}" for p in PARTS)
            + f"  {run['bit_exact']}"
        )
    if len(runs) > 1:
        print(f"median time to resume {statistics.median(r['time_to_resume_s'] for r in runs):.2f} s")
    write_json(args.json, {"benchmark": "full_cluster", "runs": runs})
    return 0 if all(r["bit_exact"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
