"""CheckpointConfig: what one job checkpoints and how it is protected (frozen, validated)."""

from __future__ import annotations

import dataclasses
import math

from ray_ckpt.errors import ConfigError

MAX_SHARDS = 256
"""The most shards one rank's payload is coded into (k + m): a Reed-Solomon code over GF(2^8)
has 256 distinct points. Here, in the foundation, so the config, the codec and the shard
format's readers (``ray_ckpt.core.shard``, ``ray_ckpt.core.wire``) all check the one limit."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """How a job's checkpoints are coded and kept.

    data_shards (k) and parity_shards (m): each rank's payload is split in k shards plus m
    parity shards on k+m distinct nodes; any m of those nodes may die. Peer memory per step is
    (k+m)/k of the state.
    keep_committed: committed steps kept in peer memory (>= 1); older ones are evicted after a
    newer step commits.
    failure_domain_label: a node label (e.g. "zone", "rack") whose values name failure
    domains; shards of one rank are spread over as many domains as possible.
    commit_timeout_s: how long ``SaveHandle.wait`` waits for every rank to stage a step.
    local_copy: also keep the rank's whole checkpoint in the store on its own node, so a
    process restarted on the same node restores with no network (costs 1x the state there).
    on_busy: what ``save`` does while the previous save is still in the background: "wait"
    for it (the wait counts as stall) or "skip" this step.
    every: which steps ``save`` saves: an int N saves the steps divisible by N (1, the default:
    every call), "auto" lets ray_ckpt choose a power-of-two interval from what it measures
    (``ray_ckpt.core.interval``; a rank whose previous save still runs then skips, whatever
    ``on_busy`` says). A step that is not saved returns a skipped ``SaveHandle`` at once.
    backup_every: write a persistent backup of saved steps divisible by this (0: never); with
    an int ``every`` a multiple of it; with "auto", a power of two keeps every saved multiple
    of it backed up while the interval is at most backup_every.
    backup_uri: where backups go: a local path or a pyarrow.fs URI (s3://, gs://, ...).
    ``ray_ckpt.train.Checkpointer`` defaults it to the run's storage path.
    backup_keep: complete backup steps kept (older ones are deleted).
    """

    data_shards: int = 4
    parity_shards: int = 2
    keep_committed: int = 2
    failure_domain_label: str | None = None
    commit_timeout_s: float = 300.0
    local_copy: bool = True
    on_busy: str = "wait"
    every: int | str = 1
    backup_every: int = 0
    backup_uri: str | None = None
    backup_keep: int = 2

    def __post_init__(self) -> None:
        check_every(self.every)
        _check_int("backup_every", self.backup_every, 0)
        if isinstance(self.every, int) and self.backup_every % self.every:
            raise ConfigError(
                f"backup_every={self.backup_every} is not a multiple of every={self.every}: only saved steps "
                "are backed up, so such backups would come every lcm of the two steps; make backup_every a "
                "multiple of every"
            )
        _check_int("backup_keep", self.backup_keep, 1)
        if not isinstance(self.local_copy, bool):
            raise ConfigError(f"local_copy must be True or False, got {self.local_copy!r}")
        if self.on_busy not in ("wait", "skip"):
            raise ConfigError(f"on_busy must be 'wait' or 'skip', got {self.on_busy!r}")
        if self.backup_uri is not None and (not isinstance(self.backup_uri, str) or not self.backup_uri):
            raise ConfigError(f"backup_uri must be a non-empty path or URI, or None, got {self.backup_uri!r}")
        _check_int("data_shards", self.data_shards, 1)
        _check_int("parity_shards", self.parity_shards, 0)
        _check_int("keep_committed", self.keep_committed, 1)
        if self.data_shards + self.parity_shards > MAX_SHARDS:
            raise ConfigError(
                f"data_shards + parity_shards = {self.data_shards + self.parity_shards} exceeds "
                f"{MAX_SHARDS}, the most a code over GF(2^8) supports"
            )
        if self.failure_domain_label is not None and (
            not isinstance(self.failure_domain_label, str) or not self.failure_domain_label
        ):
            raise ConfigError(
                f"failure_domain_label must be a non-empty str or None, got {self.failure_domain_label!r}"
            )
        timeout = self.commit_timeout_s
        # bool is an int; nan and inf pass "> 0" but break Future.result(timeout=...) downstream
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ConfigError(f"commit_timeout_s must be a finite number > 0 seconds, got {timeout!r}")

    @property
    def total_shards(self) -> int:
        return self.data_shards + self.parity_shards

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, object]) -> CheckpointConfig:
        """The config ``to_dict`` gave; ConfigError names any key that is not a field."""
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(
                f"{', '.join(map(repr, unknown))} not a CheckpointConfig field; the fields are "
                f"{', '.join(f.name for f in dataclasses.fields(cls))}"
            )
        return cls(**values)  # type: ignore[arg-type]


EVERY_AUTO = "auto"


def check_every(value: object) -> None:
    """ConfigError unless ``value`` is an int >= 1 (not a bool) or "auto"."""
    if isinstance(value, str) and value == EVERY_AUTO:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(
            f"every must be an int >= 1 (save the steps divisible by it; 1 saves every call) or "
            f"{EVERY_AUTO!r} (ray_ckpt picks the interval), got {value!r}"
        )


def _check_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, got {value!r}")
