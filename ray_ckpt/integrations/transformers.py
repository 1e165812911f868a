"""Hugging Face Transformers: the ``Trainer``'s whole state in ray_ckpt's peer memory.

``PeerMemoryCallback`` saves, ``resume_from_peers`` brings a run back; docs/transformers.md is
the guide::

    callback = PeerMemoryCallback(ray_ckpt.CheckpointConfig(every=50))
    trainer = Trainer(model, args, train_dataset=data, callbacks=[callback])
    trainer = ray.train.huggingface.transformers.prepare_trainer(trainer)  # under Ray Train
    trainer.train(resume_from_checkpoint=resume_from_peers(trainer))

- **What a step holds** (one ray_ckpt state per rank): ``{"format": FORMAT, "global_step",
  "world_size", "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler":
  lr_scheduler.state_dict() or None, "scaler": the AMP GradScaler's state or None,
  "trainer_state": TrainerState as the JSON text HF writes (global step, epoch, log history,
  stateful callbacks' states, TrainerControl), "rng": ray_ckpt.rng_state()}``.
- **When.** A step is offered to the Checkpointer once HF has logged and evaluated it: at the
  next step's ``on_step_begin``, the next epoch's ``on_epoch_begin`` (HF's epoch-end logging
  and evaluation come after ``on_epoch_end``), or ``on_train_end``. The Checkpointer's
  ``CheckpointConfig.every`` (an int, or ``"auto"``) decides which steps are saved. Nothing
  touches the disk.
- **Resume.** ``resume_from_peers`` restores the newest committed step and writes it as a
  Trainer checkpoint folder (a temporary one, removed when training ends); handing that to
  ``trainer.train(resume_from_checkpoint=...)`` lets HF's own resume load the model, the
  optimizer, the scheduler, the TrainerState and the callbacks' states, skip the batches the
  step already consumed (HF's data position: ``global_step`` batches of the epoch it derives)
  and put the RNG states back where HF does. The resumed run is thus exactly HF's resume from a
  checkpoint of that step.

HF's DeepSpeed and FSDP paths save sharded state their own way and are refused (ConfigError).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any

import torch

from ray_ckpt._optional import require
from ray_ckpt.config import CheckpointConfig
from ray_ckpt.core.rng import rng_state
from ray_ckpt.errors import ConfigError
from ray_ckpt.integrations.states import StepStates, as_step_states

_transformers = require("transformers", "transformers")
_callback = require("transformers.trainer_callback", "transformers")
_TrainerCallback: Any = _transformers.TrainerCallback

__all__ = ["FORMAT", "PeerMemoryCallback", "resume_from_peers", "write_checkpoint_folder"]

FORMAT = "ray_ckpt.transformers/1"  # the "format" entry of every saved state

# The file names HF's Trainer reads from a checkpoint folder (transformers.trainer's constants).
_MODEL = "pytorch_model.bin"
_OPTIMIZER = "optimizer.pt"
_SCHEDULER = "scheduler.pt"
_SCALER = "scaler.pt"
_TRAINER_STATE = "trainer_state.json"


class PeerMemoryCallback(_TrainerCallback):
    """A ``TrainerCallback`` that offers every optimizer step's whole Trainer state to a
    ray_ckpt Checkpointer (module docstring: what and when).

    ``config``: the ``CheckpointConfig`` (``every=N`` or ``every="auto"``, backups, codes) of
    the ``ray_ckpt.train.Checkpointer`` this callback builds under Ray Train, at
    ``resume_from_peers`` or at train start, both reached by every rank (its constructor is a
    collective); its ``backup_uri`` defaults to the run's storage path. ``checkpointer``: one
    to use instead (outside Ray Train: ``ray_ckpt.Checkpointer(job=..., rank=..., world_size=...,
    config=...)``, rank and world size those of HF's processes). Give one or neither."""

    def __init__(self, config: CheckpointConfig | None = None, *, checkpointer: Any = None) -> None:
        if config is not None and checkpointer is not None:
            raise ConfigError("pass a CheckpointConfig or a checkpointer built with one, not both")
        if config is not None and not isinstance(config, CheckpointConfig):
            raise ConfigError(f"config must be a ray_ckpt.CheckpointConfig, got {type(config).__name__}")
        self.config = config
        self._checkpointer: StepStates | None = (
            None if checkpointer is None else as_step_states(checkpointer, "PeerMemoryCallback")
        )
        self.trainer: Any = None  # set by resume_from_peers: its callbacks' states and AMP scaler are saved too
        self.resume_folder: pathlib.Path | None = None  # what resume_from_peers wrote, removed at train end
        self._ended: int | None = None  # a step HF finished but this callback has not offered yet
        self.last_saved_step: int | None = None

    @property
    def checkpointer(self) -> StepStates:
        """The Checkpointer, built from ``config`` under Ray Train on first use."""
        if self._checkpointer is None:
            from ray_ckpt.train.checkpointer import Checkpointer

            self._checkpointer = Checkpointer(self.config)
        return self._checkpointer

    # ---- Trainer events ----------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if getattr(args, "deepspeed", None) or getattr(args, "fsdp", None):
            raise ConfigError(
                "PeerMemoryCallback saves each rank's full model and optimizer state: it does not support "
                "TrainingArguments deepspeed or fsdp (their sharded state is saved by their own code). "
                "Train with DDP, or use ray_ckpt.integrations.dcp with a loop of your own"
            )
        if self.trainer is None:
            raise ConfigError(
                "PeerMemoryCallback does not know its Trainer: call "
                "trainer.train(resume_from_checkpoint=resume_from_peers(trainer)) (it returns None on a first "
                "run); without it the AMP scaler's and the stateful callbacks' states would not be saved"
            )
        _ = self.checkpointer
        self._ended = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._ended = state.global_step
        # trained, whether or not it is saved: before the evaluation or logging that may follow
        self.checkpointer.note_step(state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._offer(args, state, control, kwargs)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # the last step of the previous epoch: HF logs and evaluates it after on_epoch_end
        self._offer(args, state, control, kwargs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        try:
            self._offer(args, state, control, kwargs)
            if self.last_saved_step is not None:
                self.checkpointer.wait()
        finally:
            if self.resume_folder is not None:
                shutil.rmtree(self.resume_folder, ignore_errors=True)
                self.resume_folder = None

    # ---- saving -------------------------------------------------------------------------

    def _offer(self, args: Any, state: Any, control: Any, kwargs: dict[str, Any]) -> None:
        step, self._ended = self._ended, None
        if step is None:
            return
        handle = self.checkpointer.save(step, self.state_of(args, state, control, kwargs))
        if not getattr(handle, "skipped", False):
            self.last_saved_step = step

    def state_of(self, args: Any, state: Any, control: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The ray_ckpt state of the Trainer now (module docstring: its entries)."""
        model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
        if model is None or optimizer is None:
            raise ConfigError("the Trainer passed no model or optimizer to the callback: add it with callbacks=[...]")
        scheduler = kwargs.get("lr_scheduler")
        return {
            "format": FORMAT,
            "global_step": int(state.global_step),
            "world_size": int(args.world_size),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "scaler": self._scaler_state(),
            "trainer_state": _trainer_state_json(state, [control, *self._callbacks()]),
            "rng": rng_state(),
        }

    def _callbacks(self) -> list[Any]:
        handler = getattr(self.trainer, "callback_handler", None)
        return list(getattr(handler, "callbacks", []))

    def _scaler_state(self) -> Any:
        scaler = getattr(getattr(self.trainer, "accelerator", None), "scaler", None)
        return None if scaler is None else scaler.state_dict()


def _trainer_state_json(state: Any, callbacks: list[Any]) -> str:
    """``state`` as HF's ``trainer_state.json`` text, its ``stateful_callbacks`` those of
    ``callbacks`` now (a list of states where a class appears more than once). ``state`` is
    not changed."""
    exportable = _callback.ExportableState
    states: dict[str, list[Any]] = {}
    for callback in callbacks:
        if isinstance(callback, exportable):
            states.setdefault(type(callback).__name__, []).append(callback.state())
    fields = dataclasses.asdict(state)
    fields["stateful_callbacks"] = {name: found[0] if len(found) == 1 else found for name, found in states.items()}
    return json.dumps(fields, indent=2, sort_keys=True) + "\n"


# ---- resuming -----------------------------------------------------------------------------


def resume_from_peers(
    trainer: Any, step: int | None = None, *, folder: str | os.PathLike[str] | None = None
) -> str | None:
    """The Trainer checkpoint folder of the newest committed step (or ``step``), restored from
    peer memory, for ``trainer.train(resume_from_checkpoint=...)``; None when the job has no
    step yet (a first run). Call it on every rank before ``train``, on each run of the job.

    ``trainer`` must hold a ``PeerMemoryCallback``; ``folder``: where to write (default: a new
    temporary folder, removed at train end). ConfigError when the callback is missing or the
    step is not a Transformers state; the Checkpointer's errors (another world size, a step
    that cannot be rebuilt) as they are."""
    callback = _callback_of(trainer)
    callback.trainer = trainer
    restored = callback.checkpointer.restore(step)
    if restored is None:
        return None
    where = pathlib.Path(folder) if folder is not None else pathlib.Path(tempfile.mkdtemp(prefix="ray_ckpt-hf-"))
    write_checkpoint_folder(restored.state, where, trainer.args)
    if folder is None:
        callback.resume_folder = where
    return str(where)


def _callback_of(trainer: Any) -> PeerMemoryCallback:
    handler = getattr(trainer, "callback_handler", None)
    found = [cb for cb in getattr(handler, "callbacks", []) if isinstance(cb, PeerMemoryCallback)]
    if len(found) != 1:
        raise ConfigError(
            f"the Trainer holds {len(found)} PeerMemoryCallback(s); give it exactly one: "
            "Trainer(..., callbacks=[PeerMemoryCallback(config)]) or trainer.add_callback(...)"
        )
    return found[0]


def write_checkpoint_folder(saved: Any, folder: str | os.PathLike[str], args: Any) -> None:
    """Write a restored state (module docstring) into ``folder`` as the files HF's
    ``Trainer`` resumes from: weights, optimizer, scheduler, AMP scaler, TrainerState and this
    process's RNG file (``rng_state.pth``, or ``rng_state_<process_index>.pth`` when
    ``args.world_size`` > 1). ConfigError when ``saved`` is not such a state or was saved at
    another world size."""
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        found = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
        raise ConfigError(
            f"this step is not a Transformers Trainer state (format {found!r}, expected {FORMAT!r}): it was "
            "saved by other code under the same job; give this run its own job name"
        )
    if saved["world_size"] != args.world_size:
        raise ConfigError(
            f"step {saved['global_step']} was saved by {saved['world_size']} process(es), this run has "
            f"{args.world_size}: HF's data skipping assumes the same world size. Resume with as many workers"
        )
    path = pathlib.Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    torch.save(_own_bytes(saved["model"]), path / _MODEL)
    torch.save(_own_bytes(saved["optimizer"]), path / _OPTIMIZER)
    if saved["scheduler"] is not None:
        torch.save(_own_bytes(saved["scheduler"]), path / _SCHEDULER)
    if saved["scaler"] is not None:
        torch.save(_own_bytes(saved["scaler"]), path / _SCALER)
    (path / _TRAINER_STATE).write_text(saved["trainer_state"])
    name = f"rng_state_{args.process_index}.pth" if args.world_size > 1 else "rng_state.pth"
    torch.save(_hf_rng(saved["rng"], distributed=args.world_size > 1), path / name)


def _own_bytes(tree: Any) -> Any:
    """``tree`` with each tensor that views a larger buffer (a restored step's payload) copied
    into its own: ``torch.save`` writes a tensor's whole storage, so the model's file would
    hold the optimizer's bytes too."""
    if isinstance(tree, torch.Tensor):
        return tree.clone() if tree.untyped_storage().nbytes() > tree.nbytes else tree
    if isinstance(tree, dict):
        return {key: _own_bytes(value) for key, value in tree.items()}
    if type(tree) in (list, tuple):
        return type(tree)(_own_bytes(value) for value in tree)
    return tree


def _hf_rng(saved: dict[str, Any], *, distributed: bool) -> dict[str, Any]:
    """ray_ckpt's ``rng_state()`` in HF's RNG file layout (``cpu`` for torch's generator; for
    CUDA, every device's states when distributed, else the current device's)."""
    states: dict[str, Any] = {"python": saved["python"], "numpy": saved["numpy"], "cpu": saved["torch"]}
    if torch.cuda.is_available():
        cuda = saved.get("cuda")
        if cuda is None:  # CUDA was never initialised in the saving process: nothing was drawn from it
            cuda = torch.cuda.get_rng_state_all()
        states["cuda"] = list(cuda) if distributed else cuda[torch.cuda.current_device()]
    return states
