"""The reliability suite uses the integration fixtures (real Kafka and Redis)."""

from tests.integration.conftest import isolated_cfg, isolated_env

__all__ = ["isolated_cfg", "isolated_env"]
