"""The in-place rendezvous at N members: a full start's registrations, a generation formed after
a failure, one round of heartbeats; through the stores' relay tree or straight to the coordinator.

Starts the real ray_ckpt service (one store per node) on a simulated cluster of a few nodes on
this machine (``ray_ckpt.testing.SimulatedCluster``: a head with no CPUs plus 2 one-CPU
workers, dashboard off, a private RAY_TMPDIR) and one real ``GenerationCoordinator``, and drives
them with N simulated members (``Member`` records spread over the real nodes; no training
processes). Per N (``--members``) and path (``--paths``):

- ``relay`` (what workers do where their node has a store): each caller call stands for one
  child store of a real store passing its subtree's ranks' calls up the tree
  (``ray_ckpt.core.coordinator_relay``): the members are split over the real stores' free
  places in the tree (``RAY_CKPT_RELAY_FANIN`` under each), as the stores below would merge
  them, and the real stores merge those again into their calls to the coordinator. The levels
  below (a node's store merging its ranks' calls; more levels past fan-in^2 nodes) add one hop
  each, in parallel on their own nodes, and are not run here.
- ``direct`` (a worker whose node has no store): one call per member, from 32 caller threads.

Measured (seconds, wall clock of this process):

- ``register_s``: a full start: from the first registration sent until every member's returned;
- ``rendezvous_s``: the median of ``ROUNDS`` generations formed as after a failure, each from
  the first join sent until every member has its ``FORMED`` reply and the new generation's
  address, in three waves (every member joins; every member polls until formed; rank 0
  publishes the address and every member asks for it), where workers overlap them: an upper
  bound; ``waves_s`` times each;
- ``beat_round_s``: one heartbeat of every member, until every answer is back (median);
- ``coordinator_cpu_s_per_member``: the coordinator process's CPU (psutil, user + system) per
  member for the registrations, a rendezvous and a round of beats (medians).

Rows: ``{"members", "path", "callers", "register_s", "rendezvous_s", "waves_s", "beat_round_s",
"coordinator_cpu_s_per_member"}``; the table at the end gives each path's
rendezvous at the largest N over that at the smallest. All "nodes" share this machine's cores,
and the callers share one Python process with the driver's Ray client.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchutil import add_json_flag, make_parser, on_private_ray, write_json

CALLERS = 32
WORKERS = 2
ROUNDS = 3  # rendezvous (and beat rounds) per N: the median is reported
HANG_TIMEOUT_S = 1e9  # the simulated members' pids are not real processes: never kill one as hung
NO_PID = 2**31 - 1  # and none is a process (above any pid_max), should the hang watcher ever fire


def relay_slots(stores: list[Any], fanin: int) -> list[Any]:
    """The real stores' free places in the relay tree, interleaved: each stands for a child store."""
    capacity = [fanin - (len(stores) - 1)] + [fanin] * (len(stores) - 1)
    return [store for j in range(fanin) for store, free in zip(stores, capacity) if j < free]


class Path:
    """How calls reach the coordinator: ``send(op, key, entries, slot)`` returns one result per entry."""

    def __init__(self, name: str, coordinator: Any, stores: list[Any], fanin: int) -> None:
        self.name, self.coordinator, self.run = name, coordinator, uuid.uuid4().hex
        self.slots = relay_slots(stores, fanin) if name == "relay" else []

    def groups(self, members: list[Any]) -> list[list[Any]]:
        """Who calls together: a child store's subtree (relay) or each member alone (direct)."""
        if self.name == "direct":
            return [[member] for member in members]
        count = min(len(self.slots), len(members))
        return [members[len(members) * i // count : len(members) * (i + 1) // count] for i in range(count)]

    def send(self, op: str, key: tuple[Any, ...], entries: list[Any], slot: int) -> list[Any]:
        import ray

        from ray_ckpt.core.coordinator_relay import OPS

        if self.name == "relay":
            store = self.slots[slot % len(self.slots)]
            return list(ray.get(store.coordinate.remote(self.run, self.coordinator, op, list(key), entries)))
        return list(ray.get(getattr(self.coordinator, OPS[op]).remote(*key, entries)))


def in_parallel(groups: list[list[Any]], call: Any) -> float:
    """``call(index, group)`` for every group from CALLERS threads; seconds until all returned."""
    start = time.perf_counter()
    with ThreadPoolExecutor(min(CALLERS, len(groups))) as pool:
        list(pool.map(lambda numbered: call(*numbered), enumerate(groups)))
    return time.perf_counter() - start


def measure(path: Path, coordinator: Any, nodes: list[str], count: int) -> dict[str, Any]:
    import psutil
    import ray

    from ray_ckpt.core.generations import Beat, JoinStatus, Member

    cpu = psutil.Process(ray.get(coordinator.__ray_call__.remote(lambda _actor: os.getpid())))
    cpu0 = sum(cpu.cpu_times()[:2])
    begun = ray.get(coordinator.begin.remote(count))
    epoch = begun.epoch
    members = [
        Member(rank=r, incarnation=f"{epoch}.{r}", node_id=nodes[r % len(nodes)], pid=NO_PID, host="h", epoch=epoch)
        for r in range(count)
    ]
    groups = path.groups(members)

    def register(slot: int, group: list[Any]) -> None:
        if not all(path.send("register", (begun.generation,), [m.to_wire() for m in group], slot)):
            raise RuntimeError("a registration was refused")

    register_s = in_parallel(groups, register)
    register_cpu = sum(cpu.cpu_times()[:2]) - cpu0
    address = f"h:{uuid.uuid4().int % 50000 + 10000}"
    after: list[int] = []

    def join(slot: int, group: list[Any]) -> None:
        replies = path.send("join", (), [m.to_wire() for m in group], slot)
        refused = [reply for _, reply in replies if reply is not None]
        if refused:
            raise RuntimeError(f"joins were refused: {refused[:3]}")
        after.append(replies[0][0])

    def formed(slot: int, group: list[Any]) -> None:
        waiting = list(group)
        while waiting:
            answers = path.send("await", (after[0],), [m.waiting for m in waiting], slot)
            if any(a is not None and a.status is not JoinStatus.FORMED for a in answers):
                raise RuntimeError(f"a join ended {answers}")
            waiting = [m for m, a in zip(waiting, answers) if a is None]

    def rendezvous_address(slot: int, group: list[Any]) -> None:
        while True:
            got = path.send("address", (after[0] + 1,), [m.rank for m in group], slot)
            if all(a == address for a in got):
                return
            if any(a == "" for a in got):
                raise RuntimeError("the generation was superseded")

    def beat(slot: int, group: list[Any]) -> None:
        path.send("beat", (), [Beat(m).to_wire() for m in group], slot)

    rounds, beat_rounds, cpus = [], [], []
    for _ in range(ROUNDS):
        # in three waves (every join, then every poll, then every address): a caller thread that
        # polled before every member joined would hold a thread another member needs to join
        after.clear()
        cpu1 = sum(cpu.cpu_times()[:2])
        waves = [in_parallel(groups, join), in_parallel(groups, formed)]
        start = time.perf_counter()
        ray.get(coordinator.publish.remote(after[0] + 1, address))  # rank 0, once it heard FORMED
        waves.append(time.perf_counter() - start + in_parallel(groups, rendezvous_address))
        rounds.append(waves)
        cpu2 = sum(cpu.cpu_times()[:2])
        beat_rounds.append(in_parallel(groups, beat))
        cpus.append((cpu2 - cpu1, sum(cpu.cpu_times()[:2]) - cpu2))
    waves = sorted(rounds, key=sum)[len(rounds) // 2]
    return {
        "members": count,
        "path": path.name,
        "callers": len(groups),
        "register_s": round(register_s, 4),
        "rendezvous_s": round(sum(waves), 4),
        "waves_s": [round(w, 4) for w in waves],
        "beat_round_s": round(statistics.median(beat_rounds), 4),
        "coordinator_cpu_s_per_member": {
            "register": round(register_cpu / count, 7),
            "rendezvous": round(statistics.median(c[0] for c in cpus) / count, 7),
            "beat": round(statistics.median(c[1] for c in cpus) / count, 7),
        },
    }


def _per_member(cpu: dict[str, float]) -> str:
    return ", ".join(f"{name} {seconds * 1e6:.1f} us" for name, seconds in cpu.items())


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| members | path | callers | register s | rendezvous s | beat round s | coordinator CPU per member |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['members']} | {r['path']} | {r['callers']} | {r['register_s']:.3f} | {r['rendezvous_s']:.3f} "
            f"| {r['beat_round_s']:.3f} | {_per_member(r['coordinator_cpu_s_per_member'])} |"
        )
    for name in sorted({r["path"] for r in rows}):
        mine = sorted((r for r in rows if r["path"] == name), key=lambda r: r["members"])
        if len(mine) > 1:
            low, high = mine[0], mine[-1]
            ratio = high["rendezvous_s"] / max(low["rendezvous_s"], 1e-9)
            lines.append(
                f"{name}: rendezvous of {high['members']} members / {low['members']} = {ratio:.2f}x "
                f"({high['rendezvous_s']:.3f} s / {low['rendezvous_s']:.3f} s)"
            )
    return "\n".join(lines)


def measure_all(counts: list[int], paths: list[str]) -> list[dict[str, Any]]:
    """On one simulated cluster with the service started: ``measure`` for each path and member
    count, with a new coordinator each; each row printed as it comes."""
    import ray
    from ray_ckpt.actors.generation_coordinator import GenerationCoordinator

    from ray_ckpt import settings
    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.transport import naming

    rows = []
    namespace = f"bench-rv-{uuid.uuid4().hex[:6]}"
    with SimulatedCluster(WORKERS, store_budget_bytes=64 << 20, namespace=namespace):
        stores = naming.store_handles(namespace)
        nodes = sorted(stores)
        print(f"{len(stores)} stores, up to {CALLERS} caller threads, paths {paths}", flush=True)
        for name in paths:
            for count in counts:
                coordinator = GenerationCoordinator.remote(HANG_TIMEOUT_S)  # type: ignore[attr-defined]
                path = Path(name, coordinator, [stores[n] for n in nodes], settings.relay_fanin())
                row = measure(path, coordinator, nodes, count)
                rows.append(row)
                print(json.dumps(row), flush=True)
                ray.kill(coordinator)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__)
    parser.add_argument("--members", default="256,1024,4096,8192", help="comma-separated member counts")
    parser.add_argument("--paths", default="relay,direct", help="relay, direct or both (comma-separated)")
    add_json_flag(parser)
    parser.add_argument("--quick", action="store_true", help="64 and 256 members, relay only (a smoke run)")
    args = parser.parse_args(argv)
    try:
        counts = [64, 256] if args.quick else [int(x) for x in args.members.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--members must be comma-separated integers, got {args.members!r}")
    paths = ["relay"] if args.quick else [p.strip() for p in args.paths.split(",") if p.strip()]
    if not counts or min(counts) < 1:
        parser.error("--members must be positive")
    if not paths or set(paths) - {"relay", "direct"}:
        parser.error(f"--paths takes relay and direct, got {args.paths!r}")
    rows = on_private_ray("rcrv", lambda: measure_all(counts, paths))
    if rows is None:
        return 1
    print(format_table(rows))
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
