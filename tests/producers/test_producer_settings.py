"""Every kafka-python producer Vigil makes starts from ``KAFKA_PYTHON_PRODUCER``
(idempotence off, one request in flight a connection): kafka-python 3.0.12's
idempotent producer can stall for good after a broker outage longer than its
delivery timeout (measured: `bench/bench_producer_outage.py`). A deployment's own
client settings still go over them."""

from __future__ import annotations

from typing import Any

import pytest

from vigil_gpu_monitor.alerting import service
from vigil_gpu_monitor.contracts.config import KAFKA_PYTHON_PRODUCER, load
from vigil_gpu_monitor.producers import publisher


class _Recorder:
    """Stands in for ``kafka.KafkaProducer``: keeps the settings it was made with."""

    made: list[dict[str, Any]] = []

    def __init__(self, **settings: Any) -> None:
        self.config = dict(settings, api_version=(3, 9))
        _Recorder.made.append(settings)


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    _Recorder.made = []
    monkeypatch.setattr(publisher, "KafkaProducer", _Recorder)
    monkeypatch.setattr(service, "KafkaProducer", _Recorder)
    return _Recorder.made


def test_the_agents_and_the_simulators_producers_have_no_producer_id_to_lose(
        made: list[dict[str, Any]]) -> None:
    assert KAFKA_PYTHON_PRODUCER == {"enable_idempotence": False,
                                     "max_in_flight_requests_per_connection": 1}
    buffered = publisher.BufferedPublisher("127.0.0.1:1", "t")
    buffered._factory()
    publisher.KafkaPublisher("127.0.0.1:1", "t")
    assert len(made) == 2
    for settings in made:
        assert settings["acks"] == "all"
        assert KAFKA_PYTHON_PRODUCER.items() <= settings.items(), settings


def test_the_alerters_producer_and_its_renewals_have_none_either(
        made: list[dict[str, Any]]) -> None:
    producer = service.kafka_producer(load(env={}))
    producer.renew()  # the renewal's producer too (made with the learned version)
    assert len(made) == 2 and made[1]["api_version"] == (3, 9)
    for settings in made:
        assert KAFKA_PYTHON_PRODUCER.items() <= settings.items(), settings


def test_a_deployments_client_settings_go_over_them(made: list[dict[str, Any]]) -> None:
    buffered = publisher.BufferedPublisher("127.0.0.1:1", "t", enable_idempotence=True,
                                           max_in_flight_requests_per_connection=5)
    buffered._factory()
    assert made[0]["enable_idempotence"] is True
    assert made[0]["max_in_flight_requests_per_connection"] == 5


def test_a_publisher_closed_while_no_broker_answers_ends_its_sender() -> None:
    """Its first producer is still trying to reach a broker when it is closed: the
    sender gives up within close's wait for it (kafka-python's bootstrap would try for
    30 s, past that wait, and log on after its owner had gone)."""
    from vigil_gpu_monitor.simulator.cluster import Cluster, JobSpec, Simulator

    sample = next(iter(Simulator(Cluster([JobSpec("j", ["n0"])], []), 1_893_000_000.0,
                                 seed=1).samples(5)))
    closed = publisher.BufferedPublisher("127.0.0.1:1", "t")  # nothing listens there
    closed.publish(sample)
    assert not closed.close(timeout=1.0)  # not flushed: no broker
    assert not closed._thread.is_alive()
