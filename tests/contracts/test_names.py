"""Names are names (issue #49): a node is one RFC 1123 host name, a job id has a
stated character set, and a sample that breaks either is refused as ``bad_name``
by the contract, by the worker's fast decoder and by the JSON Schema alike."""

from __future__ import annotations

import json
import lzma
import re
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vigil_gpu_monitor.contracts import SAMPLE_SCHEMA
from vigil_gpu_monitor.contracts.codec import decode_sample, encode_sample
from vigil_gpu_monitor.contracts.errors import ContractError
from vigil_gpu_monitor.contracts.names import (
    JOB_SCHEMA_PATTERN,
    NODE_SCHEMA_PATTERN,
    is_node_name,
    job_problem,
    node_problem,
)
from vigil_gpu_monitor.contracts.schema_gen import sample_schema
from vigil_gpu_monitor.streams.decode import decode_sample_fast

FOREIGN = Path(__file__).resolve().parents[2] / ".." / "shared" / "foreign"

BAD_NODES = ["gpu-[01-04]", "gpu-01,gpu-02", "ALL", "all", "Default", "-h", "--help",
             "gpu 01", "gpu-01\n", "\tgpu", "../gpu-01", "gpu-01/status", "a/b", "gpu-01.",
             ".gpu", "a..b", "gpu-", "-gpu", "gpu_01", "gpu*", "gpu?", "gpü-01", "%2e%2e",
             "gpu-01;reboot", "'gpu'", "", "a" * 64, ".".join(["a" * 60] * 5)]
GOOD_NODES = ["gpu-01", "n0", "big-n10", "node-07.cluster.example.com", "GPU-01", "1",
              "a" * 63, ".".join(["a" * 62] * 4)]
BAD_JOBS = ["job 1", "-rf", "{job}", "j*", "job,2", "j[1-2]", "/abs", ".hidden", "a\nb",
            "é", "a" * 257]
GOOD_JOBS = ["", "1234", "1234_7", "1234+0", "team/train-70b", "big", "train-1",
             "ns/name.v2", "a:b@c", "a" * 256]


def sample(node: str = "gpu-01", job: str = "train-1") -> dict[str, object]:
    return {"schema": SAMPLE_SCHEMA, "ts": 1.0, "job": job, "node": node,
            "gpus": {"0": {"sm_active": 0.5}}, "host": {}, "nics": {}}


@pytest.mark.parametrize("node", BAD_NODES)
def test_a_node_that_is_not_one_host_name_is_refused_everywhere(node: str) -> None:
    assert node_problem(node) is not None and not is_node_name(node)
    raw = json.dumps(sample(node=node)).encode()
    for decode in (decode_sample, decode_sample_fast):
        with pytest.raises(ContractError) as err:
            decode(raw)
        assert err.value.reason == "bad_name", (decode, node, err.value)
    with pytest.raises(ContractError):
        encode_sample(sample(node=node))  # type: ignore[arg-type]


@pytest.mark.parametrize("node", GOOD_NODES)
def test_host_names_pass(node: str) -> None:
    assert node_problem(node) is None
    assert decode_sample_fast(json.dumps(sample(node=node)).encode())["node"] == node


@pytest.mark.parametrize("job", BAD_JOBS)
def test_a_job_id_outside_its_character_set_is_refused(job: str) -> None:
    assert job_problem(job) is not None
    raw = json.dumps(sample(job=job)).encode()
    for decode in (decode_sample, decode_sample_fast):
        with pytest.raises(ContractError) as err:
            decode(raw)
        assert err.value.reason == "bad_name"


@pytest.mark.parametrize("job", GOOD_JOBS)
def test_slurm_kubernetes_and_trace_job_ids_pass(job: str) -> None:
    assert job_problem(job) is None
    assert decode_sample_fast(json.dumps(sample(job=job)).encode())["job"] == job


def test_the_reason_says_what_is_wrong() -> None:
    assert "'[]'" in (node_problem("gpu-[01-04]") or "")
    assert "every node" in (node_problem("ALL") or "")


@given(st.text(max_size=300))
def test_the_codec_the_fast_decoder_and_the_schema_agree_on_any_node(node: str) -> None:
    raw = json.dumps(sample(node=node)).encode()
    accepted = []
    for decode in (decode_sample, decode_sample_fast):
        try:
            decode(raw)
            accepted.append(True)
        except ContractError as exc:
            assert exc.reason == "bad_name"
            accepted.append(False)
    assert accepted == [is_node_name(node)] * 2
    if "\n" not in node:  # Python's ``$`` (jsonschema's) also matches before a final \n
        schema = jsonschema.Draft202012Validator(sample_schema())
        assert schema.is_valid(sample(node=node)) == is_node_name(node)
    if is_node_name(node):  # one host name: nothing Slurm or a URL could expand
        assert re.fullmatch(r"[A-Za-z0-9.-]+", node) and not node.startswith(("-", "."))


@given(st.text(max_size=300))
def test_schema_pattern_matches_the_job_check(job: str) -> None:
    assert (re.search(JOB_SCHEMA_PATTERN, job) is not None and "\n" not in job) \
        == (job_problem(job) is None)
    assert re.search(NODE_SCHEMA_PATTERN, "gpu-01")


@pytest.mark.parametrize("trace", ["base-5.jsonl.xz", "hard-15.jsonl.xz"])
def test_the_foreign_traces_names_all_pass(trace: str) -> None:
    path = FOREIGN / trace
    if not path.exists():
        pytest.skip(f"{path} not here")
    names: set[tuple[str, str]] = set()
    with lzma.open(path, "rt") as fh:
        for line in fh:
            if line.strip():
                message = json.loads(line)
                names.add((message["node"], message["job"]))
    bad = [(n, j) for n, j in names if node_problem(n) or job_problem(j)]
    assert names and not bad
