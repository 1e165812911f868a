"""docs/ray-train.md, "Everything else a resumed run needs": its block runs as written, and what
it saves (step, LR scheduler, StatefulDataLoader, RNG states) goes through a snapshot and puts a
fresh scheduler, loader and the generators back where the interrupted run was. (The cluster test
tests/cluster/test_ray_train_guide.py runs every block of the guide too, on a cluster.)"""

from __future__ import annotations

import pathlib
import random
import re
from typing import Any

import numpy as np
import pytest
import torch

from ray_ckpt.core import snapshot as snap

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "ray-train.md"
HEADING = "### Everything else a resumed run needs"


def section_block() -> str:
    """The first python block after the heading, before the next heading."""
    text = GUIDE.read_text()
    assert HEADING in text, f"{GUIDE.name} lost its section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n#", 1)[0]
    found = re.search(r"^```python\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert found, f"no python block under {HEADING!r}"
    return found.group(1)


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_the_sections_block_saves_and_resumes_scheduler_loader_and_rng() -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")
    namespace: dict[str, Any] = {}
    exec(compile("import ray_ckpt\n" + section_block(), f"{GUIDE.name} {HEADING}", "exec"), namespace)

    def build(seed: int) -> tuple[Any, Any, Any]:
        optim = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.5)
        generator = torch.Generator().manual_seed(seed)
        loader = stateful.StatefulDataLoader(list(range(40)), batch_size=4, shuffle=True, generator=generator)
        return optim, scheduler, loader

    optim, scheduler, loader = build(0)
    batches = iter(loader)
    for _ in range(5):
        next(batches)
        optim.step()
        scheduler.step()
    header, payload = snap.snapshot({"extra": namespace["extra_state"](4, scheduler, loader)})
    expected = (next(batches), scheduler.get_last_lr(), random.random(), np.random.rand(), torch.rand(2))

    _, fresh_scheduler, fresh_loader = build(1)
    random.seed(9)  # the generators moved on, as in a new process
    np.random.seed(9)
    torch.manual_seed(9)
    extra = snap.restore(header, payload)["extra"]
    assert namespace["load_extra_state"](extra, fresh_scheduler, fresh_loader) == 5
    got = (next(iter(fresh_loader)), fresh_scheduler.get_last_lr(), random.random(), np.random.rand(), torch.rand(2))
    assert torch.equal(got[0], expected[0]) and got[1:4] == expected[1:4] and torch.equal(got[4], expected[4])
