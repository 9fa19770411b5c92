"""The counters file Vigil ships for dcgm-exporter (deploy/dcgm-exporter) lists exactly
the fields the agent reads, and its ConfigMap carries the same file."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from vigil_gpu_monitor.producers.dcgm import DCGM_FIELDS, READ_FIELDS

DEPLOY = Path(__file__).parents[2] / "deploy" / "dcgm-exporter"
CSV = DEPLOY / "vigil-counters.csv"


def _listed(text: str) -> list[str]:
    """The fields of a dcgm-exporter counters CSV (lines not starting with '#')."""
    return [line.split(",")[0].strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_every_field_in_the_file_is_one_the_agent_reads() -> None:
    listed = [f for f in _listed(CSV.read_text()) if f != "DCGM_FI_DRIVER_VERSION"]  # a label
    assert len(listed) == len(set(listed)), "a field listed twice"
    assert set(listed) <= READ_FIELDS, set(listed) - READ_FIELDS


def test_every_field_the_agent_reads_is_in_the_file_or_explained() -> None:
    text = CSV.read_text()
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    missing = READ_FIELDS - set(_listed(text))
    unexplained = {f for f in missing if not re.search(rf"\b{f}\b", comments)}
    assert not unexplained, unexplained
    assert missing == {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}  # the old name, explained
    assert set(DCGM_FIELDS) <= READ_FIELDS


def test_the_lines_are_in_dcgm_exporters_csv_format() -> None:
    for line in CSV.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, kind, help_text = (part.strip() for part in line.split(",", 2))
            assert re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", name), line
            assert kind in {"gauge", "counter", "label"} and help_text, line


def test_the_configmap_carries_the_same_file_and_the_values_mount_it() -> None:
    configmap = yaml.safe_load((DEPLOY / "configmap.yaml").read_text())
    assert configmap["data"]["vigil-counters.csv"] == CSV.read_text()
    values = yaml.safe_load((DEPLOY / "gpu-operator-values.yaml").read_text())
    assert values["dcgmExporter"]["config"]["name"] == configmap["metadata"]["name"]
    env = {e["name"]: e["value"] for e in values["dcgmExporter"]["env"]}
    assert env["DCGM_EXPORTER_COLLECTORS"].endswith("/vigil-counters.csv")
