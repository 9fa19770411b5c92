"""Per-node keys and proofs (contracts.identity): a node's key proves only its own
samples, and nothing but the exact bytes it signed."""

from __future__ import annotations

from pathlib import Path

import pytest

from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.contracts.errors import ConfigError, ContractError
from vigil_gpu_monitor.contracts.identity import (
    KEY_ID_HEADER,
    SIG_HEADER,
    Signer,
    Verifier,
    main,
    node_key,
    parse_keys,
    verifier_from,
)

MASTER = bytes(range(32))
VALUE = b'{"schema":"vigil.sample/1","node":"gpu-01"}'


def signer(node: str, master: bytes = MASTER, kid: str = "k1") -> Signer:
    return Signer(kid, node_key(master, node))


def test_a_nodes_own_proof_passes_in_either_header_form() -> None:
    headers = signer("gpu-01").headers(VALUE)
    Verifier({"k1": MASTER}).check("gpu-01", VALUE, headers)
    Verifier({"k1": MASTER}).check("gpu-01", VALUE, dict(headers))


@pytest.mark.parametrize(("headers", "reason"), [
    (None, "unsigned"),
    ([], "unsigned"),
    ([(KEY_ID_HEADER, b"k1")], "unsigned"),
    ([(KEY_ID_HEADER, b"k9"), (SIG_HEADER, b"00")], "unknown_key"),
    ([(KEY_ID_HEADER, b"k1"), (SIG_HEADER, b"not hex at all")], "bad_signature"),
])
def test_a_missing_or_unverifiable_proof_is_refused(headers: object, reason: str) -> None:
    with pytest.raises(ContractError) as err:
        Verifier({"k1": MASTER}).check("gpu-01", VALUE, headers)  # type: ignore[arg-type]
    assert err.value.reason == reason


def test_a_node_cannot_speak_for_another() -> None:
    forged = signer("gpu-01").headers(VALUE)  # gpu-01's key, a sample naming gpu-02
    with pytest.raises(ContractError) as err:
        Verifier({"k1": MASTER}).check("gpu-02", VALUE, forged)
    assert err.value.reason == "bad_signature"


def test_altered_bytes_or_another_fleets_key_are_refused() -> None:
    headers = signer("gpu-01").headers(VALUE)
    with pytest.raises(ContractError, match="bad_signature|altered"):
        Verifier({"k1": MASTER}).check("gpu-01", VALUE.replace(b"01", b"02"), headers)
    with pytest.raises(ContractError):
        Verifier({"k1": bytes(32)}).check("gpu-01", VALUE, headers)


def test_node_keys_differ_per_node_and_rotation_keeps_old_keys_valid() -> None:
    assert node_key(MASTER, "gpu-01") != node_key(MASTER, "gpu-02")
    new = bytes(range(1, 33))
    both = Verifier({"k2": new, "k1": MASTER})
    both.check("gpu-01", VALUE, signer("gpu-01").headers(VALUE))
    both.check("gpu-01", VALUE, signer("gpu-01", new, "k2").headers(VALUE))


def test_settings_are_checked_at_load() -> None:
    good = {"VIGIL_IDENTITY_VERIFY": "true", "VIGIL_IDENTITY_MASTER_KEYS": f"k1={MASTER.hex()}"}
    assert load(env=good).identity.verify
    assert "k1=" not in repr(load(env=good).identity)  # a secret, masked
    with pytest.raises(ConfigError, match="no key to verify"):  # refused as the worker starts
        verifier_from(load(env={"VIGIL_IDENTITY_VERIFY": "true"}).identity.verify, "")
    with pytest.raises(ConfigError, match="at least 16 bytes"):
        load(env={"VIGIL_IDENTITY_MASTER_KEYS": "k1=abcd"})
    with pytest.raises(ConfigError, match="exactly one"):
        load(env={"VIGIL_IDENTITY_NODE_KEY": f"a={MASTER.hex()},b={MASTER.hex()}"})
    assert parse_keys(f" k1={MASTER.hex()} , ", "x") == {"k1": MASTER}


def test_issue_prints_the_key_the_worker_derives(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VIGIL_IDENTITY_MASTER_KEYS", f"k1={MASTER.hex()}")
    assert main(["issue", "gpu-01"]) == 0
    kid, _, key = capsys.readouterr().out.strip().partition("=")
    assert kid == "k1" and bytes.fromhex(key) == node_key(MASTER, "gpu-01")
    assert main(["issue", "gpu-[01-04]"]) == 2  # a key for one host name only
    assert main(["new-master", "k7"]) == 0 and capsys.readouterr().out.startswith("k7=")


def test_the_agent_reads_its_key_from_a_file(tmp_path: Path) -> None:
    from vigil_gpu_monitor.vigil.agentcmd import node_signer

    path = tmp_path / "node.key"
    path.write_text(f"k1={node_key(MASTER, 'gpu-01').hex()}\n")
    signer_ = node_signer(load(env={"VIGIL_IDENTITY_NODE_KEY_FILE": str(path)}))
    assert signer_ is not None
    Verifier({"k1": MASTER}).check("gpu-01", VALUE, signer_.headers(VALUE))
    assert node_signer(load(env={})) is None
    with pytest.raises(ConfigError, match="not a file"):
        load(env={"VIGIL_IDENTITY_NODE_KEY_FILE": str(tmp_path / "missing")})
