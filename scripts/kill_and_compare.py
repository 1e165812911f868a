"""The trainer examples' harness (hf_example.py, lightning_example.py): a Ray Train job run
twice on a simulated cluster, uninterrupted and with a node hard-killed where the job asks for
it, and the two final states compared bit for bit.

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


def fit(train_func: TrainFunc, name: str, storage: str, config: dict[str, Any]) -> Any:
    """``train_func`` on 2 Ray Train workers, up to 3 failures; the run's ``Result``."""
    trainer = TorchTrainer(
        train_func,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=3)),
    )
    return trainer.fit()


def kill_when_marked(sim: Any, mark: pathlib.Path, killed: list[str]) -> None:
    """Once ``mark`` exists, hard-kill the node whose id it holds (appended to ``killed``)."""
    while not mark.exists():
        time.sleep(0.05)
    time.sleep(0.1)
    killed.append(mark.read_text())
    sim.kill(killed)


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
) -> dict[str, Any]:
    """The uninterrupted run and the run with a node killed, on ``nodes`` one-CPU nodes (runs
    and folders named after ``name``): ``{"killed", "error"`` (the killed run's), ``"reference",
    "resumed"`` (the final states), ``"equal"`` (bit for bit), ``"reference_attempts"`` (the
    worker groups the uninterrupted run had: 1)``}``. ``cluster``: a ``SimulatedCluster`` of
    ``nodes`` workers to run on instead of a fresh one (this process connected, the service
    started in the default namespace), left up at the end. ``overlap``: the uninterrupted run
    goes on beside the killed one, on workers of its own, instead of before it (``nodes`` must
    leave room for both runs and the restart: 5)."""
    from ray_ckpt.testing import SimulatedCluster

    out = pathlib.Path(tempfile.mkdtemp(prefix=f"{name}-example-out"))
    storage = tempfile.mkdtemp(prefix=f"{name}-example-storage")
    base = {"steps": steps, "kill_at": kill_at, "step_s": step_s}
    killed: list[str] = []
    if cluster is not None and len(cluster.workers) != nodes:
        raise ValueError(f"the cluster has {len(cluster.workers)} workers, the example needs {nodes}")
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
        mark = out / "kill"
        killer = threading.Thread(target=kill_when_marked, args=(sim, mark, killed), daemon=True)
        killer.start()
        try:
            result = fit(
                train_func, f"{name}-killed", storage, {**base, "mark": str(mark), "out": str(out / "killed.pt")}
            )
        finally:
            killer.join(timeout=5)
            if overlap:
                beside.join()  # the uninterrupted run ends before the cluster goes
        attempts = attempts_of(f"{name}-reference")
    reference, resumed = torch.load(out / "reference.pt"), torch.load(out / "killed.pt")
    return {"killed": killed, "error": result.error, "reference": reference, "resumed": resumed,
            "equal": same(reference, resumed), "reference_attempts": attempts}  # fmt: skip


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
            if r.get("kind") in ("save", "restore")
            and r.get("attempt") is not None
            and (r.get("job") == job or str(r.get("job")).startswith(f"{job}."))
        }
    )


def example(train_func: TrainFunc, name: str) -> Callable[..., dict[str, Any]]:
    """An example's ``run_example(*, nodes, steps, kill_at, step_s, cluster, overlap)``:
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
    args = parser.parse_args()
    report = run(steps=args.steps, kill_at=args.kill_at)
    print(f"killed node(s): {report['killed']}; run error: {report['error']}")
    print(f"final step {report['resumed']['step']}; bit-exact against the uninterrupted run: {report['equal']}")
