"""PyTorch Lightning: Lightning's checkpoint dict in ray_ckpt's peer memory.

``PeerMemoryCheckpointIO`` is a Lightning ``CheckpointIO`` plugin (Lightning's storage seam) and
``SaveToPeers`` the callback that asks Lightning for a checkpoint every N steps; docs/lightning.md
is the guide::

    io = PeerMemoryCheckpointIO(ray_ckpt.CheckpointConfig(every=10))
    trainer = pl.Trainer(..., strategy=RayDDPStrategy(), plugins=[io], callbacks=[SaveToPeers()])
    trainer.fit(module, loader, ckpt_path=io.resume_path())  # None on the first run

- **Paths.** A checkpoint path is ``peers://...``. A save is kept as the ray_ckpt step of the
  dict's ``global_step`` (whatever follows ``peers://``); a load reads ``peers://latest`` (the
  newest committed step) or ``peers://<step>``. Any other path is a ConfigError.
- **Whose dict.** Lightning builds its dict on every rank but hands it to the ``CheckpointIO``
  on global rank 0 only (``Strategy.save_checkpoint``), and every rank loads that one dict. The
  plugin keeps it the same way: as a ray_ckpt job of one rank, ``<job>.lightning``, that rank 0
  saves and every rank reads (RayDDPStrategy, RayFSDPStrategy with its default full state dict).
- **What is kept.** The dict as Lightning made it (model, optimizers, LR schedulers, loops'
  progress, callbacks' states, hyper-parameters, a stateful data loader's position), converted
  only where a snapshot needs exact types: a dict subclass (Lightning's ``AttributeDict``) is
  kept as a plain ``dict``. Any other object a snapshot refuses (a ``Namespace``, a set, a
  dataclass) raises ``UnsupportedLeafError`` naming its key path and what to convert it to.
- **Removal.** ``remove_checkpoint`` removes nothing: peer memory keeps its newest steps on its
  own (``CheckpointConfig`` retention).
"""

from __future__ import annotations

import collections
import os
from collections.abc import Mapping
from typing import Any

from ray_ckpt._optional import require
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.core.shard import check_step
from ray_ckpt.errors import ConfigError, RayCkptError, UnsupportedLeafError
from ray_ckpt.integrations.states import StepStates, as_step_states

_pl = require("lightning.pytorch", "lightning")
_CheckpointIO: Any = _pl.plugins.CheckpointIO
_Callback: Any = _pl.Callback

__all__ = ["FORMAT", "LATEST", "SCHEME", "PeerMemoryCheckpointIO", "SaveToPeers", "plain", "step_of_path"]

FORMAT = "ray_ckpt.lightning/1"  # the "format" entry of every saved state
SCHEME = "peers://"
LATEST = "peers://latest"


def step_of_path(path: Any) -> int | None:
    """The step a load path names: None for ``peers://latest``, the int of ``peers://<step>``;
    ConfigError for any other path."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if isinstance(text, str) and text.startswith(SCHEME):
        rest = text[len(SCHEME) :].strip("/")
        if rest == "latest":
            return None
        if rest.isascii() and rest.isdigit():
            step = int(rest)
            try:
                check_step(step)
            except RayCkptError as error:
                raise ConfigError(f"checkpoint path {text!r}: {error}") from None
            return step
    raise ConfigError(
        f"PeerMemoryCheckpointIO loads {LATEST!r} or '{SCHEME}<step>' (e.g. ckpt_path='{SCHEME}120'), got {path!r}; "
        "a file path belongs to Lightning's own TorchCheckpointIO"
    )


def plain(value: Any) -> Any:
    """``value`` with every dict subclass but ``OrderedDict`` (Lightning's ``AttributeDict``,
    a ``defaultdict``) turned into a plain ``dict``, recursively through dicts, lists and
    tuples; everything else as it is (the snapshot checks it)."""
    kind = type(value)
    if kind is dict or kind is collections.OrderedDict:
        return kind((key, plain(item)) for key, item in value.items())
    if isinstance(value, dict) or (isinstance(value, Mapping) and not hasattr(value, "_fields")):
        return {key: plain(item) for key, item in value.items()}
    if kind is list:
        return [plain(item) for item in value]
    if kind is tuple:
        return tuple(plain(item) for item in value)
    return value


class PeerMemoryCheckpointIO(_CheckpointIO):
    """Lightning's ``CheckpointIO`` over ray_ckpt's peer memory (module docstring: paths,
    whose dict, what is kept).

    ``config``: the ``CheckpointConfig`` of the one-rank Checkpointer this plugin builds under
    Ray Train, when it is constructed, on every rank (a collective: every worker constructs
    the plugin); job ``<the run's job>.lightning``; ``backup_uri`` defaults to the run's
    storage path. Its ``every`` (an int, or ``"auto"``) decides which of the offered steps are
    kept. ``checkpointer``: one to use instead, on every rank, of rank 0 of a world of 1 (outside
    Ray Train: ``ray_ckpt.Checkpointer(job=..., rank=0, world_size=1, attempt=<the same str on
    every rank>)``). Give one or neither."""

    def __init__(self, config: CheckpointConfig | None = None, *, checkpointer: Any = None) -> None:
        super().__init__()
        if config is not None and checkpointer is not None:
            raise ConfigError("pass a CheckpointConfig or a checkpointer built with one, not both")
        if config is not None and not isinstance(config, CheckpointConfig):
            raise ConfigError(f"config must be a ray_ckpt.CheckpointConfig, got {type(config).__name__}")
        if checkpointer is None:
            checkpointer = _rank_zero_checkpointer(config or CheckpointConfig())
        self.checkpointer: StepStates = as_step_states(checkpointer, "PeerMemoryCheckpointIO")
        if self.checkpointer.rank != 0:
            raise ConfigError(
                f"the checkpointer has rank {self.checkpointer.rank}: Lightning's checkpoint is rank 0's dict, so "
                "every process passes a Checkpointer of rank=0, world_size=1 (the same attempt on every process)"
            )
        self.last_saved_step: int | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Keep ``checkpoint`` as the step of its ``global_step`` (a step kept already is not
        kept again). ConfigError for a path outside ``peers://``, for ``storage_options``, or
        a dict without an int ``global_step``; UnsupportedLeafError for a value a snapshot
        cannot keep."""
        if storage_options is not None:
            raise ConfigError(f"PeerMemoryCheckpointIO takes no storage_options, got {storage_options!r}")
        text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
        if not isinstance(text, str) or not text.startswith(SCHEME):
            raise ConfigError(
                f"PeerMemoryCheckpointIO saves to '{SCHEME}...' paths (trainer.save_checkpoint('{SCHEME}latest'), "
                f"or the SaveToPeers callback), got {path!r}"
            )
        step = checkpoint.get("global_step") if isinstance(checkpoint, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ConfigError(
                f"Lightning's checkpoint dict has no int 'global_step' (got {step!r}): nothing to key it by"
            )
        if self.last_saved_step is not None and step <= self.last_saved_step:
            return  # this step is kept already (a second save at the same step, e.g. on train end)
        state = {"format": FORMAT, "path": text, "checkpoint": plain(checkpoint)}
        try:
            handle = self.checkpointer.save(step, state)
        except UnsupportedLeafError as error:
            raise UnsupportedLeafError(
                f"{error} (in Lightning's checkpoint dict: convert it in LightningModule.on_save_checkpoint, or in "
                "the state_dict of the callback or data module that puts it there)",
                **error.details,
            ) from None
        if not getattr(handle, "skipped", False):
            self.last_saved_step = step

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> Any:
        """Lightning's dict of the step ``path`` names (``peers://latest`` or ``peers://<step>``),
        its tensors on the CPU (Lightning moves them). ConfigError for another path, a job with
        no step, or a step that holds no Lightning dict; NoCheckpointError for a step not
        committed."""
        step = step_of_path(path)
        restored = self.checkpointer.restore(step)
        if restored is None:
            raise ConfigError(f"{path!r}: this job has no checkpoint in peer memory yet (pass ckpt_path=None to start)")
        saved = restored.state
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            found = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
            raise ConfigError(
                f"step {restored.step} is not a Lightning checkpoint (format {found!r}, expected {FORMAT!r}): it was "
                "saved by other code under the same job; give this run its own job"
            )
        return saved["checkpoint"]

    def remove_checkpoint(self, path: Any) -> None:
        """Nothing: peer memory drops old steps by its own retention."""

    def resume_path(self) -> str | None:
        """``peers://<newest committed step>`` for ``trainer.fit(ckpt_path=...)``, or None
        when the job has none yet (a first run). Every rank gets the same answer only when no
        save is committing meanwhile: call it before ``fit``."""
        step = self.checkpointer.latest_step()
        return None if step is None else f"{SCHEME}{step}"


def _rank_zero_checkpointer(config: CheckpointConfig) -> Any:
    """Under Ray Train: a Checkpointer of rank 0 in a world of 1 that every worker makes, job
    ``<the run's job>.lightning`` (``ray_ckpt.train.checkpointer.SharedRankZero``: its attempt
    is broadcast from rank 0, or the in-place generation's)."""
    import ray.train

    from ray_ckpt.train.checkpointer import SharedRankZero, job_name

    job = f"{job_name(ray.train.get_context().get_experiment_name())}.lightning"
    return SharedRankZero(config, job=job)


def _note_step(trainer: Any, step: int) -> None:
    """On global rank 0, tell the checkpointer that ``step`` was trained without a save
    (``Checkpointer.note_step``), where the trainer's checkpoint plugin is a
    ``PeerMemoryCheckpointIO``."""
    io = getattr(getattr(trainer, "strategy", None), "checkpoint_io", None)
    if isinstance(io, PeerMemoryCheckpointIO) and getattr(trainer, "is_global_zero", False):
        io.checkpointer.note_step(step)


class SaveToPeers(_Callback):
    """Asks Lightning for a checkpoint at ``peers://<global_step>`` after every ``every``-th
    optimizer step (``on_train_batch_end``, as Lightning's ``ModelCheckpoint``), on every rank
    (``trainer.save_checkpoint`` is a collective). Leave ``every`` at 1 with
    ``CheckpointConfig(every="auto")``: the plugin's Checkpointer then picks the steps."""

    def __init__(self, every: int = 1) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ConfigError(f"every must be an int >= 1 (steps between checkpoints), got {every!r}")
        self.every = every
        self._last: int | None = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._last:
            return  # no optimizer step since the last save (gradient accumulation)
        if step % self.every:  # not due: still a step a failure would make the job train again
            _note_step(trainer, step)
            return
        self._last = step
        trainer.save_checkpoint(f"{SCHEME}{step}")

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """A checkpoint of an epoch's last batch keeps no loader position: the epoch is done and
        the resume starts the next one afresh (with the finished epoch's position, Lightning's
        resume skipped the whole next epoch)."""
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        if getattr(trainer, "is_last_batch", False) and "combined_loader" in fit_loop.get("state_dict", {}):
            fit_loop["state_dict"]["combined_loader"] = []

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Set the epoch of the training loader's sampler to the one the resume trains in
        before Lightning makes the loader's iterator: on a restart it makes it before it sets
        the epoch, so an epoch-seeded sampler gave epoch 0's order. Only a loader and sampler
        the caller passed to ``fit`` are reached (``use_distributed_sampler=False`` with one's
        own ``DistributedSampler`` under Ray's strategies)."""
        epoch = checkpoint.get("epoch")
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress", {})
        if not isinstance(epoch, int):
            return
        if progress.get("is_last_batch"):
            epoch += 1  # the resume starts the next epoch
        loader = getattr(getattr(trainer.fit_loop, "_data_source", None), "instance", None)
        batch_sampler = getattr(loader, "batch_sampler", None)
        samplers: tuple[Any, ...] = (getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None))
        for sampler in samplers:
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
