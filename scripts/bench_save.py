"""Save stall: how long ``Checkpointer.save`` blocks the training loop, next to the alternatives.

What is measured, for each state size (default 100 MiB and 1 GiB), in one run. The state is a
nested dict of four float32 tensors adding up to the size: ``{"model": {"embed.weight",
"proj.weight"} (1/3 of the bytes), "optim": {"exp_avg", "exp_avg_sq"} (2/3)}``. Each figure is
the median over ``--repeats`` timed saves after one untimed warm-up save; the tensors are changed
in place (``add_(1)``) before every timed save, as a training step would.

- ``ray_ckpt``: on a simulated cluster (``ray.cluster_utils.Cluster``: a head with 0 CPUs plus 6
  one-CPU worker nodes on this machine, dashboard off, a private RAY_TMPDIR, stores on all 7
  nodes), one rank runs as a Ray actor pinned to worker node 0 and calls ``save(step, state)``
  with ``CheckpointConfig(data_shards=4, parity_shards=2, keep_committed=2)`` (other settings at
  their defaults, so ``local_copy=True``). Before each timed save the previous one has finished
  (``handle.staged()``, then a short pause), so the figure is the copy into the reused host
  buffer, not a wait. Reported: ``last_save_phases_s["blocking"]``.
- ``ray_ckpt_back_to_back``: the same rank calls ``save`` again at once after each save, with
  nothing in between, so each save's blocking time includes ``wait_previous`` (the previous
  save's encode + scatter + stage running in the background).
- ``memcpy``: inside the same rank actor (same process, same torch thread count), a bare
  ``copy_`` of the same tensors into views of a preallocated uint8 buffer. The floor.
- ``raw_push`` (printed with the background of the gapped saves, not a row): from the same
  rank actor, the bytes a save moves pushed bare over sockets kept open to a sink on each
  node (``ray_ckpt.testing.RawSink``; a shard of size/k to each of k+m other nodes and, with the
  local copy, the whole state to the rank's own node over a Unix socket), all at once, one
  thread per sink: the floor a save's background work (encode + scatter + stage) is held to.
  Goal: background <= 1.3x that.
- ``torch_save``: ``torch.save(state, path)`` to a local temp dir (page cache; one file, rewritten).
- ``dcp_async_save``: ``torch.distributed.checkpoint.async_save(state, checkpoint_id=dir)`` in a
  single process with a gloo process group of world size 1; the time until the call returns
  (its blocking staging copy); the returned future is waited for, untimed, before the next save.
- ``ray_train_report``: inside a ``TorchTrainer`` with 1 worker (on a fresh local Ray cluster),
  ``torch.save(state, dir/state.pt)`` + ``ray.train.report(metrics, checkpoint=
  Checkpoint.from_directory(dir))`` with a local ``storage_path``: the time of those two calls.
  Ray Train runs with its DEFAULT controller poll interval (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``
  unset: 2 s); a report blocks until the controller's next poll, which is what users get.
  Between reports the worker "trains" for a random time (uniform in 0-2 s, seeded), as a real
  loop computes between checkpoints: back-to-back reports would phase-lock with the poll and
  each wait only for the rest of the interval after ``torch.save``, whatever its length.

``torch_save`` and ``dcp_async_save`` run in this process after the simulated cluster is shut
down, with torch's intra-op thread count set to the one the rank actor had (Ray gives a 1-CPU
worker one thread); Ray Train's worker gets Ray's setting.

Memory: clusters never overlap, so memory peaks in the ray_ckpt part, where all 7 simulated
nodes' stores and object stores share this machine: about 4 GiB with no data plus, per byte of
state, 2.5 in the rank (state, buffer, parity), 2.5 per step held by the stores (1.5 of shards,
1 of local copy; keep_committed + 1 steps at the peak, as the oldest is evicted only after the
new step commits) and 2 per byte a save ships plus 1.5 in the object stores (objects of one save
are released while the next is put; measured): ~20 GiB for a 1 GiB state with the defaults. Per
size the script takes the first of: the defaults, ``local_copy=False``, also
``keep_committed=1``, whose estimate fits in 75% of the machine's memory (counting what is in
use now), says which it took, and skips ray_ckpt for a size where none fits. Neither change
touches what ``ray_ckpt`` measures (the copy); both shorten the background work that
``ray_ckpt_back_to_back`` waits for. Past 85% of the machine's memory in use the run aborts and
shuts its clusters down. The peak memory in use is printed.

Goals (ratios printed per size): ``ray_ckpt`` blocks <= 1.5x ``memcpy``, >= 3x less than
``dcp_async_save`` and >= 20x less than ``ray_train_report``. All "nodes" share this machine's
cores, memory and disk: compare ratios within one run, not absolute figures across runs.

Rows (``--json PATH``): a list of ``{"size_bytes", "impl", "blocking_s"}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from benchutil import (
    MIB,
    BenchError,
    add_json_flag,
    add_sizes_flag,
    make_parser,
    on_node,
    on_private_ray,
    render_rows,
    render_table,
    write_json,
)

from ray_ckpt.testing import float_state, touch

WORKERS = 6
CODE = {"data_shards": 4, "parity_shards": 2}
DEFAULT_CONFIG = {"keep_committed": 2, "local_copy": True}
# Memory of the simulated cluster (all its processes), measured on this kind of machine: about
# 4 GiB with no data, plus per byte of state 2.5 in the rank (state, buffer, parity), 1.5
# (shards) + 1 (local copy) per step held by the stores (keep_committed + 1 at the peak: the
# oldest step is evicted only after the new one commits), and in the object stores 2 per byte a
# save ships plus 1.5 (a save's objects are released asynchronously, while the next is put).
CLUSTER_BASE_BYTES = 4 << 30
FIT_FRACTION = 0.75  # memory in use now + the estimate must stay under this share of the machine's
GUARD_FRACTION = 0.85  # abort (shutting the cluster down) when the machine's memory in use passes this
JOB = "bench-save"
TRAIN_POLL_S = 2.0  # Ray Train's default controller poll interval
GAP_S = 0.25  # pause after the previous save finished, before the next timed one
IMPLS = ("ray_ckpt", "ray_ckpt_back_to_back", "memcpy", "torch_save", "dcp_async_save", "ray_train_report")
GOALS = (  # (numerator, denominator, label, passes(ratio))
    ("ray_ckpt", "memcpy", "ckpt/memcpy", "<= 1.5", lambda r: r <= 1.5),
    ("dcp_async_save", "ray_ckpt", "dcp/ckpt", ">= 3", lambda r: r >= 3.0),
    ("ray_train_report", "ray_ckpt", "train/ckpt", ">= 20", lambda r: r >= 20.0),
)


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def estimate_cluster_bytes(size: int, config: dict[str, Any]) -> int:
    """Peak memory of the simulated cluster while a rank saves ``size``-byte states."""
    step = 1.5 + (1.0 if config["local_copy"] else 0.0)  # bytes stored per state byte and step
    factor = 2.5 + (config["keep_committed"] + 1) * step + 2 * step + 1.5
    return int(CLUSTER_BASE_BYTES + factor * size)


def fitting_config(size: int) -> tuple[dict[str, Any] | None, str]:
    """The first of: the default config, without the local copy, also with keep_committed=1,
    whose estimated peak fits in FIT_FRACTION of the machine (with what is in use now); None if
    none does. Neither change touches the blocking copy measured by ``ray_ckpt``; both shorten
    the background work that ``ray_ckpt_back_to_back`` waits for."""
    import psutil

    memory = psutil.virtual_memory()
    room = FIT_FRACTION * memory.total - (memory.total - memory.available)
    candidates = (
        dict(DEFAULT_CONFIG),
        {**DEFAULT_CONFIG, "local_copy": False},
        {**DEFAULT_CONFIG, "local_copy": False, "keep_committed": 1},
    )
    for config in candidates:
        needed = estimate_cluster_bytes(size, config)
        if needed <= room:
            return config, f"est. peak {needed / 2**30:.1f} GiB of {room / 2**30:.1f} GiB room"
    return None, f"even {needed / 2**30:.1f} GiB (smallest config) exceeds the {room / 2**30:.1f} GiB room"


def bench_ray_ckpt(size: int, repeats: int, config: dict[str, Any]) -> dict[str, Any]:
    """One fresh simulated cluster: memcpy, gapped saves, back-to-back saves in the rank actor."""
    import ray

    from ray_ckpt.testing import SimulatedCluster, rank_actor, sink_actor

    Rank = rank_actor()
    Sink = sink_actor()
    shard = size // CODE["data_shards"] + MIB
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    with SimulatedCluster(
        WORKERS,
        namespace=namespace,
        start_service=False,
        head_object_store_bytes=2 * shard + 96 * MIB,
        # the rank node's object store holds a save's 6 shards (1.5x) and its local copy (1x) at once
        worker_object_store_bytes=[3 * size + 128 * MIB] + [2 * shard + 96 * MIB] * (WORKERS - 1),
        fast_failure_detection=False,
    ) as sim:
        # the rank starts (imports, builds its state) while the stores start
        rank = Rank.options(scheduling_strategy=on_node(sim.node_id(0))).remote(size, state="floats")
        # Peak per store: keep_committed committed steps plus the one being saved (older steps
        # are evicted only after the new one commits). The rank's node holds its full local copy
        # (1x per step; none without local_copy); every other node one shard (1/4x per step).
        sim.start_service((config["keep_committed"] + 1) * (size + MIB) + 16 * MIB)
        ray.get(rank.connect.remote(namespace, JOB, 0, 1, {**CODE, **config}))
        info = ray.get(rank.info.remote())
        memcpy = ray.get(rank.memcpy.remote(repeats))
        gapped = ray.get(rank.saves.remote(repeats, False, GAP_S))
        back_to_back = ray.get(rank.saves.remote(repeats, True, GAP_S))
        ray.get(rank.close.remote())
        # the floor of the scatter: the same bytes pushed bare, a shard to each other node (as
        # RS(4,2) over 7 nodes places them) and the local copy to the rank's own node
        shard_bytes = size // CODE["data_shards"]
        others = [node["NodeID"] for node in ray.nodes() if node["Alive"] and node["NodeID"] != sim.node_id(0)]
        targets = [(node, shard_bytes) for node in others[: CODE["data_shards"] + CODE["parity_shards"]]]
        if config["local_copy"]:
            targets.append((sim.node_id(0), size))
        sinks = [Sink.options(scheduling_strategy=on_node(node)).remote(nbytes) for node, nbytes in targets]
        endpoints = ray.get([sink.endpoint.remote() for sink in sinks])
        raw_push = ray.get(
            rank.raw_push.remote([(e, nbytes) for e, (_, nbytes) in zip(endpoints, targets, strict=True)], repeats)
        )
        for actor in (rank, *sinks):
            ray.kill(actor, no_restart=True)
        return {"info": info, "memcpy": memcpy, "gapped": gapped, "back_to_back": back_to_back, "raw_push": raw_push}


# ---- torch.save and DCP async_save, in this process ----------------------------------------------


def bench_torch_save(state: dict[str, Any], repeats: int, folder: pathlib.Path) -> list[float]:
    import torch

    path = folder / "state.pt"
    times = []
    for attempt in range(repeats + 1):
        touch(state)
        started = time.perf_counter()
        torch.save(state, path)
        elapsed = time.perf_counter() - started
        if attempt:
            times.append(elapsed)
    path.unlink()
    return times


def bench_dcp_async_save(state: dict[str, Any], repeats: int, folder: pathlib.Path) -> list[float]:
    """Blocking part of DCP ``async_save`` (world size 1, gloo); the upload is waited for untimed."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    dist.init_process_group("gloo", init_method=(folder / "pg").as_uri(), rank=0, world_size=1)
    try:
        times = []
        for attempt in range(repeats + 1):
            touch(state)
            target = folder / f"dcp-{attempt}"
            started = time.perf_counter()
            future = dcp.async_save(state, checkpoint_id=str(target))
            elapsed = time.perf_counter() - started
            # newer torch may return an AsyncSaveResponse (staging + upload futures)
            getattr(future, "upload_completion", future).result()
            shutil.rmtree(target, ignore_errors=True)
            if attempt:
                times.append(elapsed)
        return times
    finally:
        dist.destroy_process_group()


# ---- Ray Train: torch.save + ray.train.report(checkpoint=...) -------------------------------------


def _train_loop(config: dict[str, Any]) -> None:
    """The TorchTrainer worker: per size, a warm-up report then ``repeats`` timed ones."""
    import ray.train
    import torch

    results = []
    training = random.Random(config["seed"])
    for size in config["sizes"]:
        state = float_state(size)
        save_s, report_s = [], []
        for attempt in range(config["repeats"] + 1):
            touch(state)
            time.sleep(training.uniform(0.0, TRAIN_POLL_S))  # the training steps between checkpoints
            with tempfile.TemporaryDirectory(prefix="ckpt") as folder:
                started = time.perf_counter()
                torch.save(state, os.path.join(folder, "state.pt"))
                saved = time.perf_counter()
                ray.train.report(
                    {"size_bytes": size, "attempt": attempt},
                    checkpoint=ray.train.Checkpoint.from_directory(folder),
                )
                reported = time.perf_counter()
            if attempt:
                save_s.append(saved - started)
                report_s.append(reported - saved)
        del state
        results.append({"size_bytes": size, "save_s": save_s, "report_s": report_s})
    with open(config["out"], "w") as out:
        json.dump(results, out)


def bench_ray_train(sizes: list[int], repeats: int, folder: pathlib.Path) -> list[dict[str, Any]]:
    """One fresh local Ray cluster running a 1-worker TorchTrainer over all sizes."""
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    out = folder / "train_times.json"
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=256 * MIB,
        namespace=f"bench-train-{uuid.uuid4().hex[:8]}",
        log_to_driver=False,
    )
    try:
        trainer = TorchTrainer(
            _train_loop,
            train_loop_config={"sizes": sizes, "repeats": repeats, "out": str(out), "seed": 0},
            scaling_config=ScalingConfig(num_workers=1, use_gpu=False),
            run_config=RunConfig(
                name="bench_save",
                storage_path=str(folder / "ray_train"),
                checkpoint_config=CheckpointConfig(num_to_keep=1),
            ),
        )
        trainer.fit()
    finally:
        ray.shutdown()
    results: list[dict[str, Any]] = json.loads(out.read_text())
    if [r["size_bytes"] for r in results] != sizes:
        raise BenchError(f"the Ray Train worker reported sizes {[r['size_bytes'] for r in results]}, not {sizes}")
    return results


# ---- memory watch, table, main -----------------------------------------------------------------


@contextlib.contextmanager
def memory_watch() -> Iterator[dict[str, float]]:
    """Samples the machine's memory in use (total - available) every 0.2 s and yields
    ``{"start", "peak", "guard"}``. Past GUARD_FRACTION of the machine it interrupts the main
    thread once (KeyboardInterrupt, with ``guard`` set), so the clusters are shut down."""
    import _thread

    import psutil

    memory = psutil.virtual_memory()
    seen = {"start": float(memory.total - memory.available), "peak": 0.0, "guard": 0.0}
    seen["peak"] = seen["start"]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            memory = psutil.virtual_memory()
            used = float(memory.total - memory.available)
            seen["peak"] = max(seen["peak"], used)
            if used > GUARD_FRACTION * memory.total and not seen["guard"]:
                seen["guard"] = used
                _thread.interrupt_main()

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    by_size: dict[int, dict[str, float]] = {}
    for row in rows:
        by_size.setdefault(row["size_bytes"], {})[row["impl"]] = row["blocking_s"]
    short = {"ray_ckpt_back_to_back": "ray_ckpt b2b"}
    header = (
        "size MiB",
        *(f"{short.get(i, i)} ms" for i in IMPLS),
        *(f"{label} ({goal})" for _, _, label, goal, _ in GOALS),
    )
    lines: list[tuple[str, ...]] = [header]
    for size, impls in by_size.items():
        ratios = []
        for numerator, denominator, _, _, passes in GOALS:
            if numerator not in impls or denominator not in impls:
                ratios.append("-")
                continue
            ratio = impls[numerator] / impls[denominator] if impls[denominator] > 0 else float("inf")
            ratios.append(f"{ratio:.2f} {'ok' if passes(ratio) else 'MISS'}")
        lines.append((f"{size / MIB:.0f}", *(_ms(impls[i]) if i in impls else "-" for i in IMPLS), *ratios))
    return render_table(lines)


def format_phases(details: list[dict[str, Any]]) -> str:
    """Median ray_ckpt phases: blocking ones per series, background ones of the gapped saves."""

    def cells(series_of: tuple[dict[str, Any], str]) -> tuple[str, ...]:
        detail, series = series_of
        medians = []
        for name in ("wait_previous", "snapshot", "blocking", "encode", "scatter", "stage"):
            values = [p[name] for p in detail[series] if name in p]
            medians.append(_ms(median(values)) if values else "-")
        config = detail["config"]
        note = f"keep_committed={config['keep_committed']} local_copy={config['local_copy']}"
        return (f"{detail['size_bytes'] / MIB:.0f}", series, *medians, note)

    header = (
        "size MiB",
        "series",
        "wait_previous ms",
        "snapshot ms",
        "blocking ms",
        "encode ms",
        "scatter ms",
        "stage ms",
        "config",
    )
    return render_rows(header, [(d, s) for d in details for s in ("gapped", "back_to_back")], cells)


def _repeats(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an int: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("repeats must be >= 1")
    return value


def run_all(sizes: list[int], repeats: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every impl for every size: the rows, and the details of the ray_ckpt runs."""
    import torch

    rows: list[dict[str, Any]] = []
    details: list[dict[str, Any]] = []
    threads = torch.get_num_threads()
    for size in sizes:
        config, fit = fitting_config(size)
        started = time.monotonic()
        if config is None:
            print(f"{size / MIB:.0f} MiB: ray_ckpt and memcpy SKIPPED: the simulated cluster does not fit ({fit})")
        else:
            result = bench_ray_ckpt(size, repeats, config)
            if result["info"]["state_bytes"] != size:
                raise BenchError(f"state of {result['info']['state_bytes']} bytes, expected {size}")
            threads = result["info"]["torch_threads"]
            details.append({"size_bytes": size, "config": config, **result})
            rows.append({"size_bytes": size, "impl": "memcpy", "blocking_s": median(result["memcpy"])})
            for impl, series in (("ray_ckpt", "gapped"), ("ray_ckpt_back_to_back", "back_to_back")):
                blocking = median([p["blocking"] for p in result[series]])
                rows.append({"size_bytes": size, "impl": impl, "blocking_s": blocking})
            background = median([sum(p[name] for name in ("encode", "scatter", "stage")) for p in result["gapped"]])
            raw = median(result["raw_push"])
            print(
                f"{size / MIB:.0f} MiB: a save's background {background * 1e3:.0f} ms (encode + scatter + stage, "
                f"gapped) against the same bytes pushed bare over sockets {raw * 1e3:.0f} ms: "
                f"{background / raw:.2f}x (goal <= 1.3)",
                flush=True,
            )
            reduced = "" if config == DEFAULT_CONFIG else " (REDUCED from the defaults to fit memory)"
            print(
                f"{size / MIB:.0f} MiB: ray_ckpt + memcpy on the simulated cluster in "
                f"{time.monotonic() - started:.0f}s; keep_committed={config['keep_committed']}, "
                f"local_copy={config['local_copy']}{reduced}; {fit}; rank actor: {threads} torch thread(s)",
                flush=True,
            )
        started = time.monotonic()
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            state = float_state(size)
            with tempfile.TemporaryDirectory(prefix="bench_save") as folder:
                saved = bench_torch_save(state, repeats, pathlib.Path(folder))
                dcp = bench_dcp_async_save(state, repeats, pathlib.Path(folder))
            del state
        finally:
            torch.set_num_threads(previous_threads)
        rows.append({"size_bytes": size, "impl": "torch_save", "blocking_s": median(saved)})
        rows.append({"size_bytes": size, "impl": "dcp_async_save", "blocking_s": median(dcp)})
        print(
            f"{size / MIB:.0f} MiB: torch.save + DCP async_save in this process ({threads} torch thread(s)) "
            f"in {time.monotonic() - started:.0f}s",
            flush=True,
        )
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_train") as folder:
        train = bench_ray_train(sizes, repeats, pathlib.Path(folder))
    for result in train:
        total = [s + r for s, r in zip(result["save_s"], result["report_s"], strict=True)]
        rows.append({"size_bytes": result["size_bytes"], "impl": "ray_train_report", "blocking_s": median(total)})
        print(
            f"{result['size_bytes'] / MIB:.0f} MiB: Ray Train per checkpoint: torch.save "
            f"{median(result['save_s']) * 1e3:.0f} ms + ray.train.report {median(result['report_s']) * 1e3:.0f} ms",
            flush=True,
        )
    print(f"Ray Train (1 worker, fresh local cluster) in {time.monotonic() - started:.0f}s", flush=True)
    return rows, details


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, "See the module docstring for exactly what is timed and the goals.")
    add_sizes_flag(
        parser, [100, 1024], "comma-separated state sizes in MiB (default 100,1024); one fresh simulated cluster each"
    )
    parser.add_argument(
        "--repeats", type=_repeats, default=5, metavar="N", help="timed saves per impl and size (default 5)"
    )
    parser.add_argument("--quick", action="store_true", help="16 MiB, 1 repeat (for tests)")
    add_json_flag(parser)
    args = parser.parse_args(argv)
    sizes = [16 * MIB] if args.quick else [mib * MIB for mib in args.sizes_mib]
    repeats = 1 if args.quick else args.repeats

    poll = os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
    print(
        f"RS({CODE['data_shards']},{CODE['parity_shards']}); 1 head (0 CPUs) + {WORKERS} one-CPU workers on one "
        f"machine ({os.cpu_count()} cores); median of {repeats} saves after 1 warm-up; Ray Train with "
        + (
            "its DEFAULT poll interval (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S unset: 2 s)"
            if poll is None
            else f"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S={poll} (NOT the default of 2 s)"
        ),
        flush=True,
    )
    with memory_watch() as memory:
        try:
            measured = on_private_ray("rcks", lambda: run_all(sizes, repeats))
        except KeyboardInterrupt:
            if not memory["guard"]:
                raise
            print(
                f"error: aborted: the machine's memory in use reached {memory['guard'] / 2**30:.1f} GiB "
                f"(> {GUARD_FRACTION:.0%}); clusters shut down",
                file=sys.stderr,
            )
            return 1
    if measured is None:
        return 1
    rows, details = measured
    order = {impl: n for n, impl in enumerate(IMPLS)}
    rows.sort(key=lambda r: (r["size_bytes"], order[r["impl"]]))
    print()
    print("blocking time per save (median):")
    print(format_table(rows))
    print(
        "goals: ray_ckpt <= 1.5x memcpy, >= 3x less than DCP async_save, >= 20x less than "
        "torch.save + ray.train.report (Ray Train at its default 2 s poll interval, which bounds each report)"
    )
    print()
    print("ray_ckpt phases (median; encode/scatter/stage run in the background):")
    print(format_phases(details))
    print(
        f"machine memory in use: {memory['start'] / 2**30:.1f} GiB at start, peak {memory['peak'] / 2**30:.1f} GiB "
        "(includes other processes on the machine)"
    )
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
