"""Chapter 05 plumbing: the demo, and helpers the tests use. You may skip this file;
nothing in it is a TODO.

    python -m exercises.ch05_supervision      (the reference: python -m solutions.ch05_supervision)
"""

from __future__ import annotations

import asyncio
import time

from koans.learn.demo import demo_options
from monarch.actor import ProcMesh

from .ch05_supervision import TIMEOUT, Supervisor, spawn_supervisor


async def stop_supervisor(procs: ProcMesh, supervisor: Supervisor, timeout: float = TIMEOUT) -> None:
    """Stop the child's process, then the supervisor's (which would otherwise orphan a child still starting)."""
    try:
        await asyncio.wait_for(supervisor.stop_child.call_one(), timeout)
    finally:
        await asyncio.wait_for(procs.stop(), timeout)


async def wait_for_generation(supervisor: Supervisor, generation: int, timeout: float = TIMEOUT) -> dict:
    """Poll the supervisor's status until its child is at least `generation`; answer the status."""
    deadline = time.monotonic() + timeout
    while True:
        status = await asyncio.wait_for(supervisor.status.call_one(), timeout)
        if status["generation"] >= generation:
            return status
        if time.monotonic() > deadline:  # it answers, so this is no hang: say what it has not done
            raise AssertionError(
                f"the supervisor still runs generation {status['generation']} after {timeout} s, with "
                f"{len(status['failures'])} death(s) recorded: __supervise__ has not replaced the dead child. "
                "Each death of the current child starts the next generation (spawn_child)")
        await asyncio.sleep(0.05)


async def demo() -> None:
    print("Chapter 05: supervision\n")
    procs, supervisor = spawn_supervisor(poll="1s")

    async def ask(endpoint, *args):
        return await asyncio.wait_for(endpoint.call_one(*args), TIMEOUT)

    try:
        first = await ask(supervisor.ask, 1)
        print(f"generation 1 child answers from pid {first['pid']}")
        print(f"child raises inside an endpoint -> the supervisor sees: {await ask(supervisor.provoke, 'raise')}")
        print(f"  and the same child still answers: pid {(await ask(supervisor.ask, 2))['pid']}")
        started = time.monotonic()
        print(f"child's process exits            -> the supervisor sees: {await ask(supervisor.provoke, 'crash')}")
        status = await wait_for_generation(supervisor, 2)
        print(f"__supervise__ recorded the death of {status['failures'][-1]['mesh']} and spawned generation "
              f"{status['generation']} ({time.monotonic() - started:.1f} s after the crash, polling every {status['poll']})")
        print(f"the replacement answers from pid {(await ask(supervisor.ask, 3))['pid']}")
    finally:
        await stop_supervisor(procs, supervisor)


def main() -> None:
    demo_options(f"{__package__}.ch05_supervision", "Chapter 05's demo: an endpoint error, a death, a respawn.")
    asyncio.run(demo())
