"""ray_ckpt.train.Checkpointer: a Checkpointer that takes job, rank and world size from the run."""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow.fs as pafs
import ray.train
from ray.train.collective import broadcast_from_rank_zero

from ray_ckpt import checkpointer
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.core.generations import generation_of
from ray_ckpt.errors import ConfigError
from ray_ckpt.train import inplace

__all__ = ["Checkpointer", "default_backup_uri", "job_name"]

_SCHEMES = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs", "abfs": "abfs"}

_Method = TypeVar("_Method", bound=Callable[..., Any])


def _shielded(method: _Method) -> _Method:
    """``method`` run where in-place recovery's ``PeerLost`` cannot cut it short (it is raised
    when the call returns instead; ``ray_ckpt.train.interrupts``)."""

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        with inplace.shielded():
            return method(*args, **kwargs)

    return call  # type: ignore[return-value]


def job_name(experiment_name: str) -> str:
    """The ray_ckpt job for a Ray Train experiment name: '%' becomes '%25', then '/' becomes
    '%2F' (percent-encoding of just those two), so the job never contains '/', names with
    neither character are kept as they are, and distinct names give distinct jobs
    (``"team/exp1"`` -> ``"team%2Fexp1"``; ``"team%2Fexp1"`` -> ``"team%252Fexp1"``)."""
    if not isinstance(experiment_name, str) or not experiment_name:
        raise ConfigError(f"the experiment name must be a non-empty str, got {experiment_name!r}")
    return experiment_name.replace("%", "%25").replace("/", "%2F")


def default_backup_uri() -> str | None:
    """``<run's storage path>/<experiment>/ray_ckpt``, as a URI pyarrow.fs understands, or
    None when the run's filesystem has no URI form (pass backup_uri explicitly then)."""
    storage = ray.train.get_context().get_storage()
    fs = storage.storage_filesystem
    path = f"{storage.experiment_fs_path.rstrip('/')}/ray_ckpt"
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    scheme = _SCHEMES.get(fs.type_name)
    return f"{scheme}://{path}" if scheme else None


class Checkpointer(checkpointer.Checkpointer):
    """``ray_ckpt.Checkpointer`` for use inside ``train_loop_per_worker``.

    job = ``job`` if given (used as is: a non-empty str without '/'), else
    ``job_name(<the run's experiment name>)``; rank/world size = the worker's world rank and
    size; node identity = this worker's Ray node id. Every worker group (each restart of the
    run) gets a fresh attempt id, chosen by rank 0 and broadcast to all ranks, so steps torn by
    a failed group are discarded rather than completed by the next one. Under
    ``InPlaceRecovery`` the attempt is the generation's (no broadcast), and a failure of the
    generation abandons this checkpointer. Must be constructed by every rank, with the same
    ``job`` (the broadcast is a collective). ``backup_uri`` defaults to the run's storage path.
    ``config.every`` is used as given; under ``InPlaceRecovery`` an ``every="auto"`` interval
    counts the run's failures from the generation number (every generation after the first
    follows one); outside it, restarts are not counted and the prior RAY_CKPT_AUTO_MTBF_S
    stands (``failures_seen`` takes a count from the caller). Under ``InPlaceRecovery`` no
    ``PeerLost`` lands inside its methods: one that comes during a call is raised as it returns.
    """

    @_shielded
    def __init__(
        self, config: CheckpointConfig | None = None, *, job: str | None = None, namespace: str | None = None
    ) -> None:
        if job is not None and (not isinstance(job, str) or not job or "/" in job):
            raise ConfigError(
                f"job must be a non-empty str without '/', got {job!r}; leave job out to use the "
                "experiment name, or pass ray_ckpt.train.job_name(<name>) to map a name that has '/'"
            )
        context = ray.train.get_context()
        if job is None:
            job = job_name(context.get_experiment_name())
        config = config or CheckpointConfig()
        if config.backup_every and not config.backup_uri:
            uri = default_backup_uri()
            if uri is not None:
                config = dataclasses.replace(config, backup_uri=uri)
        attempt = inplace.current_attempt()
        if attempt is None:
            attempt = broadcast_from_rank_zero(uuid.uuid4().hex)
        super().__init__(
            job=job,
            rank=context.get_world_rank(),
            world_size=context.get_world_size(),
            config=config,
            namespace=namespace,
            attempt=attempt,
        )
        generation = generation_of(inplace.current_attempt())
        if generation is not None:
            self.failures_seen(max(0, generation - 1))
        if inplace.current_attempt() is not None:
            inplace.track(self)
            rejoin = inplace.take_rejoin()
            if rejoin is not None:
                self._record("rejoin", **rejoin.to_wire())

    save = _shielded(checkpointer.Checkpointer.save)
    wait = _shielded(checkpointer.Checkpointer.wait)
    restore = _shielded(checkpointer.Checkpointer.restore)
    close = _shielded(checkpointer.Checkpointer.close)
