"""Chapter 06 plumbing: starting, replacing and stopping the replicas of a Service; a stand-in
replica (Echo); the demo and the chaos run. You may skip this file; nothing in it is a TODO.

    python -m exercises.ch06_service            the demo, on your code (the reference: solutions.ch06_service)
    python -m exercises.ch06_service --chaos    requests keep flowing while replica processes are killed
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from dataclasses import dataclass

import monarch.actor
from koans.learn.demo import demo_options
from koans.testkit.monarch_compat import MESH_NAME_LIMIT, MONARCH_PROCESS_MESHES
from monarch.actor import Actor, ProcMesh, endpoint, this_host


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
    in_flight: int = 0  # calls made and not yet done (kept only when the actor is wrapped in InFlight)


class _ExpectedDeaths:
    """One fault hook for every open pool: it passes on a failure unless its mesh is one of theirs.
    Installed when the first pool opens, and the hook before it put back when the last one closes,
    in whatever order the pools close."""

    def __init__(self):
        self.prefixes: list[str] = []  # one per open pool (names may repeat)
        self.previous = None

    def expect(self, prefix: str) -> None:
        if not self.prefixes:
            self.previous = monarch.actor.unhandled_fault_hook
            monarch.actor.unhandled_fault_hook = self.hook
        self.prefixes.append(prefix)

    def stop_expecting(self, prefix: str) -> None:
        if prefix in self.prefixes:
            self.prefixes.remove(prefix)
        if not self.prefixes and monarch.actor.unhandled_fault_hook == self.hook:
            monarch.actor.unhandled_fault_hook = self.previous

    def hook(self, failure) -> None:
        mesh = str(getattr(failure, "mesh_name", ""))
        ours = tuple(prefix[:MESH_NAME_LIMIT] for prefix in self.prefixes)  # Monarch cuts long names
        if not mesh.startswith((*MONARCH_PROCESS_MESHES, *ours)):
            self.previous(failure)


_expected_deaths = _ExpectedDeaths()


def replica_label(actor_name: str, role: str) -> str:
    """How reports name a replica by its actor's name ('<service name><index>_g<generation>', as ReplicaPool
    makes it): 'generator 0', and 'generator 0 (g2)' for the replacement after its first death."""
    found = re.search(r"(\d+)_g(\d+)$", actor_name)
    if found is None:
        return actor_name
    index, generation = found.groups()
    return f"{role} {index}" + (f" (g{generation})" if generation != "1" else "")


class ReplicaPool:
    """N replicas of `actor_class`, each on a process of its own; replaces dead ones on request.

    Recovery runs as an asyncio task on the loop of whoever asked for it, so a
    pool lives on one event loop (use it inside `async with`). Every process
    it ever starts is stopped by `close()`, including one a cancelled recovery
    had just started.

    Where a replica's process goes is `_new_procs` (this host), and how a dead
    replica's process is let go is `_retire` (stop it); ch10_multihost.HostService
    overrides both to spread replicas over a job's hosts and survive losing one.
    """

    def __init__(self, actor_class: type, *args, replicas: int, name: str, call_timeout: float):
        if replicas < 1:
            raise ValueError(f"need at least 1 replica, got replicas={replicas}")
        self.actor_class, self.args, self.name, self.call_timeout = actor_class, args, name, call_timeout
        self.recovering: dict[int, asyncio.Task] = {}
        self.recoveries = 0
        self.recovery_errors: list[str] = []
        self.closed = False
        self._spawned: list[ProcMesh] = []
        self._install_fault_filter()
        self.replicas = [self._start_replica(index, generation=1) for index in range(replicas)]

    def _install_fault_filter(self) -> None:
        """Expect our replicas to die. The pool owns their meshes, so Monarch reports each death to the
        job's fault hook, whose default ends the program. Deaths of our replicas (and of the meshes
        Monarch keeps on every process, MONARCH_PROCESS_MESHES, which die with it) are handled by the service's retry
        and recovery; every other failure still goes to the hook that was there before (_expected_deaths)."""
        _expected_deaths.expect(self.name)
    def _new_procs(self, index: int) -> ProcMesh:
        """A new process for replica `index`: here, on this host."""
        return this_host().spawn_procs(per_host={"procs": 1})

    def _start_replica(self, index: int, generation: int) -> Replica:
        procs = self._new_procs(index)
        self._spawned.append(procs)
        actor = procs.spawn(f"{self.name}{index}_g{generation}", self.actor_class, *self.args)
        return Replica(index, procs, actor, generation)

    async def _stop(self, procs: ProcMesh) -> None:
        try:
            await asyncio.wait_for(procs.stop(), self.call_timeout)
        except Exception:
            pass  # a dead process may not stop cleanly; it is gone either way
        if procs in self._spawned:
            self._spawned.remove(procs)

    def start_recovery(self, replica: Replica) -> None:
        """Replace `replica` by a new one on a new process, in the background (an asyncio task)."""
        if replica.index not in self.recovering and not self.closed:
            self.recovering[replica.index] = asyncio.get_running_loop().create_task(self._recover(replica))

    async def _retire(self, old: Replica) -> None:
        """Let a dead or hung replica's process go before its replacement starts."""
        await self._stop(old.procs)  # a hung process must not linger

    async def _recover(self, old: Replica) -> None:
        try:
            await self._retire(old)
            if self.closed:
                return
            new = self._start_replica(old.index, old.generation + 1)
            new.served, new.failures = old.served, old.failures
            self.replicas[old.index] = new
            self.recoveries += 1
        except Exception as err:  # say so; the replica stays out of rotation
            self.recovery_errors.append(f"replica {old.index}: {type(err).__name__}: {err}")
        finally:
            self.recovering.pop(old.index, None)

    def recover_now(self) -> None:
        """Start recovering every unhealthy replica (when auto_recover is off)."""
        for replica in self.replicas:
            if not replica.healthy:
                self.start_recovery(replica)

    async def wait_recovered(self, timeout: float | None = None) -> None:
        """Wait until every recovery started so far has finished."""
        timeout = self.call_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while self.recovering:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"replicas {sorted(self.recovering)} still recovering after {timeout} s")
            await asyncio.wait(list(self.recovering.values()), timeout=left)

    def healthy_count(self) -> int:
        return sum(r.healthy for r in self.replicas)

    async def close(self) -> None:
        """Stop every replica's process, after any recovery in flight."""
        if self.closed:
            return
        self.closed = True
        _expected_deaths.stop_expecting(self.name)
        loop = asyncio.get_running_loop()
        mine = [t for t in self.recovering.values() if not t.done() and t.get_loop() is loop]
        if mine:
            await asyncio.wait(mine, timeout=self.call_timeout)
        await asyncio.gather(*(self._stop(procs) for procs in list(self._spawned)))

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


class InFlight:
    """Wraps a replica's actor: every call made through it counts in `replica.in_flight` until it is done
    (answered, failed, or given up by its caller's timeout)."""

    def __init__(self, actor, replica: Replica):
        self._actor, self._replica = actor, replica

    def __getattr__(self, name: str):
        return _CountedEndpoint(getattr(self._actor, name), self._replica)


class _CountedEndpoint:
    def __init__(self, endpoint, replica: Replica):
        self._endpoint, self._replica = endpoint, replica

    def call_one(self, *args, **kwargs):
        return _Counted(self._endpoint.call_one(*args, **kwargs), self._replica)


class _Counted:
    """An awaitable call that counts itself in flight from its start until it ends (or is cancelled)."""

    def __init__(self, future, replica: Replica):
        self._future, self._replica = future, replica
        replica.in_flight += 1

    def __await__(self):
        try:
            return (yield from self._future.__await__())
        finally:
            self._replica.in_flight -= 1

    def get(self, timeout: float | None = None):
        try:
            return self._future.get(timeout=timeout)
        finally:
            self._replica.in_flight -= 1


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


async def kill_replica(service, index: int) -> int:
    """SIGKILL replica `index`'s process from outside, as a machine failure would. Answers the pid."""
    pid = await asyncio.wait_for(service.replicas[index].actor.whoami.call_one(), service.call_timeout)
    os.kill(pid, signal.SIGKILL)
    return pid


async def chaos(requests: int = 240, kills: int = 4, replicas: int = 3, concurrency: int = 4) -> dict:
    """`requests` requests, `concurrency` in flight at a time, while a replica process is SIGKILLed
    `kills` times at evenly spaced points; answers the figures."""
    from .ch06_service import Service, ServiceUnavailable

    kill_at = {requests * (n + 1) // (kills + 1) for n in range(kills)}
    answers, failed, killed = {}, [], []
    issued = iter(range(requests))

    async with Service(Echo, replicas=replicas, name="chaos", attempts=replicas) as service:
        await service.route("handle", -1)  # replicas are up
        started = time.monotonic()

        async def stream() -> None:
            for i in issued:  # the streams share one iterator: each request is sent once
                if i in kill_at:
                    await service.wait_recovered()  # kill a live process, not one already being replaced
                    victim = len(killed) % replicas
                    killed.append((i, victim, await kill_replica(service, victim)))
                try:
                    answers[i] = (await service.route("handle", i))["y"]
                except ServiceUnavailable:
                    failed.append(i)

        await asyncio.gather(*(stream() for _ in range(concurrency)))
        took = time.monotonic() - started
        await service.wait_recovered()
        figures = service.snapshot()
        wrong = [i for i, y in answers.items() if y != i * i]
        figures.update(killed=killed, answered=len(answers), wrong=wrong, failed_seen_by_caller=len(failed),
                       seconds=took, healthy_at_end=service.healthy_count(), sent=requests)
    return figures


async def demo() -> None:
    from .ch06_service import Service

    print("Chapter 06: a service over three replicas\n")
    # Automatic recovery is off here, so that you can see the service run on two replicas; by default
    # it starts at the first report of a death, and the replacement is up within seconds.
    async with Service(Echo, replicas=3, name="demo", auto_recover=False) as service:
        pids = [(await service.route("handle", i))["pid"] for i in range(6)]
        print(f"round robin, 6 requests -> pids {pids}")
        alice = [(await service.route("handle", i, session="alice"))["pid"] for i in range(3)]
        print(f"session 'alice' sticks: {alice}")
        victim = service.sessions["alice"]
        print(f"\nSIGKILL replica {victim} (alice's), then keep routing:")
        await kill_replica(service, victim)
        for i in range(4):
            reply = await service.route("handle", i, session="alice")
            print(f"  request {i} for alice answered by pid {reply['pid']}")
        answering = await service.fanout("whoami")
        print(f"now replicas {sorted(answering)} answer; replica {victim} is out of rotation "
              f"(healthy: {service.snapshot()['healthy']}, retries so far: {service.stats.retries})")
        service.recover_now()
        await service.wait_recovered()
        after = await service.fanout("whoami")
        print(f"after its recovery: replicas {sorted(after)} answer; generations {service.snapshot()['generations']}")
        many = await asyncio.gather(*(service.route("handle", i) for i in range(12)))
        print(f"12 requests at once, one event loop: {len({r['pid'] for r in many})} replicas served them")
        try:
            await service.route("reject", "malformed prompt")
        except Exception as err:
            print(f"\nan endpoint error is the request's fault, not retried: {type(err).__name__}")


async def chaos_demo() -> None:
    print("Chapter 06: chaos run (killing replica processes while requests flow)\n")
    figures = await chaos()
    for at, victim, pid in figures["killed"]:
        print(f"  at request {at:>3}: SIGKILL replica {victim} (pid {pid})")
    print(f"\nsent {figures['sent']}  answered {figures['answered']} (wrong {len(figures['wrong'])})  "
          f"failed {figures['failed_seen_by_caller']}  retried {figures['retries']}  "
          f"replica deaths seen {figures['replica_failures']}  recoveries {figures['recoveries']}  "
          f"in {figures['seconds']:.1f} s")
    print(f"served per replica: {figures['per_replica']}; generations now {figures['generations']}; "
          f"healthy at the end: {figures['healthy_at_end']}/{len(figures['generations'])}")


def main() -> None:
    args = demo_options(f"{__package__}.ch06_service", "Chapter 06's demo: a service over three replicas.",
                        (("--chaos", "240 requests, four at a time, while replica processes are killed"),))
    asyncio.run(chaos_demo() if args.chaos else demo())
