"""docs/transformers.md: its blocks run as written (Ray Train's prepare_trainer and the
Checkpointer replaced by stand-ins, tests/support/memory_states.py), and the guide's train_func, lost at
step 7 and run again, ends bit-exact with an uninterrupted run; train_plain resumes too."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support.memory_states import MemoryStates
from support.trainer_runs import LosingStates, NodeLost, assert_equal_tree, guide_blocks

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def test_the_guides_blocks_train_lose_a_node_and_resume_bit_exact(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from ray_ckpt.train import checkpointer as train_checkpointer

    namespace: dict[str, Any] = {}
    exec(compile(guide_blocks("transformers.md"), "docs/transformers.md", "exec"), namespace)
    namespace["prepare_trainer"] = lambda trainer: trainer  # no Ray Train here
    steps: dict[int, Any] = {}
    made: list[Any] = []

    def run(states: Any, name: str) -> Any:
        made.append(states)
        monkeypatch.setattr(train_checkpointer, "Checkpointer", lambda config: made[-1])
        data = [{"input_ids": r, "labels": r} for r in torch.randint(0, 64, (40, 8), generator=torch.Generator())]
        return namespace["train_func"]({"output_dir": str(tmp_path / name), "steps": 12, "data": data})

    torch.set_num_threads(1)
    every = namespace["CHECKPOINT"].every
    reference = run(MemoryStates(every=every), "a")
    with pytest.raises(NodeLost):
        run(LosingStates(steps, every=every, lost_at=7), "b")
    assert sorted(steps) == [5]
    resumed = run(MemoryStates(steps, every=every), "c")
    assert_equal_tree(resumed.model.state_dict(), reference.model.state_dict())
    assert_equal_tree(resumed.optimizer.state_dict(), reference.optimizer.state_dict())
    assert_equal_tree(resumed.lr_scheduler.state_dict(), reference.lr_scheduler.state_dict())

    plain = MemoryStates(steps)
    args = namespace["TrainingArguments"](output_dir=str(tmp_path / "d"), max_steps=12, report_to=[], use_cpu=True)
    data = [{"input_ids": r, "labels": r} for r in torch.randint(0, 64, (8, 8))]
    model = namespace["LlamaForCausalLM"](reference.model.config)
    assert namespace["train_plain"](model, args, data, plain).state.global_step == 12  # resumed at step 10
