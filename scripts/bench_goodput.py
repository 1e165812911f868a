"""Wasted time per failure in a Ray Train job: ray_ckpt every step vs Ray Train's checkpointing.

Reuses the demo (scripts/demo.py: its ``train_loop``, ``run_job``, ``Killer``,
``failures_report``, ``mean_stall``) on a simulated Ray cluster (``ray.cluster_utils.Cluster``:
a head with no CPUs plus one-CPU worker nodes, all on this machine, fast failure detection,
dashboard off, a private RAY_TMPDIR). The job (a small transformer LM, ``TorchTrainer`` with 2
workers, DDP over gloo) trains ``--steps`` steps; each step sleeps ``--step-sleep-s`` on top of
its compute, to stand in for a larger model's step time (``--step-compute-s`` adds that many
seconds of CPU work in short torch operations at the start of each step, for a long step of
compute a survivor must be interrupted in), and ``--state-mib`` adds that many MiB
of float32 state per rank (one element changed per step) that both sides save and restore, to
stand in for a larger model's parameters and optimizer state.

Failures come at a fixed mean time between failures, in steps: the failure steps are the
running sums, from the step at about ``--warm-up-s`` seconds on (the first seconds of a job,
before its warm spares are up, are not when failures come), of gaps drawn from an exponential distribution with mean
``--mtbf-steps`` (``random.Random(--seed)``; gaps of at least 5 steps, at most
``--max-failures`` failures, none in the last 5 steps). At each failure step the node of one
rank (rank 1, then 0, alternately) is hard-killed, a seeded uniform 0..``--step-sleep-s`` +
``--step-compute-s`` seconds after that step's save returned (a random point of the next step, where a real failure
would fall). The same schedule, delays included,
hits three runs of the same job:

* in place: ray_ckpt with ``ray_ckpt.train.InPlaceRecovery`` (``--quick``: one warm spare): only
  the lost rank's worker is replaced, the survivor keeps its process and rolls back from its local copy;
* ray_ckpt: RS(2,2) every step (``ray_ckpt.train.Checkpointer``), Ray Train's full restart of
  the worker group, restore from peer memory;
* Ray Train: ``torch.save`` + ``ray.train.report(checkpoint=...)`` to the run's storage path
  every N steps, N chosen as the demo does, from the estimate that a report stalls about two
  controller poll intervals: N = max(1, min(steps // 3, ceil(2 * RAY_TRAIN_HEALTH_CHECK_INTERVAL_S
  / ray_ckpt's mean stall per step))).

The estimate is only a starting point: a report blocks that long only when reports come faster
than the controller polls. So the run also measures the baseline's stall per checkpoint and
derives the truly equal-stall interval E = ceil(that stall / ray_ckpt's stall per step), both
stalls taken from the end of the warm-up on (the steps the failures fall in: a long run's
steady stall, without its start-up, where the in-place run's warm spares start on the same
shared cores); the whole run's stalls and the ratio at them are printed beside it. Its
wasted time per failure is replayed on the measured run: same kills, same step time, same
measured time to resume, with the steps lost recomputed for checkpoints every E steps (the
newest step done at the kill minus the newest multiple-of-E checkpoint before it). The ratio at
equal stall is the goal's figure; the measured run at N is shown next to it.

Per failure (from the events, via the demo's ``failures_report``): steps lost, time to resume
(kill -> first step of the new worker group done) and its phases, and the time until training
runs again (kill -> the slowest rank's restore done: the time to resume without the first step,
which at long steps is mostly that step's own compute, the same on both sides). Both are
printed as medians, in place against Ray Train. Wasted time per failure = the
time from the kill until the job is back where it was at the kill (``demo.wasted_s``): time to
resume + (steps lost - 1) x step time + the part of a step done at the kill (the first step
after the restore redoes one of the steps lost, or the one in progress), the step time being
the run's median time between consecutive steps. Also reported: the part that depends on the
checkpointing alone (steps lost x step time + the restore's own locate/fetch/decode/load),
without the failure detection and worker-group restart that Ray Train spends either way.

JSON: ``{"benchmark": "goodput", "schedule", "baseline_every", "in_place": {...}, "ray_ckpt": {...},
"ray_train": {...}, "ratio", "ratio_checkpoint_part", "baseline_stall_per_checkpoint_s",
"baseline_stall_per_checkpoint_whole_run_s", "equal_stall_every", "ray_train_equal_stall": {...},
"ratio_equal_stall", "ratio_in_place", "equal_stall_every_in_place",
"ray_train_equal_stall_in_place": {...}, "ratio_in_place_equal_stall",
"equal_stall_every_in_place_whole_run", "ray_train_equal_stall_in_place_whole_run": {...},
"ratio_in_place_whole_run_equal_stall"}`` (in place is compared at its own stall per step,
measured in its own run; the ``ratio*`` without ``in_place`` compare the full-restart run); each
side has ``failures`` (the demo's records plus ``wasted_s``), ``step_time_s``, ``mean_stall_s``
(the whole run), ``steady_stall_s`` (after the warm-up), ``wasted_per_failure_s``, ``wall_s``,
``median_time_to_resume_s``, ``median_training_again_s``.
"""

from __future__ import annotations

import math
import os
import pathlib
import random
import statistics
import sys
from typing import Any

from benchutil import (
    add_json_flag,
    add_plots_flag,
    add_steps_flags,
    draw_plot,
    load_demo,
    make_parser,
    on_private_ray,
    pyplot,
    render_table,
    save_figure,
    write_json,
)

MIN_GAP = 5
RESTORE_PHASES = ("locate", "fetch", "decode", "load")


def kill_schedule(
    steps: int, mtbf_steps: float, seed: int, max_failures: int, warm_up_steps: int = 0
) -> list[tuple[int, list[int], int]]:
    """Failure steps from a seeded exponential distribution, counted from ``warm_up_steps``, as
    the demo Killer's schedule: (step, [rank whose node dies], extra shard holders killed = 0)."""
    if mtbf_steps <= 0 or steps < 2 * MIN_GAP or warm_up_steps < 0:
        raise ValueError(
            f"need mtbf_steps > 0, steps >= {2 * MIN_GAP} and warm_up_steps >= 0, got {mtbf_steps}, {steps}, "
            f"{warm_up_steps}"
        )
    rng = random.Random(seed)
    schedule: list[tuple[int, list[int], int]] = []
    at = float(warm_up_steps)
    while len(schedule) < max_failures:
        at += max(MIN_GAP, rng.expovariate(1.0 / mtbf_steps))
        step = round(at)
        if step > steps - MIN_GAP:
            break
        schedule.append((step, [1 - len(schedule) % 2], 0))
    return schedule


def summarize(
    name: str, records: list[dict[str, Any]], demo: Any, run: dict[str, Any], warm_up_steps: int
) -> dict[str, Any]:
    failures = demo.failures_report(name, records)
    period = demo.step_time(name, records)
    for f in failures:
        lost = f["steps_lost"] * period
        f["lost_work_s"] = lost
        f["wasted_s"] = demo.wasted_s(f, period)
        restore = sum(float(f["phases"].get(p) or 0.0) for p in RESTORE_PHASES)
        f["checkpoint_part_s"] = lost + restore
    measured = [f for f in failures if f["wasted_s"] is not None]
    return {
        "failures": failures,
        "step_time_s": period,
        "mean_stall_s": demo.mean_stall(name, records),
        "steady_stall_s": demo.mean_stall(name, records, warm_up_steps),
        "wasted_per_failure_s": statistics.mean(f["wasted_s"] for f in measured) if measured else None,
        "checkpoint_part_per_failure_s": statistics.mean(f["checkpoint_part_s"] for f in measured)
        if measured
        else None,
        "steps_lost_mean": statistics.mean(f["steps_lost"] for f in measured) if measured else None,
        "wall_s": run["wall_s"],
        **{
            f"median_{key}": statistics.median(values) if values else None
            for key in ("time_to_resume_s", "training_again_s")
            for values in [[f[key] for f in measured if f.get(key) is not None]]
        },
    }


def checkpoint_stall(name: str, records: list[dict[str, Any]], every: int, first_step: int = 0) -> float:
    """Mean stall of the baseline's checkpoint steps (torch.save + report) from ``first_step`` on."""
    stalls = [
        float(r["phases_s"]["blocking"])
        for r in records
        if r["kind"] == "save"
        and r.get("job") == name
        and (int(r["step"]) + 1) % every == 0
        and int(r["step"]) >= first_step
    ]
    return statistics.mean(stalls) if stalls else float("nan")


def replay_at_interval(side: dict[str, Any], every: int, demo: Any) -> dict[str, Any]:
    """The measured baseline failures with steps lost recomputed for checkpoints every
    ``every`` steps (steps s with (s + 1) % every == 0); time to resume and the part of a step
    done at the kill as measured."""
    period = side["step_time_s"]
    failures = []
    for f in side["failures"]:
        if f["wasted_s"] is None:
            continue
        newest = f["restored_step"] + f["steps_lost"]  # the newest step done when the node died
        checkpoint = (newest + 1) // every * every - 1  # -1: none yet, start from scratch
        lost = newest - checkpoint
        failures.append(
            {
                "steps_lost": lost,
                "lost_work_s": lost * period,
                "time_to_resume_s": f["time_to_resume_s"],
                "into_step_s": f.get("into_step_s"),
            }
        )
        failures[-1]["wasted_s"] = demo.wasted_s(failures[-1], period)
    return {
        "every": every,
        "failures": failures,
        "steps_lost_mean": statistics.mean(f["steps_lost"] for f in failures) if failures else None,
        "wasted_per_failure_s": statistics.mean(f["wasted_s"] for f in failures) if failures else None,
    }


def format_table(result: dict[str, Any]) -> str:
    header = (
        "checkpointing",
        "failures",
        "step s",
        "stall/step ms (warm / all)",
        "steps lost",
        "lost work s",
        "resume s",
        "wasted/failure s",
        "ckpt part s",
        "job wall s",
    )
    lines: list[tuple[str, ...]] = [header]
    for key, label in (
        ("in_place", "ray_ckpt in place, every step"),
        ("ray_ckpt", "ray_ckpt full restart, every step"),
        ("ray_train", f"Ray Train, every {result['baseline_every']}"),
    ):
        side = result[key]
        measured = [f for f in side["failures"] if f["wasted_s"] is not None]

        def mean(values: list[float]) -> str:
            return f"{statistics.mean(values):.2f}" if values else "-"

        lines.append(
            (
                label,
                str(len(measured)),
                f"{side['step_time_s']:.3f}",
                f"{side['steady_stall_s'] * 1e3:.1f} / {side['mean_stall_s'] * 1e3:.1f}",
                mean([f["steps_lost"] for f in measured]),
                mean([f["lost_work_s"] for f in measured]),
                mean([f["time_to_resume_s"] for f in measured]),
                mean([f["wasted_s"] for f in measured]),
                mean([f["checkpoint_part_s"] for f in measured]),
                f"{side['wall_s']:.1f}",
            )
        )
    for replay, label, checkpoint_s in (
        (result["ray_train_equal_stall"], "equal stall with the full restart", "baseline_stall_per_checkpoint_s"),
        (result["ray_train_equal_stall_in_place"], "equal stall with in place", "baseline_stall_per_checkpoint_s"),
        (
            result["ray_train_equal_stall_in_place_whole_run"],
            "in place's whole run",
            "baseline_stall_per_checkpoint_whole_run_s",
        ),
    ):
        fs = replay["failures"]
        if not fs:
            continue
        lines.append(
            (
                f"Ray Train, every {replay['every']} ({label}, replayed)",
                str(len(fs)),
                f"{result['ray_train']['step_time_s']:.3f}",
                f"{result[checkpoint_s] / replay['every'] * 1e3:.1f}",
                f"{statistics.mean(f['steps_lost'] for f in fs):.2f}",
                f"{statistics.mean(f['lost_work_s'] for f in fs):.2f}",
                f"{statistics.mean(f['time_to_resume_s'] for f in fs):.2f}",
                f"{statistics.mean(f['wasted_s'] for f in fs):.2f}",
                "-",
                "-",
            )
        )
    return render_table(lines)


def plot(result: dict[str, Any], path: pathlib.Path) -> None:
    plt = pyplot()

    parts = ("lost work", "detect", "restart / replace", "restore", "first step")
    sides = (
        ("in_place", "ray_ckpt in place\nevery step"),
        ("ray_ckpt", "ray_ckpt restart\nevery step"),
        ("ray_train", f"Ray Train\nevery {result['baseline_every']} steps"),
    )
    values: dict[str, list[float]] = {p: [] for p in parts}
    for key, _ in sides:
        measured = [f for f in result[key]["failures"] if f["wasted_s"] is not None]

        def mean(get: Any, measured: list[dict[str, Any]] = measured) -> float:
            return statistics.mean(get(f) for f in measured) if measured else 0.0

        values["lost work"].append(mean(lambda f: f["lost_work_s"]))
        values["detect"].append(mean(lambda f: f["phases"].get("detect") or 0.0))
        values["restart / replace"].append(
            mean(lambda f: sum(f["phases"].get(p) or 0.0 for p in ("restart", "replace", "rendezvous")))
        )
        values["restore"].append(mean(lambda f: sum(f["phases"].get(p) or 0.0 for p in RESTORE_PHASES)))
        values["first step"].append(mean(lambda f: f["phases"].get("first_step") or 0.0))
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(sides)
    for part in parts:
        ax.bar([s[1] for s in sides], values[part], bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values[part])]
    for i, total in enumerate(bottom):
        ax.text(i, total, f"{total:.1f} s", ha="center", va="bottom")
    ax.set_ylabel("wasted seconds per failure (mean)")
    ax.set_title(
        f"Wasted time per failure: Ray Train / in place {result['ratio_in_place']:.2f}x (simulated cluster, 2 cores)",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    save_figure(fig, path)


def measure_runs(
    args: Any, schedule: list[tuple[int, list[int], int]], warm_up_steps: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """On one simulated cluster: the three runs of the job hit by ``schedule``; the result (each
    side summarized) and the Ray Train run's event records."""
    import ray_ckpt
    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.tools import quiet

    demo = load_demo()
    failures = len(schedule)
    nodes = failures + 5  # after every kill: 2 ranks + RS(2,2) on 4 other nodes, one spare
    print(
        f"{args.steps} steps, step sleep {args.step_sleep_s:.2f}s, compute {args.step_compute_s:.2f}s, "
        f"+{args.state_mib} MiB state/rank, "
        f"MTBF {args.mtbf_steps:g} steps (seed {args.seed}): "
        f"kills after steps {[s for s, _, _ in schedule]} (ranks {[r[0] for _, r, _ in schedule]}); "
        f"1 head + {nodes} one-CPU nodes on one machine ({os.cpu_count()} cores)",
        flush=True,
    )
    # the simulated nodes' default object store (150 MiB) cannot hold a rank's shards and local
    # copy in flight, and Ray would put them in files on disk instead
    object_store = 3 * (args.state_mib << 20) + (128 << 20) if args.state_mib else None
    with SimulatedCluster(
        nodes,
        # a store may hold shards of both ranks for the kept, staged and replaced steps
        store_budget_bytes=(256 << 20) + 8 * (args.state_mib << 20),
        worker_object_store_bytes=object_store,
        logging_level="ERROR",
    ) as sim:
        cluster = sim.cluster
        quiet.quiet_driver()  # Ray's messages about the nodes killed below stay in its logs
        extra: dict[str, Any] = {
            "step_sleep_s": args.step_sleep_s,
            "state_mib": args.state_mib,
            "kill_delay_s": args.step_sleep_s + args.step_compute_s,  # a kill lands anywhere in the next step
        }
        if args.step_compute_s:
            extra.update(compute="busy", compute_s=args.step_compute_s)
        # in place runs last: its warm spares stay up as the job's idle workers (memory, and CPU
        # while they start) and would weigh on the other modes' runs on these shared cores
        print("1/3 ray_ckpt with full restarts, RS(2,2) every step ...", flush=True)
        ours = demo.run_job(cluster, "goodput-ray_ckpt", "ray_ckpt", args.steps, schedule, **extra)
        ours_records = demo.job_events("goodput-ray_ckpt")
        ours_stall = demo.mean_stall("goodput-ray_ckpt", ours_records)
        ray_ckpt.drop("goodput-ray_ckpt")  # its shards' memory, for the runs below
        report_stall_s = 2 * float(os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"])
        baseline_every = max(1, min(args.steps // 3, math.ceil(report_stall_s / max(ours_stall, 1e-4))))
        sim.add_workers(failures)  # replace the killed nodes
        ray_ckpt.start()
        print(f"2/3 Ray Train checkpointing (torch.save + report) every {baseline_every} steps ...", flush=True)
        base = demo.run_job(
            cluster, "goodput-ray_train", "baseline", args.steps, schedule, baseline_every=baseline_every, **extra
        )
        base_records = demo.job_events("goodput-ray_train")
        sim.add_workers(failures)  # replace the killed nodes
        ray_ckpt.start()
        print("3/3 ray_ckpt in place (InPlaceRecovery), RS(2,2) every step ...", flush=True)
        # a quick run keeps one warm spare: InPlaceRecovery's default, one per free node, would
        # warm them all on these shared cores through its 20 steps
        spares = 1 if args.quick else None
        inplace = demo.run_job(
            cluster, "goodput-in_place", "ray_ckpt", args.steps, schedule, in_place=True, warm_spares=spares, **extra
        )
        inplace_records = demo.job_events("goodput-in_place")
        result: dict[str, Any] = {
            "benchmark": "goodput",
            "steps": args.steps,
            "mtbf_steps": args.mtbf_steps,
            "seed": args.seed,
            "step_sleep_s": args.step_sleep_s,
            "step_compute_s": args.step_compute_s,
            "state_mib": args.state_mib,
            "schedule": [{"step": s, "ranks": r} for s, r, _ in schedule],
            "baseline_every": baseline_every,
            "in_place": summarize("goodput-in_place", inplace_records, demo, inplace, warm_up_steps),
            "ray_ckpt": summarize("goodput-ray_ckpt", ours_records, demo, ours, warm_up_steps),
            "ray_train": summarize("goodput-ray_train", base_records, demo, base, warm_up_steps),
        }
    return result, base_records


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, "See the module docstring for what is measured.")
    add_steps_flags(parser, 90, step_sleep_s=0.2)
    parser.add_argument("--mtbf-steps", type=float, default=25.0, help="mean steps between failures (default 25)")
    parser.add_argument("--max-failures", type=int, default=3, help="at most this many failures (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the failure schedule (default 1)")
    parser.add_argument(
        "--warm-up-s", type=float, default=15.0, help="no failure in about the first seconds of a run (default 15)"
    )
    parser.add_argument(
        "--step-compute-s",
        type=float,
        default=0.0,
        help="seconds of CPU compute (short torch operations) at the start of each step (default 0)",
    )
    parser.add_argument(
        "--state-mib", type=int, default=0, help="extra MiB of state per rank, saved by both sides (default 0)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="20 steps, 1 failure (after step 5), 0.05 s steps, 1 warm spare, no plot (tests)",
    )
    add_json_flag(parser, "the report")
    add_plots_flag(parser)
    args = parser.parse_args(argv)
    if args.quick:
        # the kill lands after step 5: 14 steps after it leave the killer room to strike before the end
        args.steps, args.mtbf_steps, args.max_failures, args.step_sleep_s, args.warm_up_s = 20, 12.0, 1, 0.05, 0.0
    if not 1 <= args.max_failures <= 6:
        parser.error("--max-failures must be in 1..6 (the demo's FailureConfig allows 6 restarts)")
    if args.step_sleep_s < 0 or args.step_compute_s < 0:
        parser.error("--step-sleep-s and --step-compute-s must be >= 0")
    if not 0 <= args.state_mib <= 2048:
        parser.error("--state-mib must be in 0..2048")
    try:
        warm_up_steps = math.ceil(args.warm_up_s / max(args.step_sleep_s + args.step_compute_s, 0.01))
        schedule = kill_schedule(args.steps, args.mtbf_steps, args.seed, args.max_failures, warm_up_steps)
    except ValueError as error:
        parser.error(str(error))
    if not schedule:
        parser.error("the schedule has no failure: raise --steps or lower --mtbf-steps")

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    os.environ["RAY_CKPT_SAVE_EVENT_EVERY"] = "1"  # the Killer watches save events
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    measured = on_private_ray("rckg", lambda: measure_runs(args, schedule, warm_up_steps))
    if measured is None:
        return 1
    result, base_records = measured
    demo = load_demo()
    failures = len(schedule)
    baseline_every = result["baseline_every"]
    ours_w = result["ray_ckpt"]["wasted_per_failure_s"]
    base_w = result["ray_train"]["wasted_per_failure_s"]
    result["ratio"] = base_w / ours_w if ours_w and base_w else None
    # Ray Train replayed at each side's stall per step, after the warm-up (the goal's figures: a
    # long run's steady stall) and over the whole run (its start-up included)
    base_stall_whole = checkpoint_stall("goodput-ray_train", base_records, baseline_every)
    base_stall = checkpoint_stall("goodput-ray_train", base_records, baseline_every, warm_up_steps)
    if not math.isfinite(base_stall):  # no checkpoint after the warm-up
        base_stall = base_stall_whole
    result["baseline_stall_per_checkpoint_s"] = base_stall
    result["baseline_stall_per_checkpoint_whole_run_s"] = base_stall_whole
    inplace_w = result["in_place"]["wasted_per_failure_s"]
    result["ratio_in_place"] = base_w / inplace_w if inplace_w and base_w else None
    for side, suffix, stall_key, checkpoint_s in (
        ("ray_ckpt", "", "steady_stall_s", base_stall),
        ("in_place", "_in_place", "steady_stall_s", base_stall),
        ("in_place", "_in_place_whole_run", "mean_stall_s", base_stall_whole),
    ):
        every = (
            max(1, math.ceil(checkpoint_s / max(result[side][stall_key], 1e-6)))
            if math.isfinite(checkpoint_s)
            else baseline_every
        )
        replay = replay_at_interval(result["ray_train"], every, demo)
        side_w, replay_w = result[side]["wasted_per_failure_s"], replay["wasted_per_failure_s"]
        result[f"equal_stall_every{suffix}"] = every
        result[f"ray_train_equal_stall{suffix}"] = replay
        result[f"ratio{suffix}_equal_stall"] = replay_w / side_w if side_w and replay_w else None
    ours_c = result["ray_ckpt"]["checkpoint_part_per_failure_s"]
    base_c = result["ray_train"]["checkpoint_part_per_failure_s"]
    result["ratio_checkpoint_part"] = base_c / ours_c if ours_c and base_c else None
    demo.print_failures("ray_ckpt in place (peer memory, every step):", result["in_place"]["failures"])
    demo.print_failures("ray_ckpt with full restarts (peer memory, every step):", result["ray_ckpt"]["failures"])
    demo.print_failures(f"Ray Train checkpointing (every {baseline_every} steps):", result["ray_train"]["failures"])
    print()
    print(format_table(result))
    ratio = result["ratio"]
    part = result["ratio_checkpoint_part"]
    equal = result["ratio_equal_stall"]
    print(
        f"stall after the warm-up (step {warm_up_steps} on): Ray Train {base_stall * 1e3:.1f} ms per checkpoint, "
        f"ray_ckpt {result['ray_ckpt']['steady_stall_s'] * 1e3:.1f} ms per step, in place "
        f"{result['in_place']['steady_stall_s'] * 1e3:.1f} ms per step; over the whole run: "
        f"{base_stall_whole * 1e3:.1f}, {result['ray_ckpt']['mean_stall_s'] * 1e3:.1f}, "
        f"{result['in_place']['mean_stall_s'] * 1e3:.1f} ms"
    )
    print(
        f"wasted time per failure: Ray Train / ray_ckpt = {equal:.2f}x at equal stall (Ray Train every "
        f"{result['equal_stall_every']} steps); {ratio:.2f}x measured with Ray Train every {baseline_every} steps"
        if ratio is not None and equal is not None
        else "wasted time per failure: no measured failure on one side"
    )
    in_place_equal = result["ratio_in_place_equal_stall"]
    whole = result["ratio_in_place_whole_run_equal_stall"]
    if in_place_equal is not None and whole is not None:
        print(
            f"wasted time per failure in place: Ray Train / ray_ckpt in place = {in_place_equal:.2f}x at equal "
            f"stall after the warm-up (Ray Train every {result['equal_stall_every_in_place']} steps), {whole:.2f}x "
            f"at the whole run's (every {result['equal_stall_every_in_place_whole_run']}); "
            f"{result['ratio_in_place']:.2f}x measured with Ray Train every {baseline_every} steps"
        )
    if part is not None:
        print(f"checkpoint-dependent part (lost work + restore, no detect/restart): {part:.1f}x")
    for key, what in (("time_to_resume_s", "time to resume"), ("training_again_s", "until training runs again")):
        ours, theirs = result["in_place"].get(f"median_{key}"), result["ray_train"].get(f"median_{key}")
        if ours is not None and theirs:
            print(f"{what}, median: in place {ours:.2f} s, Ray Train {theirs:.2f} s = {ours / theirs:.2f}x")
    write_json(args.json, result, default=str)
    if not args.quick and ratio is not None:
        draw_plot(args.plots, "bench_goodput.png", lambda path: plot(result, path))
    sides = ("in_place", "ray_ckpt", "ray_train")
    measured = [f for side in sides for f in result[side]["failures"] if f["wasted_s"] is not None]
    return 0 if len(measured) == len(sides) * failures else 1


if __name__ == "__main__":
    sys.exit(main())
