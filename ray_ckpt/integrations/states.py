"""What the trainer integrations (Transformers, Lightning) need of ray_ckpt: one small protocol.

A ``StepStates`` saves a whole state per step and gives back the newest (or a named) committed
one. ``ray_ckpt.Checkpointer`` and ``ray_ckpt.train.Checkpointer`` are ``StepStates``; unit tests
stand a fake in for them.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ray_ckpt.errors import ConfigError


@runtime_checkable
class StepStates(Protocol):
    """One rank's checkpoints of a job, by step."""

    @property
    def rank(self) -> int: ...

    def save(self, step: int, state: Any) -> Any:
        """Checkpoint ``state`` as ``step`` (steps increase); returns a handle whose ``skipped``
        says whether the step was left out (``CheckpointConfig.every``)."""
        ...

    def note_step(self, step: int) -> None:
        """Say that ``step`` was trained, saved or not (what a failure's steps redone count
        from: ``ray_ckpt.Checkpointer.note_step``)."""
        ...

    def restore(self, step: int | None = None) -> Any:
        """The newest committed step (or ``step``) as an object with ``step`` and ``state``,
        or None when the job has none."""
        ...

    def latest_step(self) -> int | None:
        """The newest committed step, or None."""
        ...

    def wait(self, timeout_s: float | None = None) -> None:
        """Return once the last save committed (re-raising its error)."""
        ...


def as_step_states(target: Any, what: str) -> StepStates:
    """``target`` when it is a ``StepStates``; ConfigError naming ``what`` wanted it otherwise."""
    if isinstance(target, StepStates):
        return target
    raise ConfigError(
        f"{what} needs a ray_ckpt Checkpointer (ray_ckpt.train.Checkpointer() under Ray Train, "
        f"ray_ckpt.Checkpointer(...) outside it), got {type(target).__name__}"
    )
