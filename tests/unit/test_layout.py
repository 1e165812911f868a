"""The package's wings and their import rules (docs/design.md, "Layout"), checked over the
folders themselves, so a new module is covered the day it lands; each module has one path
(the flat layout's are gone, the actors import only as ``ray_ckpt.actors``); the CLI's
``python -m`` path and the warm-up hook's dotted name work."""

from __future__ import annotations

import ast
import importlib
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ray_ckpt"

# every module's floor; a module may import its own floor and those below it, never one above
FOUNDATION = {
    "ray_ckpt",
    "ray_ckpt.errors",
    "ray_ckpt.settings",
    "ray_ckpt.config",
    "ray_ckpt._lazy",
    "ray_ckpt._optional",
}
STACK = {
    "checkpointer",
    "save",
    "restore",
    "reader",
    "own_copies",
    "prefetch",
    "process_copies",
    "reshard",
    "ranges",
    "backup",
    "service",
}
FLOORS = ["foundation", "core", "transport", "actors", "stack", "train", "tools"]


def floor_of(module: str) -> str:
    """The floor of a module of ``ray_ckpt`` (dotted name; ``ray_ckpt.actors`` is actors/)."""
    parts = module.split(".")
    if module in FOUNDATION:
        return "foundation"
    if len(parts) > 1 and parts[1] == "actors":
        return "actors"
    if len(parts) > 1 and parts[1] in ("core", "transport", "train", "tools"):
        return parts[1]
    if len(parts) > 1 and parts[1] == "integrations":
        return "train"  # frameworks' checkpoint seams: the train floor's rule, beside it
    if module == "ray_ckpt._ray_compat":
        return "transport"  # Ray's internal names, fenced; used from transport upwards
    if len(parts) > 1 and parts[1] in STACK:
        return "stack"
    if len(parts) > 1 and parts[1] in ("dashboard", "testing"):
        return "tools"
    raise AssertionError(f"{module} is in no floor: place it in a wing (docs/design.md, 'Where it goes')")


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "actors").rglob("*.py")]:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[0] == "actors":  # installed as ray_ckpt.actors
            parts.insert(0, "ray_ckpt")
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(path: pathlib.Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports anywhere (functions included), but for type
    checking only (``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    skip = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for stmt in block.body
        for node in ast.walk(stmt)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in known else node.module)
    return {n for n in names if n in known}


def test_every_module_sits_in_a_wing_and_imports_nothing_above_its_floor() -> None:
    known = modules()
    upward = []
    for module, path in sorted(known.items()):
        floor = FLOORS.index(floor_of(module))
        for target in sorted(imported(path, set(known))):
            if FLOORS.index(floor_of(target)) > floor:
                upward.append(f"{module} ({floor_of(module)}) imports {target} ({floor_of(target)})")
    assert upward == []


def test_importing_any_core_module_loads_no_ray() -> None:
    core = sorted(m for m in modules() if m.startswith("ray_ckpt.core."))
    assert len(core) >= 20
    probe = (
        "import importlib, json, sys\n"
        f"for name in {core!r}:\n"
        "    importlib.import_module(name)\n"
        "    assert 'ray' not in sys.modules, name\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('ray_ckpt.'))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert set(core) <= loaded


@pytest.mark.parametrize("old", ["ray_ckpt.chaos", "ray_ckpt.timeline", "ray_ckpt.stores", "ray_ckpt.cli"])
def test_a_flat_layout_path_no_longer_imports(old: str) -> None:
    """Each module has one path (its wing's); the flat layout's are gone."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


def test_the_command_line_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ray_ckpt.tools.cli", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kill-node" in done.stdout


@pytest.mark.parametrize("where", ["repository", "elsewhere"])
def test_the_actors_import_only_as_ray_ckpt_actors(where: str, tmp_path: pathlib.Path) -> None:
    """actors/ is installed as ray_ckpt.actors: ``import actors`` fails from the repository's
    root (where the folder is on the path) and from any other folder, so a user's own
    ``actors`` is never shadowed; ``ray_ckpt.actors`` imports, its modules too."""
    cwd = ROOT if where == "repository" else tmp_path
    script = "import importlib.util, ray_ckpt.actors.store_actor, ray_ckpt.actors.registry_actor\n"
    script += "try:\n    import actors\nexcept ImportError as error:\n    print('refused', error)\n"
    script += "else:\n    print('imported', actors.__file__)\n"
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused"), done.stdout


def test_the_warm_up_hook_and_the_entry_point_name_real_functions() -> None:
    from ray_ckpt.train import inplace

    module, _, name = inplace.WARM_HOOK.rpartition(".")
    assert module == "ray_ckpt.train.inplace" and callable(getattr(importlib.import_module(module), name))
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("[")[0]
    target = scripts.split('"')[1]
    module, _, name = target.partition(":")
    assert callable(getattr(importlib.import_module(module), name))
