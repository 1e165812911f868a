"""PyTorch Lightning under Ray Train with its checkpoints in peer memory, a node hard-killed.

Two Ray Train workers train a tiny ``LightningModule`` (Adam, a per-step StepLR) with
``RayDDPStrategy`` and a ``StatefulDataLoader`` (Lightning puts an epoch-seeded
DistributedSampler in it), checkpointed by ``PeerMemoryCheckpointIO`` and ``SaveToPeers``
(kept every 5 steps, RS(2, 1)). The run is done twice on a simulated cluster: uninterrupted,
and with the node of rank 1 killed once step ``--kill-at`` is reached; Ray Train restarts the
workers and ``trainer.fit(ckpt_path=io.resume_path())`` resumes from the newest kept step. Rank 0 of each run writes its
final model, optimizer and scheduler state; they are compared bit for bit.

    python scripts/lightning_example.py [--steps 30] [--kill-at 12]
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import threading
import time
from typing import Any

import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

import ray_ckpt
from ray_ckpt.tools import quiet

CHECKPOINT = {"every": 5, "data_shards": 2, "parity_shards": 1}


def train_func(config: dict[str, Any]) -> None:
    import lightning.pytorch as pl
    import ray.train
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer
    from torchdata.stateful_dataloader import StatefulDataLoader

    from ray_ckpt.integrations.lightning import PeerMemoryCheckpointIO, SaveToPeers

    rank, world = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()

    class Regressor(pl.LightningModule):
        def __init__(self, lr: float = 0.05) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

        def training_step(self, batch: Any, index: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            optim = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
            scheduler = torch.optim.lr_scheduler.StepLR(optim, step_size=3, gamma=0.5)
            return {"optimizer": optim, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    class Pace(pl.Callback):
        """A step's work (so the kill lands mid-run), and the mark that asks for the kill."""

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            time.sleep(config["step_s"])
            if rank == 1 and trainer.global_step == config["kill_at"] and config["mark"]:
                pathlib.Path(config["mark"]).write_text(ray.get_runtime_context().get_node_id())

    torch.manual_seed(0)
    module = Regressor()
    x = torch.randn(80, 4, generator=torch.Generator().manual_seed(0))
    data = list(zip(x, x.sum(1, keepdim=True)))
    # its own DistributedSampler (use_distributed_sampler=False): an order that depends on the
    # epoch only, whose epoch SaveToPeers can set on a resume
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1)
    loader = StatefulDataLoader(data, batch_size=4, sampler=sampler)
    io = PeerMemoryCheckpointIO(ray_ckpt.CheckpointConfig(**CHECKPOINT))
    trainer = pl.Trainer(
        max_steps=config["steps"], accelerator="cpu", devices="auto", strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment(), io], callbacks=[SaveToPeers(), Pace()], enable_checkpointing=False,
        logger=False, enable_progress_bar=False, use_distributed_sampler=False,
    )  # fmt: skip
    trainer = prepare_trainer(trainer)
    trainer.fit(module, loader, ckpt_path=io.resume_path())
    if rank == 0:
        final = {
            "model": module.state_dict(),
            "optimizer": trainer.optimizers[0].state_dict(),
            "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
            "step": trainer.global_step,
        }
        torch.save(final, config["out"])


def fit(name: str, storage: str, config: dict[str, Any]) -> Any:
    trainer = TorchTrainer(
        train_func,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=storage, failure_config=FailureConfig(max_failures=3)),
    )
    return trainer.fit()


def kill_when_marked(sim: Any, mark: pathlib.Path, killed: list[str]) -> None:
    while not mark.exists():
        time.sleep(0.05)
    time.sleep(0.1)
    killed.append(mark.read_text())
    sim.kill(killed)


def run_example(*, nodes: int = 4, steps: int = 30, kill_at: int = 12, step_s: float = 0.2) -> dict[str, Any]:
    """The uninterrupted run and the run with a node killed; their final states and whether
    they are equal bit for bit."""
    from ray_ckpt.testing import SimulatedCluster

    out = pathlib.Path(tempfile.mkdtemp(prefix="lightning-example-out"))
    storage = tempfile.mkdtemp(prefix="lightning-example-storage")
    base = {"steps": steps, "kill_at": kill_at, "step_s": step_s}
    killed: list[str] = []
    with SimulatedCluster(nodes, store_budget_bytes=256 << 20, logging_level="ERROR") as sim:
        quiet.quiet_driver()
        fit("lightning-reference", storage, {**base, "mark": "", "out": str(out / "reference.pt")})
        mark = out / "kill"
        killer = threading.Thread(target=kill_when_marked, args=(sim, mark, killed), daemon=True)
        killer.start()
        result = fit("lightning-killed", storage, {**base, "mark": str(mark), "out": str(out / "killed.pt")})
        killer.join(timeout=5)
    reference, resumed = torch.load(out / "reference.pt"), torch.load(out / "killed.pt")
    return {"killed": killed, "error": result.error, "reference": reference, "resumed": resumed,
            "equal": same(reference, resumed)}  # fmt: skip


def same(a: Any, b: Any) -> bool:
    """Bit for bit: tensors by dtype, shape and bytes; containers by keys; values by ==."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--kill-at", type=int, default=12)
    args = parser.parse_args()
    report = run_example(steps=args.steps, kill_at=args.kill_at)
    print(f"killed node(s): {report['killed']}; run error: {report['error']}")
    print(f"final step {report['resumed']['step']}; bit-exact against the uninterrupted run: {report['equal']}")


if __name__ == "__main__":
    main()
