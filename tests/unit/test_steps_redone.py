"""The steps a recovery makes the job train again (its ``restore`` event's ``steps_lost``) count
the steps trained after the last save, not only the saved ones: rank 0 tells the registry of
each step it trains (every ``save`` call, skipped ones included, and ``note_step``). Real
checkpointers, registry and stores in one process (``in_process_service``)."""

from __future__ import annotations

from typing import Any

import torch
from support.in_process_service import Service


def state_of(step: int) -> dict[str, Any]:
    return {"w": torch.full((64,), float(step))}


def restores(service: Service) -> list[dict[str, Any]]:
    return [e for e in service.client.events if e["kind"] == "restore"]


def test_a_restore_counts_the_steps_trained_after_the_newest_save() -> None:
    """Saves every 5 steps; the job trained step 12 and died: the next attempt restores step 10
    and counts 2 steps to train again (with the saved steps only, it counted 0)."""
    service = Service()
    first = [
        service.checkpointer(job="sparse", rank=r, world_size=2, node=f"n{r}", attempt="A", every=5) for r in (0, 1)
    ]
    for step in range(1, 13):
        handles = [ckpt.save(step, state_of(step)) for ckpt in first]
        if not handles[0].skipped:
            for handle in handles:
                handle.wait(timeout_s=30)
    assert service.client.calls.count("note_reached") == 12  # rank 0 only, one per step
    for ckpt in first:
        ckpt.close()
    second = [
        service.checkpointer(job="sparse", rank=r, world_size=2, node=f"n{r}", attempt="B", every=5) for r in (0, 1)
    ]
    for ckpt in second:
        restored = ckpt.restore()
        assert restored is not None and restored.step == 10
    assert [(e["rank"], e["step"], e["steps_lost"]) for e in restores(service)] == [(0, 10, 2), (1, 10, 2)]
    # an explicit step plans nothing: the count comes from the registry all the same
    viewer = service.checkpointer(job="sparse", rank=0, world_size=2, node="n2", attempt="C", every=5)
    assert viewer.restore(step=5) is not None
    assert restores(service)[-1]["steps_lost"] == 7
    for ckpt in (*second, viewer):
        ckpt.close()


def test_note_step_tells_steps_trained_without_a_save_call_once_each() -> None:
    """A loop that saves every N steps through another path (``dcp.save``) tells the steps in
    between with ``note_step``; a step told twice, or an older one, sends nothing."""
    service = Service()
    ckpt = service.checkpointer(job="noted", rank=0, world_size=1, node="n0", attempt="A")
    for step in (1, 2, 2, 1, 3):
        ckpt.note_step(step)
    assert service.client.calls.count("note_reached") == 3
    assert service.registry.steps_reached("noted", "B") == (None, 3)
    ckpt.close()
