"""The `vigil` command: one subcommand per stage, all sharing one configuration."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from contracts import config as config_mod
from contracts.codec import SEVERITIES
from contracts.config import Config
from contracts.errors import VigilError

Handler = Callable[[Config, argparse.Namespace], int]


def _command(name: str) -> Handler:
    """The handler ``vigil.commands.<name>``, imported only when it runs, so that each
    command pulls in its own dependencies alone."""

    def run(cfg: Config, args: argparse.Namespace) -> int:
        from vigil import commands
        return int(getattr(commands, name)(cfg, args))
    return run


def _goodput(cfg: Config, args: argparse.Namespace) -> int:
    from vigil.goodputcmd import goodput
    return goodput(cfg, args)


def _up(cfg: Config, args: argparse.Namespace) -> int:
    from vigil.ops import localstack
    localstack.up(cfg)
    return 0


def _down(cfg: Config, args: argparse.Namespace) -> int:
    from vigil.ops import localstack
    localstack.down(cfg)
    return 0


def _status(cfg: Config, args: argparse.Namespace) -> int:
    from vigil.ops import localstack
    report = localstack.health(cfg)
    for name, state in report.items():
        print(f"{name:6} {state}")
    return 0 if all(s.startswith(("up", "external")) for s in report.values()) else 1


def _config(cfg: Config, args: argparse.Namespace) -> int:
    print(config_mod.describe(cfg))
    return 0







def _agent(cfg: Config, args: argparse.Namespace) -> int:
    from vigil import agentcmd
    return agentcmd.run(cfg, args)



def _worker(cfg: Config, args: argparse.Namespace) -> int:
    from streams.worker import run_worker
    from vigil.ops.kafka_admin import ensure_topics
    replication = ensure_topics(cfg)
    return run_worker(cfg, replication.factor)





def _top(cfg: Config, args: argparse.Namespace) -> int:
    import redis

    from alerting.state import LiveState
    from vigil.views import top
    state = LiveState(redis.Redis.from_url(cfg.redis_url), cfg.redis.key_prefix)
    return top.run(state, args.interval, args.once, False if args.no_color else None)


def _bench(cfg: Config, args: argparse.Namespace) -> int:
    if args.what == "detect":
        from vigil.evaluation import benchdetect
        sizes = tuple(int(x) for x in args.sizes.split(","))
        seeds = tuple(int(x) for x in args.seeds.split(","))
        from vigil.agentcmd import sampling_config
        sampling = sampling_config(cfg) if args.adaptive else None
        return benchdetect.main(sizes, seeds, args.json, args.verbose_results, sampling)
    raise AssertionError(args.what)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand and its flags."""
    parser = argparse.ArgumentParser(prog="vigil", description=__doc__)
    parser.add_argument("--config", help="TOML config file (default: $VIGIL_CONFIG)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(handler=handler)
        return p

    add("up", _up, "start the local Kafka and Redis (unless external ones are configured)")
    add("down", _down, "stop what `vigil up` started")
    add("status", _status, "show the local stack's health")
    add("config", _config, "print the effective configuration, secrets masked")

    sim = add("simulate", _command("simulate"),
              "publish a synthetic cluster's samples (or write a trace)")
    sim.add_argument("--out", help="write JSON lines to this file ('-' = stdout) instead of Kafka")
    sim.add_argument("--duration", type=float, default=240.0, help="simulated seconds")
    sim.add_argument("--seed", type=int, default=7)
    sim.add_argument("--jobs", type=int, default=2, help="number of jobs")
    sim.add_argument("--nodes", type=int, default=4, help="nodes per job")
    sim.add_argument("--start", type=float, default=None, help="first timestamp (default: now)")
    sim.add_argument("--realtime", action="store_true", help="pace publishing at 1 tick/s")
    sim.add_argument("--labels", help="write the ground-truth fault labels (JSON) here")
    sim.add_argument("--slow-after", type=float, default=60.0,
                     help="seconds until the injected GPU slows down")

    rep = add("replay", _command("replay"),
              "run the detectors over a JSON-lines trace, in event time")
    rep.add_argument("trace", help="trace file of vigil.sample/1 lines, '-' for stdin")
    rep.add_argument("--out", default="-", help="detections output (default stdout)")

    rpt = add("report", _command("report"),
              "a job's HTML report with per-GPU heatmaps and detections")
    rpt.add_argument("job", help="job id")
    rpt.add_argument("--trace", help="JSON-lines trace (default: the samples topic)")
    rpt.add_argument("--out", help="HTML file (default vigil-report-JOB.html)")

    gp = add("goodput", _goodput, "GPU-hours lost to faults, by day, week, cause, node, GPU")
    gp.add_argument("--since", default="7d", help="30m, 12h, 7d, 2w back, or Unix seconds")
    gp.add_argument("--job", help="one job (default: the fleet)")
    gp.add_argument("--json", action="store_true", help="the whole summary as JSON")

    add("worker", _worker, "run the Faust stream worker")

    ag = add("agent", _agent, "the node agent: sample this node's GPUs, NICs and host")
    ag.add_argument("--sources", help="comma list: nvml, fake-nvml, infiniband, host, dcgm, "
                    "trace (default: agent.sources)")
    ag.add_argument("--job", help="static job id (default: agent.job)")
    ag.add_argument("--trace", help="trace file for the trace source")
    ag.add_argument("--out", help="write JSON lines here ('-' = stdout) instead of Kafka")
    ag.add_argument("--ticks", type=int, help="stop after this many ticks")
    ag.add_argument("--fast", action="store_true", help="with --ticks: do not wait between")
    ag.add_argument("--witness-socket", help="receive vigil.witness step timings on this Unix "
                    "socket and publish them on vigil.steps (docs/witness.md)")
    ag.add_argument("--log-tail", help="tail this job log for its step times (vigil.steps)")
    ag.add_argument("--log-pattern", default="megatron", help="megatron, deepspeed, or a "
                    "regular expression with (?P<step>) and (?P<ms>) or (?P<ts>) groups")

    sel = add("select-metrics", _command("select_metrics"),
              "pick representative GPU metrics from a trace (Moneo §2.2)")
    sel.add_argument("trace", help="trace file of vigil.sample/1 lines, '-' for stdin")
    sel.add_argument("--min-variance", type=float, default=1e-4)
    sel.add_argument("--max-distance", type=float, default=0.05)

    bench = add("bench", _bench, "measure detection quality against the static-rules baseline")
    bench.add_argument("what", choices=["detect"])
    bench.add_argument("--sizes", default="2,4,8,16,32,64", help="job sizes in nodes")
    bench.add_argument("--seeds", default="1,2")
    bench.add_argument("--json", help="also write the figures here")
    bench.add_argument("--list", dest="verbose_results", action="store_true",
                       help="list every miss and false alarm")
    bench.add_argument("--adaptive", action="store_true",
                       help="Vigil sees what agents publish with [agent] adaptive sampling")

    al = add("alerter", _command("alerter"),
              "consume detections into Redis live state")
    al.add_argument("--max-seconds", type=float, default=None, help="stop after this long")

    alerts = add("alerts", _command("alerts"),
              "list open incidents from Redis")
    alerts.add_argument("--job", help="only this job")
    alerts.add_argument("--kind", help="only this detection kind")
    alerts.add_argument("--severity", choices=SEVERITIES)

    top = add("top", _top, "live view: per-GPU heat, open incidents, pipeline health")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between redraws")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--no-color", action="store_true", help="no ANSI colours")

    sil = add("silence", _command("silence"),
              "silence notifications matching labels (Redis-wide)")
    sil.add_argument("action", choices=["add", "list", "expire"])
    sil.add_argument("id", nargs="?", help="silence id (expire)")
    sil.add_argument("--match", action="append",
                     help="label=value (kind, severity, job, node, gpu, incident; * globs)")
    sil.add_argument("--for", dest="duration", default="1h", help="90s, 30m, 2h, 1d")
    sil.add_argument("--comment")
    sil.add_argument("--by", help="who (default: login name)")

    act = add("actions", _command("actions"),
              "the remediation audit: every decision and why")
    act.add_argument("--job", help="only this job")
    act.add_argument("--node", help="only this node")
    act.add_argument("--count", type=int, default=50)

    add("nodes", _command("nodes"),
        "nodes Vigil holds out of service: state, since when, why, GPU-hours out")

    rep_ = add("repair", _command("repair"),
               "report a node Vigil took out as repaired: it is verified, then returned")
    rep_.add_argument("what", choices=["done"])
    rep_.add_argument("node")
    rep_.add_argument("--note", help="what was done (kept in the audit)")
    rep_.add_argument("--by", help="who (default: login name)")

    ackp = add("ack", _command("ack"),
              "acknowledge an incident: pagers stop re-notifying it")
    ackp.add_argument("incident")
    ackp.add_argument("--by", help="who (default: login name)")
    return parser


# Long-running services: their INFO logs (their own and their clients') are their record.
DAEMONS = frozenset({"agent", "worker", "alerter"})
OWN_PACKAGES = ("vigil", "contracts", "producers", "simulator", "detectors", "streams",
                "alerting")
# command → the extra that brings its dependencies (pyproject.toml)
EXTRA_OF = {"agent": "agent", "worker": "worker", "alerter": "alerter", "alerts": "alerter",
            "top": "alerter", "silence": "alerter", "ack": "alerter", "actions": "alerter",
            "nodes": "alerter", "repair": "alerter", "goodput": "alerter"}


def configure_logging(command: str, verbose: bool) -> None:
    """Daemons log at INFO. Commands a person runs at a terminal show Vigil's own INFO
    lines but only warnings from client libraries (kafka, aiokafka, redis…), whose INFO
    chatter about connections is noise there; ``-v`` shows everything at DEBUG."""
    if verbose:
        level = logging.DEBUG
    else:
        level = logging.INFO if command in DAEMONS else logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        force=True)
    own_level = logging.INFO if level == logging.WARNING else logging.NOTSET
    for own in OWN_PACKAGES:
        logging.getLogger(own).setLevel(own_level)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `vigil` console script."""
    args = build_parser().parse_args(argv)
    configure_logging(args.command, args.verbose)
    try:
        cfg = config_mod.load(args.config)
        return int(args.handler(cfg, args))
    except VigilError as exc:
        print(f"vigil: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in OWN_PACKAGES:
            raise  # our own code is broken, not the install
        extra = EXTRA_OF.get(args.command, "report")
        print(f"vigil: error: `vigil {args.command}` needs {exc.name!r}, which this install "
              f"lacks: pip install 'vigil[{extra}]'", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
