"""Ray Train integration: a Checkpointer that takes job, rank and world size from the run."""

from __future__ import annotations

import dataclasses
import uuid

import pyarrow.fs as pafs
import ray.train
from ray.train.collective import broadcast_from_rank_zero

from ray_ckpt import checkpointer
from ray_ckpt.config import CheckpointConfig

_SCHEMES = {"s3": "s3", "gcs": "gs", "hdfs": "hdfs", "abfs": "abfs"}


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

    job = the run's experiment name, rank/world size = the worker's world rank and size, node
    identity = this worker's Ray node id. Every worker group (each restart of the run) gets a
    fresh attempt id, chosen by rank 0 and broadcast to all ranks, so steps torn by a failed
    group are discarded rather than completed by the next one. Must be constructed by every
    rank (the broadcast is a collective). ``backup_uri`` defaults to the run's storage path.
    """

    def __init__(self, config: CheckpointConfig | None = None, *, namespace: str | None = None) -> None:
        context = ray.train.get_context()
        config = config or CheckpointConfig()
        if config.backup_every and not config.backup_uri:
            uri = default_backup_uri()
            if uri is not None:
                config = dataclasses.replace(config, backup_uri=uri)
        attempt = broadcast_from_rank_zero(uuid.uuid4().hex)
        super().__init__(
            job=context.get_experiment_name(),
            rank=context.get_world_rank(),
            world_size=context.get_world_size(),
            config=config,
            namespace=namespace,
            attempt=attempt,
        )
