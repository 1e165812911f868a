"""The ``ray-ckpt`` command line: deploy, inspect and remove the ray_ckpt service on a Ray cluster.

Subcommands (each connects to a running Ray cluster: ``--address``, default ``auto``):

- ``start``: one shard store per alive node plus the registry (idempotent: run it again after
  nodes join; existing stores keep their budget).
- ``status``: per node, memory used / budget, shards and jobs; per job, committed steps, the
  latest one and its protection (how many more node failures it survives). ``--json`` prints
  ``ray_ckpt.service.status()`` as JSON.
- ``stop``: kill the stores and the registry (every checkpoint they hold is gone).
- ``drop JOB``: remove one job's checkpoints from the registry and every store; other jobs are
  untouched (``ray_ckpt.service.drop``).
- ``kill-node``: simulate failures (``ray_ckpt.tools.chaos``): crash nodes (``--node``, ``--random``),
  at random with a mean time between failures (``--mtbf``), or while a save is in flight
  (``--during-save``); ``--fault store`` (or ``--store-only``) kills just the ray_ckpt store. Prints what was killed
  and when Ray declared it dead.
- ``dashboard``: a web page of recoveries (phases, time to resume), save stalls, memory per
  node, shard placement and protection, from events files (``--events``, no cluster needed)
  and/or live; ``--export report.html`` writes it as one self-contained file.

Errors (no Ray cluster, no ray_ckpt service, a ray_ckpt error) print one line to stderr and
exit with status 1. The commands print their own output only: Ray's messages about the cluster
(nodes marked dead, workers lost) stay in Ray's log files (``ray_ckpt.tools.quiet``), and
``kill-node`` says where those are.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray

from ray_ckpt import service, settings
from ray_ckpt.core.wire import KillResult
from ray_ckpt.errors import CliError, ConfigError, RayCkptError, unwrap_remote
from ray_ckpt.tools import chaos, faults, link_faults, quiet
from ray_ckpt.transport import naming

PROG = "ray-ckpt"
MIB = 1 << 20
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_STOP_WAIT_S = 30.0


Handler = Callable[[argparse.Namespace], int]


# ---- parsing ------------------------------------------------------------------------------


def parse_bytes(text: str) -> int:
    """``1073741824``, ``512MiB``, ``1.5GiB``, ``2G`` (binary units) -> bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, flags=re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (e.g. 1073741824, 512MiB, 2GiB)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--address",
        default=None,
        help="Ray cluster address (host:port of the GCS); default: auto-detect, or RAY_ADDRESS",
    )
    common.add_argument(
        "--namespace",
        default=None,
        help="Ray namespace of the ray_ckpt actors (default: RAY_CKPT_NAMESPACE or 'ray_ckpt')",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Erasure-coded in-memory checkpoints on a Ray cluster: manage the ray_ckpt service.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _common_options()

    start = commands.add_parser(
        "start",
        parents=[common],
        help="deploy a shard store on every alive node and the registry",
        description="Deploy one shard store per alive node and the registry (idempotent: run it again "
        "after nodes join). Existing stores keep their budget; `stop` first to change it.",
    )
    budget = start.add_mutually_exclusive_group()
    budget.add_argument(
        "--budget-bytes",
        type=parse_bytes,
        metavar="N",
        help="memory each store may hold, in bytes (suffixes KiB/MiB/GiB/TiB accepted)",
    )
    budget.add_argument(
        "--budget-fraction",
        type=float,
        metavar="F",
        help="share of each node's total memory a store may hold, in (0, 0.9] "
        "(default RAY_CKPT_STORE_BUDGET_FRACTION or 0.25)",
    )
    start.set_defaults(handler=_cmd_start)

    status = commands.add_parser(
        "status",
        parents=[common],
        help="show stores (memory, shards, jobs) and jobs (committed steps, protection)",
        description="Per node: memory used / budget, shards, jobs. Per job: committed steps, the latest "
        "one and its protection: how many more node failures the latest step survives.",
    )
    status.add_argument("--json", action="store_true", help="print ray_ckpt.service.status() as JSON")
    status.set_defaults(handler=_cmd_status)

    stop = commands.add_parser(
        "stop",
        parents=[common],
        help="kill the stores and the registry (their checkpoints are lost)",
        description="Kill every store and the registry of the namespace; the checkpoints they hold are gone.",
    )
    stop.set_defaults(handler=_cmd_stop)

    drop = commands.add_parser(
        "drop",
        parents=[common],
        help="remove one job's checkpoints (other jobs keep theirs)",
        description="Remove every checkpoint of JOB from the registry and from every store; other jobs "
        "are untouched. Fails if the registry knows no such job.",
    )
    drop.add_argument("job", metavar="JOB", help="the job name (as `status` lists it)")
    drop.set_defaults(handler=_cmd_drop)
    _add_kill_node(commands, common)
    _add_dashboard(commands, common)
    return parser


# ---- connecting ---------------------------------------------------------------------------


def _namespace(args: argparse.Namespace) -> str:
    return str(args.namespace or settings.namespace())


def _check_reachable(address: str) -> None:
    """Fail fast on a host:port nobody listens on (ray.init would retry for minutes)."""
    if address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise CliError(f"no Ray cluster at {address} ({reason}); check --address or RAY_ADDRESS") from None


def _connect(args: argparse.Namespace) -> bool:
    """Connect to the cluster unless this process already is; True if it connected here."""
    if ray.is_initialized():
        return False
    address = args.address or "auto"
    _check_reachable(args.address or os.environ.get("RAY_ADDRESS") or address)
    ray.init(
        address=address,
        namespace=_namespace(args),
        log_to_driver=False,
        logging_level=logging.ERROR,
    )
    quiet.quiet_driver()
    return True


# ---- commands -----------------------------------------------------------------------------


def _service_actors(namespace: str) -> list[str]:
    """Names of the live ray_ckpt actors (registry, stores) in ``namespace``."""
    return sorted(
        entry["name"]
        for entry in ray.util.list_named_actors(all_namespaces=True)
        if entry["namespace"] == namespace
        and (entry["name"] == naming.REGISTRY_NAME or entry["name"].startswith(naming.STORE_PREFIX))
    )


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:.1f}"


def _short(node_id: str | None) -> str:
    return "-" if node_id is None else _shown(node_id[:12])


def _shown(text: object) -> str:
    """``text`` with every character a terminal would act on (controls, escape sequences, bidi
    overrides: all that ``str.isprintable`` refuses) written as its Python escape, so names
    from the cluster (a job's, any) never reach the operator's terminal raw."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def _cmd_start(args: argparse.Namespace) -> int:
    namespace = _namespace(args)
    info = service.start(
        store_budget_bytes=args.budget_bytes, store_budget_fraction=args.budget_fraction, namespace=namespace
    )
    report = service.status(namespace=namespace)
    budgets = [n["budget_bytes"] for n in report["nodes"].values() if "budget_bytes" in n]
    line = f"ray_ckpt is running in namespace {namespace!r}: {len(info['stores'])} store(s)"
    if budgets:
        low, high = min(budgets), max(budgets)
        line += f", budget {_mib(low)} MiB" if low == high else f", budget {_mib(low)}-{_mib(high)} MiB"
        line += f" each ({_mib(sum(budgets))} MiB in all)"
    print(f"{line}; registry on node {_short(info['registry_node_id'])}")
    print(info["margin"])
    if args.budget_bytes is not None and any(b != args.budget_bytes for b in budgets):
        kept = sum(b != args.budget_bytes for b in budgets)
        print(
            f"note: {kept} existing store(s) kept their budget; run `{PROG} stop` first to change it",
            file=sys.stderr,
        )
    return 0


def _protection(value: int | None, full: int | None = None) -> str:
    if value is None:
        return "-"
    if value < 0:
        return f"{value} (LOST: some rank cannot be rebuilt from memory)"
    degraded = f" of {full}, DEGRADED: fewer stores than k+m" if full is not None and value < full else ""
    if value == 0:
        return f"0{degraded} (one more node failure may lose it)"
    return f"{value}{degraded}"


def _interval(summary: Any) -> str:
    """A job's ``every="auto"`` interval summary as "16 (optimum)" or "8-16 (keep-up)"."""
    if not isinstance(summary, dict) or summary.get("low") is None:
        return "-"
    low, high = summary["low"], summary.get("high", summary["low"])
    steps = str(low) if low == high else f"{low}-{high}"
    return f"{steps} ({_shown(summary.get('reason'))})"


def _steps(steps: Sequence[int]) -> str:
    if not steps:
        return "-"
    shown = [str(s) for s in steps[-4:]]
    return ("..., " if len(steps) > 4 else "") + ", ".join(shown)


def _table(header: Sequence[str], rows: list[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for n, row in enumerate([header, *rows]):
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return lines


def format_status(report: dict[str, Any], nodes_without_store: int = 0) -> str:
    """``service.status()`` as text tables: nodes, then jobs (names escaped: ``_shown``)."""
    lines = [f"ray_ckpt in namespace {report['namespace']!r} (registry: {report['registry']})", ""]
    node_rows: list[Sequence[str]] = []
    for node_id, stats in sorted(report["nodes"].items()):
        if "error" in stats:
            node_rows.append((_short(node_id), "-", "-", "-", "-", f"unreachable: {_shown(stats['error'])}"))
            continue
        budget, used = stats["budget_bytes"], stats["used_bytes"]
        share = f"{100 * used / budget:.0f}%" if budget else "-"
        jobs = ", ".join(_shown(job) for job in sorted(stats.get("jobs", {}))) or "-"
        node_rows.append((_short(node_id), _mib(used), _mib(budget), share, str(stats["shards"]), jobs))
    lines += _table(("NODE", "USED MiB", "BUDGET MiB", "USE", "SHARDS", "JOBS"), node_rows, {1, 2, 3, 4})
    if nodes_without_store:
        lines.append(
            f"({nodes_without_store} alive node(s) have no store yet: the registry starts one on every node "
            "that joins within RAY_CKPT_STORE_WATCH_INTERVAL_S)"
        )
    lines.append("")
    if not report["jobs"]:
        lines.append("no jobs have checkpoints")
        return "\n".join(lines)
    job_rows: list[Sequence[str]] = []
    for job, info in sorted(report["jobs"].items()):
        staged = info.get("staged") or {}
        in_flight = ", ".join(
            f"{step} ({len(ranks)}/{info['world_size']} ranks)" for step, ranks in sorted(staged.items())
        )
        job_rows.append(
            (
                _shown(job),
                str(info.get("world_size", "-")),
                _steps(info["committed_steps"]),
                str(info["latest_committed"]) if info.get("latest_committed") is not None else "-",
                _mib(info.get("payload_bytes_per_step")),
                _protection(info.get("protection"), info.get("full_protection")),
                _interval(info.get("interval")),
                in_flight or "-",
            )
        )
    header = ("JOB", "RANKS", "COMMITTED", "LATEST", "MiB/STEP", "PROTECTION", "AUTO EVERY", "STAGED ONLY")
    lines += _table(header, job_rows, {1, 3, 4})
    lines.append("")
    lines.append("PROTECTION: how many more node failures the latest committed step survives")
    if any(info.get("interval") for info in report["jobs"].values()):
        lines.append(
            'AUTO EVERY: the steps between saves that every="auto" chose (a range when ranks differ; '
            "all of them save the multiples of the larger), and why"
        )
    return "\n".join(lines)


def _cmd_status(args: argparse.Namespace) -> int:
    namespace = _namespace(args)
    report = service.status(namespace=namespace)
    if not report["nodes"] and report["registry"] != "alive":
        raise CliError(
            f"no ray_ckpt service is running in namespace {namespace!r} on this cluster: run "
            f"`{PROG} start` (or pass the right --namespace)"
        )
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        alive = naming.alive_node_ids()
        print(format_status(report, nodes_without_store=len(alive - set(report["nodes"]))))
    if report["registry"] != "alive":
        print(
            f"warning: the registry is missing; `{PROG} start` recreates it from the stores' shards",
            file=sys.stderr,
        )
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    namespace = _namespace(args)
    before = _service_actors(namespace)
    if not before:
        print(f"no ray_ckpt service is running in namespace {namespace!r}; nothing to stop")
        return 0
    service.shutdown(namespace=namespace)
    deadline = time.monotonic() + _STOP_WAIT_S
    while (left := _service_actors(namespace)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        raise CliError(f"{len(left)} ray_ckpt actor(s) still alive {_STOP_WAIT_S:.0f}s after stop: {left}")
    stores = sum(name.startswith(naming.STORE_PREFIX) for name in before)
    registry = " and the registry" if naming.REGISTRY_NAME in before else ""
    print(
        f"stopped ray_ckpt in namespace {namespace!r}: removed {stores} store(s){registry}; "
        "the checkpoints they held are gone"
    )
    return 0


def _cmd_drop(args: argparse.Namespace) -> int:
    namespace = _namespace(args)
    service.drop(args.job, namespace=namespace)
    print(f"dropped job {args.job!r} in namespace {namespace!r}: its checkpoints are gone from the registry and stores")
    return 0


# ---- kill-node ----------------------------------------------------------------------------


def _add_kill_node(commands: Any, common: argparse.ArgumentParser) -> None:
    kill = commands.add_parser(
        "kill-node",
        parents=[common],
        help="simulate failures: crash nodes (or only their ray_ckpt store)",
        description="Crash nodes as a machine crash would: SIGKILL the node's raylet and every process "
        "under it (workers, agents) from a Ray actor pinned to that node, then wait until Ray declares "
        "it dead. Kills are recorded as events in the ray_ckpt registry when the service runs. The head "
        "node and the node this command is connected through are never picked.",
    )
    which = kill.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--node",
        action="append",
        metavar="ID",
        help="the node to kill: its node id or a unique prefix (as `status` prints); repeat to kill "
        "several at the same moment",
    )
    which.add_argument("--random", action="store_true", help="kill --count random alive non-head nodes at once")
    which.add_argument(
        "--mtbf",
        type=float,
        metavar="S",
        help="kill --kills random nodes one at a time, after exponentially distributed gaps with mean S seconds",
    )
    which.add_argument(
        "--during-save",
        metavar="JOB",
        help="wait until a step of JOB is staged by some but not all ranks, then kill a node holding "
        "shards that the ranks already staged",
    )
    kill.add_argument("--count", type=int, default=1, metavar="N", help="with --random: how many nodes (default 1)")
    kill.add_argument("--kills", type=int, default=1, metavar="N", help="with --mtbf: how many kills (default 1)")
    kill.add_argument(
        "--holding",
        metavar="JOB",
        help="with --random or --mtbf: prefer nodes that hold shards of JOB's latest committed step",
    )
    kill.add_argument("--min-step", type=int, metavar="STEP", help="with --during-save: only steps >= STEP")
    kill.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="with --during-save: give up after S seconds without a save in flight (default 600)",
    )
    kill.add_argument(
        "--fault",
        choices=sorted(faults.FAULTS) + sorted(link_faults.LAB_FAULTS),
        default="node",
        help="what a kill does: node (or kill) = crash the whole node, its sockets close (default); store = kill "
        "only its ray_ckpt store actor, the node stays alive. On a network lab's nodes only (scripts/lab.py): "
        "power = link down and processes frozen, nothing closes; partition = cut from the head (--side peers: "
        "from its peers); slow = the link at --fraction of its rate for --duration; flap = the link down for "
        "--duration, processes running",
    )
    kill.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="lab faults: how long it lasts (slow: default 30; flap: default 3; partition: 0 = until the lab "
        "heals it; power: kill the frozen processes after S, 0 = leave them frozen); the command waits it out",
    )
    kill.add_argument(
        "--side", choices=("head", "peers"), default="head", help="--fault partition: what the node is cut from"
    )
    kill.add_argument(
        "--fraction", type=float, metavar="F", help="--fault slow: the share of its rate the link keeps (default 0.01)"
    )
    kill.add_argument(
        "--drain",
        type=float,
        metavar="S",
        help="with --node or --random: a planned loss, as a preemption notice gives one: tell Ray each node "
        "drains with a deadline S seconds away (as `ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION "
        "--deadline-remaining-seconds S`), then strike the fault at the deadline",
    )
    kill.add_argument("--store-only", action="store_true", help="the same as --fault store")
    kill.add_argument("--seed", type=int, help="random seed (victims, gaps)")
    kill.add_argument(
        "--allow-head",
        action="store_true",
        help="with --node: allow killing the head node's raylet (the GCS keeps running; see docs). This also "
        "kills the ray_ckpt registry, which is pinned to the head node and cannot restart elsewhere: saves and "
        "restores fail until the cluster is restarted. Asks for confirmation first unless --yes",
    )
    kill.add_argument(
        "--yes",
        action="store_true",
        help="with --allow-head: kill the head node without asking (needed when stdin is not a terminal)",
    )
    kill.add_argument(
        "--wait-dead",
        type=float,
        default=60.0,
        metavar="S",
        help="wait up to S seconds for Ray to declare each victim dead; 0: do not wait (default 60)",
    )
    kill.add_argument("--json", action="store_true", help="print the results as JSON (no progress lines)")
    kill.set_defaults(handler=_cmd_kill_node)


def _check_kill_args(args: argparse.Namespace) -> None:
    mode = "--node" if args.node else "--random" if args.random else "--mtbf" if args.mtbf is not None else None
    mode = mode or "--during-save"
    misplaced = [
        (args.count != 1 and not args.random, "--count", "--random"),
        (args.kills != 1 and args.mtbf is None, "--kills", "--mtbf"),
        (args.holding is not None and not (args.random or args.mtbf is not None), "--holding", "--random or --mtbf"),
        (args.min_step is not None and args.during_save is None, "--min-step", "--during-save"),
        (args.allow_head and not args.node, "--allow-head", "--node"),
        (args.yes and not args.allow_head, "--yes", "--allow-head"),
        (args.drain is not None and not (args.node or args.random), "--drain", "--node or --random"),
        (args.drain is not None and args.allow_head, "--drain", "--node or --random without --allow-head"),
    ]
    for wrong, option, allowed in misplaced:
        if wrong:
            raise CliError(f"{option} goes with {allowed}, not with {mode}")
    if args.count < 1 or args.kills < 1:
        raise CliError("--count and --kills must be >= 1")
    if args.mtbf is not None and not args.mtbf > 0:
        raise CliError("--mtbf must be > 0 seconds")
    if args.drain is not None and not args.drain > 0:
        raise CliError("--drain must be > 0 seconds (the deadline the drain gives)")


def resolve_node(text: str) -> str:
    """The id of the one alive node whose id starts with ``text``."""
    alive = sorted(naming.alive_node_ids())
    matches = [n for n in alive if n.startswith(text.strip().lower())]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        dead = [n.node_id for n in naming.nodes() if n.node_id.startswith(text) and not n.alive]
        state = "is already dead" if dead else "matches no node of this cluster"
        raise CliError(f"node {text!r} {state} (alive: {', '.join(_short(n) for n in alive) or 'none'})")
    raise CliError(f"node prefix {text!r} is ambiguous: {', '.join(matches)}")


def _clock(moment: float | None) -> str:
    if moment is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(moment)) + f".{int(moment * 1000) % 1000:03d}"


def _kill_progress(kind: str, result: KillResult) -> None:
    node = _short(result.node_id)
    host = f" on host {result.host}" if result.host else ""
    if kind == "drain":
        print(f"drained node {node}{host} at {_clock(result.kill_time)} (a preemption notice)", flush=True)
    elif kind == "kill" and result.mode == "store":
        print(f"killed the ray_ckpt store of node {node}{host} at {_clock(result.kill_time)}", flush=True)
    elif kind == "kill" and result.mode in link_faults.LAB_FAULTS:
        print(f"struck node {node}{host} with {result.mode} at {_clock(result.kill_time)}", flush=True)
    elif kind == "kill":
        when = _clock(result.kill_time)
        print(f"killed node {node}{host} at {when} (SIGKILL to its raylet and every process under it)", flush=True)
    elif result.dead_time is not None and result.details.get("gone_before_kill"):
        print(f"  node {node}: was declared dead before the kill (its ranks had handed their places over)", flush=True)
    elif result.dead_time is not None:
        what = "store is gone" if result.mode == "store" else "declared dead by Ray"
        took = result.dead_time - result.kill_time
        print(f"  node {node}: {what} at {_clock(result.dead_time)}, {took:.2f}s after the kill", flush=True)


def confirm_head_kill(head: str, *, yes: bool) -> None:
    """Go on only if the operator confirms killing the head node (or passed ``--yes``): it takes
    the ray_ckpt registry with it for good. CliError when not confirmed, or when stdin is not a
    terminal to ask on."""
    if yes:
        return
    warning = (
        f"node {_short(head)} is the head node: killing its raylet also kills the ray_ckpt registry, which is "
        "pinned to the head node and cannot restart elsewhere, so saves and restores fail until the cluster is "
        "restarted"
    )
    if not sys.stdin.isatty():
        raise CliError(f"{warning}; refusing without --yes (stdin is not a terminal to confirm on)")
    try:
        answer = input(f"{warning}. Kill it? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise CliError("the head node was not killed (not confirmed)")


def _fault_of(args: argparse.Namespace) -> faults.Fault:
    """The fault ``--fault`` names, with the lab faults' options."""
    lab_only = [(args.duration is not None, "--duration"), (args.fraction is not None, "--fraction"),
                (args.side != "head", "--side")]  # fmt: skip
    if args.store_only or args.fault not in link_faults.LAB_FAULTS:
        for given, option in lab_only:
            if given:
                raise CliError(f"{option} goes with a lab fault (--fault {'/'.join(link_faults.LAB_FAULTS)})")
        return faults.FAULTS["store" if args.store_only else args.fault]()
    options: dict[str, Any] = {} if args.duration is None else {"duration_s": args.duration}
    if args.fault == "partition":
        options["side"] = args.side
    elif args.side != "head":
        raise CliError("--side goes with --fault partition")
    if args.fault == "slow" and args.fraction is not None:
        options["fraction"] = args.fraction
    elif args.fraction is not None:
        raise CliError("--fraction goes with --fault slow")
    try:
        return link_faults.LAB_FAULTS[args.fault](**options)
    except ConfigError as error:
        raise CliError(str(error)) from None


def _cmd_kill_node(args: argparse.Namespace) -> int:
    _check_kill_args(args)
    namespace = _namespace(args)
    progress = None if args.json else _kill_progress
    common: dict[str, Any] = {"namespace": namespace, "wait_dead_s": args.wait_dead or None, "progress": progress}
    fault = _fault_of(args)
    if isinstance(fault, link_faults.LabFault):  # struck at once; whether Ray declares it dead is Ray's
        common["wait_dead_s"] = None
    if args.during_save is not None:
        found = chaos.kill_during_save(
            args.during_save, fault=fault, min_step=args.min_step, seed=args.seed, timeout_s=args.timeout, **common
        )
        if not args.json:
            caught = found.details
            print(
                f"caught job {caught['job']!r} step {caught['step']} in flight: staged by rank(s) "
                f"{caught['staged_ranks']} of {caught['world_size']}; the victim held "
                f"{caught['shards_on_victim']} of their shards"
            )
        results = [found]
    elif args.mtbf is not None:
        results = chaos.kill_loop(args.mtbf, args.kills, fault=fault, seed=args.seed, job=args.holding, **common)
    else:
        if args.node:
            victims = [resolve_node(text) for text in args.node]
            head = naming.head_node_id()
            if args.allow_head and fault.mode == "node" and head in victims:
                fault.check(victims, namespace=namespace, allow_head=True)  # what is refused anyway is not asked
                confirm_head_kill(head, yes=args.yes)
        else:
            victims = chaos.pick_nodes(args.count, seed=args.seed, job=args.holding, namespace=namespace)
        if args.drain is not None:
            results = chaos.drain_then_inject(fault, victims, args.drain, **common)
        else:
            results = chaos.inject(fault, victims, allow_head=args.allow_head, **common)
    if isinstance(fault, link_faults.LabFault) and fault.duration_s:
        if not args.json:
            print(f"waiting {fault.duration_s:g} s for the {fault.mode} fault to end", flush=True)
        time.sleep(fault.duration_s + 0.5)
    if args.json:
        print(json.dumps([r.to_wire() for r in results], indent=2, sort_keys=True, default=str))
        return 0
    if not all(r.recorded for r in results):
        print(
            f"note: no ray_ckpt registry took the events in namespace {namespace!r}: the kills were not recorded",
            file=sys.stderr,
        )
    logs = quiet.logs_dir()
    if logs is not None and fault.mode == "node":
        print(f"Ray's own messages are in its logs: {logs} (gcs_server.out on the head: when a node was marked dead)")
    return 0


# ---- dashboard ----------------------------------------------------------------------------


def _add_dashboard(commands: Any, common: argparse.ArgumentParser) -> None:
    from ray_ckpt.dashboard import server

    dashboard = commands.add_parser(
        "dashboard",
        parents=[common],
        help="web dashboard: recoveries, save stalls, memory, shard placement, protection",
        description="Serve the ray_ckpt dashboard (or --export it as one HTML file): from recorded events files "
        "(--events) and/or live from the cluster (with --address, or when no --events is given).",
    )
    server.add_arguments(dashboard)
    dashboard.set_defaults(handler=_cmd_dashboard, connect=False)  # connects itself, only when live


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from ray_ckpt.dashboard import server

    try:
        return server.run(args, connect=lambda: _connect(args))
    except OSError as error:
        raise CliError(str(error)) from None


# ---- entry point --------------------------------------------------------------------------


def _one_line(error: BaseException) -> str:
    error = unwrap_remote(error)
    if isinstance(error, ray.exceptions.RayTaskError) and error.cause is not None:
        error = error.cause
    text = error.message if isinstance(error, RayCkptError) else str(error)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if isinstance(error, RayCkptError):
        return first or type(error).__name__
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``ray-ckpt`` command; returns the exit status (argparse exits 2 on bad usage)."""
    args = build_parser().parse_args(argv)
    handler: Handler = args.handler
    connected_here = False
    try:
        connected_here = _connect(args) if getattr(args, "connect", True) else False
        return handler(args)
    except (RayCkptError, ConnectionError, TimeoutError, ray.exceptions.RayError) as error:
        print(f"{PROG}: error: {_one_line(error)}", file=sys.stderr)
        return 1
    finally:
        if connected_here:
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
