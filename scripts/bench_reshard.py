"""Resharded restore of an FSDP2 state from peer memory, against DCP's resharding load from disk.

On a simulated Ray cluster (a head with no CPUs plus 4 worker nodes, all on this machine, a
private RAY_TMPDIR), ranks are Ray actors (one per node, round robin) in a gloo process group:

1. N ranks build the same FSDP2 model (``--state-mib`` of parameters plus Adam's two moments,
   default 256 MiB in all), take one step, save it with ray_ckpt (RS(2,1), local copies) and
   wait for the commit; they also write it with DCP (``torch.distributed.checkpoint.save``) to
   a local folder. Jobs are saved at 4 and at 2 ranks.
2. M new ranks (new processes, a new process group) build the model in their own sharding and
   time ``Checkpointer.restore(into=...)``: for N == M the plain restore (each rank's local copy
   or its shards), for N != M the resharded one, which reads only the byte ranges it needs.
   Then, in the same processes, ``dcp.load`` of the same state into the same state dict.
3. Every restored global tensor is compared with the saved one (``full_tensor`` digests); a
   mismatch aborts the run.

Steps 2 and 3 run ``--repeats`` rounds over all pairs (new processes each time). Rows:
``{"from_ranks", "to_ranks", "size_bytes", "restore_s", "dcp_load_s", "bytes_fetched",
"bytes_needed", "restore_s_trials"}``: the median over the rounds of the slowest rank's times
(each round's in ``restore_s_trials``), and per rank the most bytes read against what its
new shards need (a plain restore at the same size reads its local copy: 0 bytes over the
network, reported as the local bytes). All "nodes" share this machine's cores, so the times
are comparable only within one run.

    python scripts/bench_reshard.py [--state-mib 256] [--repeats 3] [--json PATH] [--quick]
"""

from __future__ import annotations

import hashlib
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

from benchutil import (
    MIB,
    BenchError,
    add_json_flag,
    make_parser,
    on_node,
    on_private_ray,
    render_table,
    write_json,
)

NODES = 4
WIDTH = 1024  # each layer: a WIDTH x WIDTH Linear, 4 MiB of float32 parameters
CODE = {"data_shards": 2, "parity_shards": 1}
PAIRS = ((4, 4), (4, 2), (4, 3), (2, 2), (2, 4))  # (saved by, restored by)


def build(state_mib: int, seed: int) -> Any:
    import torch

    layers = max(1, round(state_mib * MIB / 3 / (WIDTH * WIDTH * 4)))  # parameters + 2 moments
    torch.manual_seed(seed)
    return torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))


class Rank:
    """One rank of a job: a process in a gloo group holding an FSDP2 model and its Adam."""

    def __init__(self, job: str, rank: int, world: int, state_mib: int) -> None:
        self.job, self.rank, self.world, self.state_mib = job, rank, world, state_mib

    def host(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())

    def setup(self, master: str, seed: int) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=self.rank, world_size=self.world)
        self.model = build(self.state_mib, seed)
        fully_shard(self.model, mesh=init_device_mesh("cpu", (self.world,)))
        self.optim = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.model(torch.ones(2, WIDTH)).sum().backward()
        self.optim.step()

    def state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(self.model, self.optim)
        return {"model": model_state, "optim": optim_state}

    def save(self, folder: str) -> None:
        import torch.distributed.checkpoint as dcp

        import ray_ckpt

        ckpt = ray_ckpt.Checkpointer(
            job=self.job,
            rank=self.rank,
            world_size=self.world,
            config=ray_ckpt.CheckpointConfig(**CODE),
            attempt="savers",  # the ranks save without restoring first: one worker group, named
        )
        ckpt.save(0, self.state()).wait()
        ckpt.close()
        dcp.save(self.state(), checkpoint_id=folder)

    def restore(self, job: str, folder: str) -> dict[str, Any]:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        import ray_ckpt

        ckpt = ray_ckpt.Checkpointer(
            job=job, rank=self.rank, world_size=self.world, config=ray_ckpt.CheckpointConfig(**CODE)
        )
        target = self.state()
        needed = sum(t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes for t in _tensors(target))
        dist.barrier()
        started = time.perf_counter()
        restored = ckpt.restore(into=target)
        restore_s = time.perf_counter() - started
        if restored is None:  # in an actor: benchutil is not importable there
            raise RuntimeError(f"rank {self.rank}: nothing to restore for job {job!r}")
        digest = self.digest()
        fetched = ckpt.last_restore_bytes or needed  # a same-size restore from the local copy: its bytes
        ckpt.close()
        dist.barrier()
        started = time.perf_counter()
        dcp.load(target, checkpoint_id=folder)
        dcp_s = time.perf_counter() - started
        return {"restore_s": restore_s, "dcp_load_s": dcp_s, "fetched": fetched, "needed": needed, "digest": digest}

    def digest(self) -> str:
        """SHA-256 of every global tensor (a collective)."""
        import torch

        digest = hashlib.sha256()
        for tensor in _tensors(self.state()):
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            digest.update(full.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    def size(self) -> int:
        return sum(t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes for t in _tensors(self.state()))


def _tensors(tree: Any) -> list[Any]:
    import torch

    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, dict):
        return [t for key in sorted(tree, key=str) for t in _tensors(tree[key])]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in _tensors(item)]
    return []


def group(job: str, world: int, state_mib: int, seed: int, nodes: list[str], kind: type = Rank) -> list[Any]:
    """``world`` actors of ``kind`` (a Rank), one per node round robin, in a fresh process group."""
    import ray

    actor = ray.remote(num_cpus=0)(kind)
    ranks = [
        actor.options(scheduling_strategy=on_node(nodes[r % len(nodes)])).remote(job, r, world, state_mib)
        for r in range(world)
    ]
    master = f"{ray.get(ranks[0].host.remote())}:{_free_port()}"
    ray.get([r.setup.remote(master, seed) for r in ranks])
    return ranks


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def state_arguments(doc: str | None, argv: list[str] | None, *, default_mib: int, max_mib: int) -> Any:
    """The FSDP2 benchmarks' flags, parsed and checked: --state-mib, --repeats, --quick, --json."""
    parser = make_parser(doc)
    parser.add_argument(
        "--state-mib", type=int, default=default_mib, help="parameters plus Adam moments, all ranks (MiB)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds (the median is reported)")
    parser.add_argument("--quick", action="store_true", help="24 MiB and one round (for tests)")
    add_json_flag(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.state_mib, args.repeats = 24, 1
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if not 12 <= args.state_mib <= max_mib:
        parser.error(f"--state-mib must be in 12..{max_mib}")
    return args


def measure_pairs(state_mib: int, repeats: int) -> list[dict[str, Any]]:
    """On one simulated cluster: every job of PAIRS saved, then ``repeats`` rounds of every pair
    restored (DCP's files in a temp dir); a row per pair."""
    import ray

    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.tools import quiet

    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="rck-reshard-dcp", ignore_cleanup_errors=True) as scratch,
        SimulatedCluster(NODES, store_budget_bytes=4 * state_mib * MIB, logging_level="ERROR") as sim,
    ):
        folder = pathlib.Path(scratch)
        quiet.quiet_driver()
        nodes = [sim.node_id(i) for i in range(NODES)]
        digests, sizes = {}, {}
        trials: dict[tuple[int, int], list[list[dict[str, Any]]]] = {}
        for saved in sorted({n for n, _ in PAIRS}):
            ranks = group(f"saved{saved}", saved, state_mib, seed=saved, nodes=nodes)
            ray.get([r.save.remote(str(folder / f"dcp{saved}")) for r in ranks])
            digests[saved] = ray.get([r.digest.remote() for r in ranks])[0]
            sizes[saved] = sum(ray.get([r.size.remote() for r in ranks]))
            for r in ranks:
                ray.kill(r)
        for trial in range(repeats):
            for n, m in PAIRS:
                ranks = group(f"to{m}from{n}t{trial}", m, state_mib, seed=100 + m, nodes=nodes)
                results = ray.get([r.restore.remote(f"saved{n}", str(folder / f"dcp{n}")) for r in ranks])
                for r in ranks:
                    ray.kill(r)
                if {res["digest"] for res in results} != {digests[n]}:
                    raise BenchError(f"{n} -> {m}: the restored state differs from the saved one")
                trials.setdefault((n, m), []).append(results)
            print(f"  trial {trial + 1} of {repeats}: done", flush=True)
        for (n, m), runs in trials.items():
            every = [res for run in runs for res in run]
            worst = max(every, key=lambda res: res["fetched"] / max(1, res["needed"]))
            restore_s = [max(res["restore_s"] for res in run) for run in runs]
            rows.append(
                {
                    "from_ranks": n,
                    "to_ranks": m,
                    "size_bytes": sizes[n],
                    "restore_s": statistics.median(restore_s),
                    "dcp_load_s": statistics.median(max(res["dcp_load_s"] for res in run) for run in runs),
                    "bytes_fetched": worst["fetched"],
                    "bytes_needed": worst["needed"],
                    "restore_s_trials": restore_s,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = state_arguments(__doc__, argv, default_mib=256, max_mib=4096)
    print(
        f"FSDP2 state of {args.state_mib} MiB (parameters + Adam moments), RS(2,1), {NODES} one-CPU nodes", flush=True
    )
    rows = on_private_ray("rckr", lambda: measure_pairs(args.state_mib, args.repeats))
    if rows is None:
        return 1
    same = {row["from_ranks"]: row["restore_s"] for row in rows if row["from_ranks"] == row["to_ranks"]}
    lines = [("N -> M", "state", "ray_ckpt restore", "vs same size", "DCP load (disk)", "fetched / needed")]
    for row in rows:
        base = same.get(row["from_ranks"])
        lines.append(
            (
                f"{row['from_ranks']} -> {row['to_ranks']}",
                f"{row['size_bytes'] / MIB:.0f} MiB",
                f"{row['restore_s']:.3f} s",
                "-" if base is None else f"{row['restore_s'] / base:.2f}x",
                f"{row['dcp_load_s']:.3f} s",
                f"{row['bytes_fetched'] / row['bytes_needed']:.3f}",
            )
        )
    print(render_table(lines))
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
