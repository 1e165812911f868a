"""RecoveryBudget: when a worker process stops recovering in place and hands its error to Ray Train.

A lost peer shows up in a survivor as an error whose text is a collective's (``inplace.is_peer_failure``);
so does a deterministic error of the training function that happens to use the same words. Re-running
the function on every such error would loop forever on the latter, never reaching Ray Train's
``max_failures``. A worker process therefore gives up, and raises the error, when

- it has recovered in place ``max_recoveries`` times already (``RAY_CKPT_INPLACE_MAX_RECOVERIES``), or
- the error recurs with no progress since the last recovery (no newer step saved: the same step
  failed again) and that recovery lost no peer (the next generation had the same processes as
  the failed one): the error is the job's own, not a peer's loss.

Pure bookkeeping, one per worker process; the wrapper in ``ray_ckpt.train.inplace`` consults it.
"""

from __future__ import annotations

from collections.abc import Collection

from ray_ckpt.errors import ConfigError


class RecoveryBudget:
    """The in-place recoveries of one worker process. Not thread-safe (the wrapper's thread)."""

    def __init__(self, max_recoveries: int) -> None:
        if not isinstance(max_recoveries, int) or isinstance(max_recoveries, bool) or max_recoveries < 0:
            raise ConfigError(
                f"max_recoveries (RAY_CKPT_INPLACE_MAX_RECOVERIES) must be an int >= 0, got {max_recoveries!r}"
            )
        self.max_recoveries = max_recoveries
        self.recoveries = 0
        self._last_step: int | None = None  # the newest step saved when the last recovery began
        self._last_lost: list[int] | None = None  # ranks that recovery replaced (None: no recovery yet)

    def give_up(self, step: int | None) -> str | None:
        """Why a lost-peer error, raised when the newest step saved was ``step`` (None: none in
        this generation), must go to Ray Train rather than be recovered from; None to recover."""
        if self.recoveries >= self.max_recoveries:
            return (
                f"this worker already recovered in place {self.recoveries} time(s), the most "
                f"RAY_CKPT_INPLACE_MAX_RECOVERIES={self.max_recoveries} allows"
            )
        if self._last_lost is not None and not self._last_lost and not _newer(step, self._last_step):
            at = "before any step was saved" if self._last_step is None else f"after step {self._last_step}"
            return (
                f"it recurred {at}, where it failed before, and the in-place recovery from that failure lost "
                "no peer (the same processes formed the next generation): it is the training function's own error"
            )
        return None

    def recovered(self, step: int | None, replaced: Collection[int]) -> None:
        """A recovery from an error raised at ``step`` (as given to ``give_up``) completed, and
        the next generation replaced the processes of ``replaced`` ranks (empty: no peer lost)."""
        self.recoveries += 1
        if _newer(step, self._last_step):
            self._last_step = step
        self._last_lost = sorted(replaced)


def _newer(step: int | None, than: int | None) -> bool:
    return step is not None and (than is None or step > than)
