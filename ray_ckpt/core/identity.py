"""RankIdentity: which rank of which job a checkpointer saves and restores for, checked once.

The public ``Checkpointer`` takes the identity as keyword arguments (``job``, ``rank``,
``world_size``, ``attempt``) and learns its node from Ray; the save pipeline and the restorer
it builds take the one record. ``WithIdentity`` lets a holder of the record read its fields as
its own attributes (``ckpt.rank``).
"""

from __future__ import annotations

import dataclasses

from ray_ckpt.core.forwarded import Forwarded
from ray_ckpt.core.shard import SAVE_ID_MAX
from ray_ckpt.errors import ConfigError

JOB_MAX_BYTES = 1024  # the longest job name, in bytes of UTF-8 (a store's data port takes no longer one)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankIdentity:
    """One rank of one job, as its saves, restores and events name it.

    job: the job's name, a non-empty str without '/' of at most ``JOB_MAX_BYTES`` bytes of UTF-8
    (it names the job's shards and backups).
    rank: this rank, an int in [0, world_size).
    world_size: how many ranks save each step, an int >= 1.
    attempt: the incarnation of the job (one worker group): a non-empty str of at most
    ``SAVE_ID_MAX`` characters, the same on every rank of the group; None until the registry
    gives one at the first restore (``with_attempt``).
    node_id: the Ray node the rank runs on, a non-empty str.

    Frozen: checked once, here, with ConfigError naming the bad field and what it must be; a
    rank that learns its attempt gets a new record.
    """

    job: str
    rank: int
    world_size: int
    attempt: str | None = None
    node_id: str

    def __post_init__(self) -> None:
        self.check(job=self.job, rank=self.rank, world_size=self.world_size, attempt=self.attempt)
        if not isinstance(self.node_id, str) or not self.node_id:
            raise ConfigError(f"node_id must be the non-empty id of the rank's Ray node, got {self.node_id!r}")

    @staticmethod
    def check(*, job: object, rank: object, world_size: object, attempt: object) -> None:
        """The checks of every field but the node, for a caller that checks its arguments before
        it knows its node (``Checkpointer``: before Ray is needed); ConfigError naming the field."""
        if not isinstance(job, str) or not job or "/" in job:
            raise ConfigError(f"job must be a non-empty str without '/', got {job!r}")
        size = len(job.encode("utf-8", "surrogatepass"))
        if size > JOB_MAX_BYTES:
            raise ConfigError(
                f"job {job[:64]!r}... is {size} bytes of UTF-8, more than the {JOB_MAX_BYTES} a job name may have "
                "(ray_ckpt.core.identity.JOB_MAX_BYTES: the stores' data port takes no longer one); use a shorter "
                "job name",
                job_bytes=size,
                max_bytes=JOB_MAX_BYTES,
            )
        if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
            raise ConfigError(f"world_size must be an int >= 1, got {world_size!r}")
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
            raise ConfigError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
        if attempt is not None and (not isinstance(attempt, str) or not attempt or len(attempt) > SAVE_ID_MAX):
            raise ConfigError(
                f"attempt must be None or a non-empty str of at most {SAVE_ID_MAX} characters, the same on every "
                f"rank of one worker group, got {attempt!r}"
            )

    def with_attempt(self, attempt: str | None) -> RankIdentity:
        """This identity under ``attempt`` (checked as at construction)."""
        return dataclasses.replace(self, attempt=attempt)


class WithIdentity:
    """A holder of a ``RankIdentity`` (``identity``) whose fields it reads as its own
    attributes: ``job``, ``rank``, ``world_size``, ``attempt``, ``node_id`` (read-only; a new
    attempt is a new ``identity``)."""

    identity: RankIdentity

    job = Forwarded[str]("identity")
    rank = Forwarded[int]("identity")
    world_size = Forwarded[int]("identity")
    attempt = Forwarded[str | None]("identity")
    node_id = Forwarded[str]("identity")
