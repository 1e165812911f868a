"""The cluster tests' fixtures and hooks: a simulated multi-node cluster per module, handed to its
tests in turn (``support.sim_cluster``), and a failed test's report with its cluster's logs."""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from support.ray_logs import ray_log_excerpt
from support.scripts_under_test import load_script
from support.sim_cluster import ClusterPool, SimCluster


@pytest.fixture(scope="module")
def cluster_pool() -> Iterator[ClusterPool]:
    """The module's shared cluster (own RAY_TMPDIR), stopped after its last test."""
    pool = ClusterPool()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_TMPDIR", tempfile.mkdtemp(prefix="rck"))
        try:
            yield pool
        finally:
            pool.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the test (``rep_setup``, ``rep_call``) for its fixtures; a
    failed test's report gets what its cluster's recovery logged (``ray_log_excerpt``)."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    if report.when == "call" and report.failed:
        excerpt = ray_log_excerpt(pathlib.Path(os.environ.get("RAY_TMPDIR", "")))
        if excerpt:
            report.sections.append(("what Ray Train and ray_ckpt logged", excerpt))
    return report


@pytest.fixture
def sim_cluster(cluster_pool: ClusterPool, request: pytest.FixtureRequest) -> Iterator[SimCluster]:
    """A head with no CPUs plus N one-CPU workers (N from @pytest.mark.nodes(N), default 7),
    the ray_ckpt service started on all of them with a 256 MiB budget per store, in a namespace
    of this test's own. The nodes are the module's (see ClusterPool)."""
    marker = request.node.get_closest_marker("nodes")
    cluster = cluster_pool.take(marker.args[0] if marker else 7)
    try:
        yield cluster
    finally:
        failed = any(getattr(getattr(request.node, f"rep_{when}", None), "failed", False) for when in ("setup", "call"))
        cluster_pool.give_back(failed)


@pytest.fixture
def train_example(train_example_module: ModuleType) -> Iterator[ModuleType]:
    """scripts/train_example.py as a module, with its ``ABANDONED`` event clear for this test
    (a test that set it at its end must not stop the next test's fault threads) and set after."""
    train_example_module.ABANDONED.clear()
    yield train_example_module
    train_example_module.ABANDONED.set()


@pytest.fixture(scope="session")
def train_example_module() -> ModuleType:
    """scripts/train_example.py as a module, pickled by value (workers cannot import scripts/)."""
    loaded: ModuleType = load_script("train_example", by_value=True)
    return loaded
