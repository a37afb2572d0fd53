"""Chapter 06: a service that routes around failed replicas.

Callers of a generator service should not care which replica answers, or that
one died a second ago. `await service.route("generate", prompt)` picks the next
healthy replica (round robin) and calls it. If the replica died or did not
answer in time, it is marked unhealthy (and replaced in the background), and the
request goes to another, up to `attempts` tries. An exception raised *inside*
the endpoint is the request's fault: it goes straight back to the caller.

    route --> replica 0 (own process)  healthy
          --> replica 1 (own process)  X died -> recovering
          --> replica 2 (own process)  healthy

A timeout does not stop the call it gave up on, so a retry may run a request
twice. That is fine for generation (a second sample is as good as the first);
a request that must not run twice needs a request id the replica checks.

Everything runs on one asyncio event loop, many requests in flight at once.
Between two `await`s nothing else runs, so the bookkeeping needs no locks.

Your TODOs:
  1. Service.next_replica     round robin over the healthy replicas
  2. Service.mark_unhealthy   health bookkeeping, and start the recovery
  3. Service.route            call, and retry on another replica when one fails

Given, safe to skip: ch06_plumbing.py (starting and replacing replica processes, the demo).
Check: koans check 6    Demo: python -m exercises.ch06_service (--chaos)    Read: docs/06_service.md
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from koans.learn.demo import run_demo

from .ch05_supervision import classify
from .ch06_plumbing import Replica, ReplicaPool

TIMEOUT = 30.0


@dataclass
class Attempt:
    """One failed try of a request: which replica, what became of it ("died" or "timeout"), and why."""

    replica: int
    outcome: str
    detail: str


class ServiceUnavailable(RuntimeError):
    """Every attempt failed. `attempts` says which replica was tried and what went wrong."""

    def __init__(self, endpoint_name: str, attempts: list[Attempt], healthy: int):
        self.attempts = attempts
        lines = [f"  attempt {n}: replica {a.replica}: {a.outcome}: {a.detail}" for n, a in enumerate(attempts, 1)]
        if not attempts:
            lines = ["  no attempt was made: no replica is healthy right now"]
        super().__init__(f"route({endpoint_name!r}) failed after {len(attempts)} attempt(s); "
                         f"{healthy} replica(s) healthy now:\n" + "\n".join(lines))


@dataclass
class Stats:
    requests: int = 0
    ok: int = 0
    failed: int = 0  # requests that reached the caller as ServiceUnavailable
    retries: int = 0  # attempts after the first, summed over requests
    replica_failures: int = 0  # replicas taken out of rotation
    per_replica: dict[int, int] = field(default_factory=dict)  # replica index -> requests it served


class Service(ReplicaPool):
    """N replicas of `actor_class`, each on its own process, behind one `route`.

    The pool it extends (ch06_plumbing.py) keeps `self.replicas`, a list of
    Replica(index, procs, actor, generation, healthy, served, failures), and
    replaces a dead replica in the background when asked:
    `self.start_recovery(replica)`. `failures` counts the deaths seen at that index.
    This class decides where each request goes.

        async with Service(Echo, replicas=3) as service:
            reply = await service.route("handle", 7)
    """

    def __init__(self, actor_class: type, *args, replicas: int = 3, name: str = "replica", attempts: int = 3,
                 call_timeout: float = TIMEOUT, auto_recover: bool = True):
        if attempts < 1:
            raise ValueError(f"need at least 1 attempt, got attempts={attempts}")
        super().__init__(actor_class, *args, replicas=replicas, name=name, call_timeout=call_timeout)
        self.attempts, self.auto_recover = attempts, auto_recover
        self.stats = Stats()
        self.cursor = 0  # where round robin looks next
        self.sessions: dict[str, int] = {}  # session id -> replica index

    def next_replica(self, exclude: set[int] = frozenset()) -> Replica | None:
        """The next healthy replica in round-robin order, skipping `exclude`; None if there is none."""
        # >>> TODO(ch06): the first healthy replica at or after self.cursor, wrapping around, not in exclude
        # Move the cursor just past the replica you return (only then), so that the next call starts
        # after it: with three healthy replicas, calls return 0, 1, 2, 0, 1, ... Read self.cursor and
        # self.replicas as they are at each call (a replica may have been replaced since the last).
        count = len(self.replicas)
        for step in range(count):
            replica = self.replicas[(self.cursor + step) % count]
            if replica.healthy and replica.index not in exclude:
                self.cursor = (replica.index + 1) % count
                return replica
        return None
        # <<< TODO

    def mark_unhealthy(self, replica: Replica, why: str) -> None:
        """Take `replica` out of rotation and (with auto_recover) start replacing it."""
        # >>> TODO(ch06): take a replica out of rotation once, count it, and start its recovery
        # Two requests can meet the same death: only the first report counts. A report about a
        # replica that is no longer in self.replicas (already replaced) changes nothing. Count one more
        # failure on the replica (replica.failures: every death at its index so far, carried into its
        # replacement) and one in self.stats.replica_failures; recover if self.auto_recover.
        if self.replicas[replica.index] is replica and replica.healthy:
            replica.healthy = False
            replica.failures += 1
            self.stats.replica_failures += 1
            if self.auto_recover:
                self.start_recovery(replica)
        # <<< TODO

    async def route(self, endpoint_name: str, *args, session: str | None = None, **kwargs):
        """Call `endpoint_name` on one healthy replica; retry on others if a replica fails."""
        self.stats.requests += 1
        attempts: list[Attempt] = []
        tried: set[int] = set()
        # >>> TODO(ch06): up to self.attempts tries, each on an untried replica; return the first reply, even None or 0
        # self._pick(session, tried) chooses the replica (None: nobody left to try). Each call waits at most
        # self.call_timeout. An endpoint error goes straight back to the caller, unretried: re-raise the
        # ActorError itself. A death or a timeout marks the replica called unhealthy (that one, though another may
        # hold its index by then), is recorded as Attempt(replica index, outcome kind, outcome.summary), and the
        # next try goes elsewhere; count stats.retries for every try after the first. On success,
        # self._served(replica, session). When no try is left: count stats.failed, raise
        # ServiceUnavailable(endpoint_name, attempts, self.healthy_count()).
        for number in range(self.attempts):
            replica = self._pick(session, tried)
            if replica is None:
                break
            if number > 0:
                self.stats.retries += 1
            call = getattr(replica.actor, endpoint_name).call_one(*args, **kwargs)
            outcome = await classify(call, self.call_timeout, where=f"replica {replica.index}")
            if outcome.ok:
                self._served(replica, session)
                return outcome.value
            if outcome.kind == "endpoint_error":
                raise outcome.value
            self.mark_unhealthy(replica, outcome.kind)
            attempts.append(Attempt(replica.index, outcome.kind, outcome.summary))
            tried.add(replica.index)
        self.stats.failed += 1
        raise ServiceUnavailable(endpoint_name, attempts, self.healthy_count())
        # <<< TODO

    # --- given: sessions, fanout, counters -----------------------------------------------------

    def _pick(self, session: str | None, tried: set[int]) -> Replica | None:
        """The session's replica while it is healthy; otherwise the next in round robin."""
        if session is not None and session in self.sessions:
            replica = self.replicas[self.sessions[session]]
            if replica.healthy and replica.index not in tried:
                return replica
        return self.next_replica(exclude=tried)

    def _served(self, replica: Replica, session: str | None) -> None:
        replica.served += 1
        self.stats.ok += 1
        self.stats.per_replica[replica.index] = self.stats.per_replica.get(replica.index, 0) + 1
        if session is not None:
            self.sessions[session] = replica.index

    async def fanout(self, endpoint_name: str, *args, **kwargs) -> dict[int, object]:
        """Call every healthy replica at once; {replica index: reply}. Replicas that fail are marked and left out."""
        targets = [r for r in self.replicas if r.healthy]
        outcomes = await asyncio.gather(*(classify(getattr(r.actor, endpoint_name).call_one(*args, **kwargs),
                                                   self.call_timeout) for r in targets))
        replies = {}
        for replica, outcome in zip(targets, outcomes):
            if outcome.ok:
                replies[replica.index] = outcome.value
            elif outcome.kind == "endpoint_error":
                raise outcome.value
            else:
                self.mark_unhealthy(replica, outcome.kind)
        return replies

    def snapshot(self) -> dict:
        """Counters for reports and tests."""
        return {"requests": self.stats.requests, "ok": self.stats.ok, "failed": self.stats.failed,
                "retries": self.stats.retries, "replica_failures": self.stats.replica_failures,
                "recoveries": self.recoveries, "per_replica": dict(self.stats.per_replica),
                "healthy": [r.healthy for r in self.replicas], "generations": [r.generation for r in self.replicas]}


if __name__ == "__main__":
    from .ch06_plumbing import main  # the demo and the chaos run: given code, safe to skip

    run_demo(main)
