"""Small actors for tests/test_monarch_claims.py: they live in a module the spawned processes can
import (a test module cannot be imported there). Nothing here is an exercise."""

import asyncio
import os
import threading

import torch
from monarch.actor import Actor, concurrent_endpoint, context, current_rank, endpoint
from monarch.rdma import RDMABuffer


class Probe(Actor):
    @endpoint
    def ping(self) -> int:
        return os.getpid()

    @endpoint
    def boom(self) -> None:
        raise ValueError("an endpoint error")

    @endpoint
    def die(self) -> None:
        os._exit(1)

    @endpoint
    def places(self) -> tuple[dict, dict]:
        return dict(current_rank()), dict(context().actor_instance.rank)


class Broken(Actor):
    def __init__(self):
        raise RuntimeError("a constructor that fails")

    @endpoint
    def ping(self) -> int:
        return os.getpid()


class Holder(Actor):
    def __init__(self):
        self.memory = torch.zeros(16)
        self.handle = RDMABuffer(self.memory)

    @endpoint
    def buffer(self) -> RDMABuffer:
        return self.handle

    @endpoint
    def fill(self, value: float) -> None:
        self.memory.fill_(value)


class Notifier(Actor):
    """Answers by a message of its own: what a transfer's completion looks like to the actor that started it."""

    @endpoint
    def notify(self, waiter) -> None:
        waiter.completed.broadcast()


class Waiter(Actor):
    """Starts a piece of work whose completion comes back as a message to this same actor, then waits for it."""

    def __init__(self):
        self.events, self.blocking_done, self.done = [], threading.Event(), asyncio.Event()

    def _start(self, notifier, me) -> None:
        self.events.append("waiting starts")
        notifier.notify.broadcast(me)

    @endpoint
    async def start_and_block(self, notifier, me, patience: float) -> None:
        """The wedge: a blocking wait (a Future's .get(), an Event.wait(), a sleep loop) holds the actor's loop."""
        self._start(notifier, me)
        self.events.append("waiting woken" if self.blocking_done.wait(patience) else "waiting gave up")

    @endpoint
    async def start_and_await(self, notifier, me, patience: float) -> None:
        """Awaiting, but in a plain endpoint: no later message starts until it returns."""
        self._start(notifier, me)
        await self._await(patience)

    @concurrent_endpoint
    async def start_and_await_concurrently(self, notifier, me, patience: float) -> None:
        """The fix: await in a concurrent endpoint; the completion's message runs at the await."""
        self._start(notifier, me)
        await self._await(patience)

    async def _await(self, patience: float) -> None:
        try:
            await asyncio.wait_for(self.done.wait(), patience)
            self.events.append("waiting woken")
        except TimeoutError:
            self.events.append("waiting gave up")

    @concurrent_endpoint
    async def completed(self) -> None:
        self.events.append("completion arrived")
        self.blocking_done.set()
        self.done.set()

    @concurrent_endpoint
    async def log(self) -> list[str]:
        return self.events
