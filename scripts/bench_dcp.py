"""DCP into peer memory, against DCP to local disk and against ray_ckpt's own save and restore.

On a simulated Ray cluster (4 one-CPU worker nodes, all on this machine, a private RAY_TMPDIR),
4 ranks (Ray actors, one per node, a gloo process group) hold the same FSDP2 model with Adam
(``--state-mib`` of parameters plus moments in all). Each round, the same state is saved five
ways, each as a new step, and timed on every rank from the call to its return ("blocking") and
to the point where the step is durable where it went ("done": committed in peer memory, or its
files written):

- ``ray_ckpt save``: ``Checkpointer.save(step, state)``, then its handle's ``wait()``;
- ``dcp.save -> peers`` and ``dcp.async_save -> peers``: DCP with ``PeerMemoryWriter``;
- ``dcp.save -> disk`` and ``dcp.async_save -> disk``: DCP's own ``FileSystemWriter``.

Then the step is loaded back three ways into the same processes (``Checkpointer.restore(into=)``,
``dcp.load`` with ``PeerMemoryReader``, ``dcp.load`` from disk), and, after one node holding a
data shard is hard-killed, by 2 new ranks in new processes (DCP reshards; ray_ckpt's restore
reshards too). Every load is compared with the saved state (digests of every global tensor); a
mismatch voids the run. Figures are the median over ``--repeats`` rounds of the slowest rank;
ratios are against DCP to disk in the same run. All "nodes" share this machine's cores and its
disk (a page-cache write, not a remote file system): compare within one run only.

    python scripts/bench_dcp.py [--state-mib 128] [--repeats 3] [--json PATH] [--quick]
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

import bench_reshard
import ray.cloudpickle
from benchutil import MIB, BenchError, kill, on_private_ray, render_table, write_json

ray.cloudpickle.register_pickle_by_value(bench_reshard)  # its Rank runs in Ray workers

NODES = 4
CODE = bench_reshard.CODE  # RS(2,1), local copies on
SAVES = ("ray_ckpt save", "dcp.save -> peers", "dcp.async_save -> peers", "dcp.save -> disk", "dcp.async_save -> disk")
LOADS = ("ray_ckpt restore", "dcp.load <- peers", "dcp.load <- disk")


class DcpRank(bench_reshard.Rank):
    """A bench_reshard rank that also saves and loads through DCP into peer memory."""

    def _checkpointer(self, job: str, attempt: str | None = None) -> Any:
        import ray_ckpt

        return ray_ckpt.Checkpointer(
            job=job, rank=self.rank, world_size=self.world, config=ray_ckpt.CheckpointConfig(**CODE), attempt=attempt
        )

    def open(self, job: str) -> None:
        """One Checkpointer per way of saving into peer memory (each its own job), all of the
        worker group "savers": they save without restoring first."""
        self.own, self.through_dcp, self.through_async = (
            self._checkpointer(f"{job}-{way}", attempt="savers") for way in "abc"
        )

    def saves(self, step: int, folder: str) -> dict[str, tuple[float, float]]:
        """``{way: (blocking_s, done_s)}`` for this rank; each way starts after a barrier."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        from ray_ckpt.integrations.dcp import PeerMemoryWriter

        def timed(start: Any, finish: Any) -> tuple[float, float]:
            dist.barrier()
            began = time.perf_counter()
            pending = start()
            blocking = time.perf_counter() - began
            finish(pending)
            return blocking, time.perf_counter() - began

        state = self.state()
        disk = pathlib.Path(folder, f"step{step}")
        return {
            "ray_ckpt save": timed(lambda: self.own.save(step, state), lambda handle: handle.wait()),
            "dcp.save -> peers": timed(
                lambda: dcp.save(state, storage_writer=PeerMemoryWriter(self.through_dcp), checkpoint_id=step),
                lambda _: None,
            ),
            "dcp.async_save -> peers": timed(
                lambda: dcp.async_save(state, storage_writer=PeerMemoryWriter(self.through_async), checkpoint_id=step),
                lambda future: future.result(),
            ),
            "dcp.save -> disk": timed(lambda: dcp.save(state, checkpoint_id=str(disk / "sync")), lambda _: None),
            "dcp.async_save -> disk": timed(
                lambda: dcp.async_save(state, checkpoint_id=str(disk / "async")), lambda future: future.result()
            ),
        }

    def loads(self, job: str, step: int, folder: str) -> dict[str, Any]:
        """``{way: seconds}`` of loading ``step`` into this rank's state, and the digest of
        what each way loaded (a collective)."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        from ray_ckpt.integrations.dcp import PeerMemoryReader

        opened = not hasattr(self, "own")  # new processes: Checkpointers of their own
        own = self._checkpointer(f"{job}-a") if opened else self.own
        through_dcp = self._checkpointer(f"{job}-b") if opened else self.through_dcp
        ways = {
            "ray_ckpt restore": lambda target: own.restore(step, into=target),
            "dcp.load <- peers": lambda target: dcp.load(
                target, storage_reader=PeerMemoryReader(through_dcp), checkpoint_id=step
            ),
            "dcp.load <- disk": lambda target: dcp.load(
                target, checkpoint_id=str(pathlib.Path(folder, f"step{step}", "sync"))
            ),
        }
        times, digests = {}, {}
        for way, load in ways.items():
            self._scramble()
            target = self.state()
            dist.barrier()
            began = time.perf_counter()
            load(target)
            times[way] = time.perf_counter() - began
            set_state_dict(self.model, self.optim, model_state_dict=target["model"], optim_state_dict=target["optim"])
            digests[way] = self.digest()
        if opened:
            own.close()
            through_dcp.close()
        return {"times": times, "digests": digests}

    def _scramble(self) -> None:
        """Overwrite every parameter and moment, so a load that did nothing shows."""
        import torch

        with torch.no_grad():
            for tensor in bench_reshard._tensors(self.state()):
                local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
                if local.is_floating_point():
                    local.fill_(float("nan"))

    def close(self) -> None:
        for ckpt in (self.own, self.through_dcp, self.through_async):
            ckpt.close()


def slowest(results: list[dict[str, Any]], way: str) -> tuple[float, float]:
    """The (blocking, done) times of the rank whose save ``way`` was done last."""
    return max((r[way] for r in results), key=lambda times: times[1])


def measure_rounds(state_mib: int, repeats: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """On one simulated cluster: ``repeats`` rounds of saving every way and loading 4 -> 4, then
    4 -> 2 after a node kill (DCP's files in a temp dir): (the saves' times, the loads')."""
    import ray

    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.tools import quiet
    from ray_ckpt.transport.registry_client import RegistryClient

    saves: dict[str, list[tuple[float, float]]] = {way: [] for way in SAVES}
    loads: dict[str, dict[str, list[float]]] = {"4 -> 4": {way: [] for way in LOADS}, "4 -> 2": {}}
    budget = 3 * 3 * state_mib * MIB  # per store: 3 jobs, a step's 1.5x coded share + the local copy
    with (
        tempfile.TemporaryDirectory(prefix="rck-bench-dcp", ignore_cleanup_errors=True) as folder,
        SimulatedCluster(NODES, store_budget_bytes=budget, logging_level="ERROR") as sim,
    ):
        quiet.quiet_driver()
        nodes = [sim.node_id(i) for i in range(NODES)]
        ranks = bench_reshard.group("dcp", 4, state_mib, seed=0, nodes=nodes, kind=DcpRank)
        ray.get([r.open.remote("bench") for r in ranks])
        expected = ray.get([r.digest.remote() for r in ranks])[0]
        for step in range(repeats):
            results = ray.get([r.saves.remote(step, str(folder)) for r in ranks])
            for way in SAVES:
                saves[way].append(slowest(results, way))
            loaded = ray.get([r.loads.remote("bench", step, str(folder)) for r in ranks])
            check(loaded, expected, "4 -> 4")
            for way in LOADS:
                loads["4 -> 4"][way].append(max(r["times"][way] for r in loaded))
            print(f"  round {step + 1} of {repeats}: done", flush=True)
        last = repeats - 1
        ray.get([r.close.remote() for r in ranks])
        for r in ranks:
            ray.kill(r)
        record = RegistryClient(ray_ckpt_namespace()).locate("bench-b", last)[0]
        victim = next(n for n in (record.nodes[i] for i in range(CODE["data_shards"])) if n in nodes)
        kill(sim, [victim])
        alive = [n for n in nodes if n != victim]
        ranks = bench_reshard.group("dcp", 2, state_mib, seed=1, nodes=alive, kind=DcpRank)
        loaded = ray.get([r.loads.remote("bench", last, str(folder)) for r in ranks])
        check(loaded, expected, "4 -> 2 after a node kill")
        loads["4 -> 2"] = {way: [max(r["times"][way] for r in loaded)] for way in LOADS}
    return saves, loads


def main(argv: list[str] | None = None) -> int:
    args = bench_reshard.state_arguments(__doc__, argv, default_mib=128, max_mib=2048)
    print(
        f"FSDP2 state of {args.state_mib} MiB (parameters + Adam moments), 4 ranks, RS(2,1), {NODES} nodes", flush=True
    )
    measured = on_private_ray("rckd", lambda: measure_rounds(args.state_mib, args.repeats))
    if measured is None:
        return 1
    saves, loads = measured
    print(report(saves, loads, args.state_mib))
    document = {
        "state_mib": args.state_mib,
        "repeats": args.repeats,
        "saves": {way: {"blocking_s": [b for b, _ in t], "done_s": [d for _, d in t]} for way, t in saves.items()},
        "loads": loads,
    }
    write_json(args.json, document)
    return 0


def ray_ckpt_namespace() -> str:
    import ray_ckpt

    return ray_ckpt.settings.namespace()


def check(loaded: list[dict[str, Any]], expected: str, what: str) -> None:
    for way in LOADS:
        got = {r["digests"][way] for r in loaded}
        if got != {expected}:
            raise BenchError(f"{what}: {way} loaded a state that differs from the saved one")


def report(saves: dict[str, list[tuple[float, float]]], loads: dict[str, dict[str, list[float]]], mib: int) -> str:
    disk = statistics.median(d for _, d in saves["dcp.save -> disk"])
    lines = [("save", "blocking", "done", "done vs dcp.save -> disk")]
    for way, times in saves.items():
        blocking, done = statistics.median(b for b, _ in times), statistics.median(d for _, d in times)
        lines.append((way, f"{blocking:.3f} s", f"{done:.3f} s", f"{done / disk:.2f}x"))
    lines.append(("", "", "", ""))
    lines.append(("load", "4 -> 4", "4 -> 2 (a node killed)", ""))
    for way in LOADS:
        same, fewer = (statistics.median(loads[pair][way]) for pair in ("4 -> 4", "4 -> 2"))
        lines.append((way, f"{same:.3f} s", f"{fewer:.3f} s", ""))
    return f"{mib} MiB in all, slowest rank, median of rounds\n" + render_table(lines)


if __name__ == "__main__":
    sys.exit(main())
