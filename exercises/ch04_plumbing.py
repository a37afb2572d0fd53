"""Chapter 04 plumbing: the demo, and a sink the tests use. You may skip this file; nothing in it is
a TODO.

    python -m exercises.ch04_controllers      (the reference: python -m solutions.ch04_controllers)
"""

import os

from koans.learn.demo import demo_options
from monarch.actor import endpoint, this_host

from .ch04_controllers import TIMEOUT, MetricsSink, Worker, find_sink


class RefusingSink(MetricsSink):
    """A sink that refuses every record: whoever waits for the reply learns it."""

    @endpoint
    def record(self, source: str, metric: str, value: float) -> int:
        raise RuntimeError(f"this sink refuses every record ({source}, {metric})")


def main() -> None:
    demo_options(f"{__package__}.ch04_controllers", "Chapter 04's demo: one metrics sink, found by name.")
    print("Chapter 04: controllers\n")
    procs = this_host().spawn_procs(per_host={"procs": 3})
    try:
        workers = procs.spawn("workers", Worker)
        print("Worker 1 asks for the sink first, so it creates it:")
        first = workers.slice(procs=1).sink_identity.call_one().get(timeout=TIMEOUT)
        print(f"  sink {first['instance']} created_by={first['created_by']!r}, lives in pid {first['pid']} "
              f"(this client is pid {os.getpid()})")
        print("Everyone else asks with their own constructor argument, which is ignored:")
        for point, seen in workers.sink_identity.call().get(timeout=TIMEOUT).items():
            print(f"  worker {point.rank} finds sink {seen['instance']} created_by={seen['created_by']!r}")
        mine = find_sink("the client")
        print(f"  the client finds sink {mine.identity.call_one().get(timeout=TIMEOUT)['instance']} too")

        print("\nEach worker does its share and reports, with no reference passed in:")
        numbers = list(range(1, 31))
        results = workers.work.call(numbers[:10]).get(timeout=TIMEOUT)
        print(f"  results: {list(results.values())}")
        print(f"  sink summary: {mine.summary.call_one().get(timeout=TIMEOUT)}")
    finally:
        procs.stop().get(timeout=TIMEOUT)
