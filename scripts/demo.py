"""Failure-and-recovery demo on a simulated multi-node Ray cluster (one machine, no arguments).

Starts a Ray cluster of several simulated nodes (dashboard off, its own temp dir), deploys the
ray_ckpt service, lets 4 ranks checkpoint a model-sized state every step with RS(4,2), then
hard-kills two nodes at once (one of them running a rank) and restores every rank in a fresh
process. Prints a recovery report: per rank the step, the source, the restore phases and
whether the state is bit-exact.

    python scripts/demo.py [--nodes 7] [--ranks 4] [--state-mib 16] [--steps 5] [--json PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

import ray
import torch
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import ray_ckpt
from ray_ckpt import naming, service, snapshot
from ray_ckpt.checkpointer import Checkpointer


def make_state(rank: int, step: int, numel: int) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(rank * 100_003 + step)
    return {
        "model": {"weight": torch.randn(numel, generator=generator)},
        "optim": {"state": {0: {"exp_avg": torch.randn(numel // 4, generator=generator)}}, "lr": 3e-4},
        "step": step,
    }


def digest(state: Any) -> str:
    header, payload = snapshot.snapshot(state)
    return hashlib.sha256(header + payload.tobytes()).hexdigest()[:16]


@ray.remote(num_cpus=1, max_retries=0)
def train_rank(job: str, rank: int, world: int, steps: int, numel: int, config: dict[str, Any]) -> dict[str, Any]:
    blocking = []
    with Checkpointer(job=job, rank=rank, world_size=world, config=ray_ckpt.CheckpointConfig(**config)) as ckpt:
        for step in range(steps):
            state = make_state(rank, step, numel)
            handle = ckpt.save(step, state)
            blocking.append(ckpt.last_save_phases_s["blocking"])
        handle.wait(timeout_s=120)
    return {"node_id": ray.get_runtime_context().get_node_id(), "blocking_s": blocking}


@ray.remote(num_cpus=1, max_retries=0)
def restore_rank(job: str, rank: int, world: int, config: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    with Checkpointer(job=job, rank=rank, world_size=world, config=ray_ckpt.CheckpointConfig(**config)) as ckpt:
        restored = ckpt.restore()
    if restored is None:
        raise RuntimeError(f"rank {rank}: nothing to restore")
    return {
        "rank": rank,
        "step": restored.step,
        "source": restored.source,
        "phases_s": restored.phases_s,
        "total_s": time.perf_counter() - start,
        "digest": digest(restored.state),
        "node_id": ray.get_runtime_context().get_node_id(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=7, help="simulated worker nodes (default 7)")
    parser.add_argument("--ranks", type=int, default=4, help="training ranks (default 4)")
    parser.add_argument("--state-mib", type=int, default=16, help="state size per rank in MiB (default 16)")
    parser.add_argument("--steps", type=int, default=5, help="checkpointed steps before the failure")
    parser.add_argument("--json", type=pathlib.Path, help="write the report as JSON here")
    args = parser.parse_args(argv)
    config = {"data_shards": 4, "parity_shards": 2}
    if args.nodes < args.ranks or args.nodes < 6:
        parser.error("need --nodes >= max(--ranks, k+m=6)")
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rckdemo"))
    numel = (args.state_mib << 20) // 5  # float32 weight + exp_avg of a quarter: 5 bytes per element
    print(f"starting a simulated cluster: head + {args.nodes} nodes ...", flush=True)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "_system_config": {
                "health_check_initial_delay_ms": 0,
                "health_check_period_ms": 300,
                "health_check_timeout_ms": 600,
                "health_check_failure_threshold": 3,
            },
        },
    )
    workers = [cluster.add_node(num_cpus=1) for _ in range(args.nodes)]
    cluster.wait_for_nodes()
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        service.start(store_budget_bytes=2 << 30)
        job = "demo"
        print(
            f"{args.ranks} ranks save {args.steps} steps of {args.state_mib} MiB each, RS(4,2) ...",
            flush=True,
        )
        saved = ray.get(
            [
                train_rank.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(workers[r].node_id, soft=False)
                ).remote(job, r, args.ranks, args.steps, numel, config)
                for r in range(args.ranks)
            ]
        )
        latest = ray.get(naming.registry_handle(ray_ckpt.settings.namespace()).latest_committed.remote(job))
        located = ray.get(naming.registry_handle(ray_ckpt.settings.namespace()).locate.remote(job, latest))
        # kill rank 0's node and a worker node holding one of rank 1's data shards: two at once
        worker_ids = {w.node_id for w in workers}
        victims = {saved[0]["node_id"]}
        for index in sorted(located[1]["nodes"], key=int):
            node_id = located[1]["nodes"][index]
            if node_id in worker_ids and node_id not in victims:
                victims.add(node_id)
                break
        print(
            f"latest committed step: {latest}; hard-killing nodes {sorted(v[:8] for v in victims)} ...",
            flush=True,
        )
        killed_at = time.perf_counter()
        for node in [w for w in workers if w.node_id in victims]:
            cluster.remove_node(node, allow_graceful=False)
        while {str(n["NodeID"]) for n in naming.alive_nodes()} & victims:
            time.sleep(0.1)
        detected_s = time.perf_counter() - killed_at
        results = ray.get([restore_rank.remote(job, r, args.ranks, config) for r in range(args.ranks)])
        resumed_s = time.perf_counter() - killed_at
        expected = [digest(make_state(r, latest, numel)) for r in range(args.ranks)]
        bit_exact = [res["digest"] == exp for res, exp in zip(results, expected)]
        print(
            f"\nnode death detected by Ray after {detected_s:.2f} s; "
            f"all ranks restored {resumed_s:.2f} s after the kill"
        )
        print(
            f"{'rank':>4} {'step':>4} {'source':>6} {'locate':>7} {'fetch':>7} {'decode':>7} {'load':>7} "
            f"{'bit-exact':>9}"
        )
        for res, ok in zip(results, bit_exact):
            p = res["phases_s"]
            print(
                f"{res['rank']:>4} {res['step']:>4} {res['source']:>6} {p['locate']:>7.3f} {p['fetch']:>7.3f} "
                f"{p['decode']:>7.3f} {p['load']:>7.3f} {ok!s:>9}"
            )
        stall = [s for r in saved for s in r["blocking_s"][1:]]
        print(
            f"\nsave stall per checkpoint (median over ranks and steps): {sorted(stall)[len(stall) // 2] * 1e3:.1f} ms"
        )
        report = {
            "detected_s": detected_s,
            "time_to_resume_s": resumed_s,
            "restores": results,
            "bit_exact": all(bit_exact),
        }
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2))
        print("every rank bit-exact" if all(bit_exact) else "MISMATCH: a restored state differs")
        return 0 if all(bit_exact) else 1
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
