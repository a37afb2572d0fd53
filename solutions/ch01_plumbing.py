"""Chapter 01 plumbing: the demo. You may skip this file; nothing in it is a TODO.

    python -m exercises.ch01_hello_actor      (the reference: python -m solutions.ch01_hello_actor)
"""

import asyncio
import os

from koans.learn.demo import demo_options
from monarch.actor import this_proc

from .ch01_hello_actor import greet_twice, spawn_greeter, start_one_process


def main() -> None:
    demo_options(f"{__package__}.ch01_hello_actor", "Chapter 01's demo: one actor here, one in a new process.")
    timeout = 60
    print("Chapter 01: hello, actor")
    print(f"This client process has pid {os.getpid()}.\n")

    local = spawn_greeter(this_proc(), "Ada")
    where = local.whereabouts.call_one().get(timeout=timeout)
    print(f"[local]  spawn_greeter(this_proc(), 'Ada') put Ada in pid {where['pid']}: the same process as us.")
    print("         call_one() sends a message and returns a Future; .get() waits for the reply:")
    for who in ("Grace", "Linus"):
        print(f"         -> {local.greet.call_one(who).get(timeout=timeout)}")

    procs = start_one_process()
    try:
        remote = spawn_greeter(procs, "Barbara")
        where = remote.whereabouts.call_one().get(timeout=timeout)
        print(f"\n[remote] start_one_process() made a new process; Barbara lives in pid {where['pid']}"
              f" on {where['host']}, computing on {where['device']}.")
        print("         The calling code is identical; only the ProcMesh differs:")
        print(f"         -> {remote.greet.call_one('Grace').get(timeout=timeout)}")
        replies = asyncio.run(greet_twice(remote, "Edsger"))
        print("\n[async]  Inside async code the same Futures are awaited:")
        for reply in replies:
            print(f"         -> {reply}")
        print("\n[state]  Each actor kept its own count between calls:")
        for greeter in (local, remote):
            print(f"         -> {greeter.greet.call_one('you').get(timeout=timeout)}")
    finally:
        procs.stop().get(timeout=timeout)
        print("\nStopped the new process.")
