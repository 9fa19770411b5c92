"""The agent's adaptive-sampling settings come from configuration and are checked."""

from __future__ import annotations

import pytest

from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.contracts.errors import ConfigError
from vigil_gpu_monitor.vigil.agentcmd import sampling_config


def test_moneo_thresholds_are_configuration_with_moneos_defaults() -> None:
    default = sampling_config(load(env={}))
    assert (default.peak_change, default.density_band, default.density_min) == (0.1, 0.1, 0.8)
    tuned = sampling_config(load(env={"VIGIL_AGENT_PEAK_CHANGE": "0.2",
                                      "VIGIL_AGENT_DENSITY_MIN": "0.6",
                                      "VIGIL_AGENT_NOISE_SIGMAS": "3"}))
    assert (tuned.peak_change, tuned.density_min, tuned.noise_sigmas) == (0.2, 0.6, 3.0)


def test_an_impossible_threshold_is_refused_with_its_key() -> None:
    with pytest.raises(ConfigError, match=r"agent.density_min = 1.2 must be a share"):
        sampling_config(load(env={"VIGIL_AGENT_DENSITY_MIN": "1.2"}))


@pytest.mark.parametrize("node", ["gpu-[01-04]", "gpu_01", "ALL", "-h"])
def test_an_agent_whose_node_is_not_one_host_name_refuses_to_start(node: str) -> None:
    """Every sample would be refused (issue #49): the agent says why at start."""
    import argparse

    from vigil_gpu_monitor.vigil.agentcmd import run

    with pytest.raises(ConfigError, match="RFC 1123 host name"):
        run(load(env={"VIGIL_AGENT_NODE": node}), argparse.Namespace())
