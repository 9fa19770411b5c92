"""A sample speaks only for its node (issue #49): per-node keys and batch proofs.

Each node holds its own key, issued at provisioning from the fleet's master key:

    node key = HMAC-SHA256(master key, "vigil-node-key/1" NUL node name)

(an HKDF-style derivation by one PRF call: the worker, holding the master key,
derives any node's key on demand; a node holding its own key cannot compute
another's, which would need the master key). The agent signs the exact bytes it
sends, the sample's JSON value, and carries the proof in two Kafka record headers,
so nothing is re-serialised and the ``vigil.sample/1`` body is unchanged:

- ``vigil-key-id``: which master key the node key comes from (rotation: the worker
  may hold several, ``kid=secret`` pairs);
- ``vigil-sig``: HMAC-SHA256(node key, value bytes), lower-case hex.

The worker decodes the sample, derives the key of the node the sample *names* and
compares in constant time. A sample with no proof, an unknown key id or a proof
that does not match the node it names is refused (``unsigned``, ``unknown_key``,
``bad_signature``): dead-lettered and counted, never detected on.

What a node holding its key can still do: lie about its own readings, and send
again a sample it signed before (the same bytes; the worker's event time and
dedupe make a repeat a late or duplicate sample). See docs/security.md.

Standard library only (``hmac``, ``hashlib``): the node agent imports it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sys
from collections import OrderedDict
from collections.abc import Iterable, Mapping

from vigil_gpu_monitor.contracts.errors import ConfigError, ContractError
from vigil_gpu_monitor.contracts.names import node_problem

KEY_ID_HEADER = "vigil-key-id"
SIG_HEADER = "vigil-sig"
_LABEL = b"vigil-node-key/1\x00"
MAX_CACHED_KEYS = 65536  # derived node keys kept (32 bytes each): a fleet's worth

Headers = Iterable[tuple[str, bytes]] | Mapping[str, bytes] | None


def node_key(master: bytes, node: str) -> bytes:
    """The node's own key, derived from the fleet master key."""
    return hmac.new(master, _LABEL + node.encode(), hashlib.sha256).digest()


def signature(key: bytes, value: bytes) -> str:
    """The proof of one record's value bytes under a node key (hex)."""
    return hmac.new(key, value, hashlib.sha256).hexdigest()


def parse_keys(text: str, what: str) -> dict[str, bytes]:
    """``kid=hexsecret[,kid=hexsecret…]`` → {key id: secret bytes}; ConfigError with
    ``what`` (the setting's name) when malformed. Secrets are at least 16 bytes."""
    keys: dict[str, bytes] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kid, sep, secret = part.partition("=")
        try:
            raw = bytes.fromhex(secret.strip())
        except ValueError:
            raw = b""
        if not sep or not kid.strip() or len(raw) < 16:
            raise ConfigError(f"{what}: each entry is key-id=hex secret of at least 16 "
                              "bytes (32 hex digits)")
        keys[kid.strip()] = raw
    return keys


class Signer:
    """The agent's side: the headers that prove one value came from this node."""

    def __init__(self, key_id: str, key: bytes) -> None:
        self.key_id = key_id.encode()
        self.key = key

    def headers(self, value: bytes) -> list[tuple[str, bytes]]:
        """Kafka record headers carrying the proof of ``value``."""
        return [(KEY_ID_HEADER, self.key_id),
                (SIG_HEADER, signature(self.key, value).encode())]

    @classmethod
    def from_setting(cls, text: str) -> Signer:
        """From ``identity.node_key`` (``kid=hex``: one entry)."""
        keys = parse_keys(text, "identity.node_key")
        if len(keys) != 1:
            raise ConfigError("identity.node_key: exactly one key-id=hex secret")
        [(kid, key)] = keys.items()
        return cls(kid, key)


def _header(headers: Headers, name: str) -> bytes | None:
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    for key, value in items:
        if key == name:
            return value
    return None


class Verifier:
    """The worker's side: does this value's proof match the node it names?"""

    def __init__(self, masters: Mapping[str, bytes]) -> None:
        if not masters:
            raise ConfigError("identity.master_keys: no key to verify samples with")
        self.masters = {kid.encode(): key for kid, key in masters.items()}
        self._keys: OrderedDict[tuple[bytes, str], bytes] = OrderedDict()

    def _key(self, kid: bytes, node: str) -> bytes:
        cached = self._keys.get((kid, node))
        if cached is None:
            cached = node_key(self.masters[kid], node)
            self._keys[(kid, node)] = cached
            if len(self._keys) > MAX_CACHED_KEYS:
                self._keys.popitem(last=False)
        return cached

    def check(self, node: str, value: bytes, headers: Headers) -> None:
        """Return if ``value`` is proven to come from ``node``; ContractError
        (``unsigned``, ``unknown_key``, ``bad_signature``) otherwise."""
        kid, sig = _header(headers, KEY_ID_HEADER), _header(headers, SIG_HEADER)
        if kid is None or sig is None:
            raise ContractError("unsigned", f"sample of {node!r} carries no "
                                f"{KEY_ID_HEADER}/{SIG_HEADER} headers")
        if kid not in self.masters:
            raise ContractError("unknown_key", f"sample of {node!r}: key id "
                                f"{kid[:40]!r} is not one this worker holds")
        expected = signature(self._key(kid, node), value).encode()
        if not hmac.compare_digest(expected, sig):
            raise ContractError("bad_signature", f"sample of {node!r}: the proof is not "
                                f"{node!r}'s (another node's key, or altered bytes)")


def verifier_from(verify: bool, master_keys: str) -> Verifier | None:
    """The ``identity.verify`` / ``identity.master_keys`` settings as a Verifier (None:
    verification is off)."""
    return Verifier(parse_keys(master_keys, "identity.master_keys")) if verify else None


def main(argv: list[str] | None = None) -> int:
    """``python -m vigil_gpu_monitor.contracts.identity new-master [kid]`` prints a new
    master-key entry; ``python -m vigil_gpu_monitor.contracts.identity issue NODE`` prints
    NODE's ``identity.node_key`` from ``VIGIL_IDENTITY_MASTER_KEYS`` (the first key, or
    ``--kid KID``)."""
    import os

    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["new-master"]:
        print(f"{args[1] if len(args) > 1 else 'k1'}={secrets.token_hex(32)}")
        return 0
    if len(args) in (2, 4) and args[0] == "issue":
        if node_problem(args[1]) is not None:
            print(f"error: node {node_problem(args[1])}", file=sys.stderr)
            return 2
        try:
            masters = parse_keys(os.environ.get("VIGIL_IDENTITY_MASTER_KEYS", ""),
                                 "VIGIL_IDENTITY_MASTER_KEYS")
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        kid = args[3] if len(args) == 4 and args[2] == "--kid" else next(iter(masters), "")
        if kid not in masters:
            print("error: VIGIL_IDENTITY_MASTER_KEYS holds no such key", file=sys.stderr)
            return 2
        print(f"{kid}={node_key(masters[kid], args[1]).hex()}")
        return 0
    print(main.__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
