"""Chapter 09 plumbing: the actors the two loops drive (generator, queue, scorer, learner), starting a
run, and the demo. You may skip this file; nothing in it is a TODO. docs/09_async_loops.md says
what each role does.

    python -m exercises.ch09_async_loops      (the reference: python -m solutions.ch09_async_loops)
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

from koans.learn.demo import demo_options
import torch
from koans.learn.report import histogram
from koans.learn.timeline import Recorder, ascii_timeline, busy_fraction, merge
from monarch.actor import Actor, ProcMesh, concurrent_endpoint, endpoint, this_host

from .ch07_weight_sync import SnapshotReader, WeightPublisher, WeightStore
from .ch09_async_loops import TIMEOUT, Group, ReplayBuffer, continuous_rollouts, continuous_training

STATE_DIM, ACTIONS = 8, 4


def make_policy(seed: int = 0) -> torch.nn.Module:
    """The small policy, on CUDA when this process sees a GPU, else on the CPU."""
    torch.manual_seed(seed)
    policy = torch.nn.Sequential(torch.nn.Linear(STATE_DIM, 32), torch.nn.Tanh(), torch.nn.Linear(32, ACTIONS))
    return policy.to("cuda" if torch.cuda.is_available() else "cpu")


class ArrivalProbe(ReplayBuffer):
    """The chapter's buffer plus what the tests need to see whether put() wakes whoever waits on
    self.arrived (as a waiting sample() does), apart from any sample() of yours."""

    def __init__(self, max_lag: int = 1):
        super().__init__(max_lag)
        self.listening = 0

    @concurrent_endpoint
    async def woken_within(self, timeout: float) -> bool:
        """Wait on self.arrived; True if something notified it within `timeout` seconds."""
        async with self.arrived:
            self.listening += 1
            try:
                await asyncio.wait_for(self.arrived.wait(), timeout)
                return True
            except TimeoutError:
                return False
            finally:
                self.listening -= 1

    @concurrent_endpoint
    async def listeners(self) -> int:
        return self.listening

    @concurrent_endpoint
    async def sleepers(self) -> int:
        """How many wait on self.arrived right now (a waiting sample() among them)."""
        return len(self.arrived._waiters)  # asyncio.Condition keeps its waiters here (CPython 3.11-3.13)


class TrajectoryQueue(Actor):
    """Generated, not yet scored groups: the hand-off from generators to the scorer."""

    def __init__(self):
        self.queue: asyncio.Queue[list[Group]] = asyncio.Queue()
        self.puts = 0

    @endpoint
    async def put(self, groups: list[Group]) -> None:
        self.puts += 1
        await self.queue.put(groups)

    @concurrent_endpoint
    async def get(self, timeout: float = TIMEOUT) -> list[Group]:
        return await asyncio.wait_for(self.queue.get(), timeout)

    @concurrent_endpoint
    async def rollouts_queued(self) -> int:
        """How many rollouts were ever put here."""
        return self.puts


class Generator(Actor):
    """Samples actions from its copy of the policy; picks up new weights before each rollout."""

    def __init__(self, store: WeightStore, index: int, groups_per_rollout: int = 4, group_size: int = 8, seed: int = 0):
        self.name = f"generator{index}"
        self.policy = make_policy(seed=0)  # the learner starts from the same weights: version 0
        self.device = next(self.policy.parameters()).device
        self.reader = SnapshotReader(store, self.policy.state_dict())
        self.groups_per_rollout, self.group_size = groups_per_rollout, group_size
        self.random = torch.Generator().manual_seed(seed * 1000 + index)
        self.count = 0
        self.recorder = Recorder(self.name)

    @endpoint
    async def generate(self) -> list[Group]:
        with self.recorder.span("sync") as info:
            info["version"] = await self.reader.pull_and_load() or self.reader.version
        with self.recorder.span("generate", version=self.reader.version), torch.no_grad():
            states = torch.randn(self.groups_per_rollout, STATE_DIM, generator=self.random)
            probs = torch.softmax(self.policy(states.to(self.device)), dim=-1).cpu()  # messages carry CPU tensors
            actions = torch.multinomial(probs, self.group_size, replacement=True, generator=self.random)
            logps = torch.distributions.Categorical(probs=probs).log_prob(actions.T).T
            groups = []
            for state, acts, lps in zip(states, actions, logps):
                self.count += 1
                groups.append(Group(f"{self.name}-{self.count}", self.reader.version, state, acts, lps))
        return groups

    @endpoint
    async def timeline(self) -> list:
        return self.recorder.spans


class Scorer(Actor):
    """Rewards the action a hidden linear rule prefers; moves groups from the queue to the buffer."""

    def __init__(self, queue: TrajectoryQueue, buffer: ReplayBuffer, seed: int = 1234):
        self.queue, self.buffer = queue, buffer
        self.rule = torch.randn(ACTIONS, STATE_DIM, generator=torch.Generator().manual_seed(seed))
        self.recorder = Recorder("scorer")

    def reward(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return (actions == (self.rule @ state).argmax()).float()

    @endpoint
    async def score_next(self) -> dict:
        """Take one rollout off the queue, score it, put its groups into the buffer."""
        groups = await asyncio.wait_for(self.queue.get.call_one(), TIMEOUT)
        with self.recorder.span("score") as info:
            for group in groups:
                group.rewards = self.reward(group.state, group.actions)
            info["mean_reward"] = float(torch.stack([g.rewards for g in groups]).mean())
        accepted = [await asyncio.wait_for(self.buffer.put.call_one(group), TIMEOUT) for group in groups]
        return {"groups": len(groups), "accepted": sum(accepted), "mean_reward": info["mean_reward"]}

    @endpoint
    async def timeline(self) -> list:
        return self.recorder.spans


class Learner(Actor):
    """Trains the policy on sampled groups by REINFORCE with a mean baseline; publishes each version (ch07)."""

    def __init__(self, store: WeightStore, lr: float = 0.05):
        self.policy = make_policy(seed=0)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=lr)
        self.version = 0
        self.publisher = WeightPublisher(self.policy.state_dict(), store)
        self.recorder = Recorder("learner")

    @endpoint
    async def train(self, batch: list[Group]) -> dict:
        """One step on `batch`; then publish version+1. Answers version, loss, reward, lags and ids."""
        with self.recorder.span("train", version=self.version) as info:
            device = next(self.policy.parameters()).device
            states, actions, rewards = (torch.stack([getattr(g, part) for g in batch]).to(device)
                                        for part in ("state", "actions", "rewards"))
            baseline = rewards.mean(dim=1, keepdim=True)  # each group's mean reward
            logps = torch.distributions.Categorical(logits=self.policy(states)).log_prob(actions.T).T
            loss = -((rewards - baseline) * logps).mean()
            await self.publisher.wait_staged()
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            lags = [self.version - g.version for g in batch]
            self.version += 1
            await self.during_step()
            info.update(loss=loss.item(), reward=rewards.mean().item())
        with self.recorder.span("publish", version=self.version):
            if await self.publisher.publish(self.policy.state_dict(), version=self.version) is None:
                self.publisher.retry_until_free(self.policy.state_dict(), self.version)  # ch07: stay live
        return {"version": self.version, "loss": info["loss"], "reward": info["reward"], "lags": lags,
                "ids": [g.id for g in batch]}

    async def during_step(self) -> None:
        """Called inside each training step (a hook for tests)."""

    @endpoint
    async def timeline(self) -> list:
        return self.recorder.spans

    @endpoint
    async def close(self) -> None:
        await self.publisher.close()


class WatchfulLearner(Learner):
    """A learner that, inside each training step, waits until a rollout is queued (at most `patience`
    seconds). Asynchronous loops queue rollouts while it trains; loops in lock step cannot, and the
    step records that it waited in vain. For tests: it shows overlap by order of events, not timing."""

    def __init__(self, store: WeightStore, queue: TrajectoryQueue, patience: float = 20.0):
        super().__init__(store)
        self.queue, self.patience = queue, patience
        self.overlapped: list[bool] = []

    async def during_step(self) -> None:
        if self.overlapped and not all(self.overlapped):
            return  # one step in vain shows it; don't make the run wait again
        before = await asyncio.wait_for(self.queue.rollouts_queued.call_one(), TIMEOUT)
        deadline = time.monotonic() + self.patience
        while time.monotonic() < deadline:
            if await asyncio.wait_for(self.queue.rollouts_queued.call_one(), TIMEOUT) > before:
                self.overlapped.append(True)
                return
            await asyncio.sleep(0.005)
        self.overlapped.append(False)

    @endpoint
    async def overlaps(self) -> list[bool]:
        return self.overlapped


@dataclass
class Actors:
    """Everything one run needs, on the processes of one ProcMesh."""

    store: WeightStore
    buffer: ReplayBuffer
    queue: TrajectoryQueue
    scorer: Scorer
    learner: Learner
    generators: list[Generator]


def spawn_actors(procs: ProcMesh, generators: int = 2, max_lag: int = 1, seed: int = 0, tag: str = "",
                 watchful: bool = False) -> Actors:
    """Learner, store, buffer, queue and scorer on procs=0; one generator per further process."""
    home = procs.slice(procs=0)
    store = home.spawn(f"store{tag}", WeightStore)
    buffer = home.spawn(f"buffer{tag}", ReplayBuffer, max_lag)
    queue = home.spawn(f"queue{tag}", TrajectoryQueue)
    scorer = home.spawn(f"scorer{tag}", Scorer, queue, buffer)
    learner = (home.spawn(f"learner{tag}", WatchfulLearner, store, queue) if watchful
               else home.spawn(f"learner{tag}", Learner, store))
    gens = [procs.slice(procs=1 + i).spawn(f"generator{tag}", Generator, store, i, 4, 8, seed) for i in range(generators)]
    return Actors(store, buffer, queue, scorer, learner, gens)


async def run_async(actors: Actors, steps: int, batch_groups: int = 8, on_step=None, timeout: float = 600) -> dict:
    """Both loops at once, then a clean stop: rollouts finish their turn, the buffer is closed."""
    stop = asyncio.Event()
    rollouts = [continuous_rollouts(g, actors.queue, actors.scorer, stop) for g in actors.generators]
    training = continuous_training(actors.learner, actors.buffer, steps, batch_groups, stop, on_step)
    *rollout_counts, results = await asyncio.wait_for(asyncio.gather(*rollouts, training), timeout)
    ledger = await asyncio.wait_for(actors.buffer.close.call_one(), TIMEOUT)
    spans = [await asyncio.wait_for(a.timeline.call_one(), TIMEOUT) for a in [actors.learner, actors.scorer, *actors.generators]]
    return {"results": results, "rollouts": rollout_counts, "ledger": ledger, "spans": merge(*spans)}


def produced_ids(run: dict) -> set[str]:
    """Every group id the generators made, from the rollout counts (each rollout makes 4 groups)."""
    ids = set()
    for rank, count in enumerate(run["rollouts"]):
        ids |= {f"generator{rank}-{n}" for n in range(1, 4 * count + 1)}
    return ids


class DemoLearner(Learner):
    """The demo's learner: each training step also waits `train_ms`, as if an accelerator were busy.
    On the tiny bandit a real step takes about a millisecond, less than the messages around it."""

    def __init__(self, store: WeightStore, train_ms: float):
        super().__init__(store)
        self.train_s = train_ms / 1000

    async def during_step(self) -> None:
        await asyncio.sleep(self.train_s)


def demo_actors(procs: ProcMesh, max_lag: int, train_ms: float) -> Actors:
    """spawn_actors' layout (two generators), with the demo's learner."""
    home = procs.slice(procs=0)
    store = home.spawn("store", WeightStore)
    buffer = home.spawn("buffer", ReplayBuffer, max_lag)
    queue = home.spawn("queue", TrajectoryQueue)
    scorer = home.spawn("scorer", Scorer, queue, buffer)
    learner = home.spawn("learner", DemoLearner, store, train_ms)
    gens = [procs.slice(procs=1 + i).spawn("generator", Generator, store, i, 4, 8, 0) for i in range(2)]
    return Actors(store, buffer, queue, scorer, learner, gens)


def started_during(spans: list, kind: str, during: str = "train") -> float:
    """The share of `kind` spans that started while the learner was inside a `during` span."""
    inside = sorted((s.start, s.end) for s in spans if s.kind == during)
    starts = [s.start for s in spans if s.kind == kind]
    hits = sum(any(a <= t < b for a, b in inside) for t in starts)
    return hits / max(len(starts), 1)


async def demo(steps: int = 120, max_lag: int = 1, train_ms: float = 30.0, every: int = 15) -> None:
    print(f"Chapter 09: two loops and a buffer ({steps} steps, 2 generators, max lag {max_lag}; each training "
          f"step also waits {train_ms:.0f} ms, as if an accelerator were busy)\n")
    procs = this_host().spawn_procs(per_host={"procs": 3})
    try:
        actors = demo_actors(procs, max_lag, train_ms)
        started, rewards = time.time(), []

        def show(result: dict) -> None:
            rewards.append(result["reward"])
            if result["version"] % every == 0 or result["version"] == 1:
                recent = rewards[-every:]
                print(f"  step {result['version']:>4}  mean reward of the last {len(recent):>2} steps "
                      f"{sum(recent) / len(recent):.2f}  lags in this batch {dict(sorted(Counter(result['lags']).items()))}")

        run = await run_async(actors, steps, on_step=show)
        took = time.time() - started
        lags = Counter(lag for r in run["results"] for lag in r["lags"])
        ledger = run["ledger"]
        print(f"\n{steps} steps in {took:.1f} s; rollouts per generator {run['rollouts']}")
        print(f"policy lag of trained groups (the buffer's bound: {max_lag}):\n" + histogram(lags, "lag "))
        print(f"groups: produced {len(produced_ids(run))} = trained {len(ledger.trained)} + refused stale "
              f"{len(ledger.refused_stale)} + dropped stale {len(ledger.dropped_stale)} + unused at stop "
              f"{len(ledger.unused_at_stop)}")
        spans = run["spans"]
        print(f"\nthe loops overlap: {100 * started_during(spans, 'generate'):.0f}% of the rollouts started while "
              "the learner was inside a training step (in lock step: none)")
        window = 0.25
        shown = [s for s in spans if s.start >= spans[-1].end - window]
        print(f"who was busy when, in the last {window} s (a column is about {1000 * window / 64:.0f} ms; "
              "a letter: busy at some moment of that column):")
        print(ascii_timeline(shown))
        print("busy fraction over the whole run: " + ", ".join(
            f"{a} {100 * busy_fraction(spans, a):.0f}%" for a in sorted({s.actor for s in spans})))
        await asyncio.wait_for(actors.learner.close.call_one(), TIMEOUT)
    finally:
        await asyncio.wait_for(procs.stop(), TIMEOUT)


def main() -> None:
    demo_options(f"{__package__}.ch09_async_loops", "Chapter 09's demo: two loops and a buffer, 120 steps.")
    asyncio.run(demo())
