"""Given code for chapter 10: start the job, run the two loops (or lock step), show the results.

    Job.start     a trainer process (trainer, weight store, replay buffer) and a Service of
                  generator replicas, each on its own process
    run_async     one rollout loop per generator replica (or more) and the training loop, at once
    run_sync      lock step for comparison: generate a batch, train on it, wait for the new weights
    train         start, warm up, run, final weight sync, collect the timeline, stop
    main          the demo: python -m solutions.ch10_qwen_grpo --help

Nothing here is a TODO; the loops it runs are yours (ch10_qwen_grpo.py).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from koans.report import ascii_curve, histogram
from koans.viz import DEFAULT_TRACE as LAST_TRACE
from koans.timeline import busy_fraction, merge, write_chrome_trace
from monarch.actor import this_host

from .ch06_service import Service, kill_replica
from .ch07_weight_sync import WeightStore, wait_for_version
from .ch09_async_loops import ReplayBuffer
from .ch10_policy import CountingTask
from .ch10_qwen_grpo import (TIMEOUT, Generator, RunConfig, Trainer, continuous_rollouts, continuous_training,
                             pick_device, score)


@dataclass
class Job:
    """The actors of one run: a trainer process (with the weight store and buffer) and a service."""

    config: RunConfig
    trainer_procs: object
    store: WeightStore
    buffer: ReplayBuffer
    trainer: Trainer
    service: Service
    task: CountingTask = field(default_factory=CountingTask)

    @classmethod
    def start(cls, config: RunConfig, name: str = "grpo") -> "Job":
        procs = this_host().spawn_procs(per_host={"procs": 1})
        store = procs.spawn(f"{name}_store", WeightStore)
        buffer = procs.spawn(f"{name}_buffer", ReplayBuffer, config.max_lag)
        trainer = procs.spawn(f"{name}_trainer", Trainer, store, config)
        service = Service(Generator, store, config, replicas=config.generators, name=f"{name}_generator",
                          call_timeout=TIMEOUT)
        return cls(config, procs, store, buffer, trainer, service)

    def warm_up(self) -> None:
        """Load the models everywhere before the clock starts (imports and init take seconds)."""
        self.trainer.flush.call_one().get(timeout=TIMEOUT * 4)
        self.service.fanout("sync")

    def final_sync(self) -> dict:
        """Make every generator load the trainer's last version; answer both sides' fingerprints."""
        version = self.trainer.flush.call_one().get(timeout=2 * TIMEOUT)  # committed when it answers
        self.service.wait_recovered()
        versions = self.service.fanout("sync")
        return {"version": version, "generator_versions": versions,
                "trainer": self.trainer.fingerprint.call_one().get(timeout=TIMEOUT),
                "generators": self.service.fanout("fingerprint")}

    def spans(self) -> list:
        spans = [self.trainer.timeline.call_one().get(timeout=TIMEOUT)]
        spans += list(self.service.fanout("timeline").values())
        return merge(*spans)

    def stop(self) -> None:
        try:
            self.trainer.close.call_one().get(timeout=TIMEOUT)
        finally:
            self.service.close()
            self.trainer_procs.stop().get(timeout=TIMEOUT)


async def run_async(job: Job, on_step=None, timeout: float = 1800, loops_per_generator: int = 2) -> dict:
    """Both loops at once: rollout loops (two per replica keep each one busy) and one training loop."""
    config, stop = job.config, asyncio.Event()
    rollouts = [continuous_rollouts(job.service, job.buffer, job.task, stop, worker, config.seed)
                for worker in range(loops_per_generator * config.generators)]
    training = continuous_training(job.trainer, job.buffer, config.steps, config.groups_per_step, stop, on_step)
    *counts, results = await asyncio.wait_for(asyncio.gather(*rollouts, training), timeout)
    ledger = await job.buffer.close.call_one()
    return {"results": results, "rollouts": counts, "ledger": ledger}


async def run_sync(job: Job, on_step=None) -> dict:
    """Lock step, for comparison: generate a batch with the newest weights, train, wait for the sync."""
    config, results = job.config, []
    rng = random.Random(config.seed)
    for step in range(config.steps):
        prompts = [job.task.sample(rng) for _ in range(config.groups_per_step)]
        batch = await asyncio.gather(*(asyncio.to_thread(job.service.route, "generate", p, f"s{step}-{i}")
                                       for i, p in enumerate(prompts)))
        result = await job.trainer.train.call_one([score(job.task, r) for r in batch])
        await asyncio.to_thread(wait_for_version, job.store, result["version"])
        results.append(result)
        if on_step is not None:
            on_step(result)
    return {"results": results, "rollouts": [], "ledger": None}


def train(config: RunConfig, mode: str = "async", on_step=None, name: str = "grpo", kill_at: int = 0) -> dict:
    """Start a job, run it in `mode`, sync the weights one last time, stop it. Answers the figures.

    kill_at > 0: SIGKILL generator replica 0's process after that step, to watch the service cope.
    """
    job = Job.start(config, name)
    try:
        job.warm_up()
        if kill_at > 0:
            on_step = killing_at(job, kill_at, on_step)
        started = time.time()
        runner = run_async if mode == "async" else run_sync
        run = asyncio.run(runner(job, on_step))
        run["seconds"] = time.time() - started
        run["final"] = job.final_sync()
        run["spans"] = job.spans()
        run["service"] = job.service.snapshot()
        return run
    finally:
        job.stop()


def killing_at(job: Job, step: int, on_step=None):
    """Wrap `on_step` so that right after `step` it SIGKILLs generator replica 0's process."""

    def wrapped(result: dict) -> None:
        if result["version"] == step:
            def kill() -> None:  # a quick blocking call; made off the event loop's thread, as Monarch asks
                pid = kill_replica(job.service, 0)
                print(f"  ** after step {step}: SIGKILL generator replica 0 (pid {pid}) **")

            killer = threading.Thread(target=kill)
            killer.start()
            killer.join(TIMEOUT)
        if on_step is not None:
            on_step(result)

    return wrapped


def summary(run: dict, config: RunConfig) -> dict:
    """Samples per second, lags, and each actor's busy fraction over the run."""
    spans = run["spans"]
    samples = len(run["results"]) * config.groups_per_step * config.group_size
    publish = [s.end - s.start for s in spans if s.actor == "trainer" and s.kind == "sync"]
    loads = [s.end - s.start for s in spans if s.actor != "trainer" and s.kind == "sync" and s.info.get("loaded")]
    return {"samples_per_s": samples / run["seconds"], "seconds": run["seconds"],
            "lags": Counter(lag for r in run["results"] for lag in r["lags"]),
            "busy": {actor: busy_fraction(spans, actor) for actor in sorted({s.actor for s in spans})},
            "publish_ms": 1000 * sum(publish) / max(1, len(publish)),
            "publish_share": sum(publish) / run["seconds"],
            "load_ms": 1000 * sum(loads) / max(1, len(loads)), "loads": len(loads)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m solutions.ch10_qwen_grpo", description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["async", "sync"], default="async")
    parser.add_argument("--compare", action="store_true", help="run sync, then async, on the same config")
    parser.add_argument("--steps", type=int, default=RunConfig.steps)
    parser.add_argument("--model", default=None, help="hub id or local path (default: the tiny offline Qwen2)")
    parser.add_argument("--dtype", default=RunConfig.dtype)
    parser.add_argument("--generators", type=int, default=RunConfig.generators)
    parser.add_argument("--max-lag", type=int, default=RunConfig.max_lag)
    parser.add_argument("--lr", type=float, default=RunConfig.lr)
    parser.add_argument("--kl-coef", type=float, default=RunConfig.kl_coef)
    parser.add_argument("--seed", type=int, default=RunConfig.seed)
    parser.add_argument("--show-every", type=int, default=20)
    parser.add_argument("--kill-at", type=int, default=0, metavar="STEP",
                        help="SIGKILL a generator replica after this step; training carries on")
    parser.add_argument("--trace", help="write the timeline as Chrome trace JSON (open in ui.perfetto.dev)")
    args = parser.parse_args()
    config = RunConfig(model=args.model, seed=args.seed, steps=args.steps, max_lag=args.max_lag,
                       generators=args.generators, kl_coef=args.kl_coef, dtype=args.dtype, lr=args.lr)
    modes = ["sync", "async"] if args.compare else [args.mode]
    print(f"Chapter 10: GRPO on {config.model or 'a tiny Qwen2 (random init)'}, task 'Count to N', "
          f"{config.generators} generators, {config.steps} steps of {config.groups_per_step}x{config.group_size} "
          f"samples, max lag {config.max_lag}, device {pick_device()}\n")
    figures = {}
    for mode in modes:
        figures[mode] = show_run(config, mode, args.show_every, args.trace if mode == modes[-1] else None,
                                 args.kill_at)
    if args.compare:
        s, a = figures["sync"], figures["async"]
        print(f"\nasync vs sync: {a['samples_per_s']:.1f} vs {s['samples_per_s']:.1f} samples/s = "
              f"{a['samples_per_s'] / s['samples_per_s']:.2f}x")
        for mode in modes:
            print(f"  busy {mode:>5}: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in figures[mode]["busy"].items()))


def show_run(config: RunConfig, mode: str, show_every: int, trace: str | None, kill_at: int = 0) -> dict:
    print(f"--- {mode} ---")
    rewards: list[float] = []

    def on_step(result: dict) -> None:
        rewards.append(result["reward"])
        if result["version"] % show_every == 0 or result["version"] == 1:
            recent = rewards[-show_every:]
            ex = result["example"]
            print(f"  step {result['version']:>4}  running mean reward {sum(recent) / len(recent):.2f}  "
                  f"lags {dict(sorted(Counter(result['lags']).items()))}\n"
                  f"      {ex['prompt']!r} -> {ex['response']!r}  reward {ex['reward']:.2f}  (policy v{ex['version']})")

    run = train(config, mode, on_step, name=f"grpo_{mode}", kill_at=kill_at)
    figures = summary(run, config)
    tenth = max(1, len(rewards) // 10)
    print(f"\n{len(rewards)} steps in {run['seconds']:.1f} s, {figures['samples_per_s']:.1f} samples/s; mean reward "
          f"first 10% {sum(rewards[:tenth]) / tenth:.2f} -> last 10% {sum(rewards[-tenth:]) / tenth:.2f}")
    print("reward per step:\n" + ascii_curve(rewards))
    print("policy lag of trained groups:\n" + histogram(figures["lags"], "lag "))
    if run["ledger"] is not None:
        ledger = run["ledger"]
        print(f"groups: generated {sum(run['rollouts'])} = trained {len(ledger.trained)} + refused stale "
              f"{len(ledger.refused_stale)} + dropped stale {len(ledger.dropped_stale)} + unused at stop "
              f"{len(ledger.unused_at_stop)}")
    service = run["service"]
    if service["replica_failures"]:
        print(f"service: {service['replica_failures']} replica death(s), {service['retries']} retried request(s), "
              f"{service['failed']} failed, {service['recoveries']} recovered; generations {service['generations']}")
    final = run["final"]
    same = all(f == final["trainer"] for f in final["generators"].values())
    print(f"final weights: version {final['version']} on every generator {sorted(final['generator_versions'].values())}; "
          f"bit-equal to the trainer's: {same}")
    print("busy: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in figures["busy"].items()))
    print(f"weight sync: the trainer spent {figures['publish_ms']:.1f} ms per step publishing "
          f"({100 * figures['publish_share']:.1f}% of the wall time); a generator took {figures['load_ms']:.1f} ms "
          f"per new version it loaded ({figures['loads']} loads)")
    LAST_TRACE.parent.mkdir(exist_ok=True)
    write_chrome_trace(run["spans"], str(LAST_TRACE))  # what `koans viz` draws by default
    if trace:
        write_chrome_trace(run["spans"], trace)
        print(f"timeline written to {trace} (open it in https://ui.perfetto.dev, or: koans viz --trace {trace})")
    else:
        print("timeline: `koans viz` draws it (or add --trace run.json for ui.perfetto.dev)")
    return figures
