"""Restore all ranks after node failures, next to a raw Ray transfer, Ray Train's storage restore
and torch.distributed.checkpoint, in one run.

For each per-rank state size (default 256 MiB and 1 GiB; ``--quick``: 8 MiB), on a fresh
simulated cluster (``ray.cluster_utils.Cluster``: a head with no CPUs plus 7 one-CPU worker
nodes, all on this machine, fast failure detection, dashboard off, a private RAY_TMPDIR):

1. ``ray_ckpt.service.start`` deploys a store on every node (8 stores).
2. Two ranks (actors pinned to worker nodes 0 and 1, world size 2) save
   ``{"w": <random uint8 tensor of the size>}`` as step 0 with ``CheckpointConfig(data_shards=4,
   parity_shards=2, keep_committed=1, local_copy=False)``, one after the other (to halve the
   memory peak), and the step commits. No local copy: every restore below goes over the
   "network", as for a rank whose node died.
3. The nodes to kill: worker nodes holding *data* shards (the worst case: a lost data shard is
   rebuilt from parity), preferring nodes that hold data shards of both ranks; never a rank's
   node, never the head.
4. One such node is hard-killed (``remove_node(allow_graceful=False)``); once Ray declares it
   dead, two fresh rank processes (new actors on the same nodes, Checkpointer constructed)
   restore at the same time. ``seconds`` is the slowest rank's ``restore()`` wall time. Each
   restored tensor's XXH3 checksum must equal the saved one (else exit status 1). Then a
   second node is killed (m=2 in all) and the restore is repeated with fresh processes.
5. Raw Ray transfer of the same bytes: on two surviving worker nodes, actors hold an array of
   the per-rank size in their memory (as a store holds a shard); actors on the two rank nodes
   ``ray.get`` them through a method call at the same time (Ray serializes each array into its
   holder's object store and pulls it across; timed inside each receiver, slowest reported),
   twice with new arrays; the second (warm) time is reported as ``raw_ray_transfer``. One more
   to rank 0's node alone: ``raw_ray_transfer_single``.
6. Ray Train's own restore: a ``TorchTrainer`` with 2 workers, ``RunConfig(storage_path=<local
   folder>)``. Attempt 1: each worker ``torch.save``s a state of the size and reports it with
   ``ray.train.report(checkpoint=...)``, then raises; Ray Train restarts the worker group
   (``FailureConfig(max_failures=1)``). Attempt 2, timed inside the loop on each worker:
   ``ray.train.get_checkpoint()`` + ``as_directory()`` + ``torch.load``; slowest worker reported
   as ``ray_train_storage``.
7. ``torch.distributed.checkpoint``: after the cluster is gone, the driver (gloo process group of
   world size 1) ``dcp.save``s the state to a local folder and times ``dcp.load`` into a
   preallocated state dict: ``dcp_load``.

JSON: ``{"benchmark": "recovery", "rows": [{"size_bytes", "killed", "impl", "seconds"}],
"ratios": [{"size_bytes", "killed", "vs_raw", "vs_ray_train_storage", "vs_dcp"}], "skipped",
"details"}``. A size that would not fit in the free memory (about 9x the per-rank state plus
2 GiB) is skipped, and one that fails for another reason than a wrong restore (e.g. Ray's memory
monitor killed a worker) is reported in ``skipped`` while the other sizes still run.
Rows of the baselines have ``killed`` 0 (no failure is involved in them). Every ratio is
(the other's seconds) / (ray_ckpt's seconds): above 1, ray_ckpt is faster; ``vs_raw`` >= 0.7
means the restore runs at >= 70% of the raw transfer speed. The file-based baselines read a
local disk through the page cache (the files were just written), the ray_ckpt restore pulls
from other Ray nodes: all of it shares this machine's cores and memory bandwidth.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

from benchutil import (
    MIB,
    BenchError,
    add_json_flag,
    add_plots_flag,
    add_sizes_flag,
    draw_plot,
    kill,
    make_parser,
    on_node,
    on_private_ray,
    pyplot,
    render_table,
    restore_cluster,
    save_figure,
    transfer_actors,
    write_json,
)

WORKERS = 7
RANKS = 2
CODE = {"data_shards": 4, "parity_shards": 2}
JOB = "bench-recovery"
CONFIG = {**CODE, "keep_committed": 1, "local_copy": False}
SAVERS = "savers"  # the attempt of the ranks that save step 0 without restoring first
LABELS = {
    "raw_ray_transfer": "raw transfer\n2 ranks at once",
    "raw_ray_transfer_single": "raw transfer\n1 rank alone",
    "ray_train_storage": "Ray Train\nstorage restore",
    "dcp_load": "DCP load\n(local disk)",
}
IMPLS = ("ray_ckpt", "raw_ray_transfer", "raw_ray_transfer_single", "ray_train_storage", "dcp_load")
# Peak memory of one size, as a multiple of the per-rank state: while the two ranks restore,
# each holds its 4 fetched shards in the object stores of the holders' and its own node plus
# its host buffer (3x each), next to the surviving shards (~1.5x); ~2 GiB for the Ray processes.
PEAK_MULTIPLE = 9
RAY_OVERHEAD = 2 << 30


def ray_train_loop(config: dict[str, Any]) -> None:
    """Attempt 1 saves a checkpoint and fails; the first attempt given it times loading it (inside the loop)."""
    import ray.train
    import torch

    from ray_ckpt.core.checksum import checksum
    from ray_ckpt.testing import byte_state

    started = time.perf_counter()
    checkpoint = ray.train.get_checkpoint()
    rank = ray.train.get_context().get_world_rank()
    out = pathlib.Path(config["out_dir"])
    if checkpoint is None:
        tensor = byte_state(config["size"], 1000 + rank)["w"]
        (out / f"expected-{rank}.json").write_text(json.dumps({"checksum": checksum(tensor)}))
        with tempfile.TemporaryDirectory(dir=config["scratch"]) as folder:
            began = time.perf_counter()
            torch.save({"w": tensor}, pathlib.Path(folder) / f"rank-{rank}.pt")
            ray.train.report({"step": 0}, checkpoint=ray.train.Checkpoint.from_directory(folder))
            save_s = time.perf_counter() - began
        (out / f"save-{rank}.json").write_text(json.dumps({"save_s": save_s}))
        raise RuntimeError("bench_recovery: injected failure after the checkpoint")
    with checkpoint.as_directory() as folder:
        state = torch.load(pathlib.Path(folder) / f"rank-{rank}.pt", weights_only=True)
    elapsed = time.perf_counter() - started
    tensor = state["w"]
    result = {"seconds": elapsed, "checksum": checksum(tensor), "size": int(tensor.numel())}
    (out / f"load-{rank}.json").write_text(json.dumps(result))


def choose_victims(located: dict[int, dict[str, Any]], spare: set[str], count: int) -> list[str]:
    """``count`` nodes from ``spare`` holding data shards, those holding data shards of the most
    ranks first (ties: more data shards, then node id)."""
    ranks_held: dict[str, set[int]] = {}
    shards_held: dict[str, int] = {}
    for rank, record in located.items():
        k = next(iter(record["metas"].values()))["data_shards"]
        for index, node in record["nodes"].items():
            if int(index) < k and node in spare:
                ranks_held.setdefault(node, set()).add(int(rank))
                shards_held[node] = shards_held.get(node, 0) + 1
    ordered = sorted(ranks_held, key=lambda n: (-len(ranks_held[n]), -shards_held[n], n))
    if len(ordered) < count:
        raise BenchError(f"fewer than {count} killable data-shard holders: {located}")
    return ordered[:count]


def _restore_all(Rank: Any, namespace: str, rank_nodes: list[str], expected: list[int], size: int) -> dict[str, Any]:
    import ray

    ranks = [Rank.options(scheduling_strategy=on_node(node)).remote() for node in rank_nodes]
    # fresh processes, Checkpointer constructed
    ray.get([r.connect.remote(namespace, JOB, rank, RANKS, CONFIG) for rank, r in enumerate(ranks)])
    began = time.perf_counter()
    results = ray.get([r.restore.remote() for r in ranks])
    wall = time.perf_counter() - began
    for r in ranks:
        ray.kill(r, no_restart=True)
    for rank, result in enumerate(results):
        if result["step"] is None:
            raise BenchError("restore() found no committed step")
        if result["size"] != size or result["checksum"] != expected[rank]:
            raise BenchError(f"rank {rank}: restored state differs from the saved one ({result})")
    return {
        "seconds": max(r["seconds"] for r in results),
        "wall_s": wall,
        "per_rank_s": [r["seconds"] for r in results],
        "phases_s": [r["phases_s"] for r in results],
        "sources": [r["source"] for r in results],
    }


def _raw_transfers(Holder: Any, Receiver: Any, holder_nodes: list[str], rank_nodes: list[str], size: int) -> Any:
    import ray

    holders = [Holder.options(scheduling_strategy=on_node(n)).remote() for n in holder_nodes]
    receivers = [Receiver.options(scheduling_strategy=on_node(n)).remote() for n in rank_nodes]

    def pull(pairs: list[int], seed: int) -> float:
        ray.get([holders[i].make.remote(size, seed + i) for i in pairs])
        timings = ray.get([receivers[i].fetch.remote(holders[i], seed + i) for i in pairs])
        if any(received != size for _, received in timings):
            raise BenchError(f"raw transfer moved {timings}, expected {size} bytes each")
        return max(seconds for seconds, _ in timings)

    both = list(range(len(rank_nodes)))
    cold = pull(both, 1)
    warm = pull(both, 11)
    single = pull([0], 21)
    for actor in holders + receivers:
        ray.kill(actor, no_restart=True)
    return {"parallel_cold_s": cold, "parallel_warm_s": warm, "single_warm_s": single}


def _ray_train_restore(size: int, scratch: str) -> dict[str, Any]:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out_dir = tempfile.mkdtemp(prefix="rt-out", dir=scratch)
    storage = tempfile.mkdtemp(prefix="rt-storage", dir=scratch)
    began = time.perf_counter()
    TorchTrainer(
        ray_train_loop,
        train_loop_config={"size": size, "out_dir": out_dir, "scratch": scratch},
        scaling_config=ScalingConfig(num_workers=RANKS),
        run_config=RunConfig(
            name=f"bench-recovery-{uuid.uuid4().hex[:6]}",
            storage_path=storage,
            # a checkpoint reported just before a worker's error can be lost on a loaded machine
            # (its report and the error reach the controller in one poll): that attempt has no
            # checkpoint and fails again, so a few attempts are allowed; the first that loads is timed
            failure_config=FailureConfig(max_failures=4),
        ),
    ).fit()
    total = time.perf_counter() - began
    out = pathlib.Path(out_dir)
    loads, saves = [], []
    for rank in range(RANKS):
        expected = json.loads((out / f"expected-{rank}.json").read_text())["checksum"]
        load = json.loads((out / f"load-{rank}.json").read_text())
        if load["size"] != size or load["checksum"] != expected:
            raise BenchError(f"Ray Train rank {rank}: loaded state differs from the saved one")
        loads.append(load["seconds"])
        saves.append(json.loads((out / f"save-{rank}.json").read_text())["save_s"])
    shutil.rmtree(storage, ignore_errors=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"seconds": max(loads), "per_rank_s": loads, "save_s": max(saves), "fit_s": total}


def _dcp_load(size: int, scratch: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from ray_ckpt.testing import byte_state

    folder = pathlib.Path(tempfile.mkdtemp(prefix="dcp", dir=scratch))
    dist.init_process_group("gloo", init_method=f"file://{folder / 'pg'}", rank=0, world_size=1)
    try:
        state = byte_state(size, 2000)
        began = time.perf_counter()
        dcp.save(state, checkpoint_id=str(folder / "ckpt"))
        save_s = time.perf_counter() - began
        target = {"w": torch.empty_like(state["w"])}
        began = time.perf_counter()
        dcp.load(target, checkpoint_id=str(folder / "ckpt"))
        load_s = time.perf_counter() - began
        if not torch.equal(target["w"], state["w"]):
            raise BenchError("DCP: loaded state differs from the saved one")
    finally:
        dist.destroy_process_group()
        shutil.rmtree(folder, ignore_errors=True)
    return {"seconds": load_s, "save_s": save_s}


def bench_size(size: int, scratch: str) -> dict[str, Any]:
    """One fresh cluster: save, kill 1 then 2 data-shard holders, restore after each; raw
    transfers; Ray Train's storage restore. Then DCP in this process."""
    import ray

    from ray_ckpt.testing import rank_actor
    from ray_ckpt.transport import naming

    Rank = rank_actor()
    Holder, Receiver = transfer_actors()
    details: dict[str, Any] = {"size_bytes": size}
    namespace = f"benchrec-{uuid.uuid4().hex[:8]}"
    with restore_cluster(WORKERS, size, namespace) as sim:
        workers = list(sim.workers)
        registry = naming.registry_handle(namespace)
        rank_nodes = [sim.node_id(rank) for rank in range(RANKS)]

        expected = []
        saves = []
        for rank, node in enumerate(rank_nodes):
            saver = Rank.options(scheduling_strategy=on_node(node)).remote(size, seed=rank)
            ray.get(saver.connect.remote(namespace, JOB, rank, RANKS, CONFIG, SAVERS))
            expected.append(ray.get(saver.checksum.remote()))
            saves.append(ray.get(saver.save.remote("staged")))
            ray.get(saver.close.remote())  # frees the host buffer before the other rank saves
            ray.kill(saver, no_restart=True)
        if not ray.get(registry.wait_committed.remote(JOB, 0, 120.0)):
            raise BenchError("step 0 did not commit")
        details["save_staged_s"] = [s["seconds"] for s in saves]

        located = {int(r): v for r, v in ray.get(registry.locate.remote(JOB, 0)).items()}
        spare = {str(w.node_id) for w in workers} - set(rank_nodes)
        victims = choose_victims(located, spare, CODE["parity_shards"])
        details["shards"] = {r: {int(i): n[:8] for i, n in v["nodes"].items()} for r, v in located.items()}
        restores = []
        for killed, victim in enumerate(victims, 1):
            detect = kill(sim, [victim])
            result = _restore_all(Rank, namespace, rank_nodes, expected, size)
            result.update(killed=killed, victim=victim[:8], detect_s=detect)
            restores.append(result)
            print(
                f"  {size // MIB} MiB: killed {killed} (node {victim[:8]}, dead after {detect:.1f}s): all ranks "
                f"restored bit-exact in {result['seconds']:.3f}s (per rank {result['per_rank_s']})",
                flush=True,
            )
        details["restores"] = restores
        ray.get(registry.forget.remote(JOB))  # frees the stores' memory for the baselines

        survivors = [str(w.node_id) for w in workers if str(w.node_id) not in victims]
        holder_nodes = [n for n in survivors if n not in rank_nodes][:RANKS]
        raw = _raw_transfers(Holder, Receiver, holder_nodes, rank_nodes, size)
        details["raw"] = raw
        print(f"  {size // MIB} MiB: raw Ray transfer {raw}", flush=True)

        details["ray_train"] = _ray_train_restore(size, scratch)
        print(f"  {size // MIB} MiB: Ray Train storage restore {details['ray_train']}", flush=True)
    details["dcp"] = _dcp_load(size, scratch)
    print(f"  {size // MIB} MiB: DCP {details['dcp']}", flush=True)
    return details


def rows_and_ratios(results: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    ratios: list[dict[str, Any]] = []
    for d in results:
        size = d["size_bytes"]
        baselines = {
            "raw_ray_transfer": d["raw"]["parallel_warm_s"],
            "raw_ray_transfer_single": d["raw"]["single_warm_s"],
            "ray_train_storage": d["ray_train"]["seconds"],
            "dcp_load": d["dcp"]["seconds"],
        }
        for restore in d["restores"]:
            rows.append(
                {"size_bytes": size, "killed": restore["killed"], "impl": "ray_ckpt", "seconds": restore["seconds"]}
            )
        for impl, seconds in baselines.items():
            rows.append({"size_bytes": size, "killed": 0, "impl": impl, "seconds": seconds})
        for restore in d["restores"]:
            ours = restore["seconds"]
            ratios.append(
                {
                    "size_bytes": size,
                    "killed": restore["killed"],
                    "vs_raw": baselines["raw_ray_transfer"] / ours,
                    "vs_ray_train_storage": baselines["ray_train_storage"] / ours,
                    "vs_dcp": baselines["dcp_load"] / ours,
                }
            )
    return rows, ratios


def _table(header: tuple[str, ...], lines: list[tuple[str, ...]]) -> str:
    everything = [header, *lines]
    return render_table(everything)


def format_tables(rows: list[dict[str, Any]], ratios: list[dict[str, Any]]) -> str:
    times = _table(
        ("size MiB", "impl", "killed", "seconds", "GB/s per rank"),
        [
            (
                f"{r['size_bytes'] / MIB:.0f}",
                r["impl"],
                str(r["killed"]),
                f"{r['seconds']:.3f}",
                f"{r['size_bytes'] / r['seconds'] / 1e9:.2f}",
            )
            for r in rows
        ],
    )
    factors = _table(
        ("size MiB", "killed", "raw / restore (goal >= 0.7)", "Ray Train storage / restore", "DCP load / restore"),
        [
            (
                f"{r['size_bytes'] / MIB:.0f}",
                str(r["killed"]),
                f"{r['vs_raw']:.2f}",
                f"{r['vs_ray_train_storage']:.2f}",
                f"{r['vs_dcp']:.2f}",
            )
            for r in ratios
        ],
    )
    return f"{times}\n\n{factors}"


def plot(rows: list[dict[str, Any]], path: pathlib.Path) -> None:
    plt = pyplot()

    sizes = sorted({r["size_bytes"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5.5 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        mine = [r for r in rows if r["size_bytes"] == size]
        labels = [f"ray_ckpt\n{r['killed']} killed" if r["impl"] == "ray_ckpt" else LABELS[r["impl"]] for r in mine]
        colors = ["tab:blue" if r["impl"] == "ray_ckpt" else "tab:gray" for r in mine]
        bars = ax.bar(range(len(mine)), [r["seconds"] for r in mine], color=colors)
        for bar, r in zip(bars, mine):
            ax.text(bar.get_x() + bar.get_width() / 2, r["seconds"], f"{r['seconds']:.2f}", ha="center", va="bottom")
        ax.set_xticks(range(len(mine)), labels, fontsize=7)
        ax.set_ylim(0, 1.15 * max(r["seconds"] for r in mine))
        ax.set_ylabel("seconds (2 ranks, slowest)")
        ax.set_title(f"{size / MIB:.0f} MiB per rank, RS(4,2)")
    fig.suptitle("Restore all ranks vs raw transfer, Ray Train storage, DCP (one 2-core machine)", fontsize=10)
    save_figure(fig, path)


def measure_sizes(sizes: list[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``bench_size`` of each size (MiB per rank) that fits in the free memory, its files in this
    run's Ray temp dir: (the results, the sizes skipped with the reason)."""
    import psutil

    results = []
    skipped: list[dict[str, Any]] = []
    for mib in sizes:
        need = PEAK_MULTIPLE * mib * MIB + RAY_OVERHEAD
        available = psutil.virtual_memory().available
        if available < need:
            reason = f"needs ~{need / 2**30:.1f} GiB of memory, {available / 2**30:.1f} GiB available"
            print(f"{mib} MiB per rank: skipped, {reason}", flush=True)
            skipped.append({"size_bytes": mib * MIB, "reason": reason})
            continue
        print(f"{mib} MiB per rank ...", flush=True)
        try:
            results.append(bench_size(mib * MIB, os.environ["RAY_TMPDIR"]))
        except BenchError:
            raise
        except Exception as error:  # e.g. Ray's memory monitor killed a worker: report what fit
            reason = f"failed: {type(error).__name__}: {str(error)[:300]}"
            print(f"{mib} MiB per rank: {reason}", flush=True)
            skipped.append({"size_bytes": mib * MIB, "reason": reason})
    return results, skipped


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, "See the module docstring for exactly what is timed.")
    add_sizes_flag(
        parser, [256, 1024], "comma-separated per-rank state sizes in MiB (default 256,1024); one fresh cluster each"
    )
    parser.add_argument("--quick", action="store_true", help="8 MiB only, no plot (for tests)")
    add_json_flag(parser, "rows and ratios")
    add_plots_flag(parser)
    parser.add_argument(
        "--replot", type=pathlib.Path, metavar="JSON", help="print the tables and redraw the plot of an earlier --json"
    )
    args = parser.parse_args(argv)
    if args.replot is not None:
        document = json.loads(args.replot.read_text())
        print(format_tables(document["rows"], document["ratios"]))
        draw_plot(args.plots, "bench_recovery.png", lambda path: plot(document["rows"], path))
        return 0
    sizes = [8] if args.quick else args.sizes_mib

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    print(
        f"RS({CODE['data_shards']},{CODE['parity_shards']}), {RANKS} ranks, 1 head (0 CPUs) + {WORKERS} one-CPU "
        f"workers on one machine ({os.cpu_count()} cores); data-shard holders hard-killed one at a time"
    )
    # Ray's logs are kept when a size was skipped or failed
    measured = on_private_ray("rckr", lambda: measure_sizes(sizes), clean=lambda m: bool(m[0]) and not m[1])
    if measured is None:
        return 1
    results, skipped = measured
    if not results:
        print("error: no size could be measured", file=sys.stderr)
        return 1
    rows, ratios = rows_and_ratios(results)
    print(format_tables(rows, ratios))
    print(
        "seconds: slowest of the 2 ranks; ratios = other's seconds / ray_ckpt's (> 1: ray_ckpt faster); "
        "baselines (killed 0) involve no failure"
    )
    for entry in skipped:
        print(f"not measured: {entry['size_bytes'] // MIB} MiB per rank ({entry['reason']})")
    document = {"benchmark": "recovery", "rows": rows, "ratios": ratios, "skipped": skipped, "details": results}
    write_json(args.json, document)
    if not args.quick:
        draw_plot(args.plots, "bench_recovery.png", lambda path: plot(rows, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
