"""What Vigil's agent reads from dcgm-exporter's default field set, and from real pages.

Given a dcgm-exporter counters CSV (its ``etc/default-counters.csv``), prints which
contract metrics the agent fills from the fields it lists (and which listed fields it
does not read), then, for each real page under ``tests/producers/fixtures/dcgm/real``,
the GPUs the agent reads, the series it skips and the parse time (the whole-page parse,
or the line-by-line fallback on a page prometheus_client refuses).

    .venv/bin/python bench/bench_exporter_pages.py --counters PATH/default-counters.csv
"""

from __future__ import annotations

import argparse
import timeit
from pathlib import Path

from vigil_gpu_monitor.contracts.catalog import GPU_METRICS
from vigil_gpu_monitor.producers.dcgm import CLOCK_EVENTS, DCGM_FIELDS, ENERGY, READ_FIELDS, parse

REAL = Path(__file__).parents[1] / "tests" / "producers" / "fixtures" / "dcgm" / "real"
DERIVED = {ENERGY: "power", CLOCK_EVENTS: "throttle"}


def listed(path: Path) -> list[str]:
    """The fields a counters CSV enables (lines not starting with '#')."""
    return [line.split(",")[0].strip() for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def main() -> int:
    """Print the figures; 0 on success."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--counters", type=Path, required=True)
    args = ap.parse_args()
    fields = listed(args.counters)
    filled = sorted({DCGM_FIELDS[f][0] for f in fields if f in DCGM_FIELDS}
                    | {DERIVED[f] for f in fields if f in DERIVED})
    print(f"{args.counters.name}: {len(fields)} fields enabled, "
          f"{len([f for f in fields if f in READ_FIELDS])} read by the agent")
    print(f"  contract metrics filled ({len(filled)} of {len(GPU_METRICS)}): {', '.join(filled)}")
    print(f"  not filled: {', '.join(sorted(set(GPU_METRICS) - set(filled) - {'xid'}))}")
    print(f"  enabled but not read: {', '.join(f for f in fields if f not in READ_FIELDS)}")
    for page in sorted(REAL.glob("*.prom")):
        text = page.read_text()
        scrape = parse(text)
        runs = 200
        seconds = timeit.timeit(lambda: parse(text), number=runs) / runs  # noqa: B023
        print(f"{page.name}: {len(scrape.gpus)} GPUs {sorted(scrape.gpus, key=int)}, "
              f"{sum(len(m) for m in scrape.gpus.values())} readings, "
              f"skipped {sum(scrape.skipped.values())}, "
              f"{len(text.splitlines())} lines, parse {seconds * 1e6:.0f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
