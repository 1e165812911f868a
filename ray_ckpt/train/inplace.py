"""In-place recovery for Ray Train: survivors keep their processes, only lost workers are replaced.

Opt in with one object used twice::

    recovery = ray_ckpt.train.InPlaceRecovery()
    trainer = TorchTrainer(recovery.wrap(train_loop), torch_config=recovery, ...)

``InPlaceRecovery`` is a ``TorchConfig`` whose backend tells Ray Train's controller to replace
only the failed workers (Ray's replica-group path, fenced in ``_ray_compat``). ``wrap`` runs the
training function and, when it fails because a peer is gone (a collective error, or a commit
that timed out), turns that into a recovery in the same process: the function's checkpointers
are abandoned, the process group is destroyed, the survivors and the replacement meet in a new
generation (``ray_ckpt.actors.generation_coordinator.GenerationCoordinator``) with a fresh TCP
store, and the function runs again from the top. There it restores as it always does: survivors from their local copy,
the replacement from peers. The contract on the training function: it must be safe to re-run
in the same process (build the model and optimizer, ``prepare_model``, create its Checkpointer,
restore), which is what a function written for Ray Train's restarts already does.

When in-place recovery cannot go on (no replacement within ``timeout_s``, a full restart of the
worker group overtook it, or this Ray lacks the path), the function raises
``InPlaceRecoveryError`` or runs as without ray_ckpt, and Ray Train restarts the worker group,
which restores from peers as before. A worker also stops recovering in place, and raises the
error for Ray Train to count, after ``RAY_CKPT_INPLACE_MAX_RECOVERIES`` recoveries or when the
error recurs at the same step after a recovery that lost no peer
(``recovery_budget.RecoveryBudget``): a deterministic error that reads like a collective's is
the job's own.

The code is in two halves, one per process: ``ray_ckpt.train.inplace_controller`` (the backend
and the warm spares, in Ray Train's controller) and ``ray_ckpt.train.inplace_worker`` (the
wrapper's recovery loop, the heartbeat and the worker process's state, in every worker); this
module is their public face. ``warm_up`` is here under its public name, the setup hook
``WARM_HOOK`` names, and so are ``current_attempt``, ``take_rejoin``, ``track``, ``shielded``,
``drain_notice`` and ``hand_over``, which the Ray Train Checkpointer calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ray.train.torch import TorchConfig

from ray_ckpt.errors import ConfigError
from ray_ckpt.train.inplace_controller import _backend_class
from ray_ckpt.train.inplace_worker import (
    WARM_HOOK,
    _Settings,
    _Worker,
    current_attempt,
    drain_notice,
    hand_over,
    is_peer_failure,
    shielded,
    take_rejoin,
    track,
    warm_up,
)

__all__ = [
    "WARM_HOOK",
    "InPlaceRecovery",
    "current_attempt",
    "drain_notice",
    "hand_over",
    "is_peer_failure",
    "shielded",
    "take_rejoin",
    "track",
    "warm_up",
]


class InPlaceRecovery(TorchConfig):
    """TorchConfig for in-place recovery; see the module docstring.

    timeout_s: how long a survivor waits for every rank to join the next generation before it
    gives up (``InPlaceRecoveryError``; Ray Train then restarts workers). hang_timeout_s: a
    worker whose heartbeat is silent this long (its process stopped) is killed and replaced.
    collective_timeout_s: the process groups' timeout, the bound on a collective that waits
    for a peer that vanished without closing its connections. warm_spares: how many nodes
    without a worker of the run keep one warm spare process waiting (started, with torch and
    Ray Train imported), so that a replacement Ray schedules there starts in it instead of in a
    new process; 0 turns them off. warm_keep_alive_s: how long Ray keeps a spare waiting; the
    run starts a new one on each free node at half of it. fence_silent_nodes: a node whose rank
    is lost, or still beats through its peers, while its raylet stays silent (power, link or
    route to the head lost) for about half a second is declared dead to Ray at once, so the
    replacement starts within seconds instead of after Ray's health checks (about a minute);
    the node cannot rejoin until Ray is restarted on it. False leaves the verdict to Ray's health checks.
    await_spares_s: how long a full start of the workers waits, before training begins, for
    the warm spares it started to finish warming up (their imports then take nothing from
    training, and the first failure finds them warm); 0 does not wait.
    ``backend`` and the remaining keyword arguments are TorchConfig's.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 120.0,
        hang_timeout_s: float = 10.0,
        collective_timeout_s: float = 300.0,
        warm_spares: int = 8,
        warm_keep_alive_s: float = 600.0,
        fence_silent_nodes: bool = True,
        await_spares_s: float = 15.0,
        backend: str | None = None,
        **torch_config: Any,
    ) -> None:
        for name, value in (
            ("timeout_s", timeout_s),
            ("hang_timeout_s", hang_timeout_s),
            ("collective_timeout_s", collective_timeout_s),
            ("warm_keep_alive_s", warm_keep_alive_s),
        ):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"InPlaceRecovery {name} must be a number of seconds > 0, got {value!r}")
        if not isinstance(warm_spares, int) or isinstance(warm_spares, bool) or warm_spares < 0:
            raise ConfigError(f"InPlaceRecovery warm_spares must be an int >= 0 (0: none), got {warm_spares!r}")
        if not isinstance(await_spares_s, (int, float)) or isinstance(await_spares_s, bool) or await_spares_s < 0:
            raise ConfigError(
                f"InPlaceRecovery await_spares_s must be a number of seconds >= 0 (0: no wait), got {await_spares_s!r}"
            )
        if not isinstance(fence_silent_nodes, bool):
            raise ConfigError(f"InPlaceRecovery fence_silent_nodes must be True or False, got {fence_silent_nodes!r}")
        super().__init__(backend=backend, timeout_s=int(collective_timeout_s), **torch_config)
        self.settings = _Settings(
            float(timeout_s),
            float(hang_timeout_s),
            float(collective_timeout_s),
            backend,
            warm_spares,
            float(warm_keep_alive_s),
            fence_silent_nodes,
            float(await_spares_s),
        )

    @property
    def backend_cls(self) -> type:
        return _backend_class()

    def wrap(self, train_loop: Callable[..., Any]) -> Callable[..., Any]:
        """``train_loop`` (taking ``config`` or nothing) made to recover in place."""
        if not callable(train_loop):
            raise ConfigError(f"wrap() takes the training function, got {type(train_loop).__name__}")

        @functools.wraps(train_loop)
        def run(*args: Any) -> Any:
            return _Worker().run(train_loop, args)

        return run
