"""The cluster tests' fixtures and hooks: one simulated multi-node cluster handed in turn to the
tests of every module that uses ``sim_cluster`` or ``train_cluster`` (``support.sim_cluster``),
and a failed test's report with its cluster's logs."""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from support.ray_logs import ray_log_excerpt
from support.scripts_under_test import load_script
from support.sim_cluster import ClusterPool, SimCluster

import ray_ckpt

_POOL = ClusterPool()


def _uses_pool(item: pytest.Item | None) -> bool:
    return item is not None and "cluster_pool" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="session")
def cluster_pool() -> Iterator[ClusterPool]:
    """The cluster shared by every module that uses ``sim_cluster`` or ``train_cluster`` (its
    own RAY_TMPDIR): those modules run back to back (``pytest_collection_modifyitems``), and
    the cluster stops after the last of their tests (``pytest_runtest_teardown``), or at the end."""
    try:
        yield _POOL
    finally:
        _POOL.close()


def _pool_order(item: pytest.Item) -> tuple[bool, int]:
    """Where a test that uses the pool runs among them: those whose nodes must start with
    RAY_CKPT_* settings of their own (``@pytest.mark.node_env``: the pool restarts for them)
    last, the others by the nodes they ask for, most first, so that the pool mostly stops
    nodes between tests (a hard kill, about a second) rather than starts them (seconds each)."""
    marker = item.get_closest_marker("nodes")
    return item.get_closest_marker("node_env") is not None, -(marker.args[0] if marker else 7)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that share the pool's cluster first (in ``_pool_order``), then the rest in
    their order (a stable sort): a module's test that builds a cluster of its own runs after the
    pool's last test, so it never makes the pool stop and start again."""
    items.sort(key=lambda item: (False, *_pool_order(item)) if _uses_pool(item) else (True, False, 0))


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared cluster after the last test that uses it."""
    if _uses_pool(item) and not _uses_pool(nextitem):
        _POOL.close()


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
    of this test's own. The nodes are shared with the tests before (see ClusterPool)."""
    yield from _pooled(cluster_pool, request, namespace=None)


@pytest.fixture
def train_cluster(cluster_pool: ClusterPool, request: pytest.FixtureRequest) -> Iterator[SimCluster]:
    """``sim_cluster`` with the service in ray_ckpt's default namespace (RAY_CKPT_NAMESPACE),
    where a Ray Train job's Checkpointers and the scripts' helpers look for it (the nodes hand
    their workers no namespace of a test's own); it is shut down when the test ends."""
    yield from _pooled(cluster_pool, request, namespace=ray_ckpt.settings.namespace())


def _pooled(cluster_pool: ClusterPool, request: pytest.FixtureRequest, namespace: str | None) -> Iterator[SimCluster]:
    marker = request.node.get_closest_marker("nodes")
    cluster = cluster_pool.take(marker.args[0] if marker else 7, namespace=namespace)
    try:
        with pytest.MonkeyPatch.context() as patch:  # where a failed test's report finds the logs
            patch.setenv("RAY_TMPDIR", cluster_pool.tmpdir)
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
