"""The repository's scripts (scripts/) as the tests reach them: loaded as modules, or run as
programs the way a user runs them."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
from types import ModuleType
from typing import Any

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str, *, module_name: str | None = None, by_value: bool = False) -> ModuleType:
    """scripts/``name``.py as a module registered as ``module_name`` (default ``name``). The
    folder goes on ``sys.path`` (last: it shadows nothing), so that the script imports its
    siblings (benchutil and the like) as when it runs. ``by_value``: also registered with Ray's
    pickler by value, for a module whose functions run in Ray workers (they cannot import
    scripts/)."""
    if str(SCRIPTS) not in sys.path:
        sys.path.append(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(module_name or name, SCRIPTS / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {SCRIPTS / name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while a class is created
    spec.loader.exec_module(module)
    if by_value:
        import ray.cloudpickle

        ray.cloudpickle.register_pickle_by_value(module)
    return module


def run_script(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python scripts/<script> args...`` in a new process, its output captured as text and
    its exit status left to the caller; without RAY_ADDRESS, so that a script that starts Ray
    starts a cluster of its own."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, str(SCRIPTS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def run_quick(
    script: str, folder: pathlib.Path, *options: str, timeout: float
) -> tuple[subprocess.CompletedProcess[str], Any]:
    """``script --quick --json folder/out/<script>.json options...`` (``run_script``; the JSON's
    folder is new, the script makes it), asserting that it exited 0 (the tail of its output in
    the message): the process and the JSON it wrote."""
    target = folder / "out" / f"{pathlib.Path(script).stem}.json"
    result = run_script(script, "--quick", "--json", str(target), *options, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-4000:]
    return result, json.loads(target.read_text())
