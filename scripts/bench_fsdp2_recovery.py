"""Time to resume of an FSDP2 job of 4 ranks after a node kill: in place against a full restart.

The job is scripts/train_example.py's FSDP2 run with every Linear its own ``fully_shard`` unit
under the root's (all-gathers and reduce-scatters on the mesh in every step), 4 ``TorchTrainer``
workers over gloo, ray_ckpt every step, on a simulated cluster (``ray_ckpt.testing.SimulatedCluster``:
a head with no CPUs plus one-CPU worker nodes on this machine). One uninterrupted reference run,
then, per mode, the same job with rank 2's node hard-killed a seeded 0..``--step-sleep-s``
seconds after step ``--kill-after`` committed (a random point of a step):

* in place: ``ray_ckpt.train.InPlaceRecovery()`` with its defaults, only rank 2's worker is
  replaced, the survivors keep their processes;
* full restart: Ray Train restarts the whole worker group, every rank restores from peer memory.

A free node per mode stands ready for the replacement, and each run has ``max_failures=1``: a
mode that took more than one of Ray Train's failures for the one node loss fails the run. Per
mode: time to resume (the kill to the first step the new group computed, as rank 0 records it)
and to every rank restored, the survivors that kept their process, the attempts the run went
through, the step restored, and whether the final parameters are bit-identical to the
reference run's.

JSON: ``{"benchmark": "fsdp2_recovery", "steps", "kill_after", "modes": {"in_place": {...},
"full_restart": {...}}, "ratio"}`` with each mode's ``resume_s``, ``restored_s``,
``survivors_kept``, ``attempts``, ``restored_step``, ``bit_exact``; ``ratio``: in place's time to
resume over the full restart's.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from typing import Any

import ray.cloudpickle
import train_example
from benchutil import (
    BenchError,
    add_json_flag,
    add_steps_flags,
    make_parser,
    on_private_ray,
    render_table,
    write_json,
)

ray.cloudpickle.register_pickle_by_value(train_example)  # Ray workers cannot import this folder

WORKERS = 4
KILLED_RANK = 2
# InPlaceRecovery's arguments, or none; in place last: its warm spares stay up as idle workers
MODES: dict[str, dict[str, Any] | None] = {"full_restart": None, "in_place": {}}


def job_arguments(steps: int) -> dict[str, Any]:
    """``train_example.run``'s arguments every run of this benchmark shares."""
    return {
        "storage_path": tempfile.mkdtemp(),
        "steps": steps,
        "workers": WORKERS,
        "checkpoint": {"data_shards": 2, "parity_shards": 2},
        "fsdp2": True,
        "fsdp2_per_layer": True,
    }


def run_mode(sim: Any, mode: str, args: Any, reference: str, seed: int) -> dict[str, Any]:
    """One killed run of ``mode``; its row."""
    example = train_example
    job = f"fsdp2-{mode.replace('_', '-')}"
    events = tempfile.mkdtemp()
    killed: dict[str, float] = {}

    def fault() -> None:
        example.wait_committed(job, args.kill_after)
        time.sleep(random.Random(seed).uniform(0.0, args.step_sleep_s))
        node = example.rank_node(job, KILLED_RANK)
        killed["time"] = time.time()
        example.remove_node(sim, node)

    final, failures = example.run_beside(
        fault,
        name=job,
        events_dir=events,
        step_sleep_s=args.step_sleep_s,
        max_failures=1,  # one node loss may use one failure, no more
        in_place=MODES[mode],
        **job_arguments(args.steps),
    )
    if failures or "time" not in killed:
        raise BenchError(f"{mode}: the kill did not happen: {failures}")
    restores = example.read_restores(events)
    attempts = list(dict.fromkeys(r["attempt"] for r in restores))
    after = [r for r in restores if r["attempt"] != attempts[0]]
    if not after:
        raise BenchError(f"{mode}: no rank restored after the kill")
    first_pids = {r["rank"]: r["pid"] for r in restores if r["attempt"] == attempts[0]}
    last = [r for r in restores if r["attempt"] == attempts[-1]]
    kept = sorted(r["rank"] for r in last if first_pids.get(r["rank"]) == r["pid"])
    steps_after = [s for s in example.read_step_digests(events) if s["attempt"] == attempts[-1]]
    if not steps_after:
        raise BenchError(f"{mode}: the new group computed no step")
    return {
        "resume_s": min(s["time"] for s in steps_after) - killed["time"],
        "restored_s": max(r["time"] for r in last) - killed["time"],
        "survivors_kept": kept,
        "attempts": len(attempts),
        "restored_step": max(r["restored_step"] for r in last),
        "bit_exact": final["params_digest"] == reference,
    }


def table(modes: dict[str, dict[str, Any]]) -> str:
    lines = [("mode", "resume s", "restored s", "survivors kept", "attempts", "restored step", "bit-exact")]
    for mode, row in modes.items():
        lines.append(
            (
                mode.replace("_", " "),
                f"{row['resume_s']:.2f}",
                f"{row['restored_s']:.2f}",
                ",".join(map(str, row["survivors_kept"])) or "none",
                str(row["attempts"]),
                str(row["restored_step"]),
                "yes" if row["bit_exact"] else "NO",
            )
        )
    return render_table(lines)


def measure_modes(args: Any) -> dict[str, dict[str, Any]]:
    """On one simulated cluster: the reference run, then a killed run of each mode (a free node
    added for the next); each mode's row."""
    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.tools import quiet

    with SimulatedCluster(WORKERS + 1, store_budget_bytes=256 << 20, logging_level="ERROR") as sim:
        quiet.quiet_driver()  # Ray's messages about the killed nodes stay in its logs
        print(
            f"FSDP2 per layer, {WORKERS} workers, {args.steps} steps, "
            f"rank {KILLED_RANK}'s node killed after step {args.kill_after} committed"
        )
        reference = train_example.run(
            name="fsdp2-reference", events_dir=tempfile.mkdtemp(), step_sleep_s=0.0, **job_arguments(args.steps)
        )["params_digest"]
        modes = {}
        for n, mode in enumerate(MODES):
            modes[mode] = run_mode(sim, mode, args, str(reference), args.seed + n)
            sim.add_workers(1)  # the next mode's free node
    return modes


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, "See the module docstring for what is measured.")
    add_steps_flags(parser, 30, step_sleep_s=0.3)
    parser.add_argument("--kill-after", type=int, default=10, help="kill once this step committed (default 10)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the kills' delays (default 1)")
    add_json_flag(parser, "the report")
    args = parser.parse_args(argv)
    if not 0 < args.kill_after < args.steps - 2:
        parser.error("--kill-after must be in 1..steps-3")
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    modes = on_private_ray("rckf", lambda: measure_modes(args), clean=lambda m: all(r["bit_exact"] for r in m.values()))
    if modes is None:
        return 1
    ratio = modes["in_place"]["resume_s"] / modes["full_restart"]["resume_s"]
    print(table(modes))
    print(f"time to resume in place / full restart: {ratio:.2f}x")
    document = {
        "benchmark": "fsdp2_recovery",
        "steps": args.steps,
        "kill_after": args.kill_after,
        "modes": modes,
        "ratio": ratio,
    }
    write_json(args.json, document)
    return 0 if all(row["bit_exact"] for row in modes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
