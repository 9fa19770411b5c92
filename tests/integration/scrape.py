"""Read one metric from a Vigil process's Prometheus /metrics endpoint (tests)."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def metric(port: int, name: str, **labels: str) -> float:
    """Sum of the series called ``name`` (or ``name_total``) whose labels include ``labels``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(sample.value)
               for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name in (name, name + "_total")
               and all(sample.labels.get(k) == v for k, v in labels.items()))
