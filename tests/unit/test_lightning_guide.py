"""docs/lightning.md: its blocks run as written (Ray's strategy, environment, prepare_trainer and
the plugin's Checkpointer replaced by stand-ins, tests/support/memory_states.py), and the guide's
train_func, lost at step 12 and resumed from step 10 (the first epoch's last batch) into the
second epoch, ends bit-exact with an uninterrupted run."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support.memory_states import MemoryStates
from support.trainer_runs import LosingStates, NodeLost, assert_equal_tree, guide_blocks

pytest.importorskip("lightning")
pytest.importorskip("torchdata")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def test_the_guides_blocks_train_lose_a_node_and_resume_bit_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray_ckpt.integrations import lightning as lit

    namespace: dict[str, Any] = {}
    exec(compile(guide_blocks("lightning.md"), "docs/lightning.md", "exec"), namespace)
    # no Ray Train here: one process, Lightning's own strategy and environment
    namespace["RayDDPStrategy"] = lambda: "auto"
    namespace["RayLightningEnvironment"] = lambda: lit.plain({})  # dropped below
    namespace["prepare_trainer"] = lambda trainer: trainer

    class Context:  # Ray Train's context of the one worker
        def get_world_size(self) -> int:
            return 1

        def get_world_rank(self) -> int:
            return 0

    monkeypatch.setattr(namespace["ray"].train, "get_context", Context)
    real_trainer = namespace["pl"].Trainer

    def trainer(**kwargs: Any) -> Any:
        kwargs["plugins"] = [p for p in kwargs["plugins"] if p != {}]
        return real_trainer(**kwargs, enable_progress_bar=False, enable_model_summary=False)

    monkeypatch.setattr(namespace["pl"], "Trainer", trainer)
    made: list[Any] = []
    monkeypatch.setattr(lit, "_rank_zero_checkpointer", lambda config: made[-1])
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    data = list(zip(x, x.sum(1, keepdim=True)))

    def run(states: Any) -> Any:
        made.append(states)
        return namespace["train_func"]({"data": data, "steps": 16})  # 10 steps an epoch

    torch.set_num_threads(1)
    every = namespace["CHECKPOINT"].every
    reference_trainer, reference = run(MemoryStates(every=every))
    steps: dict[int, Any] = {}
    with pytest.raises(NodeLost):
        run(LosingStates(steps, every=every, lost_at=12))
    assert sorted(steps) == [5, 10]  # resumed from the first epoch's last batch
    trainer_c, resumed = run(MemoryStates(steps, every=every))
    assert_equal_tree(resumed.state_dict(), reference.state_dict())
    assert_equal_tree(trainer_c.optimizers[0].state_dict(), reference_trainer.optimizers[0].state_dict())
