"""A long run of the commit protocol's model test (tests/unit/test_protocol_model.py): the same
state machine over many more generated interleavings, with a seed, printing the first violating
trace, shrunk, or the count of interleavings checked.

    python scripts/protocol_campaign.py --examples 200000 --seed 1 [--steps 40] [--workers 2] [--json PATH]

``--workers N`` splits the examples over N processes, seeds ``seed`` .. ``seed + N - 1``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "unit")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200_000, help="interleavings to generate")
    parser.add_argument("--steps", type=int, default=40, help="events per interleaving, at most")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="processes, each with its own seed")
    parser.add_argument("--json", type=pathlib.Path, help="write the counts and the wall time here")
    args = parser.parse_args(argv)
    if args.examples < 1 or args.steps < 1 or args.workers < 1:
        parser.error("--examples, --steps and --workers must be at least 1")
    if args.workers > 1:
        return _split(args)
    import logging

    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    logging.disable(logging.WARNING)  # a rebuilt-without-a-shard warning per restore is expected
    from test_protocol_model import CommitProtocol

    started = time.monotonic()
    config = settings(
        max_examples=args.examples,
        stateful_step_count=args.steps,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
    )
    import random

    random.seed(args.seed)
    from hypothesis import seed as hypothesis_seed

    failure = None
    try:
        hypothesis_seed(args.seed)(lambda: run_state_machine_as_test(CommitProtocol, settings=config))()
    except Exception as error:  # hypothesis attaches the shrunk trace as the error's notes
        failure = f"{type(error).__name__}: {error}"
        print("\n".join(getattr(error, "__notes__", [])), file=sys.stderr)
    wall = time.monotonic() - started
    report = {"examples": args.examples, "steps": args.steps, "seed": args.seed, "wall_s": round(wall, 1)}
    report["violation"] = failure
    print(json.dumps(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if failure else 0


def _split(args: argparse.Namespace) -> int:
    """Run the campaign in ``args.workers`` processes (seeds ``seed`` and up) and sum them."""
    import subprocess

    started = time.monotonic()
    share, extra = divmod(args.examples, args.workers)
    runs = []
    for worker in range(args.workers):
        examples = share + (1 if worker < extra else 0)
        command = [sys.executable, __file__, "--examples", str(examples), "--steps", str(args.steps)]
        command += ["--seed", str(args.seed + worker)]
        runs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
    reports = []
    for run in runs:
        out, _ = run.communicate()
        reports.append(json.loads(out.strip().splitlines()[-1]))
    violations = [r["violation"] for r in reports if r["violation"]]
    report = {
        "examples": sum(r["examples"] for r in reports),
        "steps": args.steps,
        "seeds": [r["seed"] for r in reports],
        "wall_s": round(time.monotonic() - started, 1),
        "violation": violations[0] if violations else None,
        "violations": len(violations),
    }
    print(json.dumps(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
