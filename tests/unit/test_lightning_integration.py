"""The Lightning integration without Ray: the example's tiny LightningModule
(scripts/lightning_example.py: Adam, a per-step StepLR) fed by a StatefulDataLoader with an
epoch-seeded sampler, checkpointed through PeerMemoryCheckpointIO and SaveToPeers into a
stand-in for peer memory (tests/support/memory_states.py: real snapshots). A run that loses its process
at step 7 (kept every 3 steps) and is resumed by a fresh process (new Trainer, module
initialised from another seed) with ``fit(ckpt_path=io.resume_path())`` ends bit-exact with an
uninterrupted run, across an epoch boundary. Paths, conversions and refusals say what to
change."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Any

import pytest
import torch
from support.memory_states import MemoryStates
from support.scripts_under_test import load_script
from support.trainer_runs import LosingStates, NodeLost, assert_equal_tree

from ray_ckpt.errors import ConfigError, UnsupportedLeafError

pl = pytest.importorskip("lightning.pytorch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
lit = pytest.importorskip("ray_ckpt.integrations.lightning")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

STEPS, EVERY, LOST_AT = 16, 3, 7  # 40 samples in batches of 4: the epoch ends at step 10


Regressor = load_script("lightning_example").regressor_class()  # the example's model, without Ray


def loader() -> Any:
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    data = list(zip(x, x.sum(1, keepdim=True)))
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=1)
    return stateful.StatefulDataLoader(data, batch_size=4, sampler=sampler)  # the order depends on the epoch only


def fit(seed: int, checkpointer: Any, every: int = 1) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    module = Regressor()
    io = lit.PeerMemoryCheckpointIO(checkpointer=checkpointer)
    trainer = pl.Trainer(
        max_steps=STEPS, accelerator="cpu", devices=1, plugins=[io], callbacks=[lit.SaveToPeers(every)], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, loader(), ckpt_path=io.resume_path())
    return trainer, module


def final_state(trainer: Any, module: Any) -> dict[str, Any]:
    return {
        "model": module.state_dict(),
        "optimizer": trainer.optimizers[0].state_dict(),
        "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
        "global_step": trainer.global_step,
    }


def test_a_run_resumed_after_losing_its_process_ends_bit_exact() -> None:
    torch.set_num_threads(1)
    reference = final_state(*fit(1, MemoryStates(every=EVERY)))
    steps: dict[int, Any] = {}
    with pytest.raises(NodeLost):
        fit(1, LosingStates(steps, every=EVERY, lost_at=LOST_AT))
    assert sorted(steps) == [3, 6]
    assert_equal_tree(final_state(*fit(2, MemoryStates(steps, every=EVERY))), reference)


@pytest.mark.parametrize("lost_at", [12, 16], ids=["from-an-epochs-last-batch", "in-the-second-epoch"])
def test_a_run_resumed_at_an_epoch_end_or_in_a_later_epoch_ends_bit_exact(lost_at: int) -> None:
    """Kept every 5 steps (10 steps an epoch): lost at 12, the resume is from step 10, the
    first epoch's last batch (Lightning's resume skipped the next epoch's data); lost at 16,
    from step 15, in the second epoch (Lightning made the loader's iterator before setting the
    sampler's epoch, which gave the first epoch's order)."""
    torch.set_num_threads(1)
    reference = final_state(*fit(1, MemoryStates(every=5)))
    steps: dict[int, Any] = {}
    with pytest.raises(NodeLost):
        fit(1, LosingStates(steps, every=5, lost_at=lost_at))
    assert max(steps) == (10 if lost_at < 15 else 15), sorted(steps)
    assert_equal_tree(final_state(*fit(2, MemoryStates(steps, every=5))), reference)


def test_what_is_kept_is_lightnings_dict_with_plain_dicts() -> None:
    store = MemoryStates(every=5)
    fit(1, store)
    saved = store.restore(10).state  # type: ignore[union-attr]
    assert saved["format"] == lit.FORMAT and saved["path"] == "peers://10"
    checkpoint = saved["checkpoint"]
    assert checkpoint["global_step"] == 10
    assert set(checkpoint) >= {"state_dict", "optimizer_states", "lr_schedulers", "loops", "callbacks"}
    assert type(checkpoint["hyper_parameters"]) is dict and checkpoint["hyper_parameters"] == {"lr": 0.05}
    assert "combined_loader" in checkpoint["loops"]["fit_loop"]["state_dict"]  # the loader's position


def test_paths_map_to_steps() -> None:
    assert lit.step_of_path("peers://latest") is None
    assert lit.step_of_path("peers://120") == 120
    for bad in ("/tmp/x.ckpt", "peers://epoch=1.ckpt", "peers://-3", 12, "peers://99999999999999999999"):
        with pytest.raises(ConfigError):
            lit.step_of_path(bad)
    io = lit.PeerMemoryCheckpointIO(checkpointer=MemoryStates())
    assert io.resume_path() is None
    with pytest.raises(ConfigError, match="no checkpoint in peer memory yet"):
        io.load_checkpoint("peers://latest")
    with pytest.raises(ConfigError, match="saves to 'peers://"):
        io.save_checkpoint({"global_step": 1}, "/tmp/model.ckpt")
    with pytest.raises(ConfigError, match="storage_options"):
        io.save_checkpoint({"global_step": 1}, "peers://1", storage_options={"x": 1})
    with pytest.raises(ConfigError, match="global_step"):
        io.save_checkpoint({"epoch": 0}, "peers://1")
    io.save_checkpoint({"global_step": 4, "weights": torch.ones(2)}, "peers://anything")
    io.save_checkpoint({"global_step": 4, "weights": torch.zeros(2)}, "peers://again")  # the step is kept already
    assert io.resume_path() == "peers://4"
    assert torch.equal(io.load_checkpoint("peers://4")["weights"], torch.ones(2))
    io.remove_checkpoint("peers://4")
    assert io.resume_path() == "peers://4"  # peer memory's retention decides


def test_objects_a_snapshot_cannot_keep_are_refused_by_key_path() -> None:
    io = lit.PeerMemoryCheckpointIO(checkpointer=MemoryStates())
    with pytest.raises(UnsupportedLeafError, match=r"hyper_parameters.*on_save_checkpoint"):
        io.save_checkpoint({"global_step": 1, "hyper_parameters": {"args": argparse.Namespace(lr=1)}}, "peers://1")
    other = MemoryStates()
    other.save(3, {"format": "ray_ckpt.dcp/1"})
    with pytest.raises(ConfigError, match="not a Lightning checkpoint"):
        lit.PeerMemoryCheckpointIO(checkpointer=other).load_checkpoint("peers://latest")
    with pytest.raises(ConfigError, match="rank=0"):
        lit.PeerMemoryCheckpointIO(checkpointer=MemoryStates(rank=1))
    with pytest.raises(ConfigError, match="every must be"):
        lit.SaveToPeers(every=0)


def test_without_lightning_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "ray_ckpt.integrations.lightning")
    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.setitem(sys.modules, "lightning.pytorch", None)
    with pytest.raises(ImportError, match=r'pip install "ray_ckpt\[lightning\]"'):
        importlib.import_module("ray_ckpt.integrations.lightning")


def test_save_to_peers_every_n_says_which_steps_it_trained_without_a_save() -> None:
    """SaveToPeers(every=3) offers steps 3, 6, ...; the others it notes as trained, so that a
    failure after step 7 counts step 7 as one to train again."""
    torch.set_num_threads(1)
    states = MemoryStates()
    fit(1, states, every=3)
    assert states.saved == list(range(3, STEPS + 1, 3))
    assert states.noted == [s for s in range(1, STEPS + 1) if s % 3]
