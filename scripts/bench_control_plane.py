"""The control plane at N ranks: commits, stage throughput, restore plans, registry CPU.

Starts the real ray_ckpt service (registry actor plus one store per node) on a simulated
cluster of a few nodes on this machine (``ray_ckpt.testing.SimulatedCluster``: a head with no
CPUs plus 2 one-CPU workers, dashboard off, a private RAY_TMPDIR) and drives the registry with
metadata only: no shard bytes are sent. The callers are lightweight: every stage's wire
record (RS(4,2), 6 shard records spread over the stores' nodes) is built before the clock
starts, and 32 caller threads of this process send them.

Per N (``--ranks``):

- stages: each of ``--steps`` steps is staged by all N ranks. With ``--ranks-per-node R``
  (default 8, a GPU node's ranks) each caller thread stands for one node: it sends the stages
  of R ranks as one ``stage_batch`` call, the call a node's store actor makes when it flushes
  the stages of the ranks on its node. ``--ranks-per-node 1`` sends one ``stage`` call per rank
  (what every rank did before stages were batched per node).
- ``commit_s``: from the first stage sent until the call whose stage committed the step
  returned (median over the steps);
- ``stage_per_s``: ranks staged per second (N over the time until every call returned);
- ``plan_s``: one rank's restore-plan latency, as ``Restorer.restore`` asks it (the plan of a
  new attempt, then ``locate_rank``: its own record and the world size), median over 32 ranks
  asking at once;
  ``plan_bytes_per_rank``: the pickled size of what one rank receives for it;
- ``registry_cpu_s_per_step``: the registry actor process's CPU seconds (psutil, user +
  system) over the stage phase, divided by the steps committed.

Rows: ``{"ranks", "commit_s", "stage_per_s", "plan_s", "plan_bytes_per_rank",
"registry_cpu_s_per_step"}``. All "nodes" share this machine's cores, and the 32 callers share
one Python process with the driver's Ray client: the numbers are an upper bound on a real
cluster's per-call costs, not a model of its network.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import pickle
import statistics
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

CODE = {"data_shards": 4, "parity_shards": 2}
CALLERS = 32
WORKERS = 2


def stage_requests(job: str, step: int, world_size: int, nodes: list[str]) -> list[Any]:
    """Every rank's ``StageRequest`` of ``step`` (RS(4,2), shards spread over ``nodes``, no local copy)."""
    from ray_ckpt.shard import ShardMeta
    from ray_ckpt.wire import StageRequest

    k, m = CODE["data_shards"], CODE["parity_shards"]
    requests = []
    for rank in range(world_size):
        metas = tuple(
            ShardMeta(
                job=job,
                step=step,
                rank=rank,
                index=i,
                world_size=world_size,
                data_shards=k,
                parity_shards=m,
                payload_size=4 << 20,
                shard_size=1 << 20,
                checksum=(rank * 131 + step * 7 + i) & 0xFFFFFFFF,
            )
            for i in range(k + m)
        )
        placed = {i: nodes[(rank + i) % len(nodes)] for i in range(k + m)}
        requests.append(StageRequest(metas=metas, nodes=placed, keep_committed=2, attempt="save"))
    return requests


def wire_calls(requests: list[Any], per_node: int) -> list[Any]:
    """The calls' arguments, built before the clock starts: per node a list of ``StageRequest``s
    on the wire (what a store sends), or per rank the arguments of ``stage``."""
    if per_node > 1:
        return [[r.to_wire() for r in requests[i : i + per_node]] for i in range(0, len(requests), per_node)]
    return [([m.to_dict() for m in r.metas], dict(r.nodes)) for r in requests]


def run_step(client: Any, calls: list[Any], per_node: int, attempt: str) -> tuple[float, float]:
    """Stage one step from CALLERS threads; (seconds until it committed, seconds until all returned)."""
    committed_at: list[float] = []
    lock = threading.Lock()

    def send(call: Any) -> None:
        if per_node > 1:
            results = client.call("stage_batch", call)
            errors = [r["error"] for r in results if r.get("error") is not None]
            if errors:
                raise RuntimeError(f"stage_batch refused a stage: {errors[0]}")
            committed = any(r["committed"] for r in results)
        else:
            metas, nodes = call
            committed = bool(client.call("stage", metas, nodes, 2, attempt, None, None))
        if committed:
            with lock:
                committed_at.append(time.perf_counter())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(CALLERS) as pool:
        list(pool.map(send, calls))
    done = time.perf_counter()
    if len(committed_at) != 1:
        raise RuntimeError(f"expected exactly one committing call, got {len(committed_at)}")
    return committed_at[0] - t0, done - t0


def plan_for_rank(client: Any, job: str, attempt: str, rank: int) -> tuple[float, int]:
    """(seconds, pickled bytes received) for one rank's restore plan and records."""
    t0 = time.perf_counter()
    plan = client.call("plan_restore", job, attempt)
    records = client.call("locate_rank", job, plan["step"], rank)  # this rank's record and the world size
    return time.perf_counter() - t0, len(pickle.dumps(plan)) + len(pickle.dumps(records))


def measure(client: Any, handle: Any, nodes: list[str], ranks: int, steps: int, per_node: int) -> dict[str, Any]:
    import psutil
    import ray

    job = f"probe-{ranks}-{uuid.uuid4().hex[:6]}"
    attempt = "save"
    pid = ray.get(handle.__ray_call__.remote(lambda _actor: os.getpid()))
    process = psutil.Process(pid)
    commits, totals = [], []
    prepared = [wire_calls(stage_requests(job, step, ranks, nodes), per_node) for step in range(steps)]
    cpu0 = sum(process.cpu_times()[:2])
    for step in range(steps):
        commit_s, total_s = run_step(client, prepared[step], per_node, attempt)
        commits.append(commit_s)
        totals.append(total_s)
    cpu = sum(process.cpu_times()[:2]) - cpu0
    asked = list(range(0, ranks, max(1, ranks // CALLERS)))[:CALLERS]
    with ThreadPoolExecutor(CALLERS) as pool:
        plans = list(pool.map(lambda r: plan_for_rank(client, job, "restore", r), asked))
    client.call("forget", job)
    return {
        "ranks": ranks,
        "commit_s": round(statistics.median(commits), 4),
        "stage_per_s": round(ranks / statistics.median(totals), 1),
        "plan_s": round(statistics.median(p[0] for p in plans), 4),
        "plan_bytes_per_rank": max(p[1] for p in plans),
        "registry_cpu_s_per_step": round(cpu / steps, 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--ranks", default="64,256,1024,4096,8192", help="comma-separated rank counts")
    parser.add_argument("--json", type=pathlib.Path, help="write the rows here")
    parser.add_argument("--quick", action="store_true", help="64,256 ranks and one step each (a smoke run)")
    parser.add_argument("--steps", type=int, default=3, help="steps committed per rank count (default 3)")
    parser.add_argument("--ranks-per-node", type=int, default=8, help="stages per batched call; 1: one call per rank")
    args = parser.parse_args(argv)
    ranks = [64, 256] if args.quick else [int(x) for x in args.ranks.split(",") if x.strip()]
    steps = 1 if args.quick else args.steps
    if steps < 1 or args.ranks_per_node < 1 or not ranks or min(ranks) < 1:
        parser.error("--ranks, --steps and --ranks-per-node must be positive")
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rccp")
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    from ray_ckpt import naming
    from ray_ckpt.registry_client import RegistryClient
    from ray_ckpt.testing import SimulatedCluster

    rows = []
    namespace = f"bench-cp-{uuid.uuid4().hex[:6]}"
    with SimulatedCluster(WORKERS, store_budget_bytes=64 << 20, namespace=namespace):
        client = RegistryClient(namespace)
        nodes = sorted(naming.store_node_ids(namespace))
        print(
            f"RS(4,2) metadata, {len(nodes)} stores, {CALLERS} caller threads, "
            f"{args.ranks_per_node} rank(s) per call, {steps} step(s) per N",
            flush=True,
        )
        for n in ranks:
            row = measure(client, client.handle, nodes, n, steps, args.ranks_per_node)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
