"""The control plane at N ranks: commits, stage throughput, restore plans, registry CPU.

Starts the real ray_ckpt service (registry actor plus one store per node) on a simulated
cluster of a few nodes on this machine (``ray_ckpt.testing.SimulatedCluster``: a head with no
CPUs plus 2 one-CPU workers, dashboard off, a private RAY_TMPDIR) and drives it with metadata
only: no shard bytes are sent. The callers are lightweight: every stage's wire record (RS(4,2),
6 shard records spread over the stores' nodes) is built before the clock starts, and 32 caller
threads of this process send them.

Per N (``--ranks``), each of ``--steps`` steps is staged by all N ranks, ``--ranks-per-node``
(default 8, a GPU node's ranks) per caller call. ``--path`` says which way:

- ``relay`` (default, what the stores do): each call stands for one node's store passing its
  ranks' stages (packed, as that store packs them) up the relay tree (``ray_ckpt.core.relay``) to
  its parent, one of the real stores, chosen round-robin; the real stores relay to the root,
  which calls the registry. One unmeasured step first forms the tree (it is handed down with
  the first commit).
- ``direct``: each call is one ``stage_batch`` of the node's ranks straight to the registry
  (what a rank does when its store is gone; with ``--ranks-per-node 1``, one call per rank).

Measured:

- ``commit_s``: from the first stage sent until a caller first heard that the step committed
  (median over the steps);
- ``stage_per_s``: ranks staged per second (N over the time until every call returned);
- ``plan_s``: one rank's restore-plan latency when it asks the registry itself (the plan of a
  new attempt and its own record, one ``plan_ranks`` call), median over 32 ranks asking at once;
  ``plan_bytes_per_rank``: the pickled size of what one rank receives for it;
- ``plan_all_s``: after a restart (a new attempt), until every rank of the job has its plan and
  record: up the relay tree (the callers ask for their subtrees' ranks, as the stores below
  merge their ranks' queries), or with ``--path direct`` every rank asking the registry;
  ``registry_cpu_s_per_plan``: the registry's CPU for it, per rank;
- ``registry_cpu_s_per_step``: the registry actor process's CPU seconds (psutil, user +
  system) over the measured steps, divided by the steps committed; ``relay_cpu_s_per_step``:
  the same for the stores together (all of them: on this cluster every store is a relay).

Rows: ``{"ranks", "commit_s", "stage_per_s", "plan_s", "plan_bytes_per_rank", "plan_all_s",
"registry_cpu_s_per_plan", "registry_cpu_s_per_step", "relay_cpu_s_per_step", "path",
"registry_calls_per_step"}``. All
"nodes" share this machine's cores, and the 32 callers share one Python process with the
driver's Ray client: the numbers are an upper bound on a real cluster's per-call costs, not a
model of its network. Here 3 stores take the calls of up to 1024 "nodes", where the relay tree
gives a store at most RAY_CKPT_RELAY_FANIN (16) children: the relays are loaded far harder
than on a real cluster.
"""

from __future__ import annotations

import json
import os
import pickle
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchutil import add_json_flag, make_parser, on_private_ray, write_json

CODE = {"data_shards": 4, "parity_shards": 2}
CALLERS = 32
WORKERS = 2


def stage_requests(job: str, step: int, world_size: int, nodes: list[str]) -> list[Any]:
    """Every rank's ``StageRequest`` of ``step`` (RS(4,2), shards spread over ``nodes``, no local copy)."""
    from ray_ckpt.core.shard import ShardMeta
    from ray_ckpt.core.wire import StageRequest

    k, m = CODE["data_shards"], CODE["parity_shards"]
    requests = []
    for rank in range(world_size):
        save = {"job": job, "step": step, "rank": rank, "world_size": world_size, "data_shards": k, "parity_shards": m}
        sizes = {"payload_size": 4 << 20, "shard_size": 1 << 20}
        metas = tuple(
            ShardMeta(**save, **sizes, index=i, checksum=(rank * 131 + step * 7 + i) & 0xFFFFFFFF) for i in range(k + m)
        )
        placed = {i: nodes[(rank + i) % len(nodes)] for i in range(k + m)}
        requests.append(StageRequest(metas=metas, nodes=placed, keep_committed=2, attempt="save"))
    return requests


def wire_calls(requests: list[Any], per_node: int, path: str, children: int) -> list[Any]:
    """The calls' arguments, built before the clock starts. Direct: one per node, its ranks'
    ``StageRequest``s on the wire. Relay: one per child of the real stores (at most
    ``children``), its subtree's nodes' stages packed and merged into one ``StageGroup`` on the
    wire, as the relays below it would pass them up."""
    from ray_ckpt.core.wire import StageGroup

    nodes = [requests[i : i + per_node] for i in range(0, len(requests), per_node)]
    if path == "direct":
        return [[r.to_wire() for r in node] for node in nodes]
    count = min(children, len(nodes))
    runs = [nodes[len(nodes) * i // count : len(nodes) * (i + 1) // count] for i in range(count)]
    return [
        [group.to_wire() for group in StageGroup.merged(g for node in run for g in StageGroup.of(node))] for run in runs
    ]


def child_slots(stores: list[Any], fanin: int) -> list[Any]:
    """The parents of the probe's callers: the real stores' free places in the relay tree (the
    root's ``fanin`` minus the other real stores, ``fanin`` under each of those), interleaved."""
    capacity = [fanin - (len(stores) - 1)] + [fanin] * (len(stores) - 1)
    return [store for j in range(fanin) for store, free in zip(stores, capacity) if j < free]


def run_step(client: Any, stores: list[Any], calls: list[Any], path: str) -> tuple[float, float]:
    """Stage one step from CALLERS threads; (seconds until a caller heard it committed, seconds
    until all returned)."""
    import ray

    committed_at: list[float] = []
    lock = threading.Lock()

    def send(numbered: tuple[int, Any]) -> None:
        number, call = numbered
        if path == "relay":
            results = ray.get(stores[number].relay.remote(call), timeout=120)
            refused = [r["refused"] for r in results if r["refused"]]
        else:
            results = client.call("stage_batch", call)
            refused = [r["error"] for r in results if r.get("error") is not None]
        if refused:
            raise RuntimeError(f"a stage was refused: {refused[0]}")
        if any(r["committed"] for r in results):
            with lock:
                committed_at.append(time.perf_counter())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(CALLERS) as pool:
        list(pool.map(send, enumerate(calls)))
    done = time.perf_counter()
    if not committed_at:
        raise RuntimeError("no call saw the step commit")
    return min(committed_at) - t0, done - t0


def plan_for_rank(client: Any, job: str, attempt: str, rank: int) -> tuple[float, int]:
    """(seconds, pickled bytes received) for one rank's restore plan and record, asked of the
    registry by the rank itself (one ``plan_ranks`` call, as ``Restorer`` does without a store)."""
    from ray_ckpt.core.wire import PlanQuery

    t0 = time.perf_counter()
    answer = client.call("plan_ranks", [PlanQuery(job, attempt, (rank,)).to_wire()])
    return time.perf_counter() - t0, len(pickle.dumps(answer))


def plan_everyone(client: Any, parents: list[Any], job: str, attempt: str, ranks: int, path: str) -> float:
    """Seconds until every rank of a restart has its plan and record: through the relay tree
    (each caller stands for a child of the real stores, asking for its subtree's ranks at once,
    as the stores below would have merged them), or every rank asking the registry itself."""
    import ray

    from ray_ckpt.core.wire import PlanQuery

    t0 = time.perf_counter()
    with ThreadPoolExecutor(CALLERS) as pool:
        if path == "relay":
            count = min(len(parents), ranks)
            runs = [tuple(range(ranks * i // count, ranks * (i + 1) // count)) for i in range(count)]
            queries = [[PlanQuery(job, attempt, run).to_wire()] for run in runs]
            answers = list(
                pool.map(lambda n: ray.get(parents[n].relay_plans.remote(queries[n]), timeout=300), range(count))
            )
            got = sum(len(a[0]["records"]) for a in answers)
        else:
            got = len(list(pool.map(lambda r: plan_for_rank(client, job, attempt, r), range(ranks))))
    if got != ranks:
        raise RuntimeError(f"{got} of {ranks} ranks got their plan and record")
    return time.perf_counter() - t0


def process_of(handle: Any) -> Any:
    import psutil
    import ray

    return psutil.Process(ray.get(handle.__ray_call__.remote(lambda _actor: os.getpid())))


def cpu_s(processes: list[Any]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in processes)


def measure(client: Any, stores: dict[str, Any], ranks: int, steps: int, per_node: int, path: str) -> dict[str, Any]:
    from ray_ckpt import settings

    job = f"probe-{ranks}-{uuid.uuid4().hex[:6]}"
    nodes = sorted(stores)
    registry = process_of(client.handle)
    relays = [process_of(handle) for handle in stores.values()]
    parents = child_slots([stores[node] for node in nodes], settings.relay_fanin())
    prepared = [
        wire_calls(stage_requests(job, step, ranks, nodes), per_node, path, len(parents)) for step in range(steps + 1)
    ]
    run_step(client, parents, prepared[0], path)  # forms the relay tree (handed down with the commit)
    time.sleep(0.5)
    calls0 = client.call("stage_calls")
    commits, totals = [], []
    cpu0, relay0 = cpu_s([registry]), cpu_s(relays)
    for step in range(1, steps + 1):
        commit_s, total_s = run_step(client, parents, prepared[step], path)
        commits.append(commit_s)
        totals.append(total_s)
    cpu, relay_cpu = cpu_s([registry]) - cpu0, cpu_s(relays) - relay0
    calls = client.call("stage_calls") - calls0
    asked = list(range(0, ranks, max(1, ranks // CALLERS)))[:CALLERS]
    with ThreadPoolExecutor(CALLERS) as pool:
        plans = list(pool.map(lambda r: plan_for_rank(client, job, "restore", r), asked))
    cpu0 = cpu_s([registry])
    plan_all_s = plan_everyone(client, parents, job, "restart", ranks, path)
    plan_cpu = cpu_s([registry]) - cpu0
    client.call("forget", job)
    return {
        "ranks": ranks,
        "commit_s": round(statistics.median(commits), 4),
        "stage_per_s": round(ranks / statistics.median(totals), 1),
        "plan_s": round(statistics.median(p[0] for p in plans), 4),
        "plan_bytes_per_rank": max(p[1] for p in plans),
        "plan_all_s": round(plan_all_s, 3),
        "registry_cpu_s_per_plan": round(plan_cpu / ranks, 6),
        "registry_cpu_s_per_step": round(cpu / steps, 4),
        "relay_cpu_s_per_step": round(relay_cpu / steps, 4),
        "path": path,
        "registry_calls_per_step": round(calls / steps, 1),
    }


def measure_all(ranks: list[int], steps: int, per_node: int, path: str) -> list[dict[str, Any]]:
    """On one simulated cluster with the service started: ``measure`` at each rank count, each
    row printed as it comes."""
    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.transport import naming
    from ray_ckpt.transport.registry_client import RegistryClient

    rows = []
    namespace = f"bench-cp-{uuid.uuid4().hex[:6]}"
    with SimulatedCluster(WORKERS, store_budget_bytes=64 << 20, namespace=namespace):
        client = RegistryClient(namespace)
        stores = naming.store_handles(namespace)
        print(
            f"RS(4,2) metadata, {len(stores)} stores, {CALLERS} caller threads, "
            f"{per_node} rank(s) per call ({path}), {steps} step(s) per N",
            flush=True,
        )
        for n in ranks:
            row = measure(client, stores, n, steps, per_node, path)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__)
    parser.add_argument("--ranks", default="64,256,1024,4096,8192", help="comma-separated rank counts")
    add_json_flag(parser)
    parser.add_argument("--quick", action="store_true", help="64,256 ranks and one step each (a smoke run)")
    parser.add_argument("--steps", type=int, default=3, help="steps committed per rank count (default 3)")
    parser.add_argument("--ranks-per-node", type=int, default=8, help="ranks per node: stages per call")
    parser.add_argument(
        "--path", choices=("relay", "direct"), default="relay", help="up the relay tree, or straight to the registry"
    )
    args = parser.parse_args(argv)
    ranks = [64, 256] if args.quick else [int(x) for x in args.ranks.split(",") if x.strip()]
    steps = 1 if args.quick else args.steps
    if steps < 1 or args.ranks_per_node < 1 or not ranks or min(ranks) < 1:
        parser.error("--ranks, --steps and --ranks-per-node must be positive")
    rows = on_private_ray("rccp", lambda: measure_all(ranks, steps, args.ranks_per_node, args.path))
    if rows is None:
        return 1
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
