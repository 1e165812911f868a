"""The trainer examples' harness (hf_example.py, lightning_example.py, dcp_loop_example.py): a
Ray Train job run twice on a simulated cluster, uninterrupted and with a node hard-killed where
the job asks for it (with a full restart of the worker group, or in place: the survivors keep
their processes), and the two final states compared bit for bit.

The job's training function takes the example's config: ``steps``, ``kill_at``, ``step_s`` (a
step's work), ``out`` (where rank 0 saves its final state with ``torch.save``) and ``mark`` (a
file; empty in the uninterrupted run): the rank to be killed writes its node's id there at step
``kill_at``, and that node is killed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import pathlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from ray_ckpt.tools import quiet

TrainFunc = Callable[[dict[str, Any]], None]


def fit(train_func: TrainFunc, name: str, storage: str, config: dict[str, Any], in_place: bool = False) -> Any:
    """``train_func`` on 2 Ray Train workers, up to 3 failures, recovered in place
    (``ray_ckpt.train.InPlaceRecovery``, one warm spare) or by Ray Train's restarts of the
    worker group; the run's ``Result``."""
    import ray_ckpt

    recovery = ray_ckpt.train.InPlaceRecovery(warm_spares=1) if in_place else None
    trainer = TorchTrainer(
        train_func if recovery is None else recovery.wrap(train_func),
        train_loop_config=config,
        torch_config=recovery,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=3)),
    )
    return trainer.fit()


def kill_when_marked(sim: Any, mark: pathlib.Path, killed: list[str], as_the_tool: bool = False) -> None:
    """Once ``mark`` exists, hard-kill the node whose id it holds (appended to ``killed``),
    ``remove_node(allow_graceful=False)``; ``as_the_tool``: through ``chaos.inject``, as
    ``ray-ckpt kill-node`` strikes, the kill recorded in the registry's events."""
    while not mark.exists():
        time.sleep(0.05)
    time.sleep(0.1)
    killed.append(mark.read_text())
    if not as_the_tool:
        sim.kill(killed)
        return
    from ray_ckpt.tools import chaos
    from ray_ckpt.tools.faults import ClusterNodeRemoval

    chaos.inject(ClusterNodeRemoval(sim.cluster), killed, namespace=sim.namespace, wait_dead_s=60.0)
    sim.workers[:] = [node for node in sim.workers if str(node.node_id) not in killed]


MODES = ("restart", "in_place")  # how a killed run recovers: Ray Train's restart of the group, or in place


def run_example(
    train_func: TrainFunc,
    name: str,
    *,
    nodes: int = 4,
    steps: int = 30,
    kill_at: int = 12,
    step_s: float = 0.2,
    cluster: Any = None,
    overlap: bool = False,
    modes: tuple[str, ...] = ("restart",),
) -> dict[str, Any]:
    """The uninterrupted run, and a run with a node killed for each of ``modes`` (``MODES``:
    recovered by Ray Train's restart of the worker group, or in place), all at once, on
    ``nodes`` one-CPU nodes (runs and folders named after ``name``): ``{"reference"`` (its
    final state), ``"reference_attempts"`` (the worker groups it had: 1), ``"runs": {mode:
    {"killed", "error"`` (the run's, or the exception ``fit`` raised), ``"resumed"`` (the final
    state; None where it wrote none), ``"equal"`` (bit for bit with the
    reference), ``"recoveries"`` (as the timeline shows them: ``recoveries_of``)``}}}``.
    ``cluster``: a ``SimulatedCluster`` of ``nodes`` workers to run on instead of a fresh one
    (this process connected, the service started in the default namespace), left up at the
    end. ``overlap``: the uninterrupted run goes on beside the killed ones, on workers of its
    own, instead of before them. ``nodes`` must leave 3 for each killed run (2 workers, and the
    restarted or replacement worker) and, with ``overlap``, 2 more. An in-place run's kill is
    recorded in the registry's events as ``ray-ckpt kill-node`` records one (its recovery on
    the timeline then has its kill)."""
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        raise ValueError(f"modes must be some of {MODES}, got {modes!r}")
    needed = 3 * len(modes) + (2 if overlap else 0)
    if nodes < needed:
        raise ValueError(f"{nodes} nodes cannot hold the runs: {needed} are needed")
    if cluster is not None and len(cluster.workers) != nodes:
        raise ValueError(f"the cluster has {len(cluster.workers)} workers, the example needs {nodes}")
    out = pathlib.Path(tempfile.mkdtemp(prefix=f"{name}-example-out"))
    storage = tempfile.mkdtemp(prefix=f"{name}-example-storage")
    try:
        return _runs(train_func, name, out, storage, nodes, steps, kill_at, step_s, cluster, overlap, modes)
    finally:  # the runs' folders: what the report needs is read by now
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(storage, ignore_errors=True)


def _runs(
    train_func: TrainFunc,
    name: str,
    out: pathlib.Path,
    storage: str,
    nodes: int,
    steps: int,
    kill_at: int,
    step_s: float,
    cluster: Any,
    overlap: bool,
    modes: tuple[str, ...],
) -> dict[str, Any]:
    """``run_example``'s runs, their final states written under ``out``, Ray Train's under ``storage``."""
    from ray_ckpt.testing import SimulatedCluster

    base = {"steps": steps, "kill_at": kill_at, "step_s": step_s}
    with (
        SimulatedCluster(nodes, store_budget_bytes=256 << 20, logging_level="ERROR")
        if cluster is None
        else contextlib.nullcontext(cluster)
    ) as sim:
        quiet.quiet_driver()
        uninterrupted = functools.partial(
            fit, train_func, f"{name}-reference", storage, {**base, "mark": "", "out": str(out / "reference.pt")}
        )
        beside = threading.Thread(target=uninterrupted, daemon=True)
        if overlap:
            beside.start()
        else:
            uninterrupted()
        runs: dict[str, dict[str, Any]] = {mode: {"killed": []} for mode in modes}

        def killed_run(mode: str) -> None:
            mark, run = out / f"kill-{mode}", runs[mode]
            in_place = mode == "in_place"
            killer = threading.Thread(target=kill_when_marked, args=(sim, mark, run["killed"], in_place), daemon=True)
            killer.start()
            try:
                config = {**base, "mark": str(mark), "out": str(out / f"{mode}.pt")}
                run["error"] = fit(train_func, f"{name}-{mode}", storage, config, in_place=in_place).error
            except Exception as error:  # a run that raised: the report says so, the others go on
                run["error"] = error
            finally:
                killer.join(timeout=5)

        threads = [threading.Thread(target=killed_run, args=(mode,), daemon=True) for mode in modes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if overlap:
            beside.join()  # the uninterrupted run ends before the cluster goes
        attempts = attempts_of(f"{name}-reference")
        for mode, run in runs.items():
            run["recoveries"] = recoveries_of(f"{name}-{mode}")
    reference = torch.load(out / "reference.pt")
    for mode, run in runs.items():  # a run that failed wrote no final state
        final = out / f"{mode}.pt"
        run["resumed"] = torch.load(final) if final.exists() else None
        run["equal"] = run["resumed"] is not None and same(reference, run["resumed"])
    return {"reference": reference, "reference_attempts": attempts, "runs": runs}


def _of_run(record: dict[str, Any], job: str) -> bool:
    """Whether an event is of the run's job or of one an integration derives from it
    (``<job>.lightning``)."""
    return record.get("job") == job or str(record.get("job")).startswith(f"{job}.")


def recoveries_of(experiment: str) -> list[dict[str, Any]]:
    """The run's recoveries as the timeline and the dashboard show them
    (``ray_ckpt.core.timeline.Recovery`` as dicts), from the registry's events."""
    import ray_ckpt
    from ray_ckpt.core import timeline
    from ray_ckpt.transport.registry_client import RegistryClient

    job = ray_ckpt.train.job_name(experiment)
    _, records = RegistryClient(ray_ckpt.settings.namespace()).events()
    return [r.as_dict() for r in timeline.recoveries(records) if _of_run({"job": r.job}, job)]


def attempts_of(experiment: str) -> int:
    """How many worker groups of a run checkpointed, from the registry's events: the attempts
    its saves and restores name (each attempt's first save sends an event), under the run's
    job or one an integration derives from it (``<job>.lightning``)."""
    import ray_ckpt
    from ray_ckpt.transport.registry_client import RegistryClient

    job = ray_ckpt.train.job_name(experiment)
    _, records = RegistryClient(ray_ckpt.settings.namespace()).events()
    return len(
        {
            r["attempt"]
            for r in records
            if r.get("kind") in ("save", "restore") and r.get("attempt") is not None and _of_run(r, job)
        }
    )


def example(train_func: TrainFunc, name: str) -> Callable[..., dict[str, Any]]:
    """An example's ``run_example(*, nodes, steps, kill_at, step_s, cluster, overlap, modes)``:
    ``run_example`` of ``train_func``."""
    return functools.partial(run_example, train_func, name)


def same(a: Any, b: Any) -> bool:
    """Bit for bit: tensors by dtype, shape and bytes; containers by keys; values by ==."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def main(doc: str | None, run: Callable[..., dict[str, Any]]) -> None:
    """An example's command line: ``[--steps 30] [--kill-at 12]``, ``doc`` as its help; the
    report of ``run`` (its ``run_example``) printed."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kill-at", type=int, default=12)
    parser.add_argument(
        "--in-place", action="store_true", help="recover in place (survivors keep their processes), not by a restart"
    )
    args = parser.parse_args()
    mode = "in_place" if args.in_place else "restart"
    run_report = run(steps=args.steps, kill_at=args.kill_at, modes=(mode,))["runs"][mode]
    print(f"killed node(s): {run_report['killed']}; run error: {run_report['error']}")
    for recovery in run_report["recoveries"]:
        resume = recovery["time_to_resume_s"]
        resumed = "-" if resume is None else f"{resume:.2f} s"
        print(
            f"recovery ({recovery['mode']}): restored step {recovery['step']}, {recovery['steps_lost']} step(s) "
            f"redone, resumed {resumed} after the kill, sources {recovery['sources']}"
        )
    resumed = run_report["resumed"]
    final = "none (the run wrote no final state)" if resumed is None else resumed["step"]
    print(f"final step {final}; bit-exact against the uninterrupted run: {run_report['equal']}")
