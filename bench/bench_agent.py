"""Agent overhead on an 8-GPU node at a 1 s base interval: CPU seconds per second and
peak RSS of the `vigil agent` process, NVML replaced by the fake answering at a
declared cost (30 µs of CPU per call; Hopper, so no blocking PCIe counter), or with
``--h100-costs`` at what each call cost on a real H100 (3.3 ms the energy counter,
1.7 ms the GPM metrics, ...: `producers/nvml_fake.py`, REAL_H100_CALL_COSTS).

    .venv/bin/vigil up
    .venv/bin/python bench/bench_agent.py [--seconds 60] [--h100-costs]

The agent publishes to the local Kafka like in production (adaptive sampling on).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid

from vigil_gpu_monitor.contracts.config import load
from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def _peak_rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--h100-costs", action="store_true",
                        help="each NVML call at its cost measured on a real H100")
    args = parser.parse_args()
    tag = uuid.uuid4().hex[:6]
    env = dict(os.environ, VIGIL_KAFKA_TOPIC_PREFIX=f"agentbench{tag}.",
               VIGIL_AGENT_METRICS_PORT="0", VIGIL_AGENT_JOB="bench",
               VIGIL_AGENT_FAKE_NVML_CALL_COST="0.00003",
               VIGIL_AGENT_FAKE_NVML_H100_COSTS="true" if args.h100_costs else "false")
    ensure_topics(load(env=env))
    agent = subprocess.Popen([sys.executable, "-m", "vigil_gpu_monitor", "agent", "--sources",
                              "fake-nvml,host,infiniband"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(8)  # start-up (imports, NVML init, first Kafka connection) is not steady state
    cpu0, t0 = _cpu_seconds(agent.pid), time.monotonic()
    time.sleep(args.seconds)
    cpu1, t1 = _cpu_seconds(agent.pid), time.monotonic()
    rss = _peak_rss_mb(agent.pid)
    agent.send_signal(signal.SIGTERM)
    agent.wait(timeout=60)
    share = (cpu1 - cpu0) / (t1 - t0)
    costs = "a real H100's call costs" if args.h100_costs else "30 µs a call"
    print(f"agent, 8 fake GPUs @1 s ({costs}), {t1 - t0:.0f} s steady state: "
          f"{share:.2%} of one core, peak RSS {rss:.0f} MB, exit {agent.returncode}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
