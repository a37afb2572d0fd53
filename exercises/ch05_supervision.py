"""Chapter 05: supervision, noticing that a child has died.

Three ways a call goes wrong look alike to the caller, and need different answers:

  the endpoint raised   ActorError: the actor is fine; retrying the request fails again
  the process died      SupervisionError: the actor is gone; start a new one elsewhere
  no answer in time     your timeout: hung, slow, or dead and not yet noticed; giving up
                        does not stop the call, which may still run to its end there

Every mesh has an owner, whoever spawned it. When a child process dies, Monarch
calls the owner's `__supervise__(failure)`: True means handled; False passes it
up to the owner's owner, and at the top to the job's fault hook (by default:
exit). From here on, code waits the asyncio way: `await asyncio.wait_for(future,
timeout)`. Chapters 06-11 wait only so.

Your TODOs:
  1. classify                  wait for a call; say what became of it: ok / endpoint error / died / timeout
  2. Supervisor.__supervise__  know the child by what you spawned; record its death; respawn it

Given, safe to skip: ch05_plumbing.py (the demo, and helpers the tests use).
Check: koans check 5    Demo: python -m exercises.ch05_supervision    Read: docs/05_supervision.md
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any

from koans.learn.demo import run_demo
from koans.testkit.monarch_compat import SupervisionError  # Monarch does not export it publicly yet
from monarch.actor import Actor, ActorError, MeshFailure, ProcMesh, default_bootstrap_cmd, endpoint, this_host

POLL_ENV = "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY"
TIMEOUT = 30.0


@dataclass(frozen=True)
class Outcome:
    """What became of one call: kind is "ok", "endpoint_error", "died" or "timeout"."""

    kind: str
    value: Any = None  # the reply when ok, else the exception
    where: str = ""

    @property
    def ok(self) -> bool:
        return self.kind == "ok"

    @property
    def summary(self) -> str:
        """One line about what happened, for logs and error messages."""
        if self.kind == "timeout":
            return "no answer in time"
        lines = str(self.value).strip().splitlines()
        return lines[0][:200] if lines else type(self.value).__name__


async def classify(future, timeout: float = TIMEOUT, where: str = "") -> Outcome:
    """Wait for `future` (at most `timeout` seconds) and say what became of the call. Never raises
    for the three failures it tells apart; any other exception propagates."""
    # Kinds: "ok" (value: the reply), "endpoint_error" (the endpoint raised; the actor lives on),
    # "died" (its process is gone), "timeout" (no reply in time). For a failure, the value is the
    # exception itself, which a caller can raise again. Every Outcome carries `where`. A cancelled
    # caller is not a timeout: the cancellation propagates.
    raise NotImplementedError("TODO(ch05): wait for the future within `timeout`; map the reply or the failure to an Outcome")


class Child(Actor):
    """The supervised worker: answers pings, can raise, can die, can stall."""

    @endpoint
    def ping(self, x: int) -> dict:
        return {"x": x, "pid": os.getpid()}

    @endpoint
    def fail(self, message: str) -> None:
        raise ValueError(message)

    @endpoint
    def crash(self) -> None:
        os._exit(1)  # the whole process, as when a machine dies

    @endpoint
    def stall(self, seconds: float) -> str:
        time.sleep(seconds)  # a hung or overloaded process looks like this from outside
        return "finally"


def spawned_as(failure: MeshFailure) -> str:
    """The name the failed mesh was spawned with: Monarch names a mesh "<that name>-<unique suffix>"."""
    return str(failure.mesh_name).rsplit("-", 1)[0]


class Supervisor(Actor):
    """Owns one child on a process of its own, and replaces it when that process dies."""

    def __init__(self):
        self.generation = 0
        self.failures: list[dict] = []  # one per child death: {"generation", "mesh", "report"}
        self.spawn_child()

    def spawn_child(self) -> None:
        """A new child, generation g+1, on a new process (a dead process takes no new actors)."""
        self.generation += 1
        self.child_name = f"child_g{self.generation}"  # what the child is spawned as: how to know it again
        self.child_procs: ProcMesh = this_host().spawn_procs(per_host={"procs": 1})
        self.child = self.child_procs.spawn(self.child_name, Child)

    def __supervise__(self, failure: MeshFailure) -> bool:
        """Called by Monarch when a mesh this actor owns fails. True = handled here."""
        # Monarch calls this for each mesh that fails on a process this supervisor started: the child,
        # and meshes Monarch runs there for itself (which ones, and their names, change between Monarch
        # versions). Know the child by what you spawned it as (self.child_name; see spawned_as), never
        # by Monarch's names. The current child's failure: append {"generation": self.generation,
        # "mesh": failure.mesh_name, "report": failure.report()} to self.failures, then start the next
        # generation. Each death is recorded and replaced once, however many failures report it. Any
        # other mesh: nothing to record or replace. Handled either way (False would fail the supervisor
        # itself, and pass it all up).
        raise NotImplementedError("TODO(ch05): know your child by what you spawned; record and replace each of its deaths once")

    @endpoint
    async def ask(self, x: int) -> dict:
        """Forward a ping to the current child; answer with its reply (or raise what it raised)."""
        return await asyncio.wait_for(self.child.ping.call_one(x), TIMEOUT)

    @endpoint
    async def provoke(self, how: str) -> str:
        """Make the child fail ("raise" or "crash"); answer the Outcome kind the supervisor saw."""
        call = self.child.fail.call_one("on purpose") if how == "raise" else self.child.crash.call_one()
        return (await classify(call, TIMEOUT)).kind

    @endpoint
    async def stop_child(self) -> None:
        """Stop the current child's process. An owner cleans up what it spawned before it goes."""
        await asyncio.wait_for(self.child_procs.stop(), TIMEOUT)

    @endpoint
    async def status(self) -> dict:
        return {"generation": self.generation, "failures": list(self.failures), "poll": os.environ.get(POLL_ENV),
                "pid": os.getpid()}


def spawn_supervisor(poll: str = "1s", name: str = "supervisor") -> tuple[ProcMesh, Supervisor]:
    """Start a process for a Supervisor that checks its children every `poll` (e.g. "500ms", "2s").

    Monarch reads the poll interval once, when it is imported in a process. So it
    goes into the new process's environment at start, through its bootstrap
    command; setting os.environ in a running process changes nothing.
    """
    command = default_bootstrap_cmd().with_env({POLL_ENV: poll})
    procs = this_host().spawn_procs(per_host={"procs": 1}, bootstrap_command=command)
    return procs, procs.spawn(name, Supervisor)


if __name__ == "__main__":
    from .ch05_plumbing import main  # the demo: given code, safe to skip

    run_demo(main)
