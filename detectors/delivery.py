"""How long each node's samples wait in its agent before they are sent, and which
ones waited for a broker that was away.

After a broker outage every agent sends what it buffered as soon as its own producer
reconnects, and producers retry on their own backoff (up to 2 s apart). A worker reads
in arrival order, so the first agent back delivers a minute of samples before the
others deliver any. In event time that reads as one node reporting while the others
say nothing: their silence is not news, since their samples may be one reconnect away.

Each Kafka record carries the time its producer sent it (``CreateTime``), on the
agent's clock, the clock of the sample's own ``ts``. So ``sent - ts``, the *wait*, is
how long the sample sat in the agent's buffer, whatever the node's clock offset. A
node's usual wait is learned: it follows shorter waits quickly and longer ones
slowly, like a node's tick interval in ``detectors/health.py``. So an agent that always
sends late (a slow path, a broker that stamps its own append time, a clock far from
the broker's) is judged against its own habit. A sample that waited more than
``grace`` beyond its node's usual wait could have missed its bin. It says the path to
the broker was down until about ``ts + excess``, on the job's clock. The health
monitor then counts a node's silence only from then (``HealthMonitor.resumed``).

Limit: one agent whose path falls behind for good (its buffer growing, its waits
rising each tick) reads as an outage that never ends, and keeps the other nodes'
silence from counting until its usual wait has caught up with its new one (its waits
then level off at its full buffer's length: some hundreds of its ticks, minutes at a
1 s tick). A node that dies meanwhile is found that much later.

Waits beyond ``MAX_WAIT`` either way say nothing of an outage. Such a record's time
and its sample's are on different clocks: a replayed trace, a simulation published in
one go. A sample without a record time (``vigil replay`` of a file) has no wait, and
nothing changes for it.
"""

from __future__ import annotations

MAX_WAIT = 3600.0  # seconds, either way: a wait beyond is not one
FOLLOW_SHORTER = 0.2  # how fast a node's usual wait follows a shorter one
FOLLOW_LONGER = 0.01  # ... and a longer one (an outage's backlog barely moves it)


class DeliveryWaits:
    """Per node, the usual wait between a sample's time and its send; JSON-able."""

    def __init__(self, state: dict[str, float] | None = None) -> None:
        self.usual: dict[str, float] = dict(state or {})

    def to_state(self) -> dict[str, float]:
        """The usual waits, for a checkpoint."""
        return self.usual

    def excess(self, node: str, wait: float | None) -> float | None:
        """How much longer than usual this sample of ``node`` waited (None: no wait
        to judge), and learn from it. A node's first wait is its usual one."""
        if wait is None or not -MAX_WAIT <= wait <= MAX_WAIT:
            return None
        usual = self.usual.get(node, wait)
        follow = FOLLOW_SHORTER if wait < usual else FOLLOW_LONGER
        self.usual[node] = usual + follow * (wait - usual)
        return wait - usual

    def forget(self, node: str) -> None:
        """The node left the job."""
        self.usual.pop(node, None)
