"""Hugging Face Trainer under Ray Train with its whole state in peer memory, a node hard-killed.

Two Ray Train workers train a tiny random-init ``LlamaForCausalLM`` with HF's ``Trainer``
(``prepare_trainer``, DDP over gloo) and ``PeerMemoryCallback`` (every 5 steps, RS(2, 2)).
The run is done twice on a simulated cluster: uninterrupted, and with the node of rank 1 killed
once step ``--kill-at`` is reached; Ray Train restarts the workers, ``resume_from_peers``
brings the newest committed step back and HF resumes from it. Rank 0 of each run writes its
final model, optimizer and scheduler state; they are compared bit for bit.

    python scripts/hf_example.py [--steps 30] [--kill-at 12]
"""

from __future__ import annotations

import pathlib
import tempfile
import time
from typing import Any

import kill_and_compare
import torch

import ray_ckpt

CHECKPOINT = {"every": 5, "data_shards": 2, "parity_shards": 2}  # m = 2: the tests kill two runs at once, a node each


def train_func(config: dict[str, Any]) -> None:
    import ray.train
    import transformers
    from ray.train.huggingface.transformers import prepare_trainer

    from ray_ckpt.integrations.transformers import PeerMemoryCallback, resume_from_peers

    rank = ray.train.get_context().get_world_rank()

    class Pace(transformers.TrainerCallback):
        """A step's work (so the kill lands mid-run), and the mark that asks for the kill."""

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            time.sleep(config["step_s"])
            if rank == 1 and state.global_step == config["kill_at"] and config["mark"]:
                pathlib.Path(config["mark"]).write_text(ray.get_runtime_context().get_node_id())

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, max_position_embeddings=16, attention_dropout=0.1,
        )
    )  # fmt: skip
    ids = torch.randint(0, 64, (64, 8), generator=torch.Generator().manual_seed(0))
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf-example"), max_steps=config["steps"], per_device_train_batch_size=4,
        learning_rate=1e-2, warmup_steps=2, save_strategy="no", report_to=[], use_cpu=True, seed=7,
        disable_tqdm=True,
    )  # fmt: skip
    callback = PeerMemoryCallback(ray_ckpt.CheckpointConfig(**CHECKPOINT))
    trainer = transformers.Trainer(
        model, args, train_dataset=[{"input_ids": r, "labels": r} for r in ids], callbacks=[callback, Pace()]
    )
    trainer = prepare_trainer(trainer)
    trainer.train(resume_from_checkpoint=resume_from_peers(trainer))
    if rank == 0:
        final = {
            "model": trainer.model.state_dict(),
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.lr_scheduler.state_dict(),
            "step": trainer.state.global_step,
        }
        torch.save(final, config["out"])


run_example = kill_and_compare.example(train_func, "hf")


if __name__ == "__main__":
    kill_and_compare.main(__doc__, run_example)
