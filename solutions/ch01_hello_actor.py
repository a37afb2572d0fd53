"""Chapter 01: hello, actor.

An actor is an object that lives in one process, owns its state, and is
reached only through messages. Its endpoints are the methods others may call.
A caller never touches the actor's memory: it sends a message and gets back a
Future, which it waits on with `.get(timeout=...)` (plain code) or `await`
(async code).

Where an actor lives is chosen when it is spawned, on a ProcMesh:
  - `this_proc()`                                   the calling process itself
  - `this_host().spawn_procs(per_host={"procs": 1})` one new process

The same `.spawn(name, ActorClass, *args)` works on both, and the code that
calls the actor does not change. That sameness is the whole point of Monarch:
distributed code that reads like local code.

Your TODOs:
  1. Greeter.greet         an endpoint that reads and updates the actor's state
  2. Greeter.whereabouts   an endpoint that reports the actor's process and device
  3. start_one_process     make a ProcMesh of one new process
  4. spawn_greeter         put a Greeter on any ProcMesh

Given, safe to skip: ch01_plumbing.py (the demo).
Check: koans check 1    Demo: python -m exercises.ch01_hello_actor    Read: docs/01_hello_actor.md
"""

import os
import socket

import torch
from koans.learn.demo import run_demo
from monarch.actor import Actor, ProcMesh, endpoint, this_host


class Greeter(Actor):
    """Greets whoever asks, and remembers how many greetings it has given."""

    def __init__(self, name: str):
        # Runs once, in the actor's own process, before the first message.
        self.name = name
        self.greetings_given = 0

    @endpoint
    def greet(self, who: str) -> str:
        # >>> TODO(ch01): count this greeting, then return the greeting text
        # Returns "Hello, <who>! I am <name> (greeting #<n>)." where n counts this actor's
        # greetings, this one included. The count is this actor's own: it survives between calls.
        self.greetings_given += 1
        return f"Hello, {who}! I am {self.name} (greeting #{self.greetings_given})."
        # <<< TODO

    @endpoint
    def whereabouts(self) -> dict:
        """Where this actor runs: {"pid", "host", "device"}.

        "device" names the torch device this actor would compute on, as a str:
        "cuda" when its own process can see a GPU, else "cpu".
        """
        # >>> TODO(ch01): report this actor's pid, host name and torch device
        # The answers must come from the actor's own process: the caller's could differ.
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return {"pid": os.getpid(), "host": socket.gethostname(), "device": device}
        # <<< TODO


def start_one_process() -> ProcMesh:
    """A ProcMesh of one new process on this host, along one dimension named "procs" (stop it with `.stop()`)."""
    # >>> TODO(ch01): spawn one new process on this host and return its ProcMesh
    return this_host().spawn_procs(per_host={"procs": 1})
    # <<< TODO


def spawn_greeter(procs: ProcMesh, name: str) -> Greeter:
    """Spawn a Greeter called `name` on `procs` (this_proc() or a new mesh)."""
    # >>> TODO(ch01): spawn a Greeter on the given ProcMesh, passing `name` to its __init__
    # The actor itself is spawned under `name` as well, so that Monarch's logs and failure reports
    # tell two greeters apart.
    return procs.spawn(name, Greeter, name)
    # <<< TODO


async def greet_twice(greeter: Greeter, who: str) -> list[str]:
    """Inside async code, futures are awaited instead of `.get()`."""
    first = await greeter.greet.call_one(who)
    second = await greeter.greet.call_one(who)
    return [first, second]


if __name__ == "__main__":
    from .ch01_plumbing import main  # the demo: given code, safe to skip

    run_demo(main)
