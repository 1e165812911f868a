"""Lightning under Ray Train (RayDDPStrategy) with PeerMemoryCheckpointIO and SaveToPeers
(scripts/lightning_example.py), the node of rank 1 hard-killed in the second epoch (10 steps an
epoch, a checkpoint every 5): the run resumes from peer memory and ends with final parameters,
optimizer state and scheduler state equal, bit for bit, to an uninterrupted run's."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest
import ray.cloudpickle

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
pytest.importorskip("lightning")

SCRIPT = pathlib.Path(__file__).parents[2] / "scripts" / "lightning_example.py"


def test_a_lightning_run_that_loses_a_node_resumes_from_peers_bit_exact(ray_tmpdir: str) -> None:
    spec = importlib.util.spec_from_file_location("lightning_example", SCRIPT)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules["lightning_example"] = example
    spec.loader.exec_module(example)
    ray.cloudpickle.register_pickle_by_value(example)  # workers cannot import scripts/
    report = example.run_example(steps=24, kill_at=17)
    assert len(report["killed"]) == 1, report["killed"]
    assert report["error"] is None, report["error"]
    assert report["resumed"]["step"] == 24
    assert report["equal"], "the resumed run's final state differs from the uninterrupted run's"
