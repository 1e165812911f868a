"""Ray Train + ray_ckpt: a TorchTrainer job that checkpoints every step and survives node kills.

Trains a small MLP with DDP (gloo) deterministically on a simulated cluster, checkpointing every
step to peer memory with ray_ckpt. With ``--kill-at-step N`` the node of rank 1 is hard-killed
once step N is committed: Ray Train restarts the worker group, every rank restores the newest
committed step from memory, and training finishes. The final parameters are compared with an
uninterrupted run of the same seed.

    python scripts/train_example.py [--steps 30] [--workers 2] [--kill-at-step 10]

With ``--elastic``: an FSDP2 job under ``ScalingConfig(num_workers=(2, 4))`` on exactly 4 nodes
loses a node, goes on at 3 workers, and grows back to 4 when a node is added; each restart
reshards the committed step from peer memory into the new sharding (``run_elastic``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import ray_ckpt
from ray_ckpt.testing import SimulatedCluster, busy, params_digest
from ray_ckpt.tools import quiet
from ray_ckpt.transport import naming

PAUSE_FILE = "pause"  # in the events folder: while it exists, ranks wait between steps
# set when the run a fault thread waits on has ended: the thread's waits stop calling Ray (a
# thread still calling Ray while its driver disconnects can end the whole process)
ABANDONED = threading.Event()


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 1009 + rank)
    x = torch.randn(64, 32, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def sharded_model(world_size: int, per_layer: bool) -> torch.nn.Module:
    """``build_model()`` sharded with FSDP2 ``fully_shard`` over a 1-D CPU mesh of the default
    process group's ``world_size`` ranks; ``per_layer``: each Linear an FSDP unit of its own,
    under the root's (more collectives)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = build_model()
    mesh = init_device_mesh("cpu", (world_size,))
    if per_layer:
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def train_step(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int, rank: int) -> None:
    """One step of rank ``rank``'s deterministic batch: forward, backward, Adam."""
    x, y = batch(step, rank)
    optim.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optim.step()


def fsdp2_state(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    """The FSDP2 model's and optimizer's state dicts (DTensors), as saved and restored into."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optim)  # creates Adam's state on first use
    return {"model": model_state, "optim": optim_state}


def train_loop(config: dict[str, Any]) -> None:
    """The per-worker loop: restore (local -> peers -> backup), then train and save every step."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    context = ray.train.get_context()
    rank = context.get_world_rank()
    # a fixed gradient-bucket layout (no rebuild after the first step): with more than 2 ranks the
    # order of the allreduce sums depends on it, and a resumed run must reduce as the original did
    fsdp2 = bool(config.get("fsdp2"))
    if fsdp2:  # parameters and Adam's moments sharded over the ranks: DTensors
        from torch.distributed.checkpoint.state_dict import set_state_dict

        model = sharded_model(context.get_world_size(), bool(config.get("fsdp2_per_layer")))
    else:
        model = ray.train.torch.prepare_model(build_model(), parallel_strategy_kwargs={"find_unused_parameters": True})
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    ckpt = ray_ckpt.train.Checkpointer(ray_ckpt.CheckpointConfig(**config["checkpoint"]))
    restored = ckpt.restore(into=fsdp2_state(model, optim)) if fsdp2 else ckpt.restore()
    start = 0
    if restored is not None and fsdp2:
        set_state_dict(model, optim, model_state_dict=restored.state["model"], optim_state_dict=restored.state["optim"])
        start = restored.step + 1
    elif restored is not None:
        model.load_state_dict(restored.state["model"])
        optim.load_state_dict(restored.state["optim"])
        start = restored.step + 1
    events = pathlib.Path(config["events_dir"])
    record = {
        "rank": rank,
        "attempt": ckpt.attempt,
        "node_id": ckpt.node_id,
        "pid": os.getpid(),
        "restored_step": None if restored is None else restored.step,
        "source": None if restored is None else restored.source,
        "from_world_size": None if restored is None else restored.from_world_size,
        # FSDP2: the full parameters as restored (gathered on every rank), to compare with the saver's
        "restored_digest": params_digest(model) if fsdp2 and restored is not None else None,
        "phases_s": None if restored is None else restored.phases_s,
        "time": time.time(),
    }
    (events / f"restore-{rank}-{uuid.uuid4().hex[:8]}.json").write_text(json.dumps(record))
    end = config["steps"]
    grown = restored is not None and (restored.from_world_size or 0) < context.get_world_size()
    if grown and config.get("steps_after_grow") is not None:  # every rank restored the same step: one end
        end = min(end, start + config["steps_after_grow"])
    for step in range(start, end):
        if step == config.get("compute_step"):  # a long step: its start is recorded
            record = {"rank": rank, "pid": os.getpid(), "started": time.time(), "seconds": config["compute_s"]}
            (events / f"compute-{rank}-{uuid.uuid4().hex[:8]}.json").write_text(json.dumps(record))
            busy(config["compute_s"])
        train_step(model, optim, step, rank)
        state = fsdp2_state(model, optim) if fsdp2 else {"model": model.state_dict(), "optim": optim.state_dict()}
        if fsdp2:  # what this step saves, to compare a later (resharded) restore with
            # written before the save: a step can commit only after rank 0 staged it, so every
            # committed step has its record even when the group is stopped right after the commit
            digest = params_digest(model)
            if rank == 0:
                record = {
                    "step": step,
                    "attempt": ckpt.attempt,
                    "digest": digest,
                    "world_size": context.get_world_size(),
                    "time": time.time(),
                }
                (events / f"step-{uuid.uuid4().hex[:8]}.json").write_text(json.dumps(record))
        ckpt.save(step, state)
        if config.get("log_steps"):  # when each step ended, per rank and process (read_steps)
            line = json.dumps({"rank": rank, "step": step, "pid": os.getpid(), "time": time.time()})
            with (events / f"steps-{rank}-{os.getpid()}.jsonl").open("a") as log:
                log.write(line + "\n")
        time.sleep(config["step_sleep_s"])
        while (events / PAUSE_FILE).exists():  # a test holds the run between steps
            time.sleep(0.1)
    ckpt.wait()
    ckpt.close()
    if rank == 0 and config.get("rank0_after_s"):  # a final evaluation or upload on rank 0 alone
        time.sleep(config["rank0_after_s"])
    final = {"rank": rank, "params_digest": params_digest(model), "time": time.time()}
    (events / f"final-{rank}-{uuid.uuid4().hex[:8]}.json").write_text(json.dumps(final))


def run(
    *,
    name: str,
    storage_path: str,
    events_dir: str,
    steps: int,
    workers: int | tuple[int, int],
    checkpoint: dict[str, Any],
    step_sleep_s: float = 0.1,
    max_failures: int = 3,
    in_place: dict[str, Any] | None = None,
    fsdp2: bool = False,
    fsdp2_per_layer: bool = False,
    compute_step: int | None = None,
    compute_s: float = 0.0,
    steps_after_grow: int | None = None,
    rank0_after_s: float = 0.0,
    log_steps: bool = False,
) -> dict[str, Any]:
    """Run the job on the connected cluster; returns rank 0's final record (params digest).
    ``in_place``: recover in place with ``ray_ckpt.train.InPlaceRecovery(**in_place)``.
    ``fsdp2``: shard the model with FSDP2 ``fully_shard`` instead of DDP (a DTensor state);
    then every step's full-parameter digest is also written (``read_step_digests``); with
    ``fsdp2_per_layer`` each Linear is an FSDP unit of its own, under the root's.
    ``compute_step``: that step (each time it runs) first computes for ``compute_s`` seconds,
    on a tensor of its own, and records when it began (``read_computes``).
    ``steps_after_grow``: a group that restored a step saved by fewer ranks ends that many steps
    after it (an elastic run that grew back has shown its reshard).
    ``rank0_after_s``: rank 0 works that much longer after training (a final evaluation) while
    the other ranks' functions have returned.
    ``log_steps``: every rank records when each of its steps ended (``read_steps``).
    While ``events_dir/PAUSE_FILE`` exists, every rank waits after its step."""
    recovery = None if in_place is None else ray_ckpt.train.InPlaceRecovery(**in_place)
    trainer = TorchTrainer(
        train_loop if recovery is None else recovery.wrap(train_loop),
        torch_config=recovery,
        train_loop_config={
            "steps": steps,
            "checkpoint": checkpoint,
            "events_dir": events_dir,
            "step_sleep_s": step_sleep_s,
            "fsdp2": fsdp2,
            "fsdp2_per_layer": fsdp2_per_layer,
            "compute_step": compute_step,
            "compute_s": compute_s,
            "steps_after_grow": steps_after_grow,
            "rank0_after_s": rank0_after_s,
            "log_steps": log_steps,
        },
        # a (min, max) pair: elastic, the group restarts at another size as nodes come and go
        scaling_config=ScalingConfig(num_workers=workers, elastic_resize_monitor_interval_s=2.0),
        run_config=RunConfig(
            name=name, storage_path=storage_path, failure_config=FailureConfig(max_failures=max_failures)
        ),
    )
    trainer.fit()
    finals = [json.loads(p.read_text()) for p in pathlib.Path(events_dir).glob("final-0-*.json")]
    if len(finals) != 1:
        raise RuntimeError(f"expected one final record of rank 0, found {len(finals)}")
    return finals[0]


def uninterrupted_digest(*, steps: int, workers: int, fsdp2: bool = False, fsdp2_per_layer: bool = False) -> str:
    """The final parameters' digest of the job run ``steps`` steps without an interruption,
    computed outside Ray: ``workers`` local processes (gloo on this host) run ``train_loop``'s
    math with no checkpointer (a TorchTrainer run of the same job ends on the same digest, a
    recovered one too). Seconds instead of a Ray Train run's start; raises RuntimeError when a
    rank fails, with its output."""
    with socket.socket() as probe:  # a free port for the ranks' rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, os.path.abspath(__file__), "--uninterrupted-rank"]
    options = ["--steps", str(steps), "--workers", str(workers), "--rendezvous-port", str(port)]
    options += ["--fsdp2"] * fsdp2 + ["--fsdp2-per-layer"] * fsdp2_per_layer
    with tempfile.TemporaryDirectory(prefix="rckref") as folder:  # files, not pipes: each rank's output
        logs = [pathlib.Path(folder, f"rank-{rank}.log") for rank in range(workers)]
        ranks = []
        for rank, log in enumerate(logs):
            with log.open("w") as out:
                ranks.append(subprocess.Popen([*command, str(rank), *options], stdout=out, stderr=subprocess.STDOUT))
        try:
            codes = [rank.wait(timeout=300) for rank in ranks]
        finally:
            for rank in ranks:
                if rank.poll() is None:
                    rank.kill()
        outputs = [log.read_text() for log in logs]
    digests = [(out.strip().splitlines() or [""])[-1] for out in outputs]
    failed = [r for r, (code, digest) in enumerate(zip(codes, digests, strict=True)) if code or len(digest) != 64]
    if failed:
        raise RuntimeError(f"the uninterrupted run's rank {failed[0]} failed:\n{outputs[failed[0]][-2000:]}")
    return digests[0]


def _uninterrupted_rank(rank: int, workers: int, steps: int, port: int, fsdp2: bool, per_layer: bool) -> str:
    """One rank of ``uninterrupted_digest``: ``train_loop``'s model, optimizer and steps, in the
    same order of calls, in the default process group; the digest of its parameters. The
    process ends without tearing the group down (``main``)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=workers)
    if fsdp2:
        model = sharded_model(workers, per_layer)
    elif workers > 1:  # as ray.train.torch.prepare_model wraps it on CPU
        model = torch.nn.parallel.DistributedDataParallel(build_model(), find_unused_parameters=True)
    else:
        model = build_model()
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    if fsdp2:
        fsdp2_state(model, optim)  # the state a restore would fill: it creates Adam's, as in the job
    for step in range(steps):
        train_step(model, optim, step, rank)
    return params_digest(model)


def kill_rank_node_when(
    cluster: Any, job: str, rank: int, at_step: int, namespace: str, timeout_s: float = 300
) -> dict[str, Any]:
    """Wait until ``at_step`` is committed, then hard-kill the node running ``rank``."""
    registry = naming.registry_handle(namespace)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not ABANDONED.is_set():
        latest = ray.get(registry.latest_committed.remote(job))
        if latest is not None and latest >= at_step:
            node_id = ray.get(registry.locate.remote(job, latest))[rank]["local_node"]
            for node in cluster.worker_nodes:
                if node.node_id == node_id:
                    killed_at = time.time()
                    cluster.remove_node(node, allow_graceful=False)
                    return {"node_id": node_id, "latest_committed": latest, "time": killed_at}
            raise RuntimeError(f"rank {rank} runs on node {node_id}, which is not a worker node")
        time.sleep(0.05)
    if ABANDONED.is_set():
        raise RuntimeError(f"the run ended before step {at_step} was committed")
    raise TimeoutError(f"step {at_step} was not committed within {timeout_s} s")


def wait_committed(job: str, step: int, timeout_s: float = 300) -> None:
    """Wait until ``job`` has committed ``step`` (or a newer one)."""
    registry = naming.registry_handle(ray_ckpt.settings.namespace())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not ABANDONED.is_set():
        latest = ray.get(registry.latest_committed.remote(job))
        if latest is not None and latest >= step:
            return
        time.sleep(0.05)
    if ABANDONED.is_set():
        raise RuntimeError(f"job {job!r}: the run ended before step {step} was committed")
    raise TimeoutError(f"job {job!r}: step {step} was not committed within {timeout_s} s")


def rank_node(job: str, rank: int) -> str:
    """The node that ran ``rank`` at ``job``'s newest committed step (where its local copy is)."""
    registry = naming.registry_handle(ray_ckpt.settings.namespace())
    latest = ray.get(registry.latest_committed.remote(job))
    return str(ray.get(registry.locate.remote(job, latest))[rank]["local_node"])


def remove_node(sim: SimulatedCluster, node_id: str) -> None:
    """Hard-kill one worker node of the simulated cluster, without waiting."""
    node = next(n for n in sim.workers if str(n.node_id) == node_id)
    sim.cluster.remove_node(node, allow_graceful=False)
    sim.workers.remove(node)


def read_step_digests(events_dir: str) -> list[dict[str, Any]]:
    """An FSDP2 run's per-step records (rank 0's): step, attempt, digest, world size, and when
    the step's compute ended."""
    return [json.loads(p.read_text()) for p in pathlib.Path(events_dir).glob("step-*.json")]


def read_computes(events_dir: str) -> list[dict[str, Any]]:
    """The long steps' records (rank, pid, started, seconds), oldest first."""
    records = [json.loads(p.read_text()) for p in pathlib.Path(events_dir).glob("compute-*.json")]
    return sorted(records, key=lambda r: r["started"])


def read_steps(events_dir: str) -> list[dict[str, Any]]:
    """With ``log_steps``: every step's end (rank, step, pid, time), in time order."""
    records = [
        json.loads(line)
        for path in pathlib.Path(events_dir).glob("steps-*.jsonl")
        for line in path.read_text().splitlines()
        if line
    ]
    return sorted(records, key=lambda r: r["time"])


def read_restores(events_dir: str) -> list[dict[str, Any]]:
    return sorted(
        (json.loads(p.read_text()) for p in pathlib.Path(events_dir).glob("restore-*.json")),
        key=lambda r: (r["time"], r["rank"]),
    )


def cluster_of(
    cluster: SimulatedCluster | None, workers: int, **args: Any
) -> contextlib.AbstractContextManager[SimulatedCluster]:
    """``cluster``, which must have ``workers`` live workers, this process connected and the
    service started in the default namespace, left up on leaving; or, without one, a fresh
    ``SimulatedCluster(workers, **args)`` whose Ray messages stay in its logs, shut down on
    leaving."""
    if cluster is None:
        return SimulatedCluster(workers, logging_level="ERROR", **args)
    if len(cluster.workers) != workers:
        raise ValueError(f"the cluster has {len(cluster.workers)} workers, the run needs {workers}")
    return contextlib.nullcontext(cluster)


def run_beside(fault: Callable[[], None], **run_args: Any) -> tuple[dict[str, Any], list[BaseException]]:
    """``run(**run_args)`` with ``fault()`` on a thread beside it: rank 0's final record and what
    ``fault`` raised (empty when nothing). ``ABANDONED`` is cleared when the run starts and set
    when it ends, so that a fault still waiting on the run stops before the cluster goes."""
    failures: list[BaseException] = []

    def guarded() -> None:
        try:
            fault()
        except BaseException as error:  # handed to the caller
            failures.append(error)

    thread = threading.Thread(target=guarded, daemon=True)
    ABANDONED.clear()
    thread.start()
    try:
        final = run(**run_args)
    finally:
        ABANDONED.set()
        thread.join(timeout=5)
    return final, failures


def run_with_kill(
    *,
    steps: int,
    workers: int,
    nodes: int,
    kill_at_step: int,
    checkpoint: dict[str, Any] | None = None,
    in_place: dict[str, Any] | None = None,
    quiet_driver: bool = False,
    cluster: SimulatedCluster | None = None,
) -> dict[str, Any]:
    """On a fresh simulated cluster of ``nodes`` workers (or on ``cluster``, see ``cluster_of``):
    the job with the node of rank 1 hard-killed after ``kill_at_step`` committed, compared with
    an uninterrupted run of the same seed (``uninterrupted_digest``). ``checkpoint``: the
    CheckpointConfig fields (default RS(2,1)). Returns the report: ``{"killed", "restores",
    "bit_exact", "reference_digest", "final_digest", "final_status"}`` (``final_status``: the
    job's ``ray_ckpt.status()`` entry at the end, with its protection). ``quiet_driver``: keep
    Ray's messages about the killed node off this process's output (``quiet.quiet_driver``)."""
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    storage = tempfile.mkdtemp(prefix="rcktrain-storage")
    checkpoint = {"data_shards": 2, "parity_shards": 1} if checkpoint is None else checkpoint
    with cluster_of(cluster, nodes, store_budget_bytes=512 << 20) as sim:
        if quiet_driver:
            quiet.quiet_driver()  # Ray's messages about the node killed below stay in its logs
        common: dict[str, Any] = {"storage_path": storage, "steps": steps, "workers": workers, "checkpoint": checkpoint}
        reference = uninterrupted_digest(steps=steps, workers=workers)
        events = tempfile.mkdtemp()
        killed: dict[str, Any] = {}
        namespace = ray_ckpt.settings.namespace()
        thread = threading.Thread(
            target=lambda: killed.update(kill_rank_node_when(sim.cluster, "killed", 1, kill_at_step, namespace)),
            daemon=True,
        )
        ABANDONED.clear()
        thread.start()
        try:
            final = run(name="killed", events_dir=events, in_place=in_place, **common)
        finally:
            ABANDONED.set()  # the kill thread, if still waiting, stops before the cluster goes
            thread.join(timeout=5)
        return {
            "killed": killed,
            "final_status": ray_ckpt.status(namespace=namespace)["jobs"].get("killed"),
            "restores": read_restores(events),
            "reference_digest": reference,
            "final_digest": final["params_digest"],
            "bit_exact": final["params_digest"] == reference,
        }


def run_elastic(
    steps: int = 100,
    step_sleep_s: float = 0.25,
    quiet_driver: bool = False,
    cluster: SimulatedCluster | None = None,
    refresh_view: bool = False,
) -> dict[str, Any]:
    """An elastic FSDP2 run, ``ScalingConfig(num_workers=(2, 4))``, on a fresh simulated
    cluster of exactly 4 one-CPU nodes (or on ``cluster``, see ``cluster_of``), RS(2,1): after
    step 4 committed the node of rank 1 is hard-killed and there is no spare, so Ray Train
    restarts the run at 3 workers, which reshard the 4 ranks' step from peer memory; once they
    have trained 2 steps a node is added back and Ray Train grows the run to 4 workers, which
    reshard from 3 and end the run 3 steps later (``steps`` bounds a run that never grows
    back). Returns
    ``{"sizes": [workers of each attempt that restored, in order], "reshards": [{"from",
    "to", "step", "bit_exact"}], "completed"}``: ``bit_exact`` compares every new rank's
    restored full parameters with those the saving group had at that step. ``quiet_driver`` as
    in ``run_with_kill``. ``refresh_view``: once the killed node is dead, and once the node
    added back is alive, have Ray Train's view of the cluster refreshed at once
    (``refresh_elastic_view``) instead of at Ray's next 20 s refresh."""
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    # a start at the old size right after the kill cannot be placed: give up on it after 10 s
    # (not Ray Train's 60 s) and retry at the size that fits (docs/ray-train.md, section 2)
    os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "10")
    events = tempfile.mkdtemp()
    failures: list[BaseException] = []

    def fit() -> None:
        try:
            run(
                name="elastic",
                storage_path=tempfile.mkdtemp(prefix="rcktrain-storage"),
                events_dir=events,
                steps=steps,  # long enough at 3 workers for the node added back to be seen
                workers=(2, 4),
                checkpoint={"data_shards": 2, "parity_shards": 1},
                step_sleep_s=step_sleep_s,
                max_failures=4,
                fsdp2=True,
                steps_after_grow=3,
            )
        except BaseException as error:  # reported below
            failures.append(error)
            ABANDONED.set()  # the waits below stop at once

    with cluster_of(cluster, 4, store_budget_bytes=256 << 20) as sim:
        if quiet_driver:
            quiet.quiet_driver()  # Ray's messages about the node killed below stay in its logs
        # Ray starts a node only from the main thread: the run goes on a thread instead
        trainer = threading.Thread(target=fit, daemon=True)
        ABANDONED.clear()
        trainer.start()
        try:
            wait_committed("elastic", 4)
            victim = rank_node("elastic", 1)
            remove_node(sim, victim)
            if refresh_view:
                wait_dead(victim)
                refresh_elastic_view()
            deadline = time.monotonic() + 240
            while not any(r["world_size"] == 3 and r["step"] >= 2 for r in read_step_digests(events)):
                if time.monotonic() > deadline or not trainer.is_alive():
                    raise TimeoutError("the run did not go on at 3 workers within 240 s")
                time.sleep(0.2)
            sim.add_workers(1)
            if refresh_view:
                refresh_elastic_view()
        except BaseException:
            if failures:  # the run's own error says more than the wait that gave up on it
                raise failures[0] from None
            raise
        trainer.join(timeout=600)
        if trainer.is_alive():
            raise TimeoutError("the elastic run did not finish within 600 s")
    if failures:
        raise failures[0]
    attempts, reshards = reshard_report(read_restores(events), read_step_digests(events))
    return {"sizes": [len(r) for r in attempts], "reshards": reshards, "completed": True}


def wait_dead(node_id: str, timeout_s: float = 60) -> None:
    """Wait until Ray no longer lists ``node_id`` alive."""
    deadline = time.monotonic() + timeout_s
    while node_id in naming.alive_node_ids():
        if time.monotonic() > deadline:
            raise TimeoutError(f"node {node_id} was not declared dead within {timeout_s} s")
        time.sleep(0.1)


def refresh_elastic_view() -> None:
    """Have Ray's autoscaling coordinator, whose view of the nodes Ray Train's elastic policy
    reads, refresh that view now (it does so every 20 s: a node lost or added is otherwise seen
    up to 20 s late). It reaches into a private part of Ray: where that is not found, this does
    nothing, and the run waits for Ray's own refresh."""
    try:
        coordinator = ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
        ray.get(coordinator.__ray_call__.remote(lambda actor: actor._tick()), timeout=30)
    except (ValueError, ray.exceptions.RayError):  # no such actor, or no such method in this Ray
        pass


def reshard_report(
    restores: list[dict[str, Any]], saved: list[dict[str, Any]]
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """The restore records grouped per attempt (in order), and per attempt that resharded:
    ``{"from", "to", "step", "bit_exact", "saved_digests", "restored_digests"}``. ``bit_exact``
    compares every new rank's restored full parameters with the digest the saving group
    recorded for that step; a saving group that recorded none is an error of the run's
    records (RuntimeError), never reported as a mismatch."""
    attempts: dict[str, list[dict[str, Any]]] = {}
    for record in restores:
        attempts.setdefault(record["attempt"], []).append(record)
    reshards = []
    for records in attempts.values():
        old = records[0]["from_world_size"]
        if old in (None, len(records)):
            continue
        step = records[0]["restored_step"]
        by_saver = sorted({s["digest"] for s in saved if s["step"] == step and s["world_size"] == old})
        if not by_saver:
            raise RuntimeError(f"no record of what {old} workers saved at step {step}, which {len(records)} restored")
        restored = sorted({r["restored_digest"] for r in records})
        reshards.append(
            {
                "from": old,
                "to": len(records),
                "step": step,
                "bit_exact": restored == by_saver,
                "saved_digests": by_saver,
                "restored_digests": restored,
            }
        )
    return list(attempts.values()), reshards


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=5, help="simulated one-CPU worker nodes")
    parser.add_argument("--kill-at-step", type=int, default=10)
    parser.add_argument(
        "--elastic",
        action="store_true",
        help="instead: an elastic FSDP2 run (2 to 4 workers) that loses a node and gets one back, resharding",
    )
    parser.add_argument("--fsdp2", action="store_true", help=argparse.SUPPRESS)  # of --uninterrupted-rank
    parser.add_argument("--fsdp2-per-layer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rendezvous-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--uninterrupted-rank", type=int, help=argparse.SUPPRESS)  # see uninterrupted_digest
    args = parser.parse_args(argv)
    if args.uninterrupted_rank is not None:
        rank, port = args.uninterrupted_rank, args.rendezvous_port
        print(_uninterrupted_rank(rank, args.workers, args.steps, port, args.fsdp2, args.fsdp2_per_layer), flush=True)
        # no teardown: a DDP reducer freed after its gloo group can deadlock on the GIL at exit
        os._exit(0)
    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rcktrain"))
    if args.elastic:
        elastic = run_elastic(quiet_driver=True)
        print(f"workers of each restart: {' -> '.join(map(str, elastic['sizes']))}")
        for r in elastic["reshards"]:
            print(
                f"{r['from']} -> {r['to']} workers: step {r['step']} resharded from peer memory, "
                + ("bit-identical to the saved parameters" if r["bit_exact"] else "MISMATCH")
            )
        return 0 if elastic["reshards"] and all(r["bit_exact"] for r in elastic["reshards"]) else 1
    report = run_with_kill(
        steps=args.steps, workers=args.workers, nodes=args.nodes, kill_at_step=args.kill_at_step, quiet_driver=True
    )
    killed = report["killed"]
    print(f"killed node {killed.get('node_id', '?')[:8]} after step {killed.get('latest_committed')} committed")
    for record in report["restores"]:
        print(
            f"rank {record['rank']} attempt {record['attempt'][:8]}: restored step {record['restored_step']} "
            f"from {record['source']}"
        )
    same = report["bit_exact"]
    print("final parameters bit-identical to the uninterrupted run" if same else "MISMATCH in final parameters")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
