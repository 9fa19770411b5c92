"""Deployment files validate against their schemas and keep the agent least-privileged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from vigil_gpu_monitor.vigil.ops.localstack import debian_binary

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.30.0"


def _k8s_docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def test_kubernetes_manifests_validate_against_the_api_schemas() -> None:
    docs = _k8s_docs()
    assert {d["kind"] for d in docs} >= {"Namespace", "ConfigMap", "DaemonSet", "Deployment",
                                         "ClusterRole", "Secret"}
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_agent_runs_least_privileged_and_takes_no_gpu() -> None:
    agent = next(d for d in _k8s_docs() if d["kind"] == "DaemonSet")
    pod = agent["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "privileged" not in container["securityContext"]
    assert "hostNetwork" not in pod and "hostPID" not in pod
    assert not any("nvidia.com/gpu" in r for r in container["resources"].values())
    assert all(m["readOnly"] for m in container["volumeMounts"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    config = yaml.safe_load(json.dumps(next(
        d for d in _k8s_docs() if d["kind"] == "ConfigMap")["data"]))["vigil.toml"]
    assert 'proc_root = "/host/proc"' in config  # the agent reads where the mounts are


def test_remediation_may_only_get_and_patch_nodes() -> None:
    role = next(d for d in _k8s_docs() if d["kind"] == "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                              "verbs": ["get", "patch"]}]


def test_the_sharded_topology_has_both_stages_sized_by_their_partitions() -> None:
    """docs/sharding.md: stage 1 up to one replica a samples partition, stage 2 up
    to one a summaries partition; both read the shared config."""
    deployments = {d["metadata"]["name"]: d for d in _k8s_docs() if d["kind"] == "Deployment"}
    config = yaml.safe_load(json.dumps(next(
        d for d in _k8s_docs() if d["kind"] == "ConfigMap")["data"]))["vigil.toml"]
    samples = int(config.split("samples_partitions = ")[1].split()[0])
    for stage, partitions in (("1", samples), ("2", 4)):
        d = deployments[f"vigil-stage{stage}"]
        [container] = d["spec"]["template"]["spec"]["containers"]
        assert container["args"][:3] == ["worker", "--stage", stage]
        assert 1 <= d["spec"]["replicas"] <= partitions
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["VIGIL_KAFKA_SUMMARIES_PARTITIONS"] == "4"
    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    assert compose["services"]["stage1"]["command"] == ["worker", "--stage", "1"]
    assert compose["services"]["stage2"]["profiles"] == ["sharded"]


def test_compose_file_validates_against_the_compose_spec() -> None:
    schema_file = resources.files("check_jsonschema") / "builtin_schemas" / "vendor" / \
        "compose-spec.json"
    schema = json.loads(schema_file.read_text())
    compose = yaml.safe_load((DEPLOY / "compose" / "docker-compose.yml").read_text())
    jsonschema.validate(compose, schema)
    assert {"kafka", "redis", "worker", "alerter", "simulator"} <= set(compose["services"])


def test_systemd_unit_verifies_and_is_hardened(tmp_path: Path) -> None:
    unit = (DEPLOY / "systemd" / "vigil-agent.service").read_text()
    for directive in ("User=vigil", "NoNewPrivileges=yes", "DevicePolicy=closed",
                      "CapabilityBoundingSet=\n", "ProtectSystem=strict", "ProtectHome=yes"):
        assert directive in unit, directive
    analyze = shutil.which("systemd-analyze") or debian_binary("systemd-analyze", "systemd")
    # verify needs the ExecStart binary to exist: point it at this interpreter. It exits 0
    # even on unknown keys and only warns, so any line about the unit is a failure.
    def verify(text: str) -> str:
        copy = tmp_path / "vigil-agent.service"
        copy.write_text(text.replace("/opt/vigil/bin/vigil agent", f"{sys.executable} -m vigil"))
        result = subprocess.run([analyze, "verify", str(copy)], capture_output=True,
                                text=True, timeout=60)
        return "\n".join(line for line in (result.stdout + result.stderr).splitlines()
                         if "vigil-agent.service" in line)

    assert verify(unit) == ""
    assert "Unknown key" in verify(unit.replace("NoNewPrivileges=yes", "NoNewPrivilegez=yes"))


@pytest.mark.parametrize("role", ["worker", "alerter"])
def test_worker_and_alerter_units_verify_and_are_hardened(role: str, tmp_path: Path) -> None:
    name = f"vigil-{role}.service"
    unit = (DEPLOY / "systemd" / name).read_text()
    for directive in ("User=vigil", "NoNewPrivileges=yes", "PrivateDevices=yes",
                      "CapabilityBoundingSet=\n", "ProtectSystem=strict", "Restart=always",
                      f"ExecStart=/opt/vigil/bin/vigil {role} --config /etc/vigil/vigil.toml"):
        assert directive in unit, directive
    analyze = shutil.which("systemd-analyze") or debian_binary("systemd-analyze", "systemd")
    copy = tmp_path / name
    copy.write_text(unit.replace(f"/opt/vigil/bin/vigil {role}", f"{sys.executable} -m vigil"))
    result = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True,
                            timeout=60)
    assert [x for x in (result.stdout + result.stderr).splitlines() if name in x] == []


def test_the_containerfile_builds_the_image_the_manifests_name() -> None:
    """No container engine runs here: what can be held without one is that the image
    the manifests run is the one the Containerfile's instructions tag, that it installs
    this distribution with every role, and copies every package the wheel needs."""
    text = (DEPLOY / "Containerfile").read_text()
    images = {c["image"] for d in _k8s_docs() if d["kind"] in ("DaemonSet", "Deployment")
              for c in d["spec"]["template"]["spec"]["containers"]}
    assert len(images) == 1 and f"-t {images.pop()} ." in text
    assert 'ARG EXTRAS=all' in text and "vigil-gpu-monitor[${EXTRAS}]" in text
    root = DEPLOY.parent
    packages = {p.parent.name for p in root.glob("*/__init__.py")} - {"tests"}
    assert {f"COPY {p} {p}" for p in packages} <= set(text.splitlines())
    assert 'ENTRYPOINT ["vigil"]' in text and "USER 10001" in text


def test_the_alertmanager_example_checks_and_routes_by_severity() -> None:
    import re

    from vigil_gpu_monitor.alerting.channels import labels
    from vigil_gpu_monitor.contracts.codec import DETECTION_KINDS

    config = DEPLOY / "alertmanager" / "alertmanager.yml"
    names = {labels({"kind": k, "severity": "info", "job": "j", "id": "i", "node": None,
                     "gpu": None})["alertname"] for k in DETECTION_KINDS}  # type: ignore[typeddict-item]
    named = set(re.findall(r"Vigil[A-Z]\w*", config.read_text()))
    assert named and named <= names, named - names  # no alert name Vigil never sends
    amtool = shutil.which("amtool") or debian_binary("amtool", "prometheus-alertmanager")
    check = subprocess.run([amtool, "check-config", str(config)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0 and "4 inhibit rules" in check.stdout, check.stdout + check.stderr

    def receiver(*label_pairs: str) -> str:
        return subprocess.run([amtool, "config", "routes", "test", f"--config.file={config}",
                               *label_pairs], capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip()

    assert receiver("alertname=VigilHang", "severity=critical", "job=j") == "gpu-oncall-pager"
    assert receiver("alertname=VigilLoadImbalance", "severity=info", "job=j") == "job-owners"
    assert receiver("alertname=VigilStraggler", "severity=warning", "job=j") == \
        "gpu-oncall-slack"
