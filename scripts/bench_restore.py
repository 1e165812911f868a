"""Restore after two node failures on a simulated Ray cluster, against a raw Ray object transfer.

For each payload size (default 256 MiB and 1 GiB), on a fresh simulated cluster
(``ray.cluster_utils.Cluster``: a head with no CPUs plus 7 one-CPU worker nodes, all on this
machine, fast failure detection, dashboard off, a private RAY_TMPDIR):

1. ``ray_ckpt.service.start`` deploys a store on every node (8 stores).
2. One rank (an actor pinned to worker node 0) saves ``{"w": <random uint8 tensor of the size>}``
   as step 0 with ``CheckpointConfig(data_shards=4, parity_shards=2, local_copy=False)`` (so the
   restore must come from peers) and waits for the commit.
3. Two nodes holding *data* shards of that rank (the worst case: two data shards must be
   rebuilt from parity) are hard-killed at once (``remove_node(allow_graceful=False)``), never
   the rank's node nor the head; the script waits until Ray declares them dead.
4. The rank actor is killed and a new one starts on the same node; inside it, ``restore()`` is
   timed (wall clock, the Checkpointer already constructed) and the XXH3 checksum of the
   restored tensor is compared with the saved one. A mismatch aborts the run (exit status 1).
5. Raw transfer, as the goal defines it: an actor on another surviving worker node holds a
   numpy array of the same size in its memory; an actor on the rank's node ``ray.get``s it
   through a method call (Ray serializes the array into the holder's object store and pulls it
   across), timed inside the receiving actor. This is the path every shard takes from a store.
   Also the lower bound of any Ray transfer: the holder ``ray.put``s the array first (not
   timed) and the receiver pulls the finished object ("object pull"). Each is done twice with
   distinct arrays; the second (warm) time is reported.

6. Fan-in: the same bytes moved the way the restore moves them: actors on the k surviving nodes
   the restore read from each hold size/k bytes, and the rank's node fetches all of them at
   once (warm time reported). On one machine, k sending nodes share the same two cores, so
   this is slower than one stream here; on real hosts each sender has its own.

Rows: ``{"size_bytes", "restore_s", "raw_transfer_s", "ratio", "object_pull_s", "fan_in_s"}`` with
``ratio = raw_transfer_s / restore_s`` (>= 0.7: restore runs at >= 70% of raw transfer speed).
The printed table adds the restore phases from ``Restored.phases_s`` (locate, fetch, decode,
load) and the ratio against the object pull. The restore runs in a fresh process (cold), as
after a real failure; the transfers are warm, so the ratios are conservative. All "nodes"
share this machine's cores and memory.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

from benchutil import (
    MIB,
    BenchError,
    add_json_flag,
    add_sizes_flag,
    kill,
    make_parser,
    on_node,
    on_private_ray,
    render_rows,
    restore_cluster,
    transfer_actors,
    write_json,
)

WORKERS = 7
CODE = {"data_shards": 4, "parity_shards": 2}
JOB = "bench-restore"
KILLED = 2
# no local copy: the restore must come from the surviving peers (the measured path)
CONFIG = {**CODE, "local_copy": False}


def bench_size(size: int, seed: int = 0) -> dict[str, Any]:
    """One fresh cluster: save, kill two data-shard holders, restore, raw transfer."""
    import ray

    from ray_ckpt.testing import rank_actor
    from ray_ckpt.transport import naming

    Rank = rank_actor()
    Holder, Receiver = transfer_actors()
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    with restore_cluster(WORKERS, size, namespace) as sim:
        workers = list(sim.workers)
        rank_node = sim.node_id(0)
        assert sim.cluster.head_node is not None
        head_node = str(sim.cluster.head_node.node_id)

        saver = Rank.options(scheduling_strategy=on_node(rank_node)).remote(size, seed=seed)
        ray.get(saver.connect.remote(namespace, JOB, 0, 1, CONFIG))
        expected = ray.get(saver.checksum.remote())
        saved = ray.get(saver.save.remote())
        ray.get(saver.close.remote())
        ray.kill(saver, no_restart=True)

        located = ray.get(naming.registry_handle(namespace).locate.remote(JOB, 0))
        nodes = {int(i): n for i, n in located[0]["nodes"].items()}
        data_holders = [nodes[i] for i in range(CODE["data_shards"]) if nodes[i] not in (rank_node, head_node)]
        victims = data_holders[:KILLED]
        if len(victims) < KILLED:
            raise BenchError(f"fewer than {KILLED} killable data-shard holders: {nodes}")
        detect_s = kill(sim, victims)

        restorer = Rank.options(scheduling_strategy=on_node(rank_node)).remote()
        ray.get(restorer.connect.remote(namespace, JOB, 0, 1, CONFIG))
        restored = ray.get(restorer.restore.remote())
        ray.kill(restorer, no_restart=True)
        if restored["step"] is None:
            raise BenchError("restore() found no committed step")
        if restored["source"] != "peers":
            raise BenchError(f"restored from {restored['source']!r}, expected 'peers'")
        if restored["size"] != size or restored["checksum"] != expected:
            raise BenchError(
                f"{size} bytes: restored state differs from the saved one (checksum "
                f"{restored['checksum']:#x} vs {expected:#x}, {restored['size']} bytes)"
            )

        survivors = [str(n.node_id) for n in workers if str(n.node_id) not in victims]
        holder_node = next(n for n in survivors if n != rank_node)
        holder = Holder.options(scheduling_strategy=on_node(holder_node)).remote()
        receiver = Receiver.options(scheduling_strategy=on_node(rank_node)).remote()
        raw, pulled = [], []
        for attempt in range(2):  # the first time warms up both processes
            ray.get([holder.make.remote(size, 10 * seed + 2 * attempt + n) for n in (1, 2)])
            seconds, received = ray.get(receiver.fetch.remote(holder, 10 * seed + 2 * attempt + 1))
            refs = ray.get(holder.put.remote(10 * seed + 2 * attempt + 2))
            pull_s, pulled_bytes = ray.get(receiver.pull.remote(refs))
            del refs
            if received != size or pulled_bytes != size:
                raise BenchError(f"raw transfer moved {received} and {pulled_bytes} bytes, expected {size}")
            raw.append(seconds)
            pulled.append(pull_s)
        # the same bytes the way a restore moves them: a quarter from each of the k nodes it read
        sources = sorted({nodes[i] for i in range(len(nodes)) if nodes[i] not in victims})[: CODE["data_shards"]]
        part = -(-size // CODE["data_shards"])
        fan_holders = [Holder.options(scheduling_strategy=on_node(n)).remote() for n in sources]
        fan_in = []
        for attempt in range(2):
            ray.get([h.make.remote(part, 100 + attempt) for h in fan_holders])
            seconds, received = ray.get(receiver.fetch_all.remote(fan_holders, 100 + attempt))
            if received != part * len(fan_holders):
                raise BenchError(f"fan-in transfer moved {received} bytes, expected {part * len(fan_holders)}")
            fan_in.append(seconds)
        return {
            "size_bytes": size,
            "restore_s": restored["seconds"],
            "raw_transfer_s": raw[-1],
            "ratio": raw[-1] / restored["seconds"],
            "phases_s": restored["phases_s"],
            "save_s": saved["seconds"],
            "save_phases_s": saved["phases_s"],
            "raw_cold_s": raw[0],
            "object_pull_s": pulled[-1],
            "fan_in_s": fan_in[-1],
            "detect_s": detect_s,
            "killed": sorted(i for i, n in nodes.items() if n in victims),
        }


def _gbps(size: int, seconds: float) -> str:
    return f"{size / seconds / 1e9:.2f}" if seconds > 0 else "inf"


def _cells(r: dict[str, Any]) -> tuple[str, ...]:
    """A result's line of the table."""
    phases = r["phases_s"]
    return (
        f"{r['size_bytes'] / MIB:.0f}",
        f"{r['restore_s']:.3f}",
        _gbps(r["size_bytes"], r["restore_s"]),
        f"{r['raw_transfer_s']:.3f}",
        _gbps(r["size_bytes"], r["raw_transfer_s"]),
        f"{r['ratio']:.2f}",
        f"{r['object_pull_s']:.3f}",
        f"{r['object_pull_s'] / r['restore_s']:.2f}",
        f"{r['fan_in_s']:.3f}",
        f"{r['fan_in_s'] / r['restore_s']:.2f}",
        *(f"{phases.get(p, float('nan')):.3f}" for p in ("locate", "fetch", "decode", "load")),
        ",".join(str(i) for i in r["killed"]),
    )


def format_table(results: list[dict[str, Any]]) -> str:
    header = (
        "size MiB",
        "restore s",
        "GB/s",
        "raw s",
        "GB/s",
        "ratio",
        "pull s",
        "ratio",
        "fan-in s",
        "ratio",
        "locate s",
        "fetch s",
        "decode s",
        "load s",
        "killed shards",
    )
    return render_rows(header, results, _cells)


def measure_size(mib: int) -> dict[str, Any]:
    """``bench_size`` of ``mib`` MiB, with its progress line printed."""
    result = bench_size(mib * MIB)
    save = ", ".join(f"{k} {v:.2f}s" for k, v in result["save_phases_s"].items())
    print(
        f"{mib} MiB: saved+committed in {result['save_s']:.2f}s ({save}); killed shards "
        f"{result['killed']}, "
        f"declared dead after {result['detect_s']:.1f}s; restored bit-exact; raw transfer "
        f"cold {result['raw_cold_s']:.3f}s, warm {result['raw_transfer_s']:.3f}s; object pull (warm) "
        f"{result['object_pull_s']:.3f}s",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__, "See the module docstring for exactly what is timed.")
    add_sizes_flag(
        parser, [256, 1024], "comma-separated payload sizes in MiB (default 256,1024); one fresh cluster each"
    )
    parser.add_argument("--quick", action="store_true", help="16 MiB only (for tests)")
    add_json_flag(parser)
    args = parser.parse_args(argv)
    sizes = [16] if args.quick else args.sizes_mib

    print(
        f"RS({CODE['data_shards']},{CODE['parity_shards']}), 1 head (0 CPUs) + {WORKERS} one-CPU workers "
        f"on one machine ({os.cpu_count()} cores); {KILLED} data-shard holders hard-killed before restore"
    )
    results = on_private_ray("rckb", lambda: [measure_size(mib) for mib in sizes])
    if results is None:
        return 1
    print(format_table(results))
    print(
        "raw = ray.get of an array an actor holds in memory (the goal's baseline); pull = ray.get of an\n"
        "object already in the holder's object store (a lower bound); fan-in = k actors on the nodes the\n"
        "restore read from each send size/k at once (the restore's traffic); ratio = that time / restore s\n"
        "(>= 0.7: restore at >= 70% of that transfer speed); GB/s = 1e9 B/s"
    )
    keys = ("size_bytes", "restore_s", "raw_transfer_s", "ratio", "object_pull_s", "fan_in_s")
    write_json(args.json, [{k: r[k] for k in keys} for r in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
