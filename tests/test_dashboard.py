"""The Grafana dashboard queries only what the gateway really exports.

The names come from the exposition text of a real ``gateway.metrics.Metrics`` registry
(per-org metrics on), every metric touched once so each family has samples: histograms
expose ``_bucket``/``_sum``/``_count``, counters ``_total``. The same helpers work on the
text of a live ``/metrics`` scrape.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families

from gateway.grpcfront import GrpcMetrics
from gateway.metrics import REAP_REASONS, Metrics, status_class

DASHBOARD = Path(__file__).resolve().parents[1] / "helm" / "sandbox-gateway" / "dashboards" / "sandbox-gateway.json"
METRIC_NAME = re.compile(r"\bsgw_[a-z_]+\b")
SELECTOR = re.compile(r"\b(sgw_[a-z_]+)\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
BY_CLAUSE = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
DATASOURCE_VAR = "${datasource}"


def touched_metrics() -> Metrics:
    """A registry with one sample in every family (labelled metrics have no samples until used)."""
    metrics = Metrics(per_org=True)
    grpc = GrpcMetrics(metrics.registry)  # the gRPC front's series, on the same registry as in app.py
    # the front's by name, not vars(): compiled, GrpcMetrics is an extension type (its fields in metrics.pxd)
    for metric in [*vars(metrics).values(), *(getattr(grpc, name) for name in dir(grpc) if not name.startswith("__"))]:
        if not isinstance(metric, MetricWrapperBase) or metric._labelvalues:  # skip bound children
            continue
        child = metric.labels(*["x"] * len(metric._labelnames)) if metric._labelnames else metric
        if hasattr(child, "observe"):
            child.observe(0.01)
        elif hasattr(child, "set"):
            child.set(1)
        else:
            child.inc()
    return metrics


def exported_labels(exposition: str) -> dict[str, set[str]]:
    """Sample name -> label names, from Prometheus text exposition (``_created`` excluded)."""
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # optional per client config; never query it
            names.setdefault(sample.name, set()).update(sample.labels)
    return names



@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    body, _ = touched_metrics().exposition()
    names = exported_labels(body.decode())
    assert "sgw_requests_total" in names and "sgw_request_duration_seconds_bucket" in names
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def all_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows included, with the panels nested in collapsed rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def all_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in all_panels(dashboard) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if var["type"] == "query":
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def family(sample_name: str) -> str:
    return re.sub(r"_(bucket|sum|count)$", "", sample_name)


def test_dashboard_identity(dashboard: dict[str, Any]) -> None:
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard["uid"]), "Grafana uids are at most 40 [A-Za-z0-9_-]"
    assert dashboard["title"]
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert "__inputs" not in dashboard, "the sidecar loads the file as is; use the datasource variable"


def test_uid_is_unique_among_the_repository_dashboards(dashboard: dict[str, Any]) -> None:
    uids = [json.loads(p.read_text(encoding="utf-8"))["uid"] for p in DASHBOARD.parent.glob("*.json")]
    assert uids.count(dashboard["uid"]) == 1


def test_variables(dashboard: dict[str, Any], exported: dict[str, set[str]]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    pool = variables["pool"]
    assert pool["type"] == "query" and pool["datasource"]["uid"] == DATASOURCE_VAR
    assert pool["includeAll"] and pool["multi"] and pool["allValue"] == ".*"
    match = re.fullmatch(r"label_values\((sgw_[a-z_]+),\s*pool\)", pool["query"]["query"])
    assert match and "pool" in exported[match.group(1)]


def test_every_panel_has_a_title_a_datasource_and_a_unique_id(dashboard: dict[str, Any]) -> None:
    ids = []
    for panel in all_panels(dashboard):
        ids.append(panel["id"])
        assert panel.get("title"), f"panel {panel['id']} has no title"
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE_VAR}, panel["title"]
        assert panel["targets"], f"{panel['title']}: no queries"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == DATASOURCE_VAR, panel["title"]
            assert target["expr"].strip(), panel["title"]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    refs = [[t["refId"] for t in p.get("targets", [])] for p in all_panels(dashboard)]
    assert all(len(r) == len(set(r)) for r in refs)


def test_every_queried_metric_is_exported(dashboard: dict[str, Any], exported: dict[str, set[str]]) -> None:
    used = {name for expr in all_exprs(dashboard) for name in METRIC_NAME.findall(expr)}
    assert used, "no sgw_ metric found in the dashboard"
    unknown = sorted(used - set(exported))
    assert not unknown, f"the dashboard queries metrics the gateway does not export: {unknown}"


def test_every_exported_family_is_on_the_dashboard(dashboard: dict[str, Any], exported: dict[str, set[str]]) -> None:
    used = {family(name) for expr in all_exprs(dashboard) for name in METRIC_NAME.findall(expr)}
    missing = sorted({family(name) for name in exported} - used)
    assert not missing, f"metrics without a panel (add one to dashboards/sandbox-gateway.json): {missing}"


def test_label_names_and_values_exist(dashboard: dict[str, Any], exported: dict[str, set[str]]) -> None:
    statuses = {status_class(code) for code in range(100, 600)}
    for expr in all_exprs(dashboard):
        for name, matchers in SELECTOR.findall(expr):
            for label, op, value in MATCHER.findall(matchers):
                assert label in exported[name], f"{name} has no label {label!r}: {expr}"
                if label == "status" and op == "=":
                    assert value in statuses, f"status is a class such as 5xx, not {value!r}: {expr}"
        names = set(METRIC_NAME.findall(expr))
        for clause in BY_CLAUSE.findall(expr):
            for label in filter(None, (part.strip() for part in clause.split(","))):
                for name in names:
                    assert label in exported[name], f"{name} has no label {label!r} (by clause): {expr}"


def test_per_org_row_is_collapsed_and_explains_itself(dashboard: dict[str, Any]) -> None:
    rows = [p for p in dashboard["panels"] if p["type"] == "row"]
    org_rows = [r for r in rows if any("sgw_org_requests_total" in t["expr"]
                                       for p in r.get("panels", []) for t in p["targets"])]
    assert len(org_rows) == 1
    row = org_rows[0]
    assert row["collapsed"] is True
    assert "per_org_metrics" in row["description"]
    top_level = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert not any("sgw_org_requests_total" in e for e in top_level)


def sample_values(exposition: str, name: str) -> dict[str, float]:
    """``reason`` label -> value of one counter's samples."""
    return {s.labels["reason"]: s.value for f in text_string_to_metric_families(exposition)
            for s in f.samples if s.name == name}


def test_reap_and_sweep_panels_show_zero_before_the_first_event() -> None:
    """A labelled counter has no series until used, so "Orphans swept" said "No data" until the
    first sweep; the known reasons are exported at zero from the start."""
    metrics = Metrics()
    body = metrics.exposition()[0].decode()
    assert sample_values(body, "sgw_reaps_total") == dict.fromkeys(REAP_REASONS, 0.0)
    assert sample_values(body, "sgw_orphan_sweeps_total") == {"no_store_record": 0.0}
    for reason in ("orphan", *REAP_REASONS):
        metrics.reaped(reason)
    body = metrics.exposition()[0].decode()
    assert sample_values(body, "sgw_reaps_total") == dict.fromkeys(REAP_REASONS, 1.0), "no new series"
    assert sample_values(body, "sgw_orphan_sweeps_total") == {"no_store_record": 1.0}


def test_the_router_reports_only_known_reap_reasons() -> None:
    """Every reason SessionRouter (and its lifecycle) passes to events.reaped() has its zero series
    (orphan is the sweep's): the constants passed to it, and the reasons of the pure reap verdict
    (routing/reaping.py's Verdict) and of the reaper's lapsed-lease acts (gateway/reaper.py's _Act),
    which the reaper passes on."""
    root = Path(__file__).resolve().parents[1]
    sources = ("gateway/sessions.py", "gateway/lifecycle.py", "gateway/reaper.py", "routing/reaping.py")
    source = "\n".join((root / name).read_text(encoding="utf-8") for name in sources)
    passed_at = {"reaped": 0, "Verdict": 1, "_Act": 3}  # the reason's position in each call
    reasons = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            at = passed_at.get(name)
            if at is not None and len(node.args) > at and isinstance(node.args[at], ast.Constant):
                reasons.add(node.args[at].value)
    assert reasons == {*REAP_REASONS, "orphan"}
