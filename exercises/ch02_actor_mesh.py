"""Chapter 02: actor meshes and adverbs.

Spawning on a ProcMesh of N processes gives an ActorMesh: N actors, one per
process, behind one handle. Instead of rank checks, you say *who* gets a
message with an adverb: `call` (every actor, a ValueMesh of replies),
`broadcast` (every actor, no reply: an exception it raises has no caller to go
to, so it kills the actor), `call_one` (the one actor of a mesh),
`choose` (one actor, picked for you), and `slice` to address part of a mesh.

Two coordinates, not to be mixed up: the actor's place in the mesh it was
spawned on (fixed), and `current_rank()`, where the *current message* sees it
(a slice renumbers it). Split work by the message's view.

Your TODOs:
  1. Worker.whoami          report both kinds of coordinates, and the pid
  2. Worker.add             per-actor state
  3. Worker.sum_my_share    per-rank work: this actor's share of a list
  4. sum_of_squares         call() the whole mesh and combine the ValueMesh

Given, safe to skip: ch02_plumbing.py (the demo).
Check: koans check 2    Demo: python -m exercises.ch02_actor_mesh    Read: docs/02_actor_mesh.md
"""

import math
import os

from koans.learn.demo import run_demo
from monarch.actor import Actor, ProcMesh, current_rank, current_size, endpoint


class Worker(Actor):
    """One member of a mesh of workers: a tally and a share of the work."""

    def __init__(self):
        # During __init__, current_rank() is this actor's place in the mesh it
        # was spawned on. Keep it: later messages may arrive through slices.
        self.spawn_coords = dict(current_rank())
        self.tally = 0

    @endpoint
    def whoami(self) -> dict:
        """{"spawn_coords", "message_coords", "message_size", "pid"}.

        spawn_coords: this actor's place in its mesh, e.g. {"procs": 2}.
        message_coords / message_size: how the current message addresses it.
        """
        # The three coordinate entries are plain dicts, e.g. {"procs": 2}; message_size is {"procs": 4}
        # for a call to the whole mesh and {"procs": 2} for a call through a 2-actor slice. Through one actor
        # picked by index (workers.slice(procs=3)) no dimension is left: both are {}.
        raise NotImplementedError("TODO(ch02): return spawn and message coordinates, the message's mesh size and the pid")

    @endpoint
    def add(self, amount: int) -> int:
        """Add `amount` to this actor's tally and return the new tally."""
        raise NotImplementedError("TODO(ch02): add to this actor's own tally and return it")

    @endpoint
    def sum_my_share(self, numbers: list[int]) -> int:
        """Sum of squares of this actor's share: numbers[rank::size].

        rank and size are the message's view (current_rank().rank, and the
        product of current_size()'s values), so a slice splits the list among itself. One actor
        picked by index sees no dimension at all: size 1, rank 0.
        """
        raise NotImplementedError("TODO(ch02): square and sum every size-th number, starting at this message's rank")

    @endpoint
    def crash(self) -> None:
        """Simulate a machine failure: the whole process dies at once."""
        os._exit(1)


def spawn_workers(procs: ProcMesh) -> Worker:
    """One Worker per process of `procs`."""
    return procs.spawn("workers", Worker)


def sum_of_squares(workers: Worker, numbers: list[int], timeout: float = 60) -> int:
    """Sum of x*x over `numbers`, computed in parallel by every worker in the mesh."""
    # Every worker of `workers` (a whole mesh or a slice, with any number of dimensions) does its share.
    # Wait at most `timeout` seconds: a worker that never answers must not hang the caller, who gets the wait's
    # TimeoutError (no retry, no None).
    raise NotImplementedError("TODO(ch02): call sum_my_share on every worker, wait for the ValueMesh, add up its values")


if __name__ == "__main__":
    from .ch02_plumbing import main  # the demo: given code, safe to skip

    run_demo(main)
