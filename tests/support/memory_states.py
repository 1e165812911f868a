"""A dict standing in for ray_ckpt's peer memory in the trainer integrations' tests (no Ray).

``MemoryStates`` is a ``StepStates``: ``save`` takes the steps ``every`` picks, turns the state
into a real snapshot (header and payload bytes, as a Checkpointer's save does, so what a
snapshot refuses is refused here too) and commits it at once; ``restore`` rebuilds a fresh
state from those bytes. Two instances over one ``steps`` dict are a run and its resumed run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray_ckpt.core import snapshot
from ray_ckpt.errors import NoCheckpointError


@dataclasses.dataclass
class Handle:
    step: int
    skipped: bool

    def wait(self, timeout_s: float | None = None) -> None:
        return None


@dataclasses.dataclass
class Restored:
    step: int
    state: Any
    source: str = "peers"


class MemoryStates:
    """Rank ``rank`` of a job whose committed steps are ``steps`` (step -> (header, payload))."""

    def __init__(self, steps: dict[int, tuple[bytes, Any]] | None = None, *, every: int = 1, rank: int = 0) -> None:
        self.steps = {} if steps is None else steps
        self.every, self._rank = every, rank
        self.saved: list[int] = []
        self.noted: list[int] = []  # steps said trained without a save call (``note_step``)
        self.waits = 0

    @property
    def rank(self) -> int:
        return self._rank

    def save(self, step: int, state: Any) -> Handle:
        if self.saved and step <= self.saved[-1]:
            raise ValueError(f"step {step} is not newer than {self.saved[-1]}")
        if step % self.every:
            return Handle(step, True)
        self.steps[step] = snapshot.snapshot(state)
        self.saved.append(step)
        return Handle(step, False)

    def restore(self, step: int | None = None) -> Restored | None:
        if step is None:
            step = self.latest_step()
            if step is None:
                return None
        if step not in self.steps:
            raise NoCheckpointError(f"step {step} is not committed (committed: {sorted(self.steps)})", step=step)
        header, payload = self.steps[step]
        return Restored(step, snapshot.restore(header, payload))

    def note_step(self, step: int) -> None:
        self.noted.append(step)

    def latest_step(self) -> int | None:
        return max(self.steps, default=None)

    def wait(self, timeout_s: float | None = None) -> None:
        self.waits += 1
