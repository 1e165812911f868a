"""The Transformers integration without Ray: a tiny random-init Llama (dropout on) trained by
HF's Trainer with PeerMemoryCallback over a stand-in for peer memory (tests/support/memory_states.py:
real snapshots). A run that loses its process at step 7 (saves every 3 steps) and is resumed by
a fresh process (new Trainer, model initialised from another seed) through resume_from_peers
ends with the parameters, optimizer state, scheduler state and log entries of an uninterrupted
run, bit for bit, across an epoch boundary. The errors say what to change."""

from __future__ import annotations

import importlib
import pathlib
import sys
from typing import Any

import pytest
import torch
from support.memory_states import MemoryStates
from support.trainer_runs import LosingStates, NodeLost, assert_equal_tree

from ray_ckpt.errors import ConfigError

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
hf = pytest.importorskip("ray_ckpt.integrations.transformers")

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

STEPS, EVERY, LOST_AT = 12, 3, 7  # 40 samples in batches of 4: the epoch ends at step 10


def dataset() -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, 64, (40, 8), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": row, "labels": row} for row in ids]


def tiny_llama(seed: int) -> Any:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=16, attention_dropout=0.2,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def trainer_of(seed: int, checkpointer: Any, output_dir: str, **extra: Any) -> Any:
    args = transformers.TrainingArguments(
        output_dir=output_dir, max_steps=STEPS, per_device_train_batch_size=4, learning_rate=1e-2, warmup_steps=2,
        logging_steps=2, save_strategy="no", report_to=[], use_cpu=True, seed=7, disable_tqdm=True, **extra,
    )  # fmt: skip
    callback = hf.PeerMemoryCallback(checkpointer=checkpointer)
    return transformers.Trainer(tiny_llama(seed), args, train_dataset=dataset(), callbacks=[callback])


def train(trainer: Any) -> Any:
    trainer.train(resume_from_checkpoint=hf.resume_from_peers(trainer))
    return trainer


def final_state(trainer: Any) -> dict[str, Any]:
    return {
        "model": trainer.model.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scheduler": trainer.lr_scheduler.state_dict(),
        "global_step": trainer.state.global_step,
        "logs": [entry for entry in trainer.state.log_history if "loss" in entry],
    }


def test_a_run_resumed_after_losing_its_process_ends_bit_exact(tmp_path: Any) -> None:
    torch.set_num_threads(1)
    reference = final_state(train(trainer_of(1, MemoryStates(every=EVERY), str(tmp_path / "a"))))

    steps: dict[int, Any] = {}
    with pytest.raises(NodeLost):
        train(trainer_of(1, LosingStates(steps, every=EVERY, lost_at=LOST_AT), str(tmp_path / "b")))
    assert sorted(steps) == [3, 6]

    resumed = trainer_of(2, MemoryStates(steps, every=EVERY), str(tmp_path / "c"))  # a new process
    folder = hf.resume_from_peers(resumed)
    assert folder is not None
    resumed.train(resume_from_checkpoint=folder)
    got = final_state(resumed)
    assert got["logs"][0]["step"] == 2  # the saved log history came back
    assert_equal_tree(got, reference)
    assert not pathlib.Path(folder).exists()  # the temporary folder is gone at train end


def test_the_saved_state_holds_the_whole_trainer_state(tmp_path: Any) -> None:
    store = MemoryStates(every=4)
    train(trainer_of(1, store, str(tmp_path)))
    saved = store.restore(8)
    assert saved is not None
    state = saved.state
    assert state["format"] == hf.FORMAT and state["global_step"] == 8 and state["world_size"] == 1
    assert set(state) >= {"model", "optimizer", "scheduler", "trainer_state", "rng"}
    assert '"global_step": 8' in state["trainer_state"] and "TrainerControl" in state["trainer_state"]
    assert set(state["rng"]) >= {"python", "numpy", "torch"}
    assert store.waits == 1  # the last save is waited for at train end


def test_a_first_run_has_nothing_to_resume(tmp_path: Any) -> None:
    assert hf.resume_from_peers(trainer_of(1, MemoryStates(), str(tmp_path))) is None


def test_errors_say_what_to_change(tmp_path: Any) -> None:
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    bare = transformers.Trainer(tiny_llama(0), args, train_dataset=dataset())
    with pytest.raises(ConfigError, match="exactly one"):
        hf.resume_from_peers(bare)
    with pytest.raises(ConfigError, match="Checkpointer"):
        hf.PeerMemoryCallback(checkpointer=object())
    with pytest.raises(ConfigError, match="CheckpointConfig"):
        hf.PeerMemoryCallback(config={"every": 3})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="not a Transformers Trainer state"):
        hf.write_checkpoint_folder({"format": "ray_ckpt.dcp/1"}, tmp_path / "x", args)
    store = MemoryStates(every=4)
    train(trainer_of(1, store, str(tmp_path / "run")))
    two = store.restore(4).state  # type: ignore[union-attr]
    two["world_size"] = 2
    with pytest.raises(ConfigError, match="as many workers"):
        hf.write_checkpoint_folder(two, tmp_path / "y", args)
    deepspeed = hf.PeerMemoryCallback(checkpointer=MemoryStates())
    with pytest.raises(ConfigError, match="fsdp"):
        deepspeed.on_train_begin(type("Args", (), {"deepspeed": None, "fsdp": "full_shard"})(), None, None)


def test_without_transformers_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "ray_ckpt.integrations.transformers")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ImportError, match=r'pip install "ray_ckpt\[transformers\]"'):
        importlib.import_module("ray_ckpt.integrations.transformers")


def test_the_temporary_folder_is_made_per_resume(tmp_path: Any) -> None:
    steps: dict[int, Any] = {}
    train(trainer_of(1, MemoryStates(steps, every=6), str(tmp_path / "a")))
    folder = hf.resume_from_peers(trainer_of(1, MemoryStates(steps), str(tmp_path / "b")), folder=tmp_path / "f")
    assert folder == str(tmp_path / "f")
    assert {p.name for p in (tmp_path / "f").iterdir()} == {
        "pytorch_model.bin", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth",
    }  # fmt: skip


def test_a_callback_whose_trainer_never_went_through_resume_from_peers_is_refused(tmp_path: pathlib.Path) -> None:
    """Without resume_from_peers the callback cannot reach the Trainer's scaler and callbacks:
    it says so at train start instead of saving steps without them."""
    trainer = trainer_of(1, MemoryStates(), str(tmp_path))
    with pytest.raises(ConfigError, match="resume_from_peers"):
        trainer.train()
