"""The Ray Train internals in-place recovery needs, all in one place.

In-place recovery rides on Ray Train's replica-group path: a backend whose
``has_replica_groups`` is True makes the controller replace only the failed workers (each worker
is one replica group in Ray 2.60) instead of restarting the whole worker group, and calls the
backend's ``on_start`` with the replacement ``ReplicaGroup``. Those names are internal to Ray,
so every use of them is here, behind ``replica_groups()``, which says whether this Ray has them.
``tests/unit/test_ray_compat.py`` fails when an upgrade moves or changes them.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import logging
from typing import Any

import ray

logger = logging.getLogger(__name__)

TESTED_RAY = ((2, 60), (2, 61))  # [from, to): the versions whose replica-group path was verified


@dataclasses.dataclass(frozen=True)
class ReplicaGroups:
    """Ray's replica-group path: ``torch_backend`` (the class TorchConfig's backend is, to
    subclass), ``replica_group`` (the type ``on_start`` gets for a replacement), or
    ``missing`` (why this Ray cannot replace single workers; the other fields are then None)."""

    torch_backend: type | None
    replica_group: type | None
    missing: str | None = None


def ray_version() -> tuple[int, int]:
    major, minor = ray.__version__.split(".")[:2]
    return int(major), int(minor)


def tested() -> bool:
    """Whether this Ray's version is one the replica-group path was verified on."""
    low, high = TESTED_RAY
    return low <= ray_version() < high


def replica_groups() -> ReplicaGroups:
    """Look up the replica-group path in the installed Ray; never raises."""
    try:
        torch_config = importlib.import_module("ray.train.torch.config")
        execution = importlib.import_module("ray.train.v2._internal.execution.worker_group")
        controller = importlib.import_module("ray.train.v2._internal.execution.controller.controller")
        backend = importlib.import_module("ray.train.backend")
    except ImportError as error:
        return ReplicaGroups(None, None, f"Ray Train's modules are missing ({error})")
    torch_backend = getattr(torch_config, "_TorchBackend", None)
    replica_group = getattr(execution, "ReplicaGroup", None)
    train_controller = getattr(controller, "TrainController", None)
    if torch_backend is None or replica_group is None or train_controller is None:
        return ReplicaGroups(None, None, "Ray lacks _TorchBackend, ReplicaGroup or TrainController")
    if not hasattr(backend.Backend, "has_replica_groups"):
        return ReplicaGroups(None, None, "Ray's Backend has no has_replica_groups")
    decide = getattr(train_controller, "_execute_resize_decision", None)
    if decide is None or "_replace_bad_workers" not in inspect.getsource(decide):
        return ReplicaGroups(None, None, "Ray's controller does not replace single replica groups")
    return ReplicaGroups(torch_backend, replica_group)


def torch_backend_base() -> type:
    """The class to subclass for a backend that sets up torch.distributed like TorchConfig."""
    from ray.train.torch.config import _TorchBackend

    return _TorchBackend


def is_replica_group(group: Any) -> bool:
    """Whether ``on_start`` was called for one replacement replica group (not a full start)."""
    replica_group = replica_groups().replica_group
    return replica_group is not None and isinstance(group, replica_group)


def set_torch_distributed_env_vars() -> None:
    """Set LOCAL_RANK, RANK, WORLD_SIZE... in a worker as TorchConfig's full start does."""
    from ray.train.torch.config import _set_torch_distributed_env_vars

    _set_torch_distributed_env_vars()


def restart_when_a_replacement_fails() -> None:
    """Make Ray Train's controller restart the whole worker group when replacing single workers
    fails, instead of ending the run. In Ray 2.60 the replacement asks every surviving worker to
    clear its result queue; if a survivor's node died meanwhile (a second failure during the
    recovery), that error escapes the controller's loop and ends the run with retries left.
    Patches ``TrainController`` and its subclasses in this process (Ray's actor machinery
    subclasses it and wraps its methods for tracing); called where the backend class is built,
    which includes the controller; idempotent."""
    controller = importlib.import_module("ray.train.v2._internal.execution.controller.controller")
    classes = [controller.TrainController, *_subclasses(controller.TrainController)]
    for cls in classes:
        if "_replace_bad_workers" in vars(cls) and not vars(cls).get("_ray_ckpt_restarts_on_failed_replacement"):
            _patch_controller(cls)


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    sub: type
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _patch_controller(cls: Any) -> None:
    decide = cls._execute_resize_decision
    replace = cls._replace_bad_workers

    @functools.wraps(decide)
    def execute_resize_decision(self: Any, decision: Any) -> Any:
        self._ray_ckpt_decision = decision
        return decide(self, decision)

    @functools.wraps(replace)
    def replace_bad_workers(self: Any, poll_status: Any) -> None:
        try:
            replace(self, poll_status)
        except Exception as error:
            decision = self._ray_ckpt_decision
            logger.warning("replacing the failed workers failed (%s); restarting the worker group", error)
            if self._worker_group:
                self._shutdown_worker_group()
            self._start_worker_group(
                num_workers=decision.num_workers, resources_per_worker=decision.resources_per_worker
            )

    cls._execute_resize_decision = execute_resize_decision
    cls._replace_bad_workers = replace_bad_workers
    cls._ray_ckpt_restarts_on_failed_replacement = True
