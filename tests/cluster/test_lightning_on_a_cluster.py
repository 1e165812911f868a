"""scripts/lightning_example.py on a simulated cluster: 2 Ray Train workers, the node of rank 1
hard-killed mid-run; Ray Train restarts the workers, the run resumes from peer memory and
finishes with the final parameters, optimizer state and scheduler state of an uninterrupted
run, bit for bit."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType
from typing import Any

import pytest
import ray

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def example() -> ModuleType:
    """scripts/lightning_example.py as a module, pickled by value (workers cannot import scripts/)."""
    path = pathlib.Path(__file__).parents[2] / "scripts" / "lightning_example.py"
    spec = importlib.util.spec_from_file_location("lightning_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lightning_example"] = module
    spec.loader.exec_module(module)
    ray.cloudpickle.register_pickle_by_value(module)
    return module


@pytest.mark.timeout(600)
def test_a_node_killed_mid_run_the_run_finishes_bit_exact(ray_tmpdir: str, example: Any) -> None:
    report = example.run_example(nodes=4, steps=30, kill_at=12)
    assert len(report["killed"]) == 1, report["killed"]
    assert report["error"] is None, report["error"]
    assert report["resumed"]["step"] == 30
    assert report["equal"], "the resumed run's final state differs from the uninterrupted run's"
