"""Chapter 09: async RL is two loops and a buffer.

    continuous_rollouts:  generate -> queue -> score -> buffer.put   (one loop per generator)
    continuous_training:  buffer.sample -> train -> publish weights

Both loops run at once; the buffer is their only meeting point. The price: a
sample may come from an older policy than the one trained. A group made by
version v and trained at version u has policy lag u - v, and the buffer bounds
it: never hand out a group more than `max_lag` versions old; drop, and count,
what turns too stale. A waiting `sample` must not keep out the `put` that wakes
it, so it is a @concurrent_endpoint.

The task is a small contextual bandit; the learner's update is REINFORCE with
the group's mean reward as baseline (chapter 10 brings GRPO).

Your TODOs:
  1. ReplayBuffer.put         store a scored group, or refuse it if it is already too stale
  2. ReplayBuffer.sample      wait (without blocking put) for a batch within the lag bound
  3. continuous_training      sample, train (which publishes), and stop everything when done
The other loop, continuous_rollouts, is given: read it first, it is the pattern.

Given, safe to skip: ch09_plumbing.py (the generator, scorer and learner actors; the demo).
Check: koans check 9    Demo: python -m exercises.ch09_async_loops    Read: docs/09_async_loops.md
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field

import torch
from koans.learn.demo import run_demo
from monarch.actor import Actor, concurrent_endpoint, endpoint

TIMEOUT = 60.0


@dataclass
class Group:
    """G actions sampled for one state by one policy version, with their rewards once scored."""

    id: str
    version: int  # the policy version that generated it
    state: torch.Tensor  # [STATE_DIM]
    actions: torch.Tensor  # [G]
    logps: torch.Tensor  # [G], log-probabilities under the generating policy
    rewards: torch.Tensor | None = None  # [G], set by the scorer


@dataclass
class Ledger:
    """Where every group went. Each id is in exactly one list: nothing lost, nothing twice."""

    trained: list[str] = field(default_factory=list)
    refused_stale: list[str] = field(default_factory=list)  # too old already when put
    dropped_stale: list[str] = field(default_factory=list)  # went too old while waiting
    unused_at_stop: list[str] = field(default_factory=list)


class ReplayBuffer(Actor):
    """Scored groups waiting to be trained on, each tagged with its policy version."""

    def __init__(self, max_lag: int = 1):
        self.max_lag = max_lag
        self.groups: list[Group] = []  # oldest first
        self.learner_version = 0  # the newest version the learner has told us about
        self.ledger = Ledger()
        self.arrived = asyncio.Condition()  # notified whenever a group arrives

    def _too_stale(self, group: Group) -> bool:
        return self.learner_version - group.version > self.max_lag

    @endpoint
    async def put(self, group: Group) -> bool:
        """Store `group`; False (and counted as refused) if it is too stale to ever be trained on."""
        # >>> TODO(ch09): refuse a group that is already too stale; else keep it and wake anyone waiting
        # A refused group's id goes to self.ledger.refused_stale, and put answers False. A kept group
        # goes to the end of self.groups, every waiting sampler is woken (self.arrived; each may wait for
        # something else, so not just one), and put answers True.
        if self._too_stale(group):
            self.ledger.refused_stale.append(group.id)
            return False
        self.groups.append(group)
        async with self.arrived:
            self.arrived.notify_all()
        return True
        # <<< TODO

    @concurrent_endpoint
    async def sample(self, count: int, learner_version: int, timeout: float = TIMEOUT / 2) -> list[Group] | None:
        """The `count` oldest groups within max_lag of `learner_version`; None if they don't come in time."""
        # >>> TODO(ch09): drop what went stale, wait for `count` fresh groups, hand out the oldest ones once
        # self.learner_version becomes learner_version (it never goes down). Groups too stale for it are dropped
        # into self.ledger.dropped_stale, also those that turn stale while you wait. Wait at most `timeout`
        # seconds in all (a timeout of 0 too) for `count` groups, woken by self.arrived (answer None if they
        # don't come; a cancel is not that: let it through): the time counts from the call, and a wake-up that
        # leaves you short does not restart it. Groups already there are handed out at once, whatever the
        # timeout. Hand out the oldest `count`, each once, and add their ids to self.ledger.trained.
        self.learner_version = max(self.learner_version, learner_version)

        def enough() -> bool:
            stale = [g for g in self.groups if self._too_stale(g)]
            self.ledger.dropped_stale += [g.id for g in stale]
            self.groups[:] = [g for g in self.groups if not self._too_stale(g)]
            return len(self.groups) >= count

        try:
            # asyncio.timeout, not wait_for: wait_for(..., 0) gives up before its coroutine even
            # starts, so groups already there would never be looked at
            async with asyncio.timeout(timeout), self.arrived:
                await self.arrived.wait_for(enough)
        except TimeoutError:
            return None
        batch, self.groups[:] = self.groups[:count], self.groups[count:]
        self.ledger.trained += [g.id for g in batch]
        return batch
        # <<< TODO

    @endpoint
    async def advance(self, learner_version: int) -> None:
        """The learner is now at `learner_version` (sample() says so too)."""
        self.learner_version = max(self.learner_version, learner_version)

    @endpoint
    async def close(self) -> Ledger:
        """End of run: what is left is counted as unused; answer the whole ledger."""
        self.ledger.unused_at_stop += [g.id for g in self.groups]
        self.groups.clear()
        return self.ledger

    @endpoint
    async def waiting(self) -> int:
        """How many groups wait in the buffer. (Not `size`: that name belongs to every ActorMesh.)"""
        return len(self.groups)


async def continuous_rollouts(generator, queue, scorer, stop: asyncio.Event) -> int:
    """Generate, hand to the queue, have it scored into the buffer; repeat until `stop` is set.

    The actors (ch09_plumbing.py), each call answered within TIMEOUT:
      generator.generate()   -> list[Group]: pulls the newest weights, then samples 4 groups
      queue.put(groups)      -> None: hands them to the scorer
      scorer.score_next()    -> dict: scores the oldest rollout in the queue, puts its groups into the buffer
    Returns how many rollouts this loop made. A rollout in flight when stop is set is
    finished, so nothing is half done. Every call is awaited, so the training loop runs
    while this one waits for an answer: that is what makes the two loops run at once.
    """
    rollouts = 0
    while not stop.is_set():
        groups = await asyncio.wait_for(generator.generate.call_one(), TIMEOUT)
        await asyncio.wait_for(queue.put.call_one(groups), TIMEOUT)
        await asyncio.wait_for(scorer.score_next.call_one(), TIMEOUT)
        rollouts += 1
    return rollouts


async def continuous_training(learner, buffer: ReplayBuffer, steps: int, batch_groups: int,
                              stop: asyncio.Event, on_step=None) -> list[dict]:
    """Sample, train, repeat for `steps` steps; then set `stop` so the rollout loops end too.

      buffer.sample(count, version) -> list[Group], or None if too few came in its default timeout (TIMEOUT / 2)
      learner.train(batch)          -> {"version": the new version, ...}: one step, then publish it
    `on_step(result)`, if given, sees each step's result. Returns the results of every step.
    """
    # >>> TODO(ch09): `steps` training steps, each on `batch_groups` groups within the lag bound; then stop all
    # Ask the buffer for groups against the learner's current version (0 before the first step; then
    # the version train answered). None means nothing came in time: ask again. Every call (sample,
    # train) is awaited, at most TIMEOUT each: a call with no answer by then ends the run (TimeoutError).
    # However this ends, even by an error or a cancellation, `stop` must be set: the rollout loops
    # wait for it.
    results, version = [], 0
    try:
        while len(results) < steps:
            batch = await asyncio.wait_for(buffer.sample.call_one(batch_groups, version), TIMEOUT)
            if batch is None:
                continue
            result = await asyncio.wait_for(learner.train.call_one(batch), TIMEOUT)
            version = result["version"]
            results.append(result)
            if on_step is not None:
                on_step(result)
    finally:
        stop.set()
    return results
    # <<< TODO


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from .ch09_plumbing import main  # the demo: given code, safe to skip

    run_demo(main)
