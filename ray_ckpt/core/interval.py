"""IntervalPolicy: how many steps apart one rank saves under ``CheckpointConfig(every="auto")``.

Pure bookkeeping (no Ray, no torch, no clock): the caller feeds it what it measured and asks
``due(step)`` at every ``save``. The interval is Young's optimum

    interval = sqrt(2 * C * MTBF) / step_s        (in steps)

where ``step_s`` is the median training time of a step while no save runs in the background,
``C`` the cost of one checkpoint: its blocking time plus the slowdown its background work
inflicts on the steps it overlaps ((median step time while a save runs - step_s) times the
steps one background spans; 0 until both kinds of step were measured), and ``MTBF`` the mean
time between failures: the job's time so far over the failures it has seen, or, before any,
the larger of the prior (RAY_CKPT_AUTO_MTBF_S) and the job's time so far.

The optimum is rounded to the nearest power of two (in log scale, with hysteresis so a value
near a boundary does not flip back and forth), capped at the largest power of two whose steps
fit in ``max_interval_s``, and never below the smallest power of two of steps that the
background work of one save spans (a save must be done before the next one is due). A step is
due when ``step % interval == 0``. Powers of two make the grids of ranks that measured
different intervals nest: every multiple of the larger interval is a multiple of the smaller
one, so all ranks save it and it commits (docs/operations.md, "How often to save").

Whether a step is due depends on the interval and the step only, never on timing: a step on
the grid is due whether or not the previous save still runs (the rank waits for it,
``on_busy="wait"``), so that every rank saves it and it commits. The first ``warmup_saves``
saves are warm-up: every step is due, so the job has a step to restore and the policy has
measurements before it adapts. (A warm-up that skipped steps finding a save still running made
ranks skip different steps: the step a rank saved last could then never commit, and its
``wait()`` at the end of a run timed out.)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque

from ray_ckpt.errors import ConfigError

WARMUP_SAVES = 3  # saves measured before the interval adapts
WINDOW = 32  # the newest measurements of each kind that the medians are taken over
HYSTERESIS = 0.15  # in log2 units beyond the rounding boundary (half way between two powers)


@dataclasses.dataclass(frozen=True)
class Decision:
    """An interval and what it came from. ``reason``: "warm-up", "optimum" (Young's, rounded),
    "keep-up" (raised to what the background work can keep up with) or "cap" (lowered to
    ``max_interval_s``). Measured values are None while unknown."""

    interval: int
    reason: str
    step_s: float | None = None
    blocking_s: float | None = None
    slowdown_s: float | None = None
    background_s: float | None = None
    cost_s: float | None = None
    mtbf_s: float | None = None
    failures: int = 0
    optimum_steps: float | None = None
    floor_steps: int | None = None
    cap_steps: int | None = None

    def measured(self) -> dict[str, float]:
        """The known numbers behind the decision (for an event: name -> finite number)."""
        values = dataclasses.asdict(self)
        del values["interval"], values["reason"]
        return {name: float(value) for name, value in values.items() if value is not None}

    def describe(self) -> str:
        """One line with the numbers, for a log."""
        if self.reason == "warm-up":
            return "warm-up: saving every step, to measure"

        def secs(value: float | None) -> str:
            return "?" if value is None else f"{value:.3g}s"

        optimum = "?" if self.optimum_steps is None else f"{self.optimum_steps:.3g}"
        return (
            f"{self.reason}: sqrt(2 * C {secs(self.cost_s)} (blocking {secs(self.blocking_s)} + slowdown "
            f"{secs(self.slowdown_s)}) * MTBF {secs(self.mtbf_s)} ({self.failures} failure(s) seen)) / step "
            f"{secs(self.step_s)} = {optimum} steps; background {secs(self.background_s)} needs >= "
            f"{self.floor_steps} steps; cap {self.cap_steps} steps"
        )


def power_of_two_at_least(value: float) -> int:
    """The smallest power of two >= ``value`` (1 for anything <= 1)."""
    return 1 if value <= 1 else 1 << math.ceil(math.log2(value) - 1e-12)


def power_of_two_at_most(value: float) -> int:
    """The largest power of two <= ``value`` (1 for anything < 2)."""
    return 1 if value < 2 else 1 << math.floor(math.log2(value) + 1e-12)


def nearest_power_of_two(value: float, current: int | None = None, hysteresis: float = HYSTERESIS) -> int:
    """``value`` rounded to a power of two in log scale (1 for anything <= 1). With ``current``
    (a power of two), ``current`` is kept unless ``value`` lies more than ``0.5 + hysteresis``
    powers of two away from it."""
    if (
        current is not None
        and current >= 1
        and value > 0
        and abs(math.log2(value) - math.log2(current)) <= 0.5 + hysteresis
    ):
        return current
    return 1 if value <= 1 else 1 << max(0, round(math.log2(value)))


def young_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Young's optimal time between checkpoints, sqrt(2 * C * MTBF), in seconds."""
    if cost_s < 0 or mtbf_s <= 0:
        raise ValueError(f"the cost ({cost_s}) must be >= 0 and the MTBF ({mtbf_s}) > 0")
    return math.sqrt(2.0 * cost_s * mtbf_s)


class IntervalPolicy:
    """Chooses one rank's save interval from its measurements (see the module docstring).

    ``max_interval_s``: the longest stretch of training left without a save (the cap);
    ``mtbf_prior_s``: the MTBF assumed until a failure is seen. Not thread-safe: one caller.
    """

    def __init__(self, *, max_interval_s: float, mtbf_prior_s: float, warmup_saves: int = WARMUP_SAVES) -> None:
        for name, value in (("max_interval_s", max_interval_s), ("mtbf_prior_s", mtbf_prior_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if isinstance(warmup_saves, bool) or not isinstance(warmup_saves, int) or warmup_saves < 1:
            raise ConfigError(f"warmup_saves must be an int >= 1, got {warmup_saves!r}")
        self.max_interval_s = float(max_interval_s)
        self.mtbf_prior_s = float(mtbf_prior_s)
        self.warmup_saves = warmup_saves
        self._idle: deque[float] = deque(maxlen=WINDOW)  # seconds per step, no save running
        self._busy: deque[float] = deque(maxlen=WINDOW)  # seconds per step while a save ran
        self._blocking: deque[float] = deque(maxlen=WINDOW)
        self._background: deque[float] = deque(maxlen=WINDOW)
        self._saves = 0
        self._failures = 0
        self._job_s: float | None = None
        self._newest_step: int | None = None
        self.decision = Decision(interval=1, reason="warm-up")

    @property
    def interval(self) -> int:
        return self.decision.interval

    @property
    def warming_up(self) -> bool:
        return self.decision.reason == "warm-up"

    # ---- measurements -------------------------------------------------------------------

    def observe_step(self, seconds_per_step: float, *, during_save: bool) -> None:
        """Training time per step between two ``save`` calls (the calls themselves left out);
        ``during_save``: a save's background work was running when the stretch began."""
        _check_seconds("seconds_per_step", seconds_per_step)
        (self._busy if during_save else self._idle).append(float(seconds_per_step))

    def observe_save(self, blocking_s: float, background_s: float) -> Decision | None:
        """A save completed: how long ``save`` blocked and how long its background work ran.
        Returns the new decision when the interval changed, else None."""
        _check_seconds("blocking_s", blocking_s)
        _check_seconds("background_s", background_s)
        self._blocking.append(float(blocking_s))
        self._background.append(float(background_s))
        self._saves += 1
        return self._decide()

    def observe_failures(self, count: int, job_s: float | None = None) -> Decision | None:
        """The job has seen ``count`` failures in ``job_s`` seconds (None: estimated at each
        decision as the newest step number times the step time, which leaves out time lost to
        recoveries and so errs towards a shorter MTBF). Returns the new decision, if any."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"the failure count must be an int >= 0, got {count!r}")
        if job_s is not None:
            _check_seconds("job_s", job_s)
        self._failures, self._job_s = count, None if job_s is None else float(job_s)
        return None if self.warming_up else self._decide()

    # ---- the rule -----------------------------------------------------------------------

    def due(self, step: int) -> bool:
        """Whether ``step`` is saved: during warm-up every step, then the multiples of the
        interval. A rank whose previous save still runs waits for it (the Checkpointer's
        ``on_busy``) rather than skip, since a step on the grid commits only if every rank saves
        it; the keep-up floor makes that wait rare. (Skipping there starved commits: at 64 ranks
        with noisy background times, almost no step on the grid found every rank idle.)"""
        self._newest_step = step if self._newest_step is None else max(step, self._newest_step)
        return self.warming_up or step % self.interval == 0

    def _decide(self) -> Decision | None:
        if self._saves < self.warmup_saves or not (self._idle or self._busy):
            return None
        decision = self.compute()
        if decision.interval == self.decision.interval and not self.warming_up:
            self.decision = decision  # the same interval, with the newest numbers
            return None
        self.decision = decision
        return decision

    def compute(self) -> Decision:
        """The decision the measurements so far give (needs a step time and a save)."""
        step_s = statistics.median(self._idle) if self._idle else statistics.median(self._busy)
        busy_s = statistics.median(self._busy) if self._busy else step_s
        blocking_s = statistics.median(self._blocking)
        background_s = statistics.median(self._background)
        step_s = max(step_s, 1e-9)
        overlapped = math.ceil(background_s / max(busy_s, 1e-9))  # steps one background spans
        slowdown_s = max(0.0, busy_s - step_s) * overlapped if self._idle and self._busy else 0.0
        cost_s = blocking_s + slowdown_s
        job_s = self._job_s
        if job_s is None:
            job_s = (self._newest_step or 0) * step_s
        mtbf_s = job_s / self._failures if self._failures else max(self.mtbf_prior_s, job_s)
        mtbf_s = max(mtbf_s, 1e-9)
        optimum = young_interval_s(cost_s, mtbf_s) / step_s
        floor = power_of_two_at_least(background_s / max(busy_s, 1e-9))
        cap = power_of_two_at_most(self.max_interval_s / step_s)
        current = None if self.warming_up else self.decision.interval
        interval, reason = nearest_power_of_two(optimum, current), "optimum"
        if interval > cap:
            interval, reason = cap, "cap"
        if interval < floor:  # a save must end before the next is due, whatever the cap says
            interval, reason = floor, "keep-up"
        return Decision(
            interval=interval,
            reason=reason,
            step_s=step_s,
            blocking_s=blocking_s,
            slowdown_s=slowdown_s,
            background_s=background_s,
            cost_s=cost_s,
            mtbf_s=mtbf_s,
            failures=self._failures,
            optimum_steps=optimum,
            floor_steps=floor,
            cap_steps=cap,
        )


def _check_seconds(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


def summarize(by_rank: dict[int, tuple[int, str]]) -> dict[str, object] | None:
    """What ``ray-ckpt status`` shows of one job's intervals, from each rank's newest
    (interval, reason): {"low", "high" (the smallest and largest interval), "reason" (the
    lowest rank's)}; None for no ranks."""
    if not by_rank:
        return None
    intervals = [interval for interval, _ in by_rank.values()]
    return {"low": min(intervals), "high": max(intervals), "reason": by_rank[min(by_rank)][1]}
