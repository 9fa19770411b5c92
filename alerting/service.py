"""`vigil alerter`: detections → Redis live state → on-call channels.

Offsets are committed only once a batch is in Redis, so a crash replays it, and the
idempotent writes of ``LiveState`` make the replay harmless: a duplicate or stale
detection changes nothing and notifies nobody. Channels deliver from their own
threads; a dead channel never holds up the others or the Redis state.

When Redis is unreachable, people are still told: detections are de-duplicated
against the newest state this process knows of each incident, routed (silences and
acks as last read) and delivered, and held in a bounded backlog with the delivery
log writes; nothing is committed meanwhile. When Redis answers again the backlog
is written (idempotently), remediation considers what it missed, and the offsets
are committed. A full backlog pauses consumption (Kafka keeps the rest) rather than
dropping anything. Remediation acts only while Redis is up: its safety rails live
there.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import redis
from kafka import KafkaConsumer, KafkaProducer

from vigil_gpu_monitor.alerting.channels import (
    AlertmanagerChannel,
    Channel,
    KafkaAlertsChannel,
    PagerDutyChannel,
    SlackChannel,
    WebhookChannel,
)
from vigil_gpu_monitor.alerting.cost import CostLedger, escalate_on_cost
from vigil_gpu_monitor.alerting.delivery import ChannelWorker, DeliveryPolicy
from vigil_gpu_monitor.alerting.executors import (
    CommandExecutor,
    Executor,
    KubernetesExecutor,
    SlurmExecutor,
)
from vigil_gpu_monitor.alerting.goodput import GoodputLedger
from vigil_gpu_monitor.alerting.metrics import serve_metrics
from vigil_gpu_monitor.alerting.outage import RedisOutage
from vigil_gpu_monitor.alerting.remediation import Remediator
from vigil_gpu_monitor.alerting.router import Route, Router
from vigil_gpu_monitor.alerting.silences import SilenceStore
from vigil_gpu_monitor.alerting.state import LiveState
from vigil_gpu_monitor.contracts import topics
from vigil_gpu_monitor.contracts.codec import decode_detection
from vigil_gpu_monitor.contracts.config import KAFKA_PYTHON_PRODUCER, Config
from vigil_gpu_monitor.contracts.errors import ConfigError, ContractError
from vigil_gpu_monitor.contracts.identity import verifier_from
from vigil_gpu_monitor.contracts.messages import Action, Detection
from vigil_gpu_monitor.contracts.status import decode_status

log = logging.getLogger(__name__)
STATUS_KEEP_SECONDS = 3600.0  # a job or worker silent this long leaves the live view
STATUS_PRUNE_EVERY = 60.0


def kafka_producer(cfg: Config) -> RenewingProducer:
    """The alerter's producer (alerts and actions topics): every write acknowledged by
    all in-sync replicas, with the configured security; renewed after a failure."""
    return RenewingProducer(lambda **more: KafkaProducer(
        bootstrap_servers=cfg.kafka_bootstrap, acks="all",
        **{**KAFKA_PYTHON_PRODUCER, **cfg.kafka_client, **more}))


class RenewingProducer:
    """A kafka-python producer that is replaced after any failed send, for callers that
    send one record and wait for it (``send(...).get(timeout)``, as the alerts channel
    and the remediation audit do). kafka-python 3.0.12's idempotent producer can
    stall after a broker restart, neither sending nor expiring what it holds
    (``contracts.config.KAFKA_PYTHON_PRODUCER``, which this one starts from, turns
    idempotence off for that): were any producer to stall, every later record would
    wait behind it until the alerter restarts. The new producer is made with the
    broker version the old one learned, so making it never waits on a broker that is
    away; the old one is closed without waiting (forced where its ``close`` raises
    from its flush)."""

    def __init__(self, make: Callable[..., Any]) -> None:
        self._make = make
        self.producer = make()

    def send(self, topic: str, **record: Any) -> _Sent:
        try:
            return _Sent(self, self.producer.send(topic, **record))
        except Exception:
            self.renew()
            raise

    def renew(self) -> None:
        """Replace the producer (after a failure)."""
        old = self.producer
        self.producer = self._make(api_version=old.config["api_version"])
        try:
            old.close(timeout=0)
        except Exception:  # kafka-python 3.0.12 raises from its flush before forcing
            sender = getattr(old, "_sender", None)
            if sender is not None:
                sender.force_close()


class _Sent:
    """A sent record's future: a failed wait renews its producer."""

    def __init__(self, owner: RenewingProducer, future: Any) -> None:
        self.owner, self.future = owner, future

    def get(self, timeout: float | None = None) -> Any:
        try:
            return self.future.get(timeout=timeout)
        except Exception:
            self.owner.renew()
            raise


def build_channels(cfg: Config, producer: Any = None) -> dict[str, tuple[Channel, Route, float]]:
    """Configured channels with their routes and rate limits (empty address = off)."""
    a = cfg.alerter
    found: dict[str, tuple[Channel, Route, float]] = {}
    try:
        if a.alertmanager_url:
            found["alertmanager"] = (AlertmanagerChannel(a.alertmanager_url),
                                     Route.parse(a.alertmanager_route, resend=True), 10.0)
        if a.slack_webhook is not None:
            found["slack"] = (SlackChannel(a.slack_webhook),
                              Route.parse(a.slack_route, pager=True), a.slack_rate_per_second)
        if a.pagerduty_routing_key is not None:
            found["pagerduty"] = (PagerDutyChannel(a.pagerduty_routing_key, a.pagerduty_url),
                                  Route.parse(a.pagerduty_route, pager=True),
                                  a.pagerduty_rate_per_second)
        if a.webhook_url:
            if a.webhook_secret is None:
                raise ConfigError("alerter.webhook_url needs alerter.webhook_secret to sign with")
            found["webhook"] = (WebhookChannel(a.webhook_url, a.webhook_secret),
                                Route.parse(a.webhook_route), 10.0)
        if a.kafka_alerts:
            producer = producer or kafka_producer(cfg)
            found["kafka"] = (KafkaAlertsChannel(producer, topics.topic(
                topics.ALERTS, cfg.kafka.topic_prefix)), Route.parse(a.kafka_alerts_route), 100.0)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return found


def build_executor(cfg: Config) -> Executor:
    """The configured remediation executor."""
    a = cfg.alerter
    if a.remediation_executor == "slurm":
        return SlurmExecutor(slurm_conf=a.slurm_conf)
    if a.remediation_executor == "kubernetes":
        return KubernetesExecutor(a.kubernetes_api, a.kubernetes_token, a.kubernetes_ca_file)
    if a.remediation_executor == "command":
        return CommandExecutor(a.remediation_command)
    raise ConfigError(f"alerter.remediation_executor {a.remediation_executor!r}: "
                      "use slurm, kubernetes or command")


def build_remediator(cfg: Config, state: LiveState,
                     escalate: Callable[[Detection], None] | None = None
                     ) -> Remediator | None:
    """The remediator when enabled; its audit also goes to the ``vigil.actions`` topic."""
    if not cfg.alerter.remediation_enabled:
        return None
    producer = kafka_producer(cfg)
    topic = topics.topic(topics.ACTIONS, cfg.kafka.topic_prefix)

    def publish(record: Action) -> None:
        """Synchronous: actions are rare, and an audit record must not sit in a buffer."""
        try:
            producer.send(topic, key=record["job"].encode(),
                          value=json.dumps(record, separators=(",", ":")).encode()
                          ).get(timeout=10)
        except Exception:  # the Redis audit already has it; say so and go on
            log.exception("could not publish remediation audit %s to %s", record["id"], topic)

    def is_open(det: Detection) -> bool:
        return any(d["id"] == det["id"] for d in state.open_incidents(job=det["job"]))

    def open_on_node(node: str) -> list[Detection]:
        return [d for d in state.open_incidents() if d["node"] == node]

    return Remediator(cfg.alerter, state.r, state.prefix, build_executor(cfg), is_open, publish,
                      escalate, open_on_node)


class Alerter:
    """One consume → apply → route → deliver loop."""

    def __init__(self, cfg: Config, consumer: Any, state: LiveState,
                 channels: dict[str, tuple[Channel, Route, float]] | None = None,
                 samples: Any = None) -> None:
        self.cfg = cfg
        self.consumer = consumer
        self.samples = samples  # a consumer of the samples topic: GPU UUIDs of nodes out
        keys = cfg.identity.master_keys  # a sample must prove its node, as in the worker
        self.verifier = verifier_from(cfg.identity.verify, keys.reveal() if keys else "")
        self.state = state
        self.silences = SilenceStore(state.r, state.prefix)
        channels = channels or {}
        a = cfg.alerter
        self.router = Router({n: c[1] for n, c in channels.items()}, self.silences,
                             a.page_after_seconds, a.resend_seconds, a.flap_max,
                             a.flap_window_seconds)
        self.workers = {
            name: ChannelWorker(channel, DeliveryPolicy(
                rate_per_second=rate, max_attempts=a.max_attempts,
                give_up_after_seconds=a.give_up_after_seconds), self._outcome)
            for name, (channel, _, rate) in channels.items()}
        self.remediator = build_remediator(cfg, state, self._escalate)
        self.applied = self.duplicates = self.invalid = self.statuses = 0
        self.outcomes: dict[tuple[str, str], int] = {}  # (channel, result) → count
        self.status_topic = topics.topic(topics.STATUS, cfg.kafka.topic_prefix)
        self._pruned_at = 0.0
        self.outage = RedisOutage()
        self.ledger = CostLedger()  # GPU-hours lost, for /metrics
        self.goodput = GoodputLedger(state.r, state.prefix)  # ... by day and cause, in Redis
        self.job_gpus: dict[str, int] = {}  # job → GPUs in its latest status
        self._escalated: set[str] = set()  # incidents raised to critical on cost
        self._uncommitted = False
        self._stop = False
        self._restore()

    def _restore(self) -> None:
        """After a restart: open incidents and who was told of them, from Redis."""
        for det in self.state.open_incidents():
            if "escalated_on_cost" in det["evidence"]:
                self._escalated.add(det["id"])
            self.ledger.apply(det)
            self.router.restore(det, self.state.told(det["job"], det["id"]))
            if self.remediator is not None:
                self.remediator.consider(det)

    def _outcome(self, channel: str, det: Detection, result: str, attempts: int,
                 why: str) -> None:
        self.outcomes[channel, result] = self.outcomes.get((channel, result), 0) + 1

        def write() -> None:
            self.state.log_delivery(channel, det, result, attempts, why)
            if result == "delivered" and det["state"] == "firing":
                self.state.mark_told(det["job"], det["id"], channel)

        self.outage.write_or_defer(write)

    def _escalate(self, det: Detection) -> None:
        """Tell people at once, on every pager channel, whatever its route says."""
        self._dispatch([(name, det) for name, route in self.router.routes.items()
                        if route.pager])

    def _dispatch(self, pairs: list[tuple[str, Detection]]) -> None:
        for name, det in pairs:
            self.workers[name].submit(det)

    def stop(self, *_: object) -> None:
        """Ask the loop to finish its batch and return."""
        self._stop = True

    def poll_once(self, timeout_ms: int = 1000) -> int:
        """Handle one poll's records and the router's timers; returns the record count."""
        if self.outage.owed:
            self._catch_up()
        if self.outage.full:  # Redis still down: let Kafka hold the rest
            time.sleep(timeout_ms / 1000)
            self._tick()
            return 0
        batches = self.consumer.poll(timeout_ms=timeout_ms, max_records=500)
        count = 0
        for records in batches.values():
            for record in records:
                count += 1
                if record.topic == self.status_topic:
                    self._pipeline_status(record)
                    continue
                try:
                    det = decode_detection(record.value)
                except ContractError as exc:
                    self.invalid += 1
                    log.warning("invalid detection at %s[%d]@%d: %s", record.topic,
                                record.partition, record.offset, exc)
                    continue
                self._apply(self._cost_severity(det))
        self._uncommitted = self._uncommitted or count > 0
        if self._uncommitted and not self.outage.ongoing:
            self.consumer.commit()  # also the batches held back while Redis was down
            self._uncommitted = False
        self._tick()
        return count

    def _watch_uuids(self) -> None:
        """Samples of nodes Vigil holds out: a changed ``meta.gpu_uuids`` is a replaced
        GPU (the repair loop then verifies the node). Other nodes' samples are skipped
        before decoding; a bad sample, or with ``identity.verify`` one whose proof is
        not its node's, is skipped (the worker dead-letters it)."""
        repair = self.remediator.repair if self.remediator is not None else None
        if self.samples is None or repair is None or self.outage.ongoing:
            return
        try:
            out = set(repair.log.out_nodes())
            for records in self.samples.poll(timeout_ms=0, max_records=2000).values():
                for record in records:
                    if not out or not any(n.encode() in record.value for n in out):
                        continue
                    try:
                        sample = json.loads(record.value)
                        uuids = sample.get("meta", {}).get("gpu_uuids")
                    except (ValueError, AttributeError):
                        continue
                    if sample.get("node") in out and isinstance(uuids, dict):
                        if self.verifier is not None:
                            try:
                                self.verifier.check(sample["node"], record.value,
                                                    record.headers)
                            except ContractError:
                                continue
                        repair.observe_uuids(sample["node"], uuids)
        except redis.RedisError as exc:
            self.outage.lost(exc)

    def _tick(self) -> None:
        self._watch_uuids()
        self._dispatch(self.router.tick())
        if self.remediator is not None and not self.outage.ongoing:
            try:
                self.remediator.tick()
                if self.remediator.repair is not None:  # nodes out of service lose GPU time
                    self.goodput.observe_out(self.remediator.repair.log.out_nodes(), time.time())
            except redis.RedisError as exc:
                self.outage.lost(exc)

    def _cost_severity(self, det: Detection) -> Detection:
        """Raise a costly incident to critical; its resolved message keeps the severity
        it fired with (Alertmanager matches the two on their labels)."""
        threshold = self.cfg.alerter.page_gpu_hours_per_hour
        if det["state"] == "resolved":
            if det["id"] in self._escalated:
                self._escalated.discard(det["id"])
                return escalate_on_cost(det, threshold, force=True)
            return det
        raised = escalate_on_cost(det, threshold)
        if raised is not det:
            self._escalated.add(det["id"])
        return raised

    def _apply(self, det: Detection) -> None:
        """Redis first; without Redis, de-duplicate in memory and deliver anyway."""
        fresh: bool | None = None
        if not self.outage.ongoing:  # Redis believed up
            try:
                fresh = self.state.apply(det)
                self.goodput.apply(det)  # idempotent: an incident is written once
            except redis.RedisError as exc:
                self.outage.lost(exc)
        newer = self.outage.remember(det)
        if not (newer if fresh is None else fresh):
            self.duplicates += 1
            return
        self.applied += 1
        self.ledger.apply(det)
        self._dispatch(self.router.handle(det))
        if fresh is None:
            self.outage.backlog.append(det)  # written (and considered) when Redis is back
        else:
            self._consider(det)

    def _catch_up(self) -> None:
        """Once Redis answers: write what it missed, then let remediation see it."""
        if self.outage.catch_up(self.state):
            while self.outage.to_consider and self._consider(
                    self.outage.to_consider.popleft()):
                pass

    def _consider(self, det: Detection) -> bool:
        """Hand a new detection to remediation; kept for later if Redis fails."""
        if self.remediator is None:
            return True
        try:
            self.remediator.consider(det)
            return True
        except redis.RedisError as exc:
            self.outage.lost(exc)
            self.outage.to_consider.appendleft(det)
            return False

    def _pipeline_status(self, record: Any) -> None:
        """Keep a worker's status for the live view; a bad one is logged and skipped
        (the topic is best-effort and its newest message supersedes it anyway)."""
        try:
            status = decode_status(record.value)
            if status["kind"] == "job":
                self.job_gpus[status["job"]] = len(status["heat"])
            self.state.put_pipeline_status(status)
            self.statuses += 1
            now = time.time()
            if now - self._pruned_at > STATUS_PRUNE_EVERY:
                self._pruned_at = now
                self.state.prune_pipeline_status(now - STATUS_KEEP_SECONDS)
        except ContractError as exc:
            self.invalid += 1
            log.warning("invalid status at %s[%d]@%d: %s", record.topic, record.partition,
                        record.offset, exc)
        except redis.RedisError:
            pass  # best-effort: the next status supersedes this one

    def run(self, max_seconds: float | None = None) -> None:
        """Loop until ``stop()`` or ``max_seconds``."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while not self._stop and (deadline is None or time.monotonic() < deadline):
            self.poll_once()

    def close(self) -> None:
        """Give channels a moment to finish, then stop them (the rest is dead-lettered)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(w.pending() for w in self.workers.values()):
            time.sleep(0.1)
        for worker in self.workers.values():
            worker.close()


def run_alerter(cfg: Config, max_seconds: float | None = None) -> int:
    """Build the consumer, Redis client and channels from config; run until signalled."""
    state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix,
                      cfg.redis.history_max)
    channels = build_channels(cfg)
    consumer = KafkaConsumer(
        topics.topic(topics.DETECTIONS, cfg.kafka.topic_prefix),
        topics.topic(topics.STATUS, cfg.kafka.topic_prefix),
        bootstrap_servers=cfg.kafka_bootstrap, group_id=cfg.alerter.group_id,
        enable_auto_commit=False, auto_offset_reset="earliest", **cfg.kafka_client)
    samples = None
    if cfg.alerter.remediation_enabled and cfg.alerter.repair_watch_samples:
        samples = KafkaConsumer(  # newest only, never committed: a UUID is a current fact
            topics.topic(topics.SAMPLES, cfg.kafka.topic_prefix),
            bootstrap_servers=cfg.kafka_bootstrap, group_id=None,
            auto_offset_reset="latest", enable_auto_commit=False, **cfg.kafka_client)
    alerter = Alerter(cfg, consumer, state, channels, samples)
    if cfg.alerter.metrics_port:
        serve_metrics(alerter, cfg.alerter.metrics_port, cfg.alerter.metrics_bind)

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        alerter.stop()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    log.info("alerter channels: %s", ", ".join(channels) or "none (Redis only)")
    try:
        alerter.run(max_seconds)
    finally:
        alerter.close()
        consumer.close()
        if samples is not None:
            samples.close()
        log.info("alerter stopped: %d applied, %d duplicates, %d invalid; deliveries %s",
                 alerter.applied, alerter.duplicates, alerter.invalid,
                 json.dumps({f"{c}/{r}": n for (c, r), n in sorted(alerter.outcomes.items())}))
    return 0
