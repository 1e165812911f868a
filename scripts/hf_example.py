"""Hugging Face Trainer under Ray Train with its whole state in peer memory, a node hard-killed.

Two Ray Train workers train a tiny random-init ``LlamaForCausalLM`` with HF's ``Trainer``
(``prepare_trainer``, DDP over gloo) and ``PeerMemoryCallback`` (every 5 steps, RS(2, 1)).
The run is done twice on a simulated cluster: uninterrupted, and with the node of rank 1 killed
once step ``--kill-at`` is reached; Ray Train restarts the workers, ``resume_from_peers``
brings the newest committed step back and HF resumes from it. Rank 0 of each run writes its
final model, optimizer and scheduler state; they are compared bit for bit.

    python scripts/hf_example.py [--steps 30] [--kill-at 12]
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

    out = pathlib.Path(tempfile.mkdtemp(prefix="hf-example-out"))
    storage = tempfile.mkdtemp(prefix="hf-example-storage")
    base = {"steps": steps, "kill_at": kill_at, "step_s": step_s}
    killed: list[str] = []
    with SimulatedCluster(nodes, store_budget_bytes=256 << 20, logging_level="ERROR") as sim:
        quiet.quiet_driver()
        fit("hf-reference", storage, {**base, "mark": "", "out": str(out / "reference.pt")})
        mark = out / "kill"
        killer = threading.Thread(target=kill_when_marked, args=(sim, mark, killed), daemon=True)
        killer.start()
        result = fit("hf-killed", storage, {**base, "mark": str(mark), "out": str(out / "killed.pt")})
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
