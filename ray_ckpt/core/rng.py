"""The random number generators a resumed run puts back, as one state a checkpoint holds.

``rng_state()`` captures Python's ``random`` module, NumPy's global generator (``np.random``'s
legacy functions), torch's CPU generator and, when this process has initialised CUDA, every CUDA
device's; ``set_rng_state(state)`` puts them back, so the draws after a resume are the ones the
interrupted run would have made. Save the state with the step's other values (``ckpt.save(step,
{..., "rng": rng_state()})``); it is a dict of tuples, ints, a numpy array and uint8 tensors,
all of which a snapshot keeps exactly.

Generators the process made itself (``torch.Generator()``, ``np.random.default_rng()``, a
sampler's or data loader's) are not global: save ``generator.get_state()`` or
``rng.bit_generator.state`` with them, or the loader's ``state_dict()``.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from ray_ckpt.errors import ConfigError

_REQUIRED = ("python", "numpy", "torch")
_KEYS = (*_REQUIRED, "cuda")


def rng_state() -> dict[str, Any]:
    """``{"python": random.getstate(), "numpy": np.random.get_state(), "torch":
    torch.get_rng_state()}``, plus ``"cuda": torch.cuda.get_rng_state_all()`` when CUDA is
    initialised in this process (if it is not, no CUDA random numbers were drawn, and capturing
    them would initialise CUDA). Copies: later draws do not change it."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Any) -> None:
    """Put back the generators of a :func:`rng_state` (as saved, or as a snapshot restored it).

    ConfigError, before any generator changes, when ``state`` is not such a dict (a key missing
    or unknown), or holds CUDA states that this process cannot take (no CUDA, or another number
    of devices: drop ``"cuda"`` from the dict to restore only the CPU generators). A generator
    that refuses its value raises ConfigError naming it; the generators set before it (in the
    order Python, NumPy, torch, CUDA) keep their new state."""
    if not isinstance(state, dict):
        raise ConfigError(f"set_rng_state takes the dict rng_state() returned, got {type(state).__name__}")
    missing = [key for key in _REQUIRED if key not in state]
    unknown = [key for key in state if key not in _KEYS]
    if missing or unknown:
        raise ConfigError(
            f"set_rng_state takes the dict rng_state() returned (keys {', '.join(_KEYS)}; 'cuda' optional): "
            f"missing {missing}, unknown {unknown}",
            missing=missing,
            unknown=unknown,
        )
    cuda = state.get("cuda")
    if cuda is not None:
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not isinstance(cuda, (list, tuple)) or len(cuda) != devices:
            saved = len(cuda) if isinstance(cuda, (list, tuple)) else type(cuda).__name__
            raise ConfigError(
                f"the RNG state holds CUDA generator states of {saved} devices, this process has {devices}: "
                "restore on as many devices, or drop 'cuda' from the dict to restore only the CPU generators",
                saved_devices=saved,
                devices=devices,
            )
    setters: list[tuple[str, Any]] = [
        ("python", random.setstate),
        ("numpy", np.random.set_state),
        ("torch", torch.set_rng_state),
    ]
    if cuda is not None:
        setters.append(("cuda", torch.cuda.set_rng_state_all))
    for key, put in setters:
        try:
            put(state[key])
        except (TypeError, ValueError, RuntimeError) as error:
            raise ConfigError(
                f"rng state[{key!r}] cannot be set back ({error}): pass the value rng_state() returned", key=key
            ) from None
