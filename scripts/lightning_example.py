"""PyTorch Lightning under Ray Train with its checkpoints in peer memory, a node hard-killed.

Two Ray Train workers train a tiny ``LightningModule`` (Adam, a per-step StepLR) with
``RayDDPStrategy`` and a ``StatefulDataLoader`` (Lightning puts an epoch-seeded
DistributedSampler in it), checkpointed by ``PeerMemoryCheckpointIO`` and ``SaveToPeers``
(kept every 5 steps, RS(2, 2)). The run is done twice on a simulated cluster: uninterrupted,
and with the node of rank 1 killed once step ``--kill-at`` is reached; Ray Train restarts the
workers and ``trainer.fit(ckpt_path=io.resume_path())`` resumes from the newest kept step. Rank 0 of each run writes its
final model, optimizer and scheduler state; they are compared bit for bit.

    python scripts/lightning_example.py [--steps 30] [--kill-at 12]
"""

from __future__ import annotations

import pathlib
import time
from typing import Any

import kill_and_compare
import torch

import ray_ckpt

CHECKPOINT = {"every": 5, "data_shards": 2, "parity_shards": 2}  # m = 2: the tests kill two runs at once, a node each


def regressor_class() -> Any:
    """The example's model: a tiny ``LightningModule`` regressing the sum of 4 inputs (Adam, a
    per-step StepLR). A class made where it is called (Lightning is imported there: in the Ray
    Train workers, or in a test that trains it without Ray)."""
    import lightning.pytorch as pl

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

    return Regressor


def train_func(config: dict[str, Any]) -> None:
    import lightning.pytorch as pl
    import ray.train
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer
    from torchdata.stateful_dataloader import StatefulDataLoader

    from ray_ckpt.integrations.lightning import PeerMemoryCheckpointIO, SaveToPeers

    rank, world = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()

    class Pace(pl.Callback):
        """A step's work (so the kill lands mid-run), and the mark that asks for the kill."""

        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            time.sleep(config["step_s"])
            if rank == 1 and trainer.global_step == config["kill_at"] and config["mark"]:
                pathlib.Path(config["mark"]).write_text(ray.get_runtime_context().get_node_id())

    torch.manual_seed(0)
    module = regressor_class()()
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


run_example = kill_and_compare.example(train_func, "lightning")


if __name__ == "__main__":
    kill_and_compare.main(__doc__, run_example)
