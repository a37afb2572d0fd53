"""Chapter 05: supervision, noticing that a child has died.

With many generators, some will crash: a GPU falls off the bus, a process
runs out of memory, a host reboots. Two kinds of failure look alike from the
caller's side and must be told apart:

  an endpoint raised      the caller gets ActorError. The actor is fine and
                          will take the next message. Retrying the same
                          request will likely fail the same way.
  the process died        the caller gets SupervisionError. The actor is gone;
                          its mesh takes no new actors. Someone must make a
                          new one, on new processes.

Who is "someone"? In Monarch every actor mesh has an owner: whoever spawned
it. When a child process dies, its owner hears about it through
`__supervise__(failure)`. Returning True says "handled"; False passes the
failure up to the owner's owner, and at the top the job's fault hook (which
by default ends the program). That chain is the *supervision tree*:

    client (root)
      |  owns
    Supervisor ---- __supervise__(failure) ---+
      |  owns                                 | 1. record it
    child mesh (generation g)  X  dies        | 2. spawn generation g+1
                                              | 3. return True: handled
    child mesh (generation g+1) <-------------+

How fast a death is noticed is set per process, by the environment variable
HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY of the *owner's* process (e.g.
"1s"; Monarch's default is about 10 s). `spawn_supervisor(poll=...)` sets it
when it starts the supervisor's process.

Your TODOs:
  1. classify                  turn a call's result into ok / endpoint error / died / timeout
  2. Supervisor.__supervise__  ignore Monarch's own meshes; record the child's death; respawn

Check:     pytest tests/test_ch05_supervision.py     (or: koans check 5)
Run demo:  python -m solutions.ch05_supervision
Read:      docs/05_supervision.md
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from koans.demo import run_demo
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError  # not re-exported in 0.7
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


def classify(future, timeout: float = TIMEOUT, where: str = "") -> Outcome:
    """Wait for `future` and say what happened, without raising."""
    # >>> TODO(ch05): get the future's value; map each way it can fail to an Outcome kind
    #   value                      -> Outcome("ok", value, where)
    #   ActorError                 -> "endpoint_error"  (the actor raised; it is still alive)
    #   SupervisionError           -> "died"            (its process is gone)
    #   TimeoutError               -> "timeout"         (no answer in time: maybe hung, maybe slow)
    # Catch ActorError before anything broader. Let any other exception propagate.
    try:
        return Outcome("ok", future.get(timeout=timeout), where)
    except ActorError as err:
        return Outcome("endpoint_error", err, where)
    except SupervisionError as err:
        return Outcome("died", err, where)
    except TimeoutError as err:
        return Outcome("timeout", err, where)
    # <<< TODO


class Child(Actor):
    """The supervised worker: answers pings, can raise, can die."""

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


class Supervisor(Actor):
    """Owns one child on a mesh of its own, and replaces it when its process dies."""

    def __init__(self):
        self.generation = 0
        self.failures: list[dict] = []  # one per child death: {"generation", "mesh", "report"}
        self.child: Child | None = None
        self.spawn_child()

    def spawn_child(self) -> None:
        """A new child on a new process. A mesh that had a death refuses new actors, so never reuse it."""
        self.generation += 1
        self.child_procs: ProcMesh = this_host().spawn_procs(per_host={"procs": 1})
        self.child = self.child_procs.spawn(f"child_g{self.generation}", Child)

    def __supervise__(self, failure: MeshFailure) -> bool:
        """Called by Monarch when a mesh this actor owns fails. True = handled here."""
        # >>> TODO(ch05): handle the failures of meshes this supervisor owns
        #   failure.mesh_name starting with "logger": Monarch's own log forwarder on the dead
        #     process. Nothing to do: return True.
        #   starting with "child_g": our child died. Append {"generation": self.generation,
        #     "mesh": failure.mesh_name, "report": failure.report()} to self.failures,
        #     call self.spawn_child(), return True.
        #   anything else: not ours to handle; return False so the failure goes up the tree.
        name = str(failure.mesh_name)
        if name.startswith("logger"):
            return True
        if name.startswith("child_g"):
            self.failures.append({"generation": self.generation, "mesh": name, "report": failure.report()})
            self.spawn_child()
            return True
        return False
        # <<< TODO

    @endpoint
    def ask(self, x: int) -> dict:
        """Forward a ping to the current child; answer with its reply (or raise what it raised)."""
        return self.child.ping.call_one(x).get(timeout=TIMEOUT)

    @endpoint
    def provoke(self, how: str) -> str:
        """Make the child fail ("raise" or "crash"); answer the Outcome kind the supervisor saw."""
        endpoint_to_call = {"raise": self.child.fail, "crash": self.child.crash}[how]
        arguments = ("on purpose",) if how == "raise" else ()
        return classify(endpoint_to_call.call_one(*arguments), TIMEOUT).kind

    @endpoint
    def stop_child(self) -> None:
        """Stop the current child's process. An owner cleans up what it spawned before it goes."""
        self.child_procs.stop().get(timeout=TIMEOUT)

    @endpoint
    def status(self) -> dict:
        return {"generation": self.generation, "failures": list(self.failures), "poll": os.environ.get(POLL_ENV),
                "pid": os.getpid()}


def spawn_supervisor(poll: str = "1s", name: str = "supervisor") -> tuple[ProcMesh, Supervisor]:
    """Start a process for a Supervisor whose failure detection polls every `poll` (e.g. "500ms", "2s").

    The setting must be in the process's environment when it starts, so it is
    passed through the bootstrap command, not set later with os.environ.
    """
    command = default_bootstrap_cmd().with_env({POLL_ENV: poll})
    procs = this_host().spawn_procs(per_host={"procs": 1}, bootstrap_command=command)
    return procs, procs.spawn(name, Supervisor)


def stop_supervisor(procs: ProcMesh, supervisor: Supervisor, timeout: float = TIMEOUT) -> None:
    """Stop the child's process, then the supervisor's (which would otherwise orphan a child still starting)."""
    try:
        supervisor.stop_child.call_one().get(timeout=timeout)
    finally:
        procs.stop().get(timeout=timeout)


def wait_for_generation(supervisor: Supervisor, generation: int, timeout: float = TIMEOUT) -> dict:
    """Poll the supervisor's status until its child is at least `generation`; return the status."""
    deadline = time.monotonic() + timeout
    while True:
        status = supervisor.status.call_one().get(timeout=timeout)
        if status["generation"] >= generation:
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"the supervisor is still at generation {status['generation']} after {timeout} s: "
                               "is __supervise__ respawning the child?")
        time.sleep(0.05)


def main() -> None:
    print("Chapter 05: supervision\n")
    procs, supervisor = spawn_supervisor(poll="1s")
    try:
        first = supervisor.ask.call_one(1).get(timeout=TIMEOUT)
        print(f"generation 1 child answers from pid {first['pid']}")
        print(f"child raises inside an endpoint -> the supervisor sees: {supervisor.provoke.call_one('raise').get(timeout=TIMEOUT)}")
        print(f"  and the same child still answers: pid {supervisor.ask.call_one(2).get(timeout=TIMEOUT)['pid']}")
        started = time.monotonic()
        print(f"child's process exits            -> the supervisor sees: {supervisor.provoke.call_one('crash').get(timeout=TIMEOUT)}")
        status = wait_for_generation(supervisor, 2)
        print(f"__supervise__ recorded the death of {status['failures'][-1]['mesh']} and spawned generation {status['generation']} "
              f"({time.monotonic() - started:.1f} s after the crash, polling every {status['poll']})")
        print(f"the replacement answers from pid {supervisor.ask.call_one(3).get(timeout=TIMEOUT)['pid']}")
    finally:
        stop_supervisor(procs, supervisor)


if __name__ == "__main__":
    run_demo(main)
