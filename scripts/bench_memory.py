"""Peer memory per committed step, measured from the stores: Reed-Solomon vs replication.

On one simulated Ray cluster (``ray.cluster_utils.Cluster``: a head with no CPUs plus 10
worker nodes, all on this machine, dashboard off, a private RAY_TMPDIR), with a store on every
node, one rank (an actor pinned to worker node 0, the same for every code) saves a fixed state
``{"w": <uint8 tensor>}`` (64 MiB; ``--quick``: 4 MiB) as steps 0 and 1 of a job of the code,
with ``CheckpointConfig(data_shards=k, parity_shards=m, keep_committed=1, local_copy=False)``,
and waits for each commit. Once step 0 is evicted (every store reports k+m shards in all), the
bytes used by all stores (``ray_ckpt.service.status()``: per node ``used_bytes``, shard data
plus metadata) are the peer memory of one committed step. Then the job is forgotten and the
next code runs.

Codes: RS(2,1), RS(4,2), RS(6,3), RS(8,2), and replication tolerating the same number of node
failures, m+1 full copies, measured as RS(1, m) (k=1: every shard is the whole payload):
RS(1,1), RS(1,2), RS(1,3). The expected multiple is (k+m)/k of the payload (the state plus a
small header, padded to k equal shards).

JSON: ``{"benchmark": "memory", "state_bytes", "rows": [{"scheme", "data_shards",
"parity_shards", "tolerates", "state_bytes", "payload_bytes", "peer_bytes", "multiple",
"expected_multiple", "per_node_bytes"}]}``.
"""

from __future__ import annotations

import pathlib
import sys
import time
import uuid
from typing import Any

from benchutil import (
    MIB,
    BenchError,
    add_json_flag,
    add_plots_flag,
    draw_plot,
    make_parser,
    on_node,
    on_private_ray,
    pyplot,
    render_rows,
    save_figure,
    write_json,
)

WORKERS = 10  # RS(8,2): 10 shards on distinct nodes other than the rank's (the head has a store too)
CODES = ((2, 1), (4, 2), (6, 3), (8, 2))


def codes() -> list[tuple[str, int, int]]:
    """(scheme, k, m): the RS codes, then replication (k=1) for each distinct m, in order."""
    result = [("rs", k, m) for k, m in CODES]
    for m in sorted({m for _, m in CODES}):
        result.append(("replication", 1, m))
    return result


def _usage(namespace: str) -> tuple[int, int, dict[str, int]]:
    """(used bytes over all stores, shards over all stores, used bytes per node)."""
    from ray_ckpt import service

    nodes = service.status(namespace=namespace)["nodes"]
    errors = {n: s["error"] for n, s in nodes.items() if "error" in s}
    if errors:
        raise BenchError(f"unreachable stores: {errors}")
    per_node = {n: int(s["used_bytes"]) for n, s in nodes.items()}
    return sum(per_node.values()), sum(int(s["shards"]) for s in nodes.values()), per_node


def _settle(namespace: str, shards: int, timeout_s: float = 30.0) -> tuple[int, dict[str, int]]:
    """Wait until the stores hold exactly ``shards`` shards in all (evictions are asynchronous)."""
    deadline = time.monotonic() + timeout_s
    while True:
        used, held, per_node = _usage(namespace)
        if held == shards:
            return used, per_node
        if time.monotonic() > deadline:
            raise BenchError(f"the stores hold {held} shards after {timeout_s:.0f}s, expected {shards}")
        time.sleep(0.1)


def rank_actor() -> Any:
    """The rank of every code: ``BenchRank`` as a Ray actor (no CPU, never restarted) whose
    ``connect`` (a new job) saves from step 0 again."""
    import ray

    from ray_ckpt.testing import BenchRank

    class MemoryRank(BenchRank):
        def connect(self, *args: Any, **kwargs: Any) -> None:
            super().connect(*args, **kwargs)
            self.step = 0

    return ray.remote(num_cpus=0, max_restarts=0)(MemoryRank)


def run(size: int) -> list[dict[str, Any]]:
    import ray

    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.transport import naming

    Rank = rank_actor()
    rows = []
    namespace = f"benchmem-{uuid.uuid4().hex[:8]}"
    # a store may hold one shard of each of two steps (before the older one is evicted)
    store_budget = 2 * size + 16 * MIB
    with SimulatedCluster(
        WORKERS,
        namespace=namespace,
        start_service=False,
        worker_cpus=0,
        head_object_store_bytes=4 * size + 96 * MIB,
        worker_object_store_bytes=5 * size + 96 * MIB,
        fast_failure_detection=False,
    ) as sim:
        # the rank starts (imports, builds its state) while the stores start
        rank = Rank.options(scheduling_strategy=on_node(sim.node_id(0))).remote(size)
        sim.start_service(store_budget)
        registry = naming.registry_handle(namespace)
        for scheme, k, m in codes():
            job = f"mem-k{k}m{m}"
            config = {"data_shards": k, "parity_shards": m, "keep_committed": 1, "local_copy": False}
            ray.get(rank.connect.remote(namespace, job, 0, 1, config))
            for _ in (0, 1):
                ray.get(rank.save.remote())
            ray.get(rank.close.remote())
            used, per_node = _settle(namespace, k + m)
            located = ray.get(registry.locate.remote(job, 1))
            meta = next(iter(located[0]["metas"].values()))
            payload = int(meta["payload_size"])
            rows.append(
                {
                    "scheme": scheme,
                    "data_shards": k,
                    "parity_shards": m,
                    "tolerates": m,
                    "state_bytes": size,
                    "payload_bytes": payload,
                    "peer_bytes": used,
                    "multiple": used / size,
                    "expected_multiple": (k + m) / k,
                    "per_node_bytes": sorted((b for b in per_node.values() if b), reverse=True),
                }
            )
            name = "replication" if scheme == "replication" else f"RS({k},{m})"
            print(f"{name}: {used} bytes in {k + m} shards = {used / size:.3f}x the state", flush=True)
            ray.get(registry.forget.remote(job))
            _settle(namespace, 0)
        ray.kill(rank, no_restart=True)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    replication = {r["parity_shards"]: r for r in rows if r["scheme"] == "replication"}

    def cells(r: dict[str, Any]) -> tuple[str, ...]:
        k, m = r["data_shards"], r["parity_shards"]
        name = f"RS({k},{m})" if r["scheme"] == "rs" else f"{m + 1} copies (RS(1,{m}))"
        rep = replication.get(m)
        return (
            name,
            str(m),
            f"{r['state_bytes'] / MIB:.0f}",
            f"{r['peer_bytes'] / MIB:.2f}",
            f"{r['multiple']:.3f}x",
            f"{r['expected_multiple']:.3f}x",
            f"{rep['peer_bytes'] / MIB:.2f}" if rep and r["scheme"] == "rs" else "",
            f"{rep['peer_bytes'] / r['peer_bytes']:.2f}x" if rep and r["scheme"] == "rs" else "",
        )

    header = (
        "code",
        "tolerates",
        "state MiB",
        "peer MiB",
        "multiple",
        "expected",
        "replication (m+1 copies) MiB",
        "replication / code",
    )
    return render_rows(header, rows, cells)


def plot(rows: list[dict[str, Any]], path: pathlib.Path) -> None:
    plt = pyplot()

    replication = {r["parity_shards"]: r for r in rows if r["scheme"] == "replication"}
    coded = [r for r in rows if r["scheme"] == "rs"]
    labels = [f"RS({r['data_shards']},{r['parity_shards']})\n(any {r['parity_shards']} fail)" for r in coded]
    x = range(len(coded))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    ax.bar([i - width / 2 for i in x], [r["multiple"] for r in coded], width, label="erasure code (measured)")
    ax.bar(
        [i + width / 2 for i in x],
        [replication[r["parity_shards"]]["multiple"] for r in coded],
        width,
        label="replication, m+1 copies (measured)",
    )
    for i, r in zip(x, coded):
        ax.text(i - width / 2, r["multiple"], f"{r['multiple']:.2f}x", ha="center", va="bottom", fontsize=8)
        rep = replication[r["parity_shards"]]["multiple"]
        ax.text(i + width / 2, rep, f"{rep:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), labels, fontsize=8)
    ax.set_ylabel("peer memory per committed step / state")
    ax.set_title(f"Peer memory per step ({coded[0]['state_bytes'] / MIB:.0f} MiB state, keep_committed=1)")
    ax.legend(fontsize=8)
    ax.set_ylim(0, max(r["multiple"] for r in rows) * 1.15)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, "See the module docstring for what is measured.")
    parser.add_argument("--state-mib", type=int, default=64, help="state size in MiB (default 64)")
    parser.add_argument("--quick", action="store_true", help="4 MiB state, no plot (for tests)")
    add_json_flag(parser)
    add_plots_flag(parser)
    args = parser.parse_args(argv)
    if args.state_mib < 1:
        parser.error("--state-mib must be >= 1")
    size = (4 if args.quick else args.state_mib) * MIB
    print(
        f"1 head + {WORKERS} worker nodes (0 CPUs each) on one machine; state {size // MIB} MiB; "
        "keep_committed=1, no local copy"
    )
    rows = on_private_ray("rckm", lambda: run(size))
    if rows is None:
        return 1
    print(format_table(rows))
    print("multiple = bytes used by all stores for one committed step / state bytes (metadata included)")
    write_json(args.json, {"benchmark": "memory", "state_bytes": size, "rows": rows})
    if not args.quick:
        draw_plot(args.plots, "bench_memory.png", lambda path: plot(rows, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
