"""The shipped Grafana dashboard: valid JSON in Grafana's dashboard shape, a Prometheus data source
variable like Ray's own dashboards, and queries that only name metrics ray_ckpt defines."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest

import ray_ckpt
from ray_ckpt.transport import metrics

DASHBOARD = pathlib.Path(ray_ckpt.__file__).parent / "grafana" / "ray_ckpt_dashboard.json"
_METRIC = re.compile(r"\bray_ckpt_[a-z0-9_]+")


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def exported_names() -> dict[str, str]:
    """Every name Prometheus sees (Ray's ``ray_`` prefix; histogram suffixes) -> our metric."""
    names = {}
    for d in metrics.DEFINITIONS:
        base = f"ray_{d.name}"
        if d.kind == "histogram":
            names.update({f"{base}{suffix}": d.name for suffix in ("_bucket", "_sum", "_count")})
        else:
            names[base] = d.name  # counters are defined with their _total suffix
    return names


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    flat = []
    for panel in dashboard["panels"]:
        flat.append(panel)
        flat.extend(panel.get("panels", []))  # panels inside collapsed rows
    return [p for p in flat if p.get("type") != "row"]


def test_dashboard_structure(dashboard: dict[str, Any]) -> None:
    assert dashboard["title"] == "ray_ckpt"
    assert dashboard["uid"] == "rayCkptDashboard" and len(dashboard["uid"]) <= 40
    assert isinstance(dashboard["schemaVersion"], int)
    panels = _panels(dashboard)
    assert len(panels) >= 8
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["title"] and panel["type"] in ("timeseries", "stat")
        assert panel["datasource"] == "${datasource}"
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"] and target["refId"]
            assert target.get("datasource", "${datasource}") == "${datasource}"
    titles = " | ".join(p["title"].lower() for p in panels)
    for wanted in (
        "time to resume",
        "recovery phases",
        "save stall",
        "memory per node",
        "protection",
        "committed step",
        "backups",
        "kills",
    ):
        assert wanted in titles, wanted


def test_datasource_variable_like_rays_dashboards(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables["datasource"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    for variable in variables.values():
        if variable["type"] == "query":
            assert variable["datasource"] == "${datasource}"
            assert set(_METRIC.findall(variable["query"]["query"])) <= set(exported_names())
    # every variable a query uses is defined (Grafana's built-ins aside)
    used = {name for p in _panels(dashboard) for t in p["targets"] for name in re.findall(r"\$(\w+)", t["expr"])}
    assert used - {"__range", "__rate_interval", "__interval"} <= set(variables)


def test_every_query_names_a_defined_metric(dashboard: dict[str, Any]) -> None:
    exported = exported_names()
    used = set()
    for panel in _panels(dashboard):
        for target in panel["targets"]:
            found = _METRIC.findall(target["expr"])
            assert found, f"{panel['title']}: no ray_ckpt metric in {target['expr']}"
            unknown = set(found) - set(exported)
            assert not unknown, f"{panel['title']}: {sorted(unknown)} are not defined in ray_ckpt/transport/metrics.py"
            for name in found:
                # histograms are queried through their series, never by the bare name
                assert (
                    name != f"ray_{exported[name]}"
                    or next(d.kind for d in metrics.DEFINITIONS if d.name == exported[name]) != "histogram"
                ), name
            used |= {exported[name] for name in found}
    # the dashboard covers the headline metrics
    for name in (
        "ckpt_save_blocking_seconds",
        "ckpt_last_recovery_phase_seconds",
        "ckpt_time_to_resume_seconds",
        "ckpt_store_used_bytes",
        "ckpt_store_budget_bytes",
        "ckpt_protection",
        "ckpt_committed_step",
        "ckpt_backups_total",
        "ckpt_kills_total",
    ):
        assert name in used, name


def test_shipped_with_the_package() -> None:
    pyproject = (pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"ray_ckpt.grafana" = ["*.json"]' in pyproject  # tests/unit/test_packaging.py builds the wheel
    assert '"ray_ckpt.dashboard.static" = ["*.html", "*.js", "*.css"]' in pyproject
