"""The pure modules import without Ray or torch; the package loads its Ray names on first use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("ray", "ray.train", "torch", "torch.distributed")
PURE = ("ray_ckpt.core.codec", "ray_ckpt.core.placement", "ray_ckpt.core.protection", "ray_ckpt.core.registry",
        "ray_ckpt.core.store", "ray_ckpt.core.shard", "ray_ckpt.config", "ray_ckpt.errors", "ray_ckpt.core.wire",
        "ray_ckpt.testing")  # fmt: skip


def loaded_after(statement: str) -> list[str]:
    """The modules of HEAVY that ``statement`` loads in a fresh interpreter."""
    probe = f"import json, sys\n{statement}\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_pure_modules_import_neither_ray_nor_torch() -> None:
    # one interpreter, one module at a time: a module that pulls Ray or torch in is named
    statement = (
        "import importlib, sys\n"
        f"for name in {PURE!r}:\n"
        "    importlib.import_module(name)\n"
        f"    assert not [m for m in {HEAVY!r} if m in sys.modules], name"
    )
    assert loaded_after(statement) == []


def test_snapshot_needs_torch_but_not_ray() -> None:
    # importing torch itself loads torch.distributed (torch 2.13); Ray must stay out
    assert not {"ray", "ray.train"} & set(loaded_after("import ray_ckpt.core.snapshot"))


def test_store_actor_and_node_crasher_skip_torch_and_ray_train() -> None:
    loaded = loaded_after("import ray_ckpt.actors.store_actor, ray_ckpt.actors.node_crasher")
    assert "ray" in loaded
    assert not {"torch", "ray.train"} & set(loaded)


def test_package_names_load_on_first_use() -> None:
    assert loaded_after("import ray_ckpt; ray_ckpt.CheckpointConfig(); ray_ckpt.RayCkptError") == []
    assert "ray" in loaded_after("from ray_ckpt import start")
    assert "ray.train" in loaded_after("import ray_ckpt; ray_ckpt.train.Checkpointer")


def test_every_public_name_resolves() -> None:
    import ray_ckpt

    for name in ray_ckpt.__all__:
        assert getattr(ray_ckpt, name) is not None
    assert ray_ckpt.service.start is ray_ckpt.start
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = ray_ckpt.nope  # type: ignore[attr-defined]
