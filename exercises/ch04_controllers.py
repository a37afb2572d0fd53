"""Chapter 04: controllers, the actors everyone can find.

Some actors are one of a kind for the whole job: a metrics sink, a registry of
replicas, a weight store. Passing a reference to them into every actor's
constructor works, but it threads one argument through every layer of code.

A *controller* is found by name instead:

    sink = get_or_spawn_controller("metrics_sink", MetricsSink, "made by me").get()

  - The first caller, anywhere in the job, creates it with its arguments.
  - Every later caller, from any process, gets the same actor; their
    constructor arguments are ignored.
  - It lives in the job's root (client) process, so it outlives the meshes of
    the actors that use it.

    client process (root)                      worker processes
    +----------------------------+             +-----------+
    | MetricsSink "metrics_sink" | <--record-- | Worker 0  |  get_or_spawn_controller(
    |  created by the 1st caller | <--record-- | Worker 1  |      "metrics_sink", ...)
    +----------------------------+ <--record-- | Worker 2  |  -> the same sink for all
                                               +-----------+

Your TODOs:
  1. MetricsSink.record   keep one record; answer how many there are
  2. find_sink            get-or-spawn the sink by name
  3. Worker.work          do the work, then report to the sink found by name

Given, safe to skip: ch04_plumbing.py (the demo).
Check: koans check 4    Demo: python -m exercises.ch04_controllers    Read: docs/04_controllers.md
"""

from __future__ import annotations

import os
import uuid

from koans.learn.demo import run_demo
from monarch.actor import Actor, current_rank, endpoint, get_or_spawn_controller

SINK_NAME = "metrics_sink"
TIMEOUT = 60.0


class MetricsSink(Actor):
    """Collects (source, metric, value) records from every actor in the job."""

    def __init__(self, created_by: str):
        self.created_by = created_by
        self.instance = uuid.uuid4().hex[:8]  # tells two sinks apart, even in one process
        self.records: list[tuple[str, str, float]] = []

    @endpoint
    def record(self, source: str, metric: str, value: float) -> int:
        """Keep one record; return how many records the sink now holds."""
        raise NotImplementedError("TODO(ch04): append (source, metric, value) to self.records and return the count")

    @endpoint
    def summary(self) -> dict:
        """{metric: {"count", "total", "sources"}} over every record so far."""
        table: dict[str, dict] = {}
        for source, metric, value in self.records:
            row = table.setdefault(metric, {"count": 0, "total": 0.0, "sources": []})
            row["count"] += 1
            row["total"] += value
            if source not in row["sources"]:
                row["sources"].append(source)
        return table

    @endpoint
    def identity(self) -> dict:
        """Who this sink is: which instance, made by whom, living in which process."""
        return {"instance": self.instance, "created_by": self.created_by, "pid": os.getpid()}


def find_sink(created_by: str, name: str = SINK_NAME, timeout: float = TIMEOUT) -> MetricsSink:
    """The job's one sink called `name`, created with `created_by` if nobody made it yet."""
    # The first caller in the whole job creates it with MetricsSink(created_by); every later
    # caller gets that same actor. Wait at most `timeout` seconds.
    raise NotImplementedError("TODO(ch04): get or spawn the controller `name` of class MetricsSink, and wait for it")


class Worker(Actor):
    """Does some work and reports it. Nobody hands it the sink: it looks it up by name."""

    def __init__(self, sink_name: str = SINK_NAME):
        self.sink_name = sink_name
        self.rank = current_rank().rank

    @endpoint
    def work(self, items: list[int]) -> int:
        """Sum the squares of `items`, report "items_done" = len(items) to the sink; return the sum."""
        # Its source name, and the created_by it gives find_sink: f"worker{self.rank}". Wait for the
        # record's reply (timeout=TIMEOUT) before returning, so the report is in before the caller reads
        # the summary; a record the sink refuses fails work() (the caller must learn it).
        raise NotImplementedError("TODO(ch04): compute the result, find the sink by name, record this worker's items_done")

    @endpoint
    def sink_identity(self) -> dict:
        """The identity of the sink as this worker finds it (creating it if it is the first)."""
        return find_sink(f"worker{self.rank}", self.sink_name).identity.call_one().get(timeout=TIMEOUT)


if __name__ == "__main__":
    from .ch04_plumbing import main  # the demo: given code, safe to skip

    run_demo(main)
