"""DCP into peer memory: torch.distributed.checkpoint's own save and load, with ray_ckpt's backend.

Four Ray Train workers train an FSDP2 model with Adam for two steps and save it with
``dcp.save(state, storage_writer=PeerMemoryWriter(ckpt), checkpoint_id=step)``, and also to disk
with DCP's ``FileSystemWriter``. Worker nodes holding data shards of the step are hard-killed
(``--kill``, at most the parity shards). Then 2 workers, and 3, load the step with
``dcp.load(state, storage_reader=PeerMemoryReader(ckpt))``: DCP's planner reshards, ray_ckpt
decodes the lost bytes from parity. Each loading rank compares what it got, bit for bit, with
what DCP loads from the disk copy into the same sharding.

    python scripts/dcp_example.py [--load-workers 2 3] [--kill 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time
from typing import Any

import ray
import torch
import torch.distributed.checkpoint as dcp
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import ray_ckpt
from ray_ckpt.core import timeline
from ray_ckpt.integrations.dcp import PeerMemoryReader, PeerMemoryWriter
from ray_ckpt.transport.registry_client import RegistryClient

JOB = "dcp-example"
STEP = 2
CHECKPOINT = {"data_shards": 2, "parity_shards": 2}


def fsdp2_training(seed: int, steps: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP sharded with FSDP2 over every rank, and its Adam after ``steps`` steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    fully_shard(model, mesh=init_device_mesh("cpu", (ray.train.get_context().get_world_size(),)))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(torch.randn(16, 32)).square().mean().backward()
        optim.step()
        optim.zero_grad()
    return model, optim


def state_of(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optim)
    return {"model": model_state, "optim": optim_state}


def save_loop(config: dict[str, Any]) -> None:
    """Every worker: train, then save the step into peer memory and, for comparison, to disk."""
    torch.set_num_threads(1)
    rank = ray.train.get_context().get_world_rank()
    model, optim = fsdp2_training(seed=0, steps=STEP)
    state = state_of(model, optim)
    ckpt = ray_ckpt.train.Checkpointer(ray_ckpt.CheckpointConfig(**config["checkpoint"]), job=config["job"])
    started = time.perf_counter()
    dcp.save(state, storage_writer=PeerMemoryWriter(ckpt), checkpoint_id=config["step"])
    peers_s = time.perf_counter() - started
    started = time.perf_counter()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(config["disk"]))
    disk_s = time.perf_counter() - started
    ckpt.close()
    record = {"rank": rank, "saved_step": config["step"], "peers_s": peers_s, "disk_s": disk_s}
    pathlib.Path(config["out"], f"save-{rank}.json").write_text(json.dumps(record))


def load_loop(config: dict[str, Any]) -> None:
    """Every worker of the new world: load the step from peer memory and from disk, each into
    this world's sharding, and compare them bit for bit."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    torch.set_num_threads(1)
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    model, optim = fsdp2_training(seed=1, steps=1)  # a step, so Adam's state exists to load into
    from_peers = state_of(model, optim)
    ckpt = ray_ckpt.train.Checkpointer(ray_ckpt.CheckpointConfig(**config["checkpoint"]), job=config["job"])
    reader = PeerMemoryReader(ckpt)
    started = time.perf_counter()
    dcp.load(from_peers, storage_reader=reader)  # no checkpoint_id: the newest committed step
    peers_s = time.perf_counter() - started
    set_state_dict(model, optim, model_state_dict=from_peers["model"], optim_state_dict=from_peers["optim"])
    other_model, other_optim = fsdp2_training(seed=2, steps=1)
    from_disk = state_of(other_model, other_optim)
    started = time.perf_counter()
    dcp.load(from_disk, storage_reader=dcp.FileSystemReader(config["disk"]))
    disk_s = time.perf_counter() - started
    mismatched = differences(from_peers, from_disk)
    ckpt.close()
    record = {
        "rank": rank,
        "world": world,
        "equal": not mismatched,
        "mismatched": mismatched[:10],
        "peers_s": peers_s,
        "disk_s": disk_s,
        "read_bytes": reader.fetched_bytes,
    }
    pathlib.Path(config["out"], f"load{world}-{rank}.json").write_text(json.dumps(record))


def differences(got: Any, expected: Any, path: str = "") -> list[str]:
    """Key paths where two states differ: tensors (a DTensor's local shard) byte for byte."""
    if isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            return [path or "/"]
        return [d for key in expected for d in differences(got[key], expected[key], f"{path}/{key}")]
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return [path]
        return [d for i, (g, e) in enumerate(zip(got, expected, strict=True)) for d in differences(g, e, f"{path}/{i}")]
    if isinstance(expected, torch.Tensor):
        mine, theirs = (t.to_local() if hasattr(t, "to_local") else t for t in (got, expected))
        same = (
            isinstance(mine, torch.Tensor)
            and (mine.dtype, mine.shape) == (theirs.dtype, theirs.shape)
            and torch.equal(mine.reshape(-1).view(torch.uint8), theirs.reshape(-1).view(torch.uint8))
        )
        return [] if same else [path]
    return [] if got == expected else [path]


def run(loop: Any, *, name: str, workers: int, storage: str, config: dict[str, Any]) -> None:
    TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=0)),
    ).fit()


def shard_holders(namespace: str, job: str, step: int, data_shards: int, workers: set[str], count: int) -> list[str]:
    """``count`` worker nodes that hold data shards of ``step`` (their bytes must be decoded)."""
    from ray_ckpt.transport.registry_client import RegistryClient

    chosen: list[str] = []
    for record in RegistryClient(namespace).locate(job, step).values():
        for index in range(data_shards):
            node = record.nodes[index]
            if node in workers and node not in chosen:
                chosen.append(node)
    return chosen[:count]


def run_example(
    *,
    nodes: int = 7,
    save_workers: int = 4,
    load_workers: tuple[int, ...] = (2, 3),
    kill: int = 2,
    cluster: Any = None,
) -> dict[str, Any]:
    """Save at ``save_workers``, kill ``kill`` worker nodes holding data shards, load at each
    of ``load_workers``; returns every rank's records and the killed nodes. On a fresh
    simulated cluster of ``nodes`` workers, or on ``cluster``, a ``SimulatedCluster`` of
    ``nodes`` workers (this process connected, the service started in the default namespace),
    left up at the end. ``recoveries``: each load as the timeline and the dashboard show it
    (``ray_ckpt.core.timeline.Recovery`` as dicts)."""
    if kill > CHECKPOINT["parity_shards"]:
        raise ValueError(f"kill must be at most parity_shards={CHECKPOINT['parity_shards']}, got {kill}")
    if cluster is not None and len(cluster.workers) != nodes:
        raise ValueError(f"the cluster has {len(cluster.workers)} workers, the example needs {nodes}")
    storage, out = tempfile.mkdtemp(prefix="dcp-train"), tempfile.mkdtemp(prefix="dcp-out")
    try:
        return _run(nodes, save_workers, load_workers, kill, cluster, storage, out)
    finally:  # the saved checkpoints and records: what the report needs is read by now
        shutil.rmtree(storage, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


def _run(
    nodes: int, save_workers: int, load_workers: tuple[int, ...], kill: int, cluster: Any, storage: str, out: str
) -> dict[str, Any]:
    """``run_example``'s save, kill and loads; Ray Train's checkpoints under ``storage``, the ranks'
    records and the disk copy under ``out``."""
    from ray_ckpt.testing import SimulatedCluster
    from ray_ckpt.tools import quiet

    config = {"job": JOB, "step": STEP, "checkpoint": CHECKPOINT, "disk": str(pathlib.Path(out, "disk")), "out": out}
    with (
        SimulatedCluster(nodes, store_budget_bytes=256 << 20, logging_level="ERROR")
        if cluster is None
        else contextlib.nullcontext(cluster)
    ) as sim:
        quiet.quiet_driver()
        run(save_loop, name="dcp-save", workers=save_workers, storage=storage, config=config)
        workers = {str(node.node_id) for node in sim.workers}
        victims = shard_holders(ray_ckpt.settings.namespace(), JOB, STEP, CHECKPOINT["data_shards"], workers, kill)
        if victims:
            sim.kill(victims)
        for world in load_workers:
            run(load_loop, name=f"dcp-load-{world}", workers=world, storage=storage, config=config)
        _, events = RegistryClient(ray_ckpt.settings.namespace()).events()
    records = [json.loads(p.read_text()) for p in sorted(pathlib.Path(out).glob("*.json"))]
    recoveries = [r.as_dict() for r in timeline.recoveries(events) if r.job == JOB]
    return {"killed": victims, "records": records, "recoveries": recoveries}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-workers", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--kill", type=int, default=2, help=f"worker nodes to kill (<= {CHECKPOINT['parity_shards']})")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rckdcp"))
    report = run_example(load_workers=tuple(args.load_workers), kill=args.kill)
    print(f"killed {len(report['killed'])} node(s) holding data shards of step {STEP}")
    for r in report["records"]:
        if "saved_step" in r:
            print(f"save rank {r['rank']}: dcp.save to peer memory {r['peers_s']:.2f} s, to disk {r['disk_s']:.2f} s")
        else:
            verdict = "bit-identical to the disk copy" if r["equal"] else f"MISMATCH {r['mismatched']}"
            print(f"load at {r['world']} rank {r['rank']}: {r['peers_s']:.2f} s from peer memory, {verdict}")
    loads = [r for r in report["records"] if "equal" in r]
    return 0 if loads and all(r["equal"] for r in loads) else 1


if __name__ == "__main__":
    sys.exit(main())
