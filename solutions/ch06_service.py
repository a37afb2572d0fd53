"""Chapter 06: a service that routes around failed replicas.

An RL job runs many generator replicas, and callers should not care which one
answers, or that one of them died a second ago. A *service* is the one handle
they use instead:

                        +-----------------+    replica 0 (own process)  healthy
    route("generate") ->|  Service        |--> replica 1 (own process)  X died -> recovering
                        |  round robin,   |--> replica 2 (own process)  healthy
                        |  retry, health  |
                        +-----------------+

  route     pick the next healthy replica (round robin) and call it. If the
            call fails because the replica died or did not answer in time,
            mark it unhealthy and try another one, up to `attempts` tries.
            An exception *inside* the endpoint is the request's fault, not
            the replica's: it goes straight back to the caller.
  recovery  an unhealthy replica is replaced in the background by a new one
            on a new process (a mesh with a death takes no new actors).
  fanout    call every healthy replica (e.g. "load these weights").
  sessions  route(..., session="abc") keeps going to the same replica while
            it is healthy (its caches stay warm).

Chapter 05's `classify` tells the kinds of failure apart.

Your TODOs:
  1. Service.next_replica     round robin over the healthy replicas
  2. Service.mark_unhealthy   health bookkeeping, and start the recovery
  3. Service.route            call, and retry on another replica when one fails

Check:     pytest tests/test_ch06_service.py     (or: koans check 6)
Run demo:  python -m solutions.ch06_service      (chaos run: add --chaos)
Read:      docs/06_service.md
"""

from __future__ import annotations

import os

# Notice dead replicas within ~1 s instead of Monarch's default ~10 s (chapter 05). Monarch reads
# this when it is first imported, so it is set before anything imports monarch.
os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")

import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import monarch.actor
from koans.demo import run_demo
from monarch.actor import Actor, ProcMesh, endpoint, this_host

from .ch05_supervision import Outcome, classify

TIMEOUT = 30.0


@dataclass
class Replica:
    """One copy of the actor on a process of its own, with its health and counters."""

    index: int
    procs: ProcMesh
    actor: object
    generation: int = 1
    healthy: bool = True
    served: int = 0
    failures: int = 0


@dataclass
class Attempt:
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
    replica_failures: int = 0
    recoveries: int = 0
    per_replica: dict[int, int] = field(default_factory=dict)  # replica index -> requests it served


class Service:
    """N replicas of `actor_class`, each on its own process, behind one `route`."""

    def __init__(self, actor_class: type, *args, replicas: int = 3, name: str = "replica", attempts: int = 3,
                 call_timeout: float = TIMEOUT, auto_recover: bool = True):
        if replicas < 1 or attempts < 1:
            raise ValueError(f"need at least 1 replica and 1 attempt, got replicas={replicas}, attempts={attempts}")
        self.actor_class, self.args, self.name = actor_class, args, name
        self.attempts, self.call_timeout, self.auto_recover = attempts, call_timeout, auto_recover
        self.lock = threading.RLock()
        self.stats = Stats()
        self.cursor = 0  # where round robin looks next
        self.sessions: dict[str, int] = {}  # session id -> replica index
        self.recovering: dict[int, threading.Thread] = {}
        self.closed = False
        self._install_fault_filter()
        self.replicas = [self._start_replica(index, generation=1) for index in range(replicas)]

    # --- given: starting and recovering replicas ---------------------------------------------

    def _install_fault_filter(self) -> None:
        """Expect our replicas to die. The service owns their meshes, so Monarch reports each death
        to the job's fault hook, whose default ends the program. Deaths of our replicas (and of
        Monarch's per-process "logger" meshes, which die with every process) are handled here by
        route's retry and recovery; every other failure still goes to the previous hook."""
        self._previous_hook = previous = monarch.actor.unhandled_fault_hook
        prefix = f"{self.name}"

        def hook(failure) -> None:
            mesh = str(getattr(failure, "mesh_name", ""))
            if not (mesh.startswith(prefix) or mesh.startswith("logger")):
                previous(failure)

        self._hook = hook
        monarch.actor.unhandled_fault_hook = hook

    def _start_replica(self, index: int, generation: int) -> Replica:
        procs = this_host().spawn_procs(per_host={"procs": 1})
        actor = procs.spawn(f"{self.name}{index}_g{generation}", self.actor_class, *self.args)
        return Replica(index, procs, actor, generation)

    def _recover(self, old: Replica) -> None:
        """Replace `old` with a fresh replica on a new process (runs in a background thread)."""
        try:
            old.procs.stop().get(timeout=self.call_timeout)  # a hung process must not linger
        except Exception:
            pass  # a dead process may not stop cleanly; it is gone either way
        if self.closed:
            return
        new = self._start_replica(old.index, old.generation + 1)
        with self.lock:
            if self.closed:
                new.procs.stop().get(timeout=self.call_timeout)
                return
            new.served, new.failures = old.served, old.failures
            self.replicas[old.index] = new
            self.recovering.pop(old.index, None)
            self.stats.recoveries += 1

    def wait_recovered(self, timeout: float = TIMEOUT) -> None:
        """Wait until every recovery started so far has finished."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                threads = list(self.recovering.values())
            if not threads:
                return
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            if time.monotonic() > deadline:
                raise TimeoutError(f"replicas {sorted(self.recovering)} still recovering after {timeout} s")

    def recover_now(self) -> None:
        """Start recovering every unhealthy replica (when auto_recover is off)."""
        with self.lock:
            for replica in self.replicas:
                if not replica.healthy and replica.index not in self.recovering:
                    self._start_recovery(replica)

    def _start_recovery(self, replica: Replica) -> None:
        thread = threading.Thread(target=self._recover, args=(replica,), name=f"recover-{replica.index}", daemon=True)
        self.recovering[replica.index] = thread
        thread.start()

    # --- the learner's part ------------------------------------------------------------------

    def next_replica(self, exclude: set[int] = frozenset()) -> Replica | None:
        """The next healthy replica in round-robin order, skipping `exclude`; None if there is none."""
        with self.lock:
            # >>> TODO(ch06): scan the replicas starting at self.cursor; return the first healthy one not excluded
            # Advance self.cursor to just past the one returned, so the next call starts after it.
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
        with self.lock:
            # >>> TODO(ch06): take a still-healthy replica out of rotation once, count it, start its recovery
            # Act only if self.replicas[replica.index] is replica and it is healthy: two callers can see
            # the same death. Then: healthy = False; add 1 to replica.failures and to
            # self.stats.replica_failures; if self.auto_recover, call self._start_recovery(replica).
            if self.replicas[replica.index] is replica and replica.healthy:
                replica.healthy = False
                replica.failures += 1
                self.stats.replica_failures += 1
                if self.auto_recover:
                    self._start_recovery(replica)
            # <<< TODO

    def route(self, endpoint_name: str, *args, session: str | None = None, **kwargs):
        """Call `endpoint_name` on one healthy replica; retry on others if a replica fails."""
        with self.lock:
            self.stats.requests += 1
        attempts: list[Attempt] = []
        tried: set[int] = set()
        # >>> TODO(ch06): up to self.attempts times: pick a replica, call it, and act on the Outcome
        #   replica = self._pick(session, tried)        (None: no healthy replica left -> stop trying)
        #   outcome = classify(getattr(replica.actor, endpoint_name).call_one(*args, **kwargs),
        #                      self.call_timeout, where=f"replica {replica.index}")
        #   "ok":             self._served(replica, session); return outcome.value
        #   "endpoint_error": raise outcome.value (the request is at fault; another replica won't help)
        #   "died"/"timeout": self.mark_unhealthy(replica, ...); remember Attempt(replica.index, kind, outcome.summary);
        #                     add replica.index to tried, count a retry if another attempt follows
        # When the loop ends: count the request failed, raise ServiceUnavailable(endpoint_name, attempts, healthy).
        for number in range(self.attempts):
            replica = self._pick(session, tried)
            if replica is None:
                break
            if number > 0:
                with self.lock:
                    self.stats.retries += 1
            outcome: Outcome = classify(getattr(replica.actor, endpoint_name).call_one(*args, **kwargs),
                                        self.call_timeout, where=f"replica {replica.index}")
            if outcome.ok:
                self._served(replica, session)
                return outcome.value
            if outcome.kind == "endpoint_error":
                raise outcome.value
            self.mark_unhealthy(replica, outcome.kind)
            attempts.append(Attempt(replica.index, outcome.kind, outcome.summary))
            tried.add(replica.index)
        with self.lock:
            self.stats.failed += 1
        raise ServiceUnavailable(endpoint_name, attempts, self.healthy_count())
        # <<< TODO

    # --- given: sessions, fanout, stats ------------------------------------------------------

    def _pick(self, session: str | None, tried: set[int]) -> Replica | None:
        """The session's replica while it is healthy; otherwise the next in round robin."""
        with self.lock:
            if session is not None and session in self.sessions:
                replica = self.replicas[self.sessions[session]]
                if replica.healthy and replica.index not in tried:
                    return replica
            return self.next_replica(exclude=tried)

    def _served(self, replica: Replica, session: str | None) -> None:
        with self.lock:
            replica.served += 1
            self.stats.ok += 1
            self.stats.per_replica[replica.index] = self.stats.per_replica.get(replica.index, 0) + 1
            if session is not None:
                self.sessions[session] = replica.index

    def fanout(self, endpoint_name: str, *args, **kwargs) -> dict[int, object]:
        """Call every healthy replica at once; {replica index: reply}. Replicas that fail are marked and left out."""
        with self.lock:
            targets = [r for r in self.replicas if r.healthy]
        futures = [(r, getattr(r.actor, endpoint_name).call_one(*args, **kwargs)) for r in targets]
        replies = {}
        for replica, future in futures:
            outcome = classify(future, self.call_timeout)
            if outcome.ok:
                replies[replica.index] = outcome.value
            elif outcome.kind == "endpoint_error":
                raise outcome.value
            else:
                self.mark_unhealthy(replica, outcome.kind)
        return replies

    def healthy_count(self) -> int:
        with self.lock:
            return sum(r.healthy for r in self.replicas)

    def snapshot(self) -> dict:
        """Counters for reports and tests."""
        with self.lock:
            return {"requests": self.stats.requests, "ok": self.stats.ok, "failed": self.stats.failed,
                    "retries": self.stats.retries, "replica_failures": self.stats.replica_failures,
                    "recoveries": self.stats.recoveries, "per_replica": dict(self.stats.per_replica),
                    "healthy": [r.healthy for r in self.replicas], "generations": [r.generation for r in self.replicas]}

    def close(self) -> None:
        """Stop every replica's process, after any recovery in flight."""
        self.closed = True
        if monarch.actor.unhandled_fault_hook is self._hook:
            monarch.actor.unhandled_fault_hook = self._previous_hook
        for thread in list(self.recovering.values()):
            thread.join(self.call_timeout)
        for replica in self.replicas:
            try:
                replica.procs.stop().get(timeout=self.call_timeout)
            except Exception:
                pass  # already dead


class Echo(Actor):
    """A stand-in generator: answers with its work and its pid; can fail on request."""

    @endpoint
    def handle(self, x: int) -> dict:
        return {"x": x, "y": x * x, "pid": os.getpid()}

    @endpoint
    def whoami(self) -> int:
        return os.getpid()

    @endpoint
    def reject(self, reason: str) -> None:
        raise ValueError(reason)

    @endpoint
    def crash(self) -> None:
        os._exit(1)

    @endpoint
    def hang(self, seconds: float) -> None:
        time.sleep(seconds)


def kill_replica(service: Service, index: int) -> int:
    """SIGKILL replica `index`'s process from outside, as a machine failure would. Returns the pid."""
    pid = service.replicas[index].actor.whoami.call_one().get(timeout=TIMEOUT)
    os.kill(pid, signal.SIGKILL)
    return pid


def chaos(requests: int = 240, kills: int = 4, replicas: int = 3) -> dict:
    """Send `requests` requests while killing a replica process `kills` times; report the figures."""
    service = Service(Echo, replicas=replicas, name="chaos", attempts=replicas)
    kill_at = {requests * (n + 1) // (kills + 1): n for n in range(kills)}
    failed, killed = 0, []
    try:
        service.route("handle", 0)  # replicas are up
        started = time.monotonic()
        for i in range(requests):
            if i in kill_at:
                victim = (i // 7) % replicas
                service.wait_recovered()  # kill a live process, not one already being replaced
                killed.append((i, victim, kill_replica(service, victim)))
            try:
                assert service.route("handle", i)["y"] == i * i
            except ServiceUnavailable:
                failed += 1
        took = time.monotonic() - started
        service.wait_recovered()
        figures = service.snapshot()
        figures.update(killed=killed, failed_seen_by_caller=failed, seconds=took, healthy_at_end=service.healthy_count())
        return figures
    finally:
        service.close()


def main() -> None:
    if "--chaos" in sys.argv:
        print("Chapter 06: chaos run (killing replica processes while requests flow)\n")
        figures = chaos()
        for at, victim, pid in figures["killed"]:
            print(f"  before request {at:>3}: SIGKILL replica {victim} (pid {pid})")
        print(f"\nrequests {figures['requests'] - 1}  ok {figures['ok'] - 1}  failed {figures['failed_seen_by_caller']}  "
              f"retried {figures['retries']}  replica deaths seen {figures['replica_failures']}  "
              f"recoveries {figures['recoveries']}  in {figures['seconds']:.1f} s")
        print(f"served per replica: {figures['per_replica']}; generations now {figures['generations']}; "
              f"healthy at the end: {figures['healthy_at_end']}/{len(figures['generations'])}")
        return
    print("Chapter 06: a service over three replicas\n")
    service = Service(Echo, replicas=3, name="demo")
    try:
        pids = [service.route("handle", i)["pid"] for i in range(6)]
        print(f"round robin, 6 requests -> pids {pids}")
        print(f"session 'alice' sticks: {[service.route('handle', i, session='alice')['pid'] for i in range(3)]}")
        victim = service.sessions["alice"]
        print(f"\nSIGKILL replica {victim} (alice's), then keep routing:")
        kill_replica(service, victim)
        for i in range(4):
            reply = service.route("handle", i, session="alice")
            print(f"  request {i} for alice answered by pid {reply['pid']}")
        print(f"fanout right after the death: {len(service.fanout('whoami'))} replicas answer (the dead one is skipped until replaced)")
        service.wait_recovered()
        print(f"after recovery: {len(service.fanout('whoami'))} replicas answer; stats {service.snapshot()}")
        try:
            service.route("reject", "malformed prompt")
        except Exception as err:
            print(f"\nan endpoint error is the request's fault, not retried: {type(err).__name__}")
    finally:
        service.close()


if __name__ == "__main__":
    run_demo(main)
