"""How quick the ray_ckpt tools are: ``ray_ckpt.start()`` and ``ray-ckpt kill-node``.

    python scripts/bench_tools.py                 # head (0 CPUs) + 5 one-CPU nodes, 2 kills
    python scripts/bench_tools.py --json artifacts/bench_tools.json
    python scripts/bench_tools.py --help

On a simulated cluster (``ray.cluster_utils.Cluster``: a head with no CPUs plus ``--nodes``
one-CPU nodes, fast failure detection) it measures:

- imports: seconds to import what each process loads, each in a fresh interpreter (the
  command line, a store actor's modules, the node crasher, the codec), and whether torch or
  ray.train came with it;
- ``start``: ``ray_ckpt.start()`` deploying a store on every node (cold: new worker processes)
  and the registry, then once more (warm: everything exists);
- ``kill-node``: ``ray-ckpt kill-node --node ID --wait-dead 0 --json`` run as its own process;
  latency = the kill time the victim reports (its SIGKILLs) minus the moment the command was
  started, plus the command's total wall time and how many lines it printed besides its JSON;
- where a kill's time goes: connecting a new driver (``ray.init``), and arming a victim
  (``ray_ckpt.tools.chaos``), each measured alone: from the killing process when the victim's raylet
  runs on its host (as on this simulated cluster), and with a NodeCrasher actor started on the
  victim (what a kill from another host takes on a real cluster).

Ray's own logs stay in the cluster's session folder (printed at the end).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from benchutil import add_json_flag, make_parser, write_json

# what each kind of process imports; heavy modules are reported when they come along
IMPORTS = {
    "cli": "import ray_ckpt.tools.cli",
    "store_actor": "import ray_ckpt.actors.store_actor",
    "node_crasher": "import ray_ckpt.actors.node_crasher",
    "codec": "import ray_ckpt.core.codec",
}
HEAVY = ("torch", "ray.train", "torch.distributed", "pandas")


def time_import(statement: str) -> dict[str, Any]:
    """Seconds for ``statement`` in a fresh interpreter (median of 3), and the heavy modules it loaded."""
    probe = (
        "import sys, time\n"
        "t = time.perf_counter()\n"
        f"{statement}\n"
        "took = time.perf_counter() - t\n"
        f"print(took, ','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    runs = []
    heavy = ""
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            return {"seconds": None, "heavy": [], "error": out.stderr.strip().splitlines()[-1:]}
        took, _, heavy = out.stdout.strip().partition(" ")
        runs.append(float(took))
    return {"seconds": statistics.median(runs), "heavy": [m for m in heavy.split(",") if m]}


def time_kill(address: str, namespace: str, node_id: str) -> dict[str, Any]:
    """Run ``ray-ckpt kill-node`` on ``node_id`` as its own process; latency from its start."""
    command = [sys.executable, "-m", "ray_ckpt.tools.cli", "kill-node", "--node", node_id]
    command += ["--address", address, "--namespace", namespace, "--wait-dead", "0", "--json"]
    invoked = time.time()
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    wall = time.time() - invoked
    if done.returncode != 0:
        raise RuntimeError(f"kill-node failed ({done.returncode}): {done.stderr.strip()}")
    start = done.stdout.index("[")
    results = json.loads(done.stdout[start:])
    noise = done.stdout[:start].strip().splitlines() + done.stderr.strip().splitlines()
    return {
        "node_id": node_id,
        "latency_s": results[0]["kill_time"] - invoked,
        "wall_s": wall,
        "other_output_lines": len(noise),
        "other_output": noise[:5],
    }


def time_connect(address: str) -> float:
    """Seconds for ``ray.init(address=...)`` in a fresh interpreter that has imported ray already."""
    probe = (
        "import time, ray\n"
        "t = time.perf_counter()\n"
        f"ray.init(address={address!r}, log_to_driver=False, logging_level='ERROR')\n"
        "print(time.perf_counter() - t)\n"
        "ray.shutdown()\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def time_arm(node_id: str, local: bool) -> float:
    """Seconds to make ``node_id`` ready to be killed (nothing is killed)."""
    from ray_ckpt.tools.faults import NodeCrash

    fault = NodeCrash(local=local)
    started = time.perf_counter()
    armed = fault.arm([node_id], namespace="")
    took = time.perf_counter() - started
    fault.disarm(armed.values())
    return took


def run(nodes: int, kills: int) -> dict[str, Any]:
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rcktools"))
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    report: dict[str, Any] = {"nodes": nodes + 1, "imports": {k: time_import(v) for k, v in IMPORTS.items()}}

    import ray_ckpt
    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.tools import quiet

    sim = SimulatedCluster(
        nodes,
        start_service=False,  # timed below
        head_object_store_bytes=100 << 20,
        worker_object_store_bytes=80 << 20,
        logging_level="ERROR",
    )
    cluster, workers = sim.cluster, sim.workers
    try:
        quiet.quiet_driver()
        namespace = f"tools-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        info = ray_ckpt.start(store_budget_bytes=64 << 20, namespace=namespace)
        cold = time.perf_counter() - started
        started = time.perf_counter()
        ray_ckpt.start(store_budget_bytes=64 << 20, namespace=namespace)
        warm = time.perf_counter() - started
        report["start"] = {"cold_s": cold, "warm_s": warm, "stores": len(info["stores"])}
        spare = str(workers[-1].node_id)
        report["kill_phases"] = {
            "connect_s": time_connect(cluster.address),
            "arm_local_s": time_arm(spare, local=True),
            "arm_crasher_actor_s": time_arm(spare, local=False),
        }
        report["kills"] = [time_kill(cluster.address, namespace, str(w.node_id)) for w in workers[:kills]]
        latencies = [k["latency_s"] for k in report["kills"]]
        report["kill_latency_median_s"] = statistics.median(latencies)
        report["ray_logs"] = quiet.logs_dir()
    finally:
        sim.shutdown()
    return report


def print_report(report: dict[str, Any]) -> None:
    print("imports (fresh interpreter, median of 3):")
    for name, found in report["imports"].items():
        seconds = "failed" if found["seconds"] is None else f"{found['seconds']:.2f} s"
        heavy = f"  (loads {', '.join(found['heavy'])})" if found["heavy"] else ""
        print(f"  {name:<13} {seconds}{heavy}")
    start = report["start"]
    print(f"start() on {start['stores']} nodes: {start['cold_s']:.2f} s cold, {start['warm_s']:.2f} s again")
    phases = report["kill_phases"]
    print(
        f"a kill's parts: import the command line {report['imports']['cli']['seconds'] or 0:.2f} s, "
        f"connect {phases['connect_s']:.2f} s, arm the victim {phases['arm_local_s']:.2f} s "
        f"(with a crasher actor, as from another host: {phases['arm_crasher_actor_s']:.2f} s)"
    )
    for kill in report["kills"]:
        print(
            f"kill-node {kill['node_id'][:12]}: killed {kill['latency_s']:.2f} s after invocation "
            f"(command took {kill['wall_s']:.2f} s, {kill['other_output_lines']} other output line(s))"
        )
    print(f"Ray's own logs: {report['ray_logs']}")


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__)
    parser.add_argument("--nodes", type=int, default=5, help="one-CPU nodes besides the head (default 5)")
    parser.add_argument("--kills", type=int, default=2, help="kill-node runs, one node each (default 2)")
    add_json_flag(parser, "the report")
    args = parser.parse_args(argv)
    if not 1 <= args.kills < args.nodes:
        parser.error("--kills must be at least 1 and less than --nodes (one node is kept for timing a crasher)")
    report = run(args.nodes, args.kills)
    print_report(report)
    write_json(args.json, report, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
