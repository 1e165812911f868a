"""Fault campaign in the network lab: failures that close no sockets, against in-place recovery.

Each trial runs ``scripts/train_example.py``'s job (2 DDP ranks, gloo, RS(1,1), in place with
``InPlaceRecovery()`` defaults, 0.25 s steps, every step saved) on a lab of 4 nodes (2 for the
ranks, 2 free for the replacement and warm spares) whose links run at ``--rate-gbit``, and
strikes rank 1's node once its step ``--at-step`` committed, with one fault kind:

- ``kill``: every process of the node SIGKILLed (sockets close);
- ``power``: its link down and its processes frozen, then killed after the trial;
- ``partition``: cut from the head (the GCS, the driver, the run's coordinator);
- ``slow``: its link at 1% of the rate for 8 s;
- ``flap``: its link down for 3 s, then up, its processes running.

Before the trials, the restore throughput over the shaped links is measured
(``lab_restore.py``: one rank's restore from its peers against its link's rate, and all ranks'
restores at once against the same bytes read from one storage node), each restore checked
against the saved bytes.

The oracle, per trial: the job ends; its final parameters are bit-identical to an uninterrupted
run's; after a lost rank the survivor kept its process (``survivors_kept``); no rank that kept
beating was taken for lost (``slow``: ``live_ranks_lost`` counts the recoveries it caused; a
``flap`` silences the node long enough to have it fenced, as ``power`` does); no step was
committed by two incarnations (the registry's committed steps each name one attempt, and none
after the last restore's step is an older incarnation's). Measured: ``detect_s``, from the fault
to the survivor leaving its collective (its rejoin's ``detected``); ``resume_s``, from the fault
to rank 0's first step done by the group that restored after it (a node cut from the head only
may train on with its peers until Ray declares it dead: that time counts).

With ``--quick --one-job`` every kind strikes one job in turn (those that lose no node first,
then one node lost per kind, each strike once ``GAP_STEPS`` more steps committed after the one
before), on a lab with a free node for each loss; each strike is judged in its window, up to the
next, and the final parameters and committed steps once for the job.

    sudo python scripts/lab_campaign.py --quick --json out.json     # one trial per kind
    sudo python scripts/lab_campaign.py --quick --one-job --json out.json   # the same at one job
    sudo python scripts/lab_campaign.py --trials 40 --seed 1 --json out.json

Prints a table per kind and writes ``{"trials", "violations", "violation_details", "kinds":
{kind: {"trials", "detect_s", "resume_s", "survivors_kept", "bit_exact", "live_ranks_lost"}},
"restore": {"link_gbps", "one_rank_vs_link", "all_ranks_vs_storage_node", ...}, "rate_gbit",
"seed"}``. Needs root (see docs/failure-simulation.md).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import lab_restore
from benchutil import MIB, add_json_flag, make_parser, write_json

KINDS = ("kill", "power", "partition", "slow", "flap")
STEPS = 40
STEP_SLEEP_S = 0.25
CHECKPOINT = {"data_shards": 1, "parity_shards": 1}
SLOW_S = 8.0
FLAP_S = 3.0
LOSES_NODE = ("kill", "power", "partition", "flap")  # the node is lost (a flap's is fenced while silent)
ONE_JOB_STEPS = 80  # --one-job: room for every kind's strike, GAP_STEPS apart, and the slow link's 8 s
GAP_STEPS = 4


def load_example() -> Any:
    import importlib.util
    import pathlib

    import ray

    spec = importlib.util.spec_from_file_location("train_example", pathlib.Path(__file__).with_name("train_example.py"))
    if spec is None or spec.loader is None:
        raise RuntimeError("scripts/train_example.py is missing")
    example = importlib.util.module_from_spec(spec)
    sys.modules["train_example"] = example
    spec.loader.exec_module(example)
    ray.cloudpickle.register_pickle_by_value(example)  # workers cannot import scripts/
    return example


class LabCampaign:
    """Trials on one lab; a struck node is brought back (processes killed, raylet restarted
    in its namespace) before the next trial."""

    def __init__(self, lab: Any, example: Any, rate_gbit: float, keep_logs: str | None = None) -> None:
        self.lab, self.example, self.rate_gbit, self.keep_logs = lab, example, rate_gbit, keep_logs
        self.results: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
        self.violations: list[str] = []
        self.reference = ""

    def run_reference(self, steps: int) -> None:
        """The uninterrupted run's digest over ``steps``, computed outside Ray (the trials must
        end on it)."""
        self.reference = self.example.uninterrupted_digest(steps=steps, workers=2)

    def trial(self, index: int, kind: str, at_step: int, last: bool = False) -> None:
        """One trial: the job run beside the fault, then checked; the struck node is brought
        back for the next trial (not after the ``last``: the lab goes down next)."""
        job, events = f"lab-{index}-{kind}", tempfile.mkdtemp()
        struck: dict[str, Any] = {}

        def fault() -> None:
            self.example.wait_committed(job, at_step)
            struck.update(self._strike(job, kind))

        what = f"trial {index} ({kind} of rank 1's node after step {at_step})"
        try:
            final, errors = self.example.run_beside(
                fault, name=job, storage_path=tempfile.mkdtemp(), events_dir=events, steps=STEPS, workers=2,
                checkpoint=CHECKPOINT, step_sleep_s=STEP_SLEEP_S, max_failures=4, in_place={}, log_steps=True,
            )  # fmt: skip
        except Exception as error:
            self.violations.append(f"{what}: the job failed: {type(error).__name__}: {error}")
            final, errors = None, []
        finally:
            if "node" in struck and not last:
                self._restore_node(struck["node"])
        before = len(self.violations)
        if errors:
            self.violations.append(f"{what}: the fault did not happen: {errors[0]!r}")
        else:
            self._check(what, kind, job, events, struck.get("time", 0.0), final)
        if len(self.violations) > before:
            self._keep_logs(f"trial-{index}-{kind}", events)

    def _keep_logs(self, name: str, events: str) -> None:
        """With ``--keep-logs``: Ray's logs and the job's records, for a trial that broke a rule."""
        if not self.keep_logs:
            return
        import shutil

        target = os.path.join(self.keep_logs, name)
        skip = shutil.ignore_patterns("sockets", "*.sock", "plasma*")
        shutil.copytree(self.lab.state.temp_dir, os.path.join(target, "ray"), ignore=skip, dirs_exist_ok=True)
        shutil.copytree(events, os.path.join(target, "events"), dirs_exist_ok=True)

    def _strike(self, job: str, kind: str) -> dict[str, Any]:
        """Strike the node of ``job``'s rank 1 with one fault ``kind`` (a slow link or a flap
        lasts its time, then heals); when it was struck, and the lab node."""
        from ray_ckpt.tools import link_faults, network_lab

        node_id = self.example.rank_node(job, 1)
        address = next(n.address for n in self.lab.nodes if self.lab.node_id(n) == node_id)
        found = network_lab.find_node(address)
        if found is None:
            raise RuntimeError(f"rank 1's node {address} is not a lab node")
        state, node = found
        struck = {"time": time.time(), "node": node}
        if kind == "kill":
            link_faults.kill(node)
        elif kind == "power":
            link_faults.link_down(node)
            link_faults.freeze(node)
        elif kind == "partition":
            link_faults.cut(node, state, "head")
        elif kind == "slow":
            network_lab.set_rate(node, self.rate_gbit * 0.01)
            time.sleep(SLOW_S)
            network_lab.set_rate(node, self.rate_gbit)
        elif kind == "flap":
            link_faults.link_down(node)
            time.sleep(FLAP_S)
            link_faults.link_up(node)
        return struck

    def one_job(self, kinds: list[str], at_step: int) -> None:
        """Every kind of ``kinds`` struck in turn at one job (``--one-job``): those that lose no
        node first, then one node lost per kind; each strike waits until ``GAP_STEPS`` more steps
        committed after the one before (for a lost node: the recovery done, and the job trained
        on). Each strike is judged as a trial of its kind, in its window (from it to the next):
        the recoveries that began there, the survivor's detection and the resume; the final
        parameters and the committed steps are the job's, judged once for all."""
        import ray_ckpt
        from ray_ckpt.transport.registry_client import RegistryClient

        order = sorted(kinds, key=lambda kind: kind in LOSES_NODE)  # stable: a slow link first
        registry = RegistryClient(ray_ckpt.settings.namespace())
        job, events = "lab-one-job", tempfile.mkdtemp()
        strikes: list[tuple[str, float]] = []

        def faults() -> None:
            step = at_step
            for kind in order:
                self.example.wait_committed(job, step)
                strikes.append((kind, self._strike(job, kind)["time"]))
                step = (registry.latest_committed(job) or 0) + GAP_STEPS

        what = f"one job ({', '.join(order)} of rank 1's node in turn)"
        before = len(self.violations)
        try:
            final, errors = self.example.run_beside(
                faults, name=job, storage_path=tempfile.mkdtemp(), events_dir=events, steps=ONE_JOB_STEPS,
                workers=2, checkpoint=CHECKPOINT, step_sleep_s=STEP_SLEEP_S, max_failures=len(order) + 2,
                in_place={}, log_steps=True,
            )  # fmt: skip
        except Exception as error:
            self.violations.append(f"{what}: the job failed: {type(error).__name__}: {error}")
            final, errors = None, []
        if errors:
            self.violations.append(f"{what}: a fault did not happen: {errors[0]!r}")
        ends = [t for _, t in strikes[1:]] + [float("inf")]
        for index, ((kind, struck), until) in enumerate(zip(strikes, ends, strict=True)):
            last = index == len(strikes) - 1
            self._check(f"{what}: {kind}", kind, job, events, struck, final, until=until, whole_job=last)
        if len(self.violations) > before:
            self._keep_logs("one-job", events)

    def _restore_node(self, node: Any) -> None:
        """Bring a struck node back for the next trial: rules and link healed, its processes
        killed, its raylet started again in its namespace."""
        from ray_ckpt.tools import link_faults, network_lab

        link_faults.uncut(node)
        link_faults.link_up(node)
        network_lab.set_rate(node, self.rate_gbit)
        self.lab.restart_node(node)  # kills what is left of it first

    def _check(
        self, what: str, kind: str, job: str, events: str, fault_s: float, final: Any,
        until: float = float("inf"), whole_job: bool = True,
    ) -> None:  # fmt: skip
        """Judge the fault struck at ``fault_s`` by what happened until ``until`` (the next
        strike at the same job); ``whole_job``: also the job's final parameters and committed
        steps (once per job)."""
        import ray_ckpt
        from ray_ckpt.transport.registry_client import RegistryClient

        restores = self.example.read_restores(events)
        attempts: dict[str, dict[int, dict[str, Any]]] = {}
        for record in restores:
            attempts.setdefault(record["attempt"], {})[record["rank"]] = record
        groups = list(attempts.values())
        # the groups that restored after this fault (and before the next one)
        after = [g for g in groups[1:] if fault_s <= min(r["time"] for r in g.values()) < until]
        recovered = bool(after)
        # training again: rank 0's first step done by the group that restored after the fault
        restored_at = min((r["time"] for g in after for r in g.values()), default=None)
        steps = [s for s in self.example.read_steps(events) if s["rank"] == 0 and s["time"] >= (restored_at or 0.0)]
        resume_s = steps[0]["time"] - fault_s if steps and restored_at is not None else None
        registry = RegistryClient(ray_ckpt.settings.namespace())
        rejoined = [e for e in registry.events()[1] if e.get("kind") == "rejoin" and e.get("job") == job]
        rejoins = [e for e in rejoined if e.get("role") == "survivor" and fault_s <= (e.get("detected") or 0) < until]
        detect_s = min((e["detected"] - fault_s for e in rejoins), default=None)
        replacements = [
            e for e in rejoined if e.get("role") == "replacement" and fault_s <= e["worker_started"] < until
        ]
        first = min(replacements, key=lambda e: e["worker_started"], default=None)
        replacement = None if first is None else {  # where the time to resume went: the replacement's start
            "warm_spare": first.get("warmed") is not None and first["warmed"] < fault_s,
            "process_started_s": round(first["process_started"] - fault_s, 3),
            "warmed_s": None if first.get("warmed") is None else round(first["warmed"] - fault_s, 3),
            "worker_started_s": round(first["worker_started"] - fault_s, 3),
            "ready_s": round(first["ready"] - fault_s, 3),
        }  # fmt: skip
        bit_exact = final is not None and final["params_digest"] == self.reference
        kept = recovered and after[0].get(0, {}).get("pid") == groups[0].get(0, {}).get("pid")
        live_lost = len(after) if kind not in LOSES_NODE else 0
        result = {"detect_s": detect_s, "resume_s": resume_s, "survivors_kept": kept, "bit_exact": bit_exact,
                  "recovered": recovered, "live_ranks_lost": live_lost, "replacement": replacement}  # fmt: skip
        self.results[kind].append(result)
        if whole_job and not bit_exact:
            self.violations.append(f"{what}: the final parameters differ from the uninterrupted run's")
        if kind in ("kill", "power", "partition") and not recovered:
            self.violations.append(f"{what}: no recovery was recorded")
        if kind in ("kill", "power", "partition") and recovered and not kept:
            self.violations.append(f"{what}: the survivor did not keep its process")
        if live_lost:
            self.violations.append(f"{what}: a rank that kept beating was taken for lost {live_lost} time(s)")
        if whole_job:
            problems, result["commits_checked"] = _commit_problems(registry, job, groups)
            self.violations.extend(f"{what}: {problem}" for problem in problems)
        print(f"{what}: {json.dumps(result)}", flush=True)

    def summary(self) -> dict[str, Any]:
        kinds = {}
        for kind, results in self.results.items():
            kinds[kind] = {
                "trials": len(results),
                "detect_s": [r["detect_s"] for r in results],
                "resume_s": [r["resume_s"] for r in results],
                "survivors_kept": all(r["survivors_kept"] for r in results if r["recovered"]) if results else None,
                "bit_exact": all(r["bit_exact"] for r in results) if results else None,
                "live_ranks_lost": sum(r["live_ranks_lost"] for r in results),
            }
        return {"trials": sum(len(r) for r in self.results.values()), "violations": len(self.violations),
                "violation_details": self.violations, "kinds": kinds}  # fmt: skip


def _commit_problems(registry: Any, job: str, groups: list[dict[int, dict[str, Any]]]) -> tuple[list[str], int]:
    """What the committed steps of ``job`` that ``registry`` (a ``RegistryClient``) still holds
    show against "no step committed by two incarnations": every record of a step, every rank's
    and shard's, names one attempt; and every step after the last group's restored one is that
    group's (an old incarnation awake again behind a link that came back committed nothing
    after it). With how many steps were checked."""
    last = groups[-1] if groups else {}
    last_attempt = next((r["attempt"] for r in last.values()), None)
    restored = max((r["restored_step"] for r in last.values() if r.get("restored_step") is not None), default=-1)
    problems = []
    steps = registry.call("committed_steps", job)
    for step in steps:
        records = registry.locate(job, step).values()
        metas = [m for record in records for m in [*record.metas.values(), record.local] if m is not None]
        attempts = sorted({m.attempt for m in metas})
        if len(attempts) != 1:
            problems.append(f"committed step {step} holds records of several incarnations: {attempts}")
        elif step > restored and last_attempt is not None and len(groups) > 1 and attempts[0] != last_attempt:
            problems.append(
                f"step {step}, after the last restore's step {restored}, was committed by {attempts[0]}, "
                f"not by the incarnation that restored ({last_attempt})"
            )
    return problems, len(steps)


def _median(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.2f}" if known else "-"


def format_table(summary: dict[str, Any]) -> str:
    lines = ["kind       trials  detect s (median)  resume s (median)  survivors kept  bit-exact  live lost"]
    for kind, row in summary["kinds"].items():
        lines.append(
            f"{kind:<10} {row['trials']:>6}  {_median(row['detect_s']):>17}  {_median(row['resume_s']):>17}  "
            f"{row['survivors_kept']!s:>14}  {row['bit_exact']!s:>9}  {row['live_ranks_lost']:>9}"
        )
    restore = summary.get("restore")
    if restore:
        lines.append(
            f"restore at {restore['link_gbps']} Gbit/s links, {restore['size_bytes'] // MIB} MiB per rank: one rank "
            f"{restore['one_rank_gbps']:.2f} Gbit/s ({restore['one_rank_vs_link']:.2f}x its link); "
            f"{restore['all_ranks']} ranks at once {restore['all_ranks_s']:.2f} s against "
            f"{restore['storage_node_s']:.2f} s from one storage node ({restore['all_ranks_vs_storage_node']:.2f}x)"
        )
    lines.append(f"violations: {summary['violations']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="one trial of each kind (of --kinds)")
    parser.add_argument(
        "--one-job",
        action="store_true",
        help="with --quick: strike every kind in turn at one job (one start of the job for all; a lab "
        "node more for each kind that loses one), not one job per kind",
    )
    parser.add_argument("--trials", type=int, default=10, help="trials, kinds drawn at random (default 10)")
    parser.add_argument("--seed", type=int, default=1, help="random seed (kinds, steps struck)")
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"fault kinds drawn, comma-separated (default {','.join(KINDS)})"
    )
    parser.add_argument("--rate-gbit", type=float, default=2.5, help="every node's link rate (default 2.5)")
    parser.add_argument("--at-step", type=int, default=10, help="strike after this step committed (default 10)")
    parser.add_argument(
        "--restore-mib",
        type=int,
        default=None,
        help="state per rank of the restore measurement (default 256, as --quick; 0: none)",
    )
    parser.add_argument("--keep-logs", metavar="DIR", help="copy Ray's logs of every trial with a violation here")
    add_json_flag(parser, "the summary")
    args = parser.parse_args(argv)
    kinds = [kind.strip() for kind in args.kinds.split(",") if kind.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        parser.error(f"--kinds takes some of {','.join(KINDS)}, got {args.kinds!r}")
    if args.trials < 1:
        parser.error(f"--trials must be at least 1, got {args.trials}")
    if args.one_job and not args.quick:
        parser.error("--one-job goes with --quick (one strike of each kind)")
    restore_mib = args.restore_mib if args.restore_mib is not None else 256
    if not 0 <= restore_mib <= 4096:
        parser.error(f"--restore-mib must be in 0..4096, got {restore_mib}")
    from ray_ckpt.tools import network_lab

    reason = network_lab.lab_unsupported()
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    rng = random.Random(args.seed)
    plan = kinds if args.quick else [rng.choice(kinds) for _ in range(args.trials)]
    import ray_ckpt

    # 2 nodes for the ranks and 2 free for the replacement and warm spares; at one job, a free
    # node for each kind that loses one (each loss's replacement takes one)
    nodes = 4 if not args.one_job else 2 + max(2, sum(kind in LOSES_NODE for kind in kinds))
    with network_lab.NetworkLab(nodes, rate_gbit=args.rate_gbit) as lab:
        lab.start()
        ray_ckpt.start(store_budget_bytes=max(256, 2 * restore_mib + 64) * MIB)
        restore = lab_restore.measure(lab, args.rate_gbit, restore_mib * MIB) if restore_mib else None
        if restore is not None:
            print(f"restore: {json.dumps(restore)}", flush=True)
        campaign = LabCampaign(lab, load_example(), args.rate_gbit, args.keep_logs)
        campaign.run_reference(ONE_JOB_STEPS if args.one_job else STEPS)
        if args.one_job:
            campaign.one_job(plan, args.at_step)
        for index, kind in enumerate(plan if not args.one_job else []):
            step = args.at_step if args.quick else rng.randint(5, 15)
            campaign.trial(index, kind, step, last=index == len(plan) - 1)
        summary = {**campaign.summary(), "restore": restore, "rate_gbit": args.rate_gbit, "seed": args.seed}
    print(format_table(summary))
    write_json(args.json, summary)
    return 0 if summary["violations"] == 0 else 1


if __name__ == "__main__":
    threading.current_thread().name = "lab_campaign"
    sys.exit(main())
