"""Roles on the broker (issue #49): one Kafka principal per role, and the ACLs that
let each do its job and nothing else, for KRaft's ``StandardAuthorizer``.

- ``agent``: write ``vigil.samples`` and ``vigil.steps`` (its jobs' step timings);
  nothing else (not detections, not actions).
- ``worker``: read samples and step timings in its group (``worker.app_id``); write
  detections, dead letters and status; own its Faust topics (``<app_id>-…``: the ``engines``
  changelog and the leader-assignor topic, which Faust creates itself).
- ``alerter``: read detections, status and samples (GPU UUIDs) in its group
  (``alerter.group_id``); write alerts and actions.
- ``reader``: read detections, alerts and actions in groups named ``vigil-reader…``
  (dashboards, tickets, a person's console consumer).

Every role but the agent may also describe Vigil's topics (``ensure_topics`` checks
their replicas) and the cluster's configs (the brokers' default replication). The
admin principal (``kafka.sasl_username``) is a super user: it creates topics and
writes these ACLs (`vigil up` with ``local.kafka_acls``, or `deploy/kafka/acls.sh`).

This module holds the table once: the local stack applies it through the admin API,
``deploy/kafka/acls.sh`` is generated from it
(``python -m vigil_gpu_monitor.vigil.ops.kafka_acls``), and a test checks the two agree.
"""

from __future__ import annotations

import hashlib
import hmac
import sys
import time
from dataclasses import dataclass
from typing import Any

from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.config import Config

ROLES = ("agent", "worker", "alerter", "reader")
READER_GROUP_PREFIX = "vigil-reader"
IN_FORCE_SECONDS = 30.0  # how long ``apply`` waits for the broker to list what it wrote


@dataclass(frozen=True)
class Grant:
    """One ALLOW: ``operation`` on a resource (``topic``, ``group``, ``cluster``),
    its name matched ``literal`` or ``prefixed``."""

    resource: str
    name: str
    operation: str
    pattern: str = "literal"


def principal(role: str) -> str:
    """The SCRAM user name of a role."""
    return f"vigil-{role}"


def role_password(admin_password: str, role: str) -> str:
    """The local stack's password for a role, derived one-way from the admin's (so the
    stack needs nothing more stored, and a role's password does not reveal the
    admin's). Deployments issue their own (deploy/kafka)."""
    return hmac.new(admin_password.encode(), f"vigil-role/{role}".encode(),
                    hashlib.sha256).hexdigest()[:32]


def grants(cfg: Config) -> dict[str, list[Grant]]:
    """Role → what it may do, for this configuration's topic prefix and group names."""
    p = cfg.kafka.topic_prefix

    def t(name: str) -> str:
        return topics.topic(name, p)

    def topic(name: str, *ops: str) -> list[Grant]:
        return [Grant("topic", t(name), op) for op in ops]

    describe_all = [Grant("topic", t("vigil."), "DESCRIBE", "prefixed"),
                    Grant("cluster", "kafka-cluster", "DESCRIBE_CONFIGS")]
    app = cfg.worker.app_id
    return {
        "agent": [*topic(topics.SAMPLES, "WRITE", "DESCRIBE"),
                  *topic(topics.STEPS, "WRITE", "DESCRIBE")],
        "worker": [*topic(topics.SAMPLES, "READ"), *topic(topics.STEPS, "READ"),
                   *topic(topics.DETECTIONS, "WRITE"),
                   *topic(topics.DEADLETTER, "WRITE"), *topic(topics.STATUS, "WRITE"),
                   # a sharded job's two stages (docs/sharding.md): their own groups
                   *topic(topics.SUMMARIES, "READ", "WRITE"),
                   # the job-clock feedback: stage 2 writes, every stage-1 worker reads
                   # it whole (no group)
                   *topic(topics.JOBCLOCK, "READ", "WRITE"),
                   Grant("topic", f"{app}-", "ALL", "prefixed"),
                   Grant("group", app, "READ"),
                   Grant("group", f"{app}-stage", "READ", "prefixed"), *describe_all],
        "alerter": [*topic(topics.DETECTIONS, "READ"), *topic(topics.STATUS, "READ"),
                    *topic(topics.SAMPLES, "READ"), *topic(topics.ALERTS, "WRITE"),
                    *topic(topics.ACTIONS, "WRITE"),
                    Grant("group", cfg.alerter.group_id, "READ"), *describe_all],
        "reader": [*topic(topics.DETECTIONS, "READ"), *topic(topics.ALERTS, "READ"),
                   *topic(topics.ACTIONS, "READ"),
                   Grant("group", READER_GROUP_PREFIX, "READ", "prefixed"), *describe_all],
    }


def apply(cfg: Config, wait_seconds: float = IN_FORCE_SECONDS) -> int:
    """Write every role's ACLs with the admin client of ``cfg`` (a super user), and
    wait until the broker lists them all (``wait_seconds`` at most); returns how many.
    Writing an ACL that exists is a no-op on the broker.

    Under KRaft an ACL written is in force once the broker has replayed its metadata
    record, a moment after the controller answered: a client started at once was
    refused on a topic its role may write (the ACL test, on a loaded machine). The
    broker's DescribeAcls answers from the authorizer that decides, so all of them
    listed there means all of them in force."""
    from kafka.admin import (
        ACL,
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePattern,
        ResourcePatternFilter,
        ResourceType,
    )

    acls = [ACL(principal=f"User:{principal(role)}", host="*",
                operation=getattr(ACLOperation, g.operation),
                permission_type=ACLPermissionType.ALLOW,
                resource_pattern=ResourcePattern(
                    getattr(ResourceType, g.resource.upper()), g.name,
                    getattr(ACLResourcePatternType, g.pattern.upper())))
            for role, role_grants in grants(cfg).items() for g in role_grants]
    admin = KafkaAdminClient(bootstrap_servers=cfg.kafka_bootstrap, client_id="vigil-acls",
                             **cfg.kafka_client)
    every = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                      ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY))
    try:
        result = admin.create_acls(acls)
        failed = result.get("failed") or []
        if failed:
            raise RuntimeError(f"Kafka refused {len(failed)} ACL(s): {failed[0]}")
        wanted = {_acl_key(a) for a in acls}
        deadline = time.monotonic() + wait_seconds
        while True:
            listed, _ = admin.describe_acls(every)
            missing = wanted - {_acl_key(a) for a in listed}
            if not missing:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(missing)} ACL(s) written but not in force on the "
                                   f"broker after {wait_seconds:.0f} s")
            time.sleep(0.2)
    finally:
        admin.close()
    return len(acls)


def _acl_key(acl: Any) -> tuple[str, int, int, str, int]:
    """What makes an ACL the same one, as written and as the broker lists it."""
    pattern = acl.resource_pattern
    return (acl.principal, int(acl.operation), int(pattern.resource_type),
            pattern.resource_name, int(pattern.pattern_type))


def _pascal(operation: str) -> str:
    """``DESCRIBE_CONFIGS`` → ``DescribeConfigs``, as kafka-acls.sh spells it."""
    return "".join(word.capitalize() for word in operation.split("_"))


def script(cfg: Config) -> str:
    """The same ACLs as ``kafka-acls.sh`` commands (``deploy/kafka/acls.sh``)."""
    lines = ['#!/bin/sh', '# Generated by `python -m vigil_gpu_monitor.vigil.ops.kafka_acls` from '
             'vigil/ops/kafka_acls.py: do not edit.',
             '# Run as the admin (super user) principal, with each role\'s password set:',
             '#   BOOTSTRAP=broker:9093 ADMIN_CONFIG=admin.properties AGENT_PASSWORD=... \\',
             '#   WORKER_PASSWORD=... ALERTER_PASSWORD=... READER_PASSWORD=... sh acls.sh',
             '# The brokers: deploy/kafka/broker-security.properties.',
             'set -eu', 'ACLS="kafka-acls.sh --bootstrap-server $BOOTSTRAP '
             '--command-config $ADMIN_CONFIG"',
             'USERS="kafka-configs.sh --bootstrap-server $BOOTSTRAP '
             '--command-config $ADMIN_CONFIG --alter --entity-type users"']
    for role in ROLES:
        lines.append(f'$USERS --entity-name {principal(role)} --add-config '
                     f'"SCRAM-SHA-512=[password=${role.upper()}_PASSWORD]"')
    for role, role_grants in grants(cfg).items():
        lines.append(f"# {role}")
        for g in role_grants:
            where = {"topic": f"--topic '{g.name}'", "group": f"--group '{g.name}'",
                     "cluster": "--cluster"}[g.resource]
            pattern = " --resource-pattern-type prefixed" if g.pattern == "prefixed" else ""
            lines.append(f"$ACLS --add --allow-principal 'User:{principal(role)}' "
                         f"--operation {_pascal(g.operation)} {where}{pattern}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(script(Config()))
