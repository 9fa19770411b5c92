"""Monitoring Vigil itself: the Prometheus config and alert rules pass promtool (and
the rules' own unit tests), and every metric the rules and the Grafana dashboard use
is one Vigil's processes really export."""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from prometheus_client import generate_latest

from vigil_gpu_monitor.alerting.cost import CostLedger
from vigil_gpu_monitor.alerting.metrics import alerter_registry
from vigil_gpu_monitor.producers.metrics import agent_registry
from vigil_gpu_monitor.streams.metrics import WorkerMetrics
from vigil_gpu_monitor.vigil.ops.localstack import debian_binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROM = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "vigil-dashboard.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",), "summary": ("", "_sum", "_count")}


def _promtool(*args: str, cwd: Path = PROM) -> str:
    done = subprocess.run([debian_binary("promtool", "prometheus"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _exported() -> set[str]:
    """Series names the worker, agent and alerter expose."""
    agent = SimpleNamespace(ticks=1, sampler=None, errors=Counter({"nvml": 1}),
                            job_of=SimpleNamespace(errors=Counter({"podresources": 1})),
                            dropped=Counter({("power", "out_of_range"): 1}),
                            sources={"dcgm": SimpleNamespace(
                                skipped=Counter({("DCGM_FI_DEV_POWER_USAGE", "blank"): 1}))})
    publisher = SimpleNamespace(published=1, dropped=0, buffered=0, errors={}, latencies=[0.1])
    alerter = SimpleNamespace(applied=1, duplicates=0, invalid=0, statuses=0,
                              outage=SimpleNamespace(errors=0, backlog=[]),
                              outcomes={("slack", "delivered"): 1}, workers={},
                              router=SimpleNamespace(open={}), ledger=CostLedger(),
                              job_gpus={}, goodput=SimpleNamespace(
                                  rows=lambda since, until: [
                                      ("j", {"kind": "hang", "source": "counters"}, 1.0)]))
    names = set()
    for registry in (WorkerMetrics().registry, agent_registry(agent, publisher),  # type: ignore[arg-type]
                     alerter_registry(alerter)):  # type: ignore[arg-type]
        for line in generate_latest(registry).decode().splitlines():
            if line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                base = name.removesuffix("_total") if kind == "counter" else name
                names.update(base + s for s in SUFFIXES[kind])
    return names


def _rule_exprs() -> list[str]:
    rules = yaml.safe_load((PROM / "vigil-rules.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_prometheus_config_and_rules_pass_promtool() -> None:
    out = _promtool("check", "config", "prometheus.yml")
    assert "SUCCESS" in out and "rule files found" in out
    _promtool("check", "rules", "vigil-rules.yml")


def test_alert_rules_unit_tests_pass() -> None:
    assert "SUCCESS" in _promtool("test", "rules", "vigil-rules.test.yml")


def test_rules_and_dashboard_only_use_metrics_vigil_exports() -> None:
    exported = _exported()
    assert "vigil_worker_lag_messages" in exported and "vigil_alerter_deliveries_total" in exported
    used = {m for e in _rule_exprs() + _dashboard_exprs()
            for m in re.findall(r"\bvigil_[a-z0-9_]+", e)}
    assert used and used <= exported, sorted(used - exported)


def test_dashboard_is_valid_grafana_json_with_valid_promql(tmp_path: Path) -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) and dash["uid"] and dash["schemaVersion"] >= 36
    assert {"datasource"} <= {v["name"] for v in dash["templating"]["list"]}
    for panel in dash["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
    # promtool parses each query (Grafana's interval variables replaced by a duration).
    exprs = [e.replace("$__rate_interval", "5m") for e in _dashboard_exprs()]
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"vigil:dashboard_query:{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    assert f"{len(exprs)} rules found" in _promtool("check", "rules", str(path), cwd=tmp_path)


def test_kubernetes_scrape_job_maps_pods_to_the_jobs_the_rules_use() -> None:
    jobs: list[dict[str, Any]] = yaml.safe_load((PROM / "kubernetes-scrape.yml").read_text())
    (job,) = jobs
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"__address__", "job"} <= targets
    used = set(re.findall(r'job="([a-z-]+)"', " ".join(_rule_exprs() + _dashboard_exprs())))
    manifests = (DEPLOY / "kubernetes" / "vigil.yaml").read_text()
    assert used and all(f"app.kubernetes.io/name: {j}" in manifests for j in used)
