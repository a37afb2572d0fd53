"""Chapter 02: actor meshes and adverbs.

Spawning on a ProcMesh of N processes gives an ActorMesh: N actors, one per
process, all answering to one handle. Instead of rank checks (`if rank == 0`)
you say *who* gets a message with an adverb on the endpoint:

    workers.add.call(1)        every actor; a Future of a ValueMesh of replies
    workers.add.broadcast(1)   every actor; fire and forget, no reply
    workers.add.call_one(1)    exactly one actor (the mesh must hold one)
    workers.add.choose(1)      one actor, picked for you
    workers.slice(procs=2)     a view of part of the mesh; adverbs work on it

Each actor is its own object in its own process. Coordinates come in two
kinds, and mixing them up is a classic bug:
  - the actor's place in the mesh it was spawned on (fixed for its life), and
  - `current_rank()`: where the *current message* sees it. A message sent
    through a slice sees ranks 0..len(slice)-1.
Split work by the message's view, so that a slice shares the work out among
the actors it addresses.

Your TODOs:
  1. Worker.whoami          report both kinds of coordinates, and the pid
  2. Worker.add             per-actor state
  3. Worker.sum_my_share    per-rank work: this actor's share of a list
  4. sum_of_squares         call() the whole mesh and combine the ValueMesh

Check:     pytest tests/test_ch02_actor_mesh.py     (or: koans check 2)
Run demo:  python -m solutions.ch02_actor_mesh
Read:      docs/02_actor_mesh.md
"""

import os

from koans.demo import run_demo
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
        # All three coordinate entries are plain dicts, e.g. {"procs": 2}; message_size is {"procs": 4}
        # for a call to the whole mesh and {"procs": 2} for a call through a 2-actor slice.
        raise NotImplementedError("TODO(ch02): return spawn and message coordinates, the message's mesh size and the pid")

    @endpoint
    def add(self, amount: int) -> int:
        """Add `amount` to this actor's tally and return the new tally."""
        raise NotImplementedError("TODO(ch02): add to this actor's own tally and return it")

    @endpoint
    def sum_my_share(self, numbers: list[int]) -> int:
        """Sum of squares of this actor's share: numbers[rank::size].

        rank and size are the message's view (current_rank().rank and the
        product of current_size()), so a slice splits the list among itself.
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
    # Every worker of `workers` (a whole mesh or a slice) does its share. Wait at most `timeout`
    # seconds: a worker that never answers must not hang the caller.
    raise NotImplementedError("TODO(ch02): call sum_my_share on every worker, wait for the ValueMesh, add up its values")


if __name__ == "__main__":
    from .ch02_plumbing import main  # the demo: given code, safe to skip

    run_demo(main)
