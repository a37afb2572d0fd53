"""Chapter 02 plumbing: the demo, and a slow worker the tests use. You may skip this file; nothing
in it is a TODO.

    python -m exercises.ch02_actor_mesh      (the reference: python -m solutions.ch02_actor_mesh)
"""

import time

from koans.learn.demo import demo_options
from monarch.actor import Actor, endpoint, this_host

from .ch02_actor_mesh import spawn_workers, sum_of_squares


class SlowWorker(Actor):
    """Answers sum_my_share only after `seconds`: a worker that is stuck, as far as a caller can tell."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    @endpoint
    def sum_my_share(self, numbers: list[int]) -> int:
        time.sleep(self.seconds)
        return 0


def main() -> None:
    demo_options(f"{__package__}.ch02_actor_mesh", "Chapter 02's demo: a mesh of four workers and every adverb.")
    timeout = 60
    print("Chapter 02: actor meshes and adverbs\n")
    procs = this_host().spawn_procs(per_host={"procs": 4})
    try:
        workers = spawn_workers(procs)

        print("call(): every actor answers; the result is a ValueMesh keyed by coordinates")
        for point, me in workers.whoami.call().get(timeout=timeout).items():
            print(f"  {point}  pid {me['pid']}  spawned at {me['spawn_coords']}")

        print("\nbroadcast(): fire and forget. add(10) goes to all four; nothing comes back.")
        workers.add.broadcast(10)
        print("call_one() on a slice: add(5) to procs=2 only")
        print(f"  procs=2 now holds {workers.slice(procs=2).add.call_one(5).get(timeout=timeout)}")
        print("choose(): add(1) to one actor Monarch picks, three times")
        for _ in range(3):
            workers.add.choose(1).get(timeout=timeout)
        tallies = workers.add.call(0).get(timeout=timeout)
        print(f"  tallies now: {list(tallies.values())}  (10 each from broadcast, +5 on procs=2, +3 spread by choose)")

        view = workers.slice(procs=slice(2, 4))
        print("\nA slice renumbers ranks for the message, not for the actor:")
        for point, me in view.whoami.call().get(timeout=timeout).items():
            print(f"  message sees {me['message_coords']} of {me['message_size']}; actor was spawned at {me['spawn_coords']}")

        numbers = list(range(1, 101))
        print("\nPer-rank work: each worker squares and sums numbers[rank::size]")
        for point, part in workers.sum_my_share.call(numbers).get(timeout=timeout).items():
            print(f"  {point}: {part}")
        print(f"  sum_of_squares(all 4 workers)  = {sum_of_squares(workers, numbers, timeout)}")
        print(f"  sum_of_squares(2-worker slice) = {sum_of_squares(view, numbers, timeout)}")
        print(f"  plain Python, one process      = {sum(x * x for x in numbers)}")
    finally:
        procs.stop().get(timeout=timeout)
        print("\nStopped the four processes.")
