"""Helpers of the trainer integrations' unit tests: a stand-in for peer memory that loses its
process at a step, a guide's python blocks, and bit-exact comparisons of state dicts."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import torch

from support.memory_states import MemoryStates

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


class NodeLost(RuntimeError):
    """The process is gone (raised where a node loss would end it)."""


class LosingStates(MemoryStates):
    """``MemoryStates`` whose process dies when step ``lost_at`` is offered."""

    def __init__(self, steps: dict[int, Any], *, every: int, lost_at: int) -> None:
        super().__init__(steps, every=every)
        self.lost_at = lost_at

    def save(self, step: int, state: Any) -> Any:
        if step >= self.lost_at:
            raise NodeLost(f"node lost at step {step}")
        return super().save(step, state)


def guide_blocks(name: str) -> str:
    """Every python block of docs/<name>, in order, as one program."""
    text = (DOCS / name).read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert blocks, f"docs/{name} has no python block"
    return "\n".join(blocks)


def assert_equal_tree(got: Any, expected: Any, path: str = "state") -> None:
    """Bit for bit: tensors by dtype, shape and bytes; containers by keys; values by ==."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == expected.dtype, path
        assert torch.equal(got.cpu(), expected.cpu()), f"{path} differs"
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and set(got) == set(expected), path
        for key in expected:
            assert_equal_tree(got[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), path
        for index, (a, b) in enumerate(zip(got, expected)):
            assert_equal_tree(a, b, f"{path}[{index}]")
    else:
        assert got == expected, f"{path}: {got!r} != {expected!r}"
