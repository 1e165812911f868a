"""What checkpointing costs a Ray Train job that never fails: step time, job time, and CPU.

The demo's job (scripts/demo.py: a small transformer LM, ``TorchTrainer`` with 2 workers, DDP
over gloo, ``--state-mib`` MiB of extra float32 state per rank standing in for a larger model's
parameters and optimizer state) runs ``--steps`` steps without failures on a simulated Ray
cluster (one-CPU nodes on this machine, dashboard off, a private RAY_TMPDIR), once per mode:

* none: no checkpoint at all (the reference every ratio is taken against);
* ray_ckpt/1: ray_ckpt RS(2,2) every step (``ray_ckpt.train.Checkpointer``);
* ray_ckpt/1 ray-put: the same, each shard put through Ray's object store instead of written
  over the store's socket (``RAY_CKPT_DIRECT_WRITES=0``, the save path before direct writes);
* ray_ckpt/N: ray_ckpt every ``--every`` steps (``CheckpointConfig(every=N)``);
* ray_ckpt/auto: ray_ckpt at the interval ``CheckpointConfig(every="auto")`` picks;
* ray_train/N: ``torch.save`` + ``ray.train.report(checkpoint=...)`` every ``--every`` steps.

and for two step shapes: ``cpu``, the demo's own compute (every process shares this machine's
cores, so the background work of a save competes with training), and ``gpu-like``, the
compute replaced by a sleep of ``--compute-s`` (only the checkpointing uses the CPU, as on a
GPU node whose host cores are mostly idle).

Per mode: median and mean step time of rank 0 (between consecutive step ends), the job's
wall time (``trainer.fit``) and its work time (rank 0's training function from just before its
checkpointing is set up, through restore, every step and the final wait for the last save, to
its end: what checkpointing can cost, without the worker group's start-up, whose noise on a
shared machine is larger than a few percent of a short run), each relative to ``none`` of the
same shape; per save, from
ray_ckpt's save events: blocking time, background wall time (encode + scatter + stage) and
bytes per rank; CPU-seconds per step of every process of the cluster (the ranks' threads, the
stores, the raylets with their object stores, the controller) from the first step's end to the
last's (sampled every 0.25 s: the workers' start and end are left out), and the extra
CPU-seconds over ``none`` per saved GiB, relative to one memcpy of a GiB measured in
the same run. The memcpy unit makes the figure comparable between machines; bytes copied per
byte of state are counted from the code path in docs/benchmarks.md.

    python scripts/bench_overhead.py [--steps 60] [--every 10] [--state-mib 32] [--shapes cpu,gpu-like]
                                     [--modes none,ray_ckpt/1,...] [--json PATH]
"""

from __future__ import annotations

import itertools
import os
import statistics
import threading
import time
from typing import Any

import numpy as np
import psutil
from benchutil import (
    BenchError,
    add_json_flag,
    add_steps_flags,
    load_demo,
    make_parser,
    on_private_ray,
    render_table,
    write_json,
)

GIB = 1 << 30
WORKERS = 2  # the demo job's
NODES = 6  # one-CPU worker nodes of the simulated cluster (--quick: 4, one store per shard of a rank's RS(2,2))
MODES = ("none", "ray_ckpt/1", "ray_ckpt/1 ray-put", "ray_ckpt/N", "ray_ckpt/auto", "ray_train/N")


class CpuMeter(threading.Thread):
    """CPU-seconds (user + system) of this process's descendants, sampled every ``period_s``
    (each sample: time and every live process's total), so that the CPU of a window of the run
    (its training steps, without the workers' start and end) can be taken afterwards. A process
    that exits within a window loses at most one period."""

    def __init__(self, period_s: float = 0.25) -> None:
        super().__init__(daemon=True, name="cpu-meter")
        self.period_s = period_s
        self.samples: list[tuple[float, dict[tuple[int, float], float]]] = []
        self._done = threading.Event()

    def _sample(self) -> None:
        totals: dict[tuple[int, float], float] = {}
        for process in psutil.Process().children(recursive=True):
            try:
                with process.oneshot():
                    key = (process.pid, process.create_time())
                    times = process.cpu_times()
            except psutil.Error:
                continue
            totals[key] = times.user + times.system
        self.samples.append((time.time(), totals))

    def run(self) -> None:
        while not self._done.is_set():
            self._sample()
            self._done.wait(self.period_s)

    def stop(self) -> None:
        self._done.set()
        self.join()
        self._sample()

    def window_s(self, start: float, end: float) -> float:
        """CPU-seconds spent between ``start`` and ``end`` (the samples nearest inside them):
        each process counts from its value at the first sample (0 if it started later) to its
        last value up to the last sample."""
        inside = [(t, totals) for t, totals in self.samples if start <= t <= end]
        if len(inside) < 2:
            raise BenchError(f"fewer than 2 CPU samples between {start:.2f} and {end:.2f}: a run too short to measure")
        first = inside[0][1]
        last: dict[tuple[int, float], float] = {}
        for _, totals in inside:
            last.update(totals)
        return sum(cpu - first.get(key, 0.0) for key, cpu in last.items())


def memcpy_s_per_gib(repeats: int = 4) -> float:
    """Seconds one core takes to copy a GiB (best of ``repeats`` copies of 256 MiB, scaled)."""
    source = np.ones(GIB // 4, dtype=np.uint8)
    target = np.empty_like(source)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        best = min(best, time.perf_counter() - started)
    return best * 4


def step_times(step_ends: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(step_ends)]


def run_mode(demo: Any, cluster: Any, shape: str, mode: str, args: Any) -> dict[str, Any]:
    """One run of the job in ``mode`` with ``shape`` steps; its measurements."""
    name = job_name(shape, mode)
    extra: dict[str, Any] = {"state_mib": args.state_mib, "baseline_every": 0}
    if shape == "gpu-like":
        extra.update(compute="sleep", compute_s=args.compute_s)
    if mode.startswith("ray_ckpt"):
        every = {"ray_ckpt/1": 1, "ray_ckpt/1 ray-put": 1, "ray_ckpt/N": args.every, "ray_ckpt/auto": "auto"}[mode]
        extra["checkpoint"] = {"data_shards": 2, "parity_shards": 2, "every": every}
        if mode.endswith("ray-put"):
            extra["env"] = {"RAY_CKPT_DIRECT_WRITES": "0"}
    elif mode == "ray_train/N":
        extra["baseline_every"] = args.every
    kind = "ray_ckpt" if mode.startswith("ray_ckpt") else "baseline"
    meter = CpuMeter()
    meter.start()
    try:  # no failure is planned: one would void the run's figures (Ray Train restarts it)
        run = demo.run_job(cluster, name, kind, args.steps, [], max_failures=0, **extra)
    except Exception as error:
        raise BenchError(f"{shape} {mode}: the job failed, its figures are void: {error}") from error
    meter.stop()
    step_ends = run["final"]["step_ends"]
    gaps = step_times(step_ends)
    cpu_per_step_s = meter.window_s(step_ends[0], step_ends[-1]) / (len(step_ends) - 1)
    records = demo.job_events(name)
    saves = [  # rank 0's; every rank saves as much
        r
        for r in records
        if r["kind"] == "save" and kind == "ray_ckpt" and not r.get("skipped") and int(r["rank"]) == 0
    ]
    background = [sum(float(r["phases_s"].get(p, 0.0)) for p in ("encode", "scatter", "stage")) for r in saves]
    return {
        "shape": shape,
        "mode": mode,
        "steps": len(step_ends),
        "wall_s": run["wall_s"],
        "work_s": run["final"]["work_s"],
        "step_median_s": statistics.median(gaps),
        "step_mean_s": statistics.fmean(gaps),
        "cpu_per_step_s": cpu_per_step_s,
        "saves": len(saves),
        "save_bytes": statistics.fmean(float(r["bytes"]) for r in saves) if saves else 0.0,
        "blocking_s": statistics.median(float(r["phases_s"]["blocking"]) for r in saves) if saves else 0.0,
        "background_s": statistics.median(background) if background else 0.0,
        "intervals": demo.intervals_chosen(name, records),
    }


def job_name(shape: str, mode: str) -> str:
    return f"{shape}-{mode.replace('/', '-').replace(' ', '-')}"


def add_ratios(rows: list[dict[str, Any]], memcpy_s: float) -> None:
    """Each row against ``none`` of its shape: step and wall ratios, extra CPU per saved GiB."""
    for row in rows:
        base = next(r for r in rows if r["shape"] == row["shape"] and r["mode"] == "none")
        row["step_ratio"] = row["step_mean_s"] / base["step_mean_s"]
        row["wall_ratio"] = row["wall_s"] / base["wall_s"]
        row["work_ratio"] = row["work_s"] / base["work_s"]
        saved_gib = row["saves"] * row["save_bytes"] * WORKERS / GIB
        extra_cpu = (row["cpu_per_step_s"] - base["cpu_per_step_s"]) * row["steps"]
        row["cpu_s_per_gib"] = extra_cpu / saved_gib if saved_gib else None
        row["memcpys_per_gib"] = row["cpu_s_per_gib"] / memcpy_s if saved_gib else None


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        (
            "shape",
            "mode",
            "step ms",
            "step x",
            "wall s",
            "wall x",
            "work s",
            "work x",
            "saves",
            "block ms",
            "bg ms",
            "CPU ms/step",
            "CPU s/GiB",
            "memcpys/GiB",
        )
    ]
    for r in rows:
        per_gib = r["cpu_s_per_gib"]
        lines.append(
            (
                r["shape"],
                r["mode"],
                f"{r['step_mean_s'] * 1e3:.0f}",
                f"{r['step_ratio']:.2f}",
                f"{r['wall_s']:.1f}",
                f"{r['wall_ratio']:.2f}",
                f"{r['work_s']:.1f}",
                f"{r['work_ratio']:.2f}",
                str(r["saves"]) if r["mode"].startswith("ray_ckpt") else "-",
                f"{r['blocking_s'] * 1e3:.1f}" if r["saves"] else "-",
                f"{r['background_s'] * 1e3:.0f}" if r["saves"] else "-",
                f"{r['cpu_per_step_s'] * 1e3:.0f}",
                "-" if per_gib is None else f"{per_gib:.1f}",
                "-" if per_gib is None else f"{r['memcpys_per_gib']:.0f}",
            )
        )
    return render_table(lines)


def measure_modes(
    args: Any, shapes: list[str], modes: list[str], nodes: int = NODES
) -> tuple[list[dict[str, Any]], float]:
    """On one simulated cluster of ``nodes`` one-CPU worker nodes: the demo's job run in every
    mode of every shape; the rows (with their ratios) and the seconds of a memcpy of a GiB."""
    import ray_ckpt
    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.tools import quiet

    demo = load_demo()
    memcpy_s = memcpy_s_per_gib()
    print(
        f"{args.steps} steps per run, /N = every {args.every} steps, +{args.state_mib} MiB state per rank, "
        f"2 workers, 1 head + {nodes} one-CPU nodes on one machine ({os.cpu_count()} cores); "
        f"memcpy {memcpy_s:.3f} s per GiB",
        flush=True,
    )
    budget = (256 << 20) + 8 * (args.state_mib << 20)
    object_store = 3 * (args.state_mib << 20) + (128 << 20)
    rows: list[dict[str, Any]] = []
    with SimulatedCluster(
        nodes,
        store_budget_bytes=budget,
        worker_object_store_bytes=object_store,
        start_service=False,
        logging_level="ERROR",
    ) as sim:
        quiet.quiet_driver()
        ray_ckpt.start(store_budget_bytes=budget)
        for shape in shapes:
            for mode in modes:
                print(f"{shape}: {mode} ...", flush=True)
                rows.append(run_mode(demo, sim.cluster, shape, mode, args))
                if mode.startswith("ray_ckpt"):
                    ray_ckpt.drop(job_name(shape, mode))  # its shards' memory, for the runs below
    add_ratios(rows, memcpy_s)
    return rows, memcpy_s


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, "See the module docstring for what is measured.")
    add_steps_flags(parser, 60)
    parser.add_argument("--every", type=int, default=10, help="the interval of the /N modes, in steps (default 10)")
    parser.add_argument("--state-mib", type=int, default=32, help="extra MiB of state per rank (default 32)")
    parser.add_argument(
        "--compute-s", type=float, default=0.3, help="seconds of a gpu-like step's compute, slept (default 0.3)"
    )
    parser.add_argument("--shapes", default="cpu,gpu-like", help="step shapes to run (default cpu,gpu-like)")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help="modes to run, comma-separated, 'none' among them (default: all of " + ", ".join(MODES) + ")",
    )
    parser.add_argument("--quick", action="store_true", help="8 steps, every 4, 4 MiB, gpu-like only, 4 nodes (tests)")
    add_json_flag(parser, "the rows")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.every, args.state_mib, args.shapes, args.compute_s = 8, 4, 4, "gpu-like", 0.1
    shapes = [s for s in args.shapes.split(",") if s]
    if not shapes or any(s not in ("cpu", "gpu-like") for s in shapes):
        parser.error(f"--shapes takes cpu and/or gpu-like, comma-separated; got {args.shapes!r}")
    modes = [m for m in args.modes.split(",") if m]
    if "none" not in modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes 'none' and any of {', '.join(MODES[1:])}, comma-separated; got {args.modes!r}")
    modes = [m for m in MODES if m in modes]  # the table's order
    if args.steps < 2 * args.every or args.every < 1:
        parser.error("--every must be >= 1 and --steps at least twice --every")
    if not 0 <= args.state_mib <= 1024:
        parser.error("--state-mib must be in 0..1024")

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    os.environ["RAY_CKPT_SAVE_EVENT_EVERY"] = "1"  # every save's phases
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    nodes = 4 if args.quick else NODES
    measured = on_private_ray("rcko", lambda: measure_modes(args, shapes, modes, nodes))
    if measured is None:
        return 1
    rows, memcpy_s = measured
    print()
    print(table(rows))
    print(
        "\nstep x, wall x, work x: against 'none' of the same shape (work: rank 0's training function from its "
        "checkpoint setup to its end); bg: a save's background wall time "
        "(encode + scatter + stage), median; CPU ms/step: every cluster process, from the first step's "
        "end to the last's; CPU s/GiB: CPU-seconds beyond 'none' per GiB saved, and in memcpys of a GiB"
    )
    document = {
        "benchmark": "overhead",
        "steps": args.steps,
        "every": args.every,
        "state_mib": args.state_mib,
        "compute_s": args.compute_s,
        "memcpy_s_per_gib": memcpy_s,
        "rows": rows,
    }
    write_json(args.json, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
