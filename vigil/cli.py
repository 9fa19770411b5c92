"""The `vigil` command: one subcommand per stage, all sharing one configuration."""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable, Sequence

from vigil_gpu_monitor.contracts import config as config_mod
from vigil_gpu_monitor.contracts.codec import DETECTION_KINDS, SEVERITIES
from vigil_gpu_monitor.contracts.config import Config
from vigil_gpu_monitor.vigil.failures import DIST, OWN_PACKAGES, describe

Handler = Callable[[Config, argparse.Namespace], int]


class HelpFormatter(argparse.HelpFormatter):
    """``--help`` shows each option's default, where it has one worth showing (not an
    unset option or a flag that is off) and its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (action.option_strings and "default" not in text and action.default not in (
                None, False, argparse.SUPPRESS)):
            text += " (default: %(default)s)"
        return text


def _command(name: str) -> Handler:
    """The handler ``vigil.commands.<name>``, imported only when it runs, so that each
    command pulls in its own dependencies alone."""

    def run(cfg: Config, args: argparse.Namespace) -> int:
        from vigil_gpu_monitor.vigil import commands
        return int(getattr(commands, name)(cfg, args))
    return run


def _goodput(cfg: Config, args: argparse.Namespace) -> int:
    from vigil_gpu_monitor.vigil.goodputcmd import goodput
    return goodput(cfg, args)


def _up(cfg: Config, args: argparse.Namespace) -> int:
    from vigil_gpu_monitor.vigil.ops import localstack
    localstack.up(cfg)
    return 0


def _down(cfg: Config, args: argparse.Namespace) -> int:
    from vigil_gpu_monitor.vigil.ops import localstack
    localstack.down(cfg)
    return 0


def _status(cfg: Config, args: argparse.Namespace) -> int:
    from vigil_gpu_monitor.vigil.ops import localstack
    report = localstack.health(cfg)
    for name, state in report.items():
        print(f"{name:6} {state}")
    return 0 if all(s.startswith(("up", "external")) for s in report.values()) else 1


def _config(cfg: Config, args: argparse.Namespace) -> int:
    print(config_mod.describe(cfg))
    return 0







def _shards(text: str) -> int:
    """``--shards``: 1..64 stage-1 shards a job (an argparse error otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError(f"{value} shards: use 1-64")
    return value


def _processes(text: str) -> int:
    """``--jobs``: a process count, 1..254 (an argparse error otherwise, no traceback)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 254:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 254, not {text!r}")
    return value


def _agent(cfg: Config, args: argparse.Namespace) -> int:
    from vigil_gpu_monitor.vigil import agentcmd
    return agentcmd.run(cfg, args)



def _worker(cfg: Config, args: argparse.Namespace) -> int:
    from vigil_gpu_monitor.streams.worker import run_worker
    from vigil_gpu_monitor.vigil.ops.kafka_admin import ensure_topics
    from vigil_gpu_monitor.vigil.reach import require_kafka
    require_kafka(cfg)
    replication = ensure_topics(cfg)
    return run_worker(cfg, replication.factor, getattr(args, "stage", 0) or 0)





def _top(cfg: Config, args: argparse.Namespace) -> int:
    from vigil_gpu_monitor.alerting.state import LiveState
    from vigil_gpu_monitor.vigil.reach import redis_client
    from vigil_gpu_monitor.vigil.views import top
    state = LiveState(redis_client(cfg), cfg.redis.key_prefix)
    return top.run(state, args.interval, args.once, False if args.no_color else None)


def _bench(cfg: Config, args: argparse.Namespace) -> int:
    if args.what == "detect":
        from vigil_gpu_monitor.vigil.evaluation import benchdetect
        sizes = tuple(int(x) for x in args.sizes.split(","))
        seeds = tuple(int(x) for x in args.seeds.split(","))
        from vigil_gpu_monitor.vigil.agentcmd import sampling_config
        sampling = sampling_config(cfg) if args.adaptive else None
        return benchdetect.main(sizes, seeds, args.json, args.verbose_results, sampling)
    raise AssertionError(args.what)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand and its flags."""
    parser = argparse.ArgumentParser(prog="vigil", description=__doc__,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--config", help="TOML config file (default: $VIGIL_CONFIG, else "
                        "built-in defaults; `vigil config` shows them)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of a failure (for bug reports)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text,
                           formatter_class=HelpFormatter)
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
    sim.add_argument("--seed", type=int, default=7, help="random seed (same seed, same samples)")
    sim.add_argument("--jobs", type=int, default=2, help="number of jobs")
    sim.add_argument("--nodes", type=int, default=4, help="nodes per job")
    sim.add_argument("--start", type=float, default=None, help="first timestamp (default: now)")
    sim.add_argument("--fast", action="store_true",
                     help="publish to Kafka as fast as possible instead of at the pace of the "
                     "samples' timestamps (their event time then runs ahead of the clock)")
    sim.add_argument("--realtime", action="store_true", help=argparse.SUPPRESS)  # the default
    sim.add_argument("--labels", help="write the ground-truth fault labels (JSON) here")
    sim.add_argument("--slow-after", type=float, default=60.0,
                     help="seconds until the injected GPU slows down")

    rep = add("replay", _command("replay"),
              "run the detectors over a JSON-lines trace, in event time")
    rep.add_argument("trace", help="trace file of vigil.sample/1 lines, '-' for stdin")
    rep.add_argument("--out", default="-", help="detections output (default stdout)")
    rep.add_argument("--jobs", type=_processes, default=1, metavar="N",
                     help="replay the trace's jobs in N processes (same detections, same "
                          "order; a file, not stdin)")
    rep.add_argument("--shards", type=_shards, default=1, metavar="K",
                     help="split each job's nodes into K stage-1 shards and a stage 2, in "
                          "one process (docs/sharding.md): the same detections as one stage")

    rpt = add("report", _command("report"),
              "a job's HTML report with per-GPU heatmaps and detections")
    rpt.add_argument("job", help="job id")
    rpt.add_argument("--trace", help="JSON-lines trace (default: the samples topic)")
    rpt.add_argument("--out", help="HTML file (default vigil-report-JOB.html)")

    gp = add("goodput", _goodput, "GPU-hours lost to faults, by day, week, cause, node, GPU")
    gp.add_argument("--since", default="7d", help="30m, 12h, 7d, 2w back, or Unix seconds")
    gp.add_argument("--job", help="one job (default: the fleet)")
    gp.add_argument("--json", action="store_true", help="the whole summary as JSON")

    wk = add("worker", _worker, "run the Faust stream worker")
    wk.add_argument("--stage", type=int, choices=(0, 1, 2), default=0,
                    help="0: one stage (default); 1: stage 1 of sharded detection (samples "
                         "to summaries); 2: stage 2 (summaries to detections); "
                         "docs/sharding.md")

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
    sel.add_argument("--min-variance", type=float, default=1e-4,
                     help="a metric whose scaled variance is below this is constant, dropped")
    sel.add_argument("--max-distance", type=float, default=0.05,
                     help="metrics nearer than this (Moneo distance) form one group")

    bench = add("bench", _bench, "measure detection quality against the static-rules baseline")
    bench.add_argument("what", choices=["detect"], help="what to measure")
    bench.add_argument("--sizes", default="2,4,8,16,32,64", help="job sizes in nodes")
    bench.add_argument("--seeds", default="1,2", help="simulator seeds, comma list")
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
    alerts.add_argument("--kind", choices=DETECTION_KINDS, help="only this detection kind")
    alerts.add_argument("--severity", choices=SEVERITIES, help="only this severity")

    top = add("top", _top, "live view: per-GPU heat, open incidents, pipeline health")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between redraws")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--no-color", action="store_true", help="no ANSI colours")

    sil = add("silence", _command("silence"),
              "silence notifications matching labels (Redis-wide)")
    sil.add_argument("action", choices=["add", "list", "expire"],
                     help="add a silence, list the active ones, or expire one by id")
    sil.add_argument("id", nargs="?", help="silence id (expire)")
    sil.add_argument("--match", action="append",
                     help="label=value (kind, severity, job, node, gpu, incident; * globs)")
    sil.add_argument("--for", dest="duration", default="1h", help="90s, 30m, 2h, 1d")
    sil.add_argument("--comment", help="why (kept with the silence)")
    sil.add_argument("--by", help="who (default: login name)")

    act = add("actions", _command("actions"),
              "the remediation audit: every decision and why")
    act.add_argument("--job", help="only this job")
    act.add_argument("--node", help="only this node")
    act.add_argument("--count", type=int, default=50, help="newest decisions to show")

    add("nodes", _command("nodes"),
        "nodes Vigil holds out of service: state, since when, why, GPU-hours out")

    rep_ = add("repair", _command("repair"),
               "report a node Vigil took out as repaired: it is verified, then returned")
    rep_.add_argument("what", choices=["done"], help="done: the node was repaired")
    rep_.add_argument("node", help="the node, as `vigil nodes` names it")
    rep_.add_argument("--note", help="what was done (kept in the audit)")
    rep_.add_argument("--by", help="who (default: login name)")

    ackp = add("ack", _command("ack"),
              "acknowledge an incident: pagers stop re-notifying it")
    ackp.add_argument("incident", help="incident id, as `vigil alerts` shows it")
    ackp.add_argument("--by", help="who (default: login name)")
    return parser


# Long-running services: their INFO logs (their own and their clients') are their record.
DAEMONS = frozenset({"agent", "worker", "alerter"})
BUG = 70  # sysexits EX_SOFTWARE: an internal error, not the user's to fix


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


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version(DIST)
    except PackageNotFoundError:  # a source tree that was never installed
        from vigil_gpu_monitor.vigil import __version__
        return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `vigil` console script: every failure ends in one line on
    stderr naming the problem and its fix, and a non-zero status (2: the user's or the
    environment's to fix; ``BUG``: a bug, whose traceback ``--debug`` shows)."""
    args = build_parser().parse_args(argv)
    configure_logging(args.command, args.verbose)
    cfg: Config | None = None
    try:
        cfg = config_mod.load(args.config)
        return int(args.handler(cfg, args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the one place every failure is told
        failure = describe(exc, args.command, cfg)
        if args.debug:
            traceback.print_exc()
        sys.stderr.write(failure.line() + "\n")
        return BUG if failure.bug else 2


if __name__ == "__main__":
    sys.exit(main())
