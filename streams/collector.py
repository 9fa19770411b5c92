"""The cyclic garbage collector paused while a worker handles one batch.

A batch allocates millions of short-lived containers (a stage-2 bin of a 16,384-node
job is 34 MB of JSON: a dict per node and per GPU) that reference counting frees as
the batch ends: decoded messages hold no cycles. Counted as allocations, they set
off the collector's young collections every 700 of them, and those its full ones,
each of which walks everything the worker keeps (the window, every GPU's health:
~3 M references at 16,384 nodes). Measured at that size (bench/RESULTS.md, issue
#46): about 1 s of stage 2's 2.7 s a bin went to full collections.

So the collector is off while a batch is handled and back on after it: what the
batch left alive is then looked at once, in one young collection, and full
collections come at the pace of what the worker keeps, not of what it parses.
Memory is not at stake: a cycle made during a batch waits one batch. A collector
already off (``gc.disable()`` by whoever embeds the worker) stays off.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with the cyclic collector off; it comes back on after (if it
    was on before), even when the block raises."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
            # the next container allocated runs the collection the batch has made
            # due (Python 3.11 collects on allocation): here, inside the batch's
            # time, not in whatever comes next
            _due = [None]
            del _due
