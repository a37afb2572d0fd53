"""Chapter 10 plumbing: the Trainer and Generator actors, starting a job, the two loops (or lock
step), and the demo. You may skip this file; nothing in it is a TODO.

    Generator     a generator replica: pulls new weights (ch07), samples a group for a prompt
    Trainer       the policy being trained: one GRPO step per batch (your functions), then publish
    AdmissionCount, Pacer   the main job's pacing: a generator starts a group only if it will be trained
                  within the lag bound (chapter 11's admission), so none is generated to be dropped
    Job.start     a trainer process (trainer, weight store, replay buffer) and a Service (ch06) of
                  generator replicas, each on its own process; with a HostsSpec (--hosts N), on a
                  Monarch job's hosts instead of this one (ch10_multihost.py)
    run_async     two rollout loops per replica and chapter 09's training loop, at once
    run_sync      lock step, for comparison: generate a batch, train on it, wait for the new weights
    main          the demo: python -m exercises.ch10_qwen_grpo --help
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
from koans.learn.report import ascii_curve, histogram
from koans.learn.timeline import Recorder, busy_fraction, merge, write_chrome_trace
from koans.learn.viz import DEFAULT_COMPARE as COMPARE
from koans.learn.viz import DEFAULT_TRACE as LAST_TRACE
from monarch.actor import Actor, context, endpoint, this_host

from .ch06_plumbing import kill_replica, replica_label
from .ch06_service import Service
from .ch07_plumbing import ask, wait_for_version
from .ch07_transports import state_fingerprint
from .ch07_weight_sync import SnapshotReader, WeightPublisher, WeightStore
from .ch09_async_loops import ReplayBuffer, continuous_training
from .ch10_multihost import (HostsSpec, JobHosts, add_host_flags, describe_hosts, host_report, hosts_from_args,
                             killing_host_at, missing_scheduler)
from .ch10_policy import (CountingTask, Prompt, greedy_answers, pad_left, prompt_ids,  # noqa: F401 (tests use them)
                          sample_group)
from .ch10_qwen_grpo import (TIMEOUT, Rollout, RunConfig, continuous_rollouts, pick_device,
                             policy_loss, response_logprobs, score)


def clip_gradients(model: torch.nn.Module, max_grad_norm: float | None) -> float:
    """Scale the gradients (after backward) so their total norm is at most `max_grad_norm`; None: leave
    them. Answers the norm before the clip. One rare batch can have a gradient tens of times the usual;
    clipped, it reaches the optimizer's running averages no larger than any other batch."""
    if max_grad_norm is not None and not max_grad_norm > 0:
        raise ValueError(f"max_grad_norm must be above 0 (or None: no clip), got {max_grad_norm}")
    limit = float("inf") if max_grad_norm is None else max_grad_norm
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), limit))


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor,
                   max_grad_norm: float | None) -> float:
    """One update: the gradients of `loss`, clipped (clip_gradients), then the optimizer's step. Answers the
    gradient's norm before the clip. The clip comes between backward and step: the step must see it."""
    optimizer.zero_grad()
    loss.backward()
    norm = clip_gradients(model, max_grad_norm)
    optimizer.step()
    return norm


class AdmissionCount:
    """Admission without waste, as a rule on numbers: start a group only if it will be trained within max_lag.

    The trainer takes groups oldest first, `batch_groups` per step, so the group admitted as number k
    (0, 1, 2, ...) is trained by the learner at version k // batch_groups. A generator holding weights
    of version g may start it only if k // batch_groups - g is at most max_lag; otherwise nothing is
    generated (no waste), and the generator asks again when it holds newer weights. It is chapter 11's
    AdmissionWindow.admit, which chapter 10 cannot import (11 builds on 10).

    A number is lost when its group never reaches the buffer (a generation that failed, a generator
    that died and never gave its number back): later groups are then trained sooner than their numbers
    say, which holds generators back for nothing, and more than a batch of lost numbers would hold them
    back until the trainer starves. So a lost number is taken back from the count: when its generation
    fails, or when it has been out ten times longer than any group took so far (5 s at least).
    """

    def __init__(self, max_lag: int, batch_groups: int, clock=time.monotonic):
        self.max_lag, self.batch_groups, self.clock = max_lag, batch_groups, clock
        self.next_number = 0
        self.in_flight: dict[int, float] = {}  # numbers of groups being generated -> when admitted
        self.longest_s = 0.5  # the longest a group has taken from admission to the buffer
        self.held_back = 0

    def admit(self, generator_version: int) -> int | None:
        """The number of the group a generator holding `generator_version` may start now, or None."""
        now = self.clock()
        patience = max(5.0, 10 * self.longest_s)
        for lost in [k for k, since in self.in_flight.items() if now - since >= patience]:
            self.lose(lost)
        number = self.next_number
        if number // self.batch_groups - generator_version > self.max_lag:
            self.held_back += 1
            return None
        self.next_number += 1
        self.in_flight[number] = now
        return number

    def restart(self, learner_version: int) -> None:
        """A run begins with the learner at `learner_version`: its next group is trained at that version."""
        self.next_number, self.in_flight = learner_version * self.batch_groups, {}

    def arrived(self, number: int) -> None:
        """The group numbered `number` is in the buffer."""
        since = self.in_flight.pop(number, None)
        if since is not None:
            self.longest_s = max(self.longest_s, self.clock() - since)

    def lose(self, number: int) -> None:
        """The group numbered `number` will never reach the buffer: the groups after it move up one place."""
        if self.in_flight.pop(number, None) is not None:
            self.next_number -= 1


class Pacer(Actor):
    """The main job's AdmissionCount, as an actor that every generator asks before it starts a group."""

    def __init__(self, max_lag: int, batch_groups: int):
        self.count = AdmissionCount(max_lag, batch_groups)

    @endpoint
    async def admit(self, generator_version: int) -> int | None:
        return self.count.admit(generator_version)

    @endpoint
    async def start(self, learner_version: int) -> None:
        self.count.restart(learner_version)

    @endpoint
    async def done(self, number: int | None, made: bool = True) -> None:
        """The group numbered `number` is in the buffer (made), or will never be (not made)."""
        if number is not None:
            (self.count.arrived if made else self.count.lose)(number)

    @endpoint
    async def counts(self) -> dict:
        return {"next_number": self.count.next_number, "held_back": self.count.held_back}


class PacerClient:
    """What a rollout loop holds of the Pacer: it puts a group, then gives its number back."""

    def __init__(self, pacer: Pacer):
        self.pacer = pacer

    async def put_then_done(self, put, ticket: int | None) -> None:
        """Await `put` (the group into the buffer); then tell the pacer whether it got there."""
        made = False
        try:
            await put
            made = True
        finally:
            await ask(self.pacer.done, ticket, made)


class Generator(Actor):
    """A generator replica: samples groups with its copy of the policy; pulls new weights first.

    The model loads at the first call, not in __init__: an error there (a bad
    --model path) then comes back to the caller as a clear endpoint error,
    where an exception in __init__ would only show as a dead actor.
    """

    def __init__(self, store: WeightStore, config: RunConfig, pacer: Pacer | None = None):
        self.store, self.config, self.pacer = store, config, pacer
        self.model = self.tokenizer = self.reader = None
        self.recorder = Recorder(replica_label(str(context().actor_instance.name), "generator"))

    def _load(self) -> None:
        if self.model is None:
            torch.set_num_threads(1)
            self.model, self.tokenizer = self.config.load_policy()
            self.model.eval()
            self.reader = SnapshotReader(self.store, self.model.state_dict())

    @endpoint
    async def generate(self, prompt: Prompt, rollout_id: str, paced: bool = False) -> Rollout | None:
        """Pull the newest weights if there are any, then sample one group for `prompt`. `paced`: ask the
        pacer first; None (nothing generated) when it holds the group back, as too stale by its training
        step. The rollout then carries the pacer's ticket, which its loop gives back once it is in the buffer."""
        self._load()
        with self.recorder.span("sync") as info:
            info["loaded"] = await self.reader.pull_and_load()  # the new version, or None if there was none
            info["version"], info["transport"] = self.reader.version, self.reader.last_transport
        ticket = await ask(self.pacer.admit, self.reader.version) if paced and self.pacer is not None else None
        if paced and self.pacer is not None and ticket is None:
            return None
        try:
            with self.recorder.span("generate", version=self.reader.version), torch.no_grad():
                group = sample_group(self.model, self.tokenizer, prompt, self.config.group_size,
                                     self.config.max_new_tokens)
                prompts = group["prompt_ids"].to(self.model.device).expand(self.config.group_size, -1)
                logps = response_logprobs(self.model, prompts, torch.ones_like(prompts),
                                          group["responses"].to(self.model.device), group["mask"].to(self.model.device))
        except BaseException:
            if ticket is not None:
                await ask(self.pacer.done, ticket, False)
            raise
        return Rollout(rollout_id, self.reader.version, prompt, group["prompt_ids"], group["responses"],
                       group["mask"], logps.float().cpu(), group["texts"], ticket=ticket)

    @endpoint
    async def sync(self) -> int:
        """Pull the newest weights now; answer the version held."""
        self._load()
        await self.reader.pull_and_load()
        return self.reader.version

    @endpoint
    async def fingerprint(self) -> str:
        self._load()
        return state_fingerprint(self.model.state_dict())

    @endpoint
    async def whoami(self) -> int:
        return os.getpid()

    @endpoint
    async def timeline(self) -> list:
        return self.recorder.spans


class Trainer(Actor):
    """Holds the policy being trained and its optimizer; publishes every new version (ch07)."""

    def __init__(self, store: WeightStore, config: RunConfig):
        self.store, self.config = store, config
        self.model = self.reference = self.publisher = None
        self.version = 0
        self.recorder = Recorder("trainer")

    def _load(self) -> None:
        if self.model is None:
            torch.set_num_threads(1)
            self.model, self.tokenizer = self.config.load_policy()
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr, weight_decay=0.0)
            if self.config.kl_coef > 0:  # a frozen copy of the starting policy
                self.reference, _ = self.config.load_policy()
                self.reference.eval().requires_grad_(False)
            self.publisher = WeightPublisher(self.model.state_dict(), self.store)

    def _batch(self, rollouts: list[Rollout]) -> dict:
        """Stack the groups into [B*G, ...] tensors: prompts padded left, responses right."""
        pad, G = self.tokenizer.pad_token_id, self.config.group_size
        prompts, prompt_attention = pad_left([r.prompt_ids for r in rollouts for _ in range(G)], pad)
        width = max(r.responses.shape[1] for r in rollouts)

        def right(t: torch.Tensor, value) -> torch.Tensor:
            return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

        device = self.model.device
        return {"prompts": prompts.to(device), "prompt_attention": prompt_attention.to(device),
                "responses": torch.cat([right(r.responses, pad) for r in rollouts]).to(device),
                "mask": torch.cat([right(r.mask, 0.0) for r in rollouts]).to(device),
                "attention": torch.cat([right(r.mask if r.attention is None else r.attention, 0.0)
                                        for r in rollouts]).to(device),
                "old_logps": torch.cat([right(r.logps, 0.0) for r in rollouts]).to(device),
                "rewards": torch.stack([r.rewards for r in rollouts]).to(device)}

    @endpoint
    async def train(self, rollouts: list[Rollout]) -> dict:
        """One GRPO step on `rollouts`, then publish version+1. Answers what happened."""
        self._load()
        with self.recorder.span("train", version=self.version) as info:
            b = self._batch(rollouts)
            logps = response_logprobs(self.model, b["prompts"], b["prompt_attention"], b["responses"], b["mask"],
                                      b["attention"])
            ref_logps = None
            if self.reference is not None:
                with torch.no_grad():
                    ref_logps = response_logprobs(self.reference, b["prompts"], b["prompt_attention"],
                                                  b["responses"], b["mask"], b["attention"])
            # group_advantages (or no std), then grpo_loss (per response, or every token alike): RunConfig's choices
            loss, stats = policy_loss(logps, b["old_logps"], b["rewards"], b["mask"], self.config, ref_logps)
            await self.publisher.wait_staged()  # the last version's snapshot is copied: weights may change
            stats["grad_norm"] = optimizer_step(self.model, self.optimizer, loss, self.config.max_grad_norm)
            lags = [self.version - r.version for r in rollouts]
            self.version += 1
            info.update(loss=loss.item(), groups=len(rollouts), samples=len(rollouts) * self.config.group_size)
        with self.recorder.span("sync", version=self.version):
            if await self.publisher.publish(self.model.state_dict(), version=self.version) is None:
                self.publisher.retry_until_free(self.model.state_dict(), self.version)  # a dead reader's lease
        first = rollouts[0]
        example = {"prompt": first.prompt.text, "response": first.texts[0], "reward": float(first.rewards[0]),
                   "version": first.version}
        return {"version": self.version, "loss": loss.item(), "reward": b["rewards"].mean().item(),
                "lags": lags, "ids": [r.id for r in rollouts], "example": example, **stats}

    @endpoint
    async def answers(self, counts: list[int]) -> dict[int, str]:
        """The policy's greedy answer to "Count to N:" for each N in `counts` (what it would say, not a sample)."""
        self._load()
        return greedy_answers(self.model, self.tokenizer, counts, self.config.max_new_tokens)

    @endpoint
    async def flush(self) -> int:
        """Make sure the newest version is published and committed; answer it. (A version skipped
        because both slots were busy goes out now, once a slot frees: the final sync needs it.)"""
        self._load()
        await self.publisher.publish_until_out(self.model.state_dict(), self.version)
        return self.version

    @endpoint
    async def fingerprint(self) -> str:
        self._load()
        return state_fingerprint(self.model.state_dict())

    @endpoint
    async def timeline(self) -> list:
        return self.recorder.spans

    @endpoint
    async def close(self) -> None:
        if self.publisher is not None:
            await self.publisher.close()


@dataclass
class Job:
    """The actors of one run: a trainer process (with the weight store and buffer) and a service."""

    config: RunConfig
    trainer_procs: object
    store: WeightStore
    buffer: ReplayBuffer
    trainer: Trainer
    service: Service
    pacer: Pacer | None = None  # config.pacing == "admission": what keeps generated groups from going stale
    task: CountingTask = field(default_factory=CountingTask)
    hosts: JobHosts | None = None  # the Monarch job whose hosts the actors run on (--hosts), or None: this host
    owns_trainer_procs: bool = True  # False: the caller gave them (and stops them)
    loading: list = field(default_factory=list)  # replies of start_loading's calls, not yet waited for

    @classmethod
    def start(cls, config: RunConfig, name: str = "grpo", hosts: HostsSpec | None = None,
              trainer_procs=None, generator: type | None = None) -> "Job":
        """`trainer_procs`: where the trainer, store and buffer go (default: a new process; tests pass
        this_proc(), to spare one process that imports transformers). `generator`: the generators'
        actor class (default: Generator; chapter 12's generate turns)."""
        where = JobHosts(hosts) if hosts is not None else None  # ch10_multihost: the trainer and the generators
        try:                                                     # on hosts of their own
            procs = trainer_procs or (where.trainer_procs() if where else this_host().spawn_procs(per_host={"procs": 1}))
            store = procs.spawn(f"{name}_store", WeightStore, config.lease_timeout_s)
            buffer = procs.spawn(f"{name}_buffer", ReplayBuffer, config.max_lag)
            trainer = procs.spawn(f"{name}_trainer", Trainer, store, config)
            pacer = (procs.spawn(f"{name}_pacer", Pacer, config.max_lag, config.groups_per_step)
                     if config.pacing == "admission" else None)
            service = (where.generator_service if where else Service)(
                generator or Generator, store, config, pacer, replicas=config.generators, name=f"{name}_generator",
                call_timeout=TIMEOUT)
        except BaseException:
            if where is not None:
                where.kill()
            raise
        return cls(config, procs, store, buffer, trainer, service, pacer, hosts=where,
                   owns_trainer_procs=trainer_procs is None)

    def start_loading(self) -> None:
        """Have the generators load their models now, without waiting: they do it while the caller goes on.
        (The trainer loads in warm_up: it may share this process, whose imports must not run twice at once.)"""
        self.loading = [r.actor.sync.call_one() for r in self.service.replicas]

    async def warm_up(self) -> None:
        """Load the models everywhere before the clock starts (imports and init take seconds): the
        trainer's load runs while the generators' (asked for by start_loading) are still going."""
        loading, self.loading = self.loading, []
        await asyncio.gather(ask(self.trainer.flush, timeout=4 * TIMEOUT),
                             *(asyncio.wait_for(reply, 4 * TIMEOUT) for reply in loading))
        await self.service.fanout("sync")

    async def final_sync(self) -> dict:
        """Make every generator load the trainer's last version; answer both sides' fingerprints."""
        version = await ask(self.trainer.flush, timeout=2 * TIMEOUT)  # committed when it answers
        await self.service.wait_recovered()
        versions = await self.service.fanout("sync")
        return {"version": version, "generator_versions": versions,
                "trainer": await ask(self.trainer.fingerprint), "generators": await self.service.fanout("fingerprint")}

    async def spans(self) -> list:
        spans = [await ask(self.trainer.timeline)]
        spans += list((await self.service.fanout("timeline")).values())
        return merge(*spans)

    async def stop(self) -> None:
        try:
            await ask(self.trainer.close)
        finally:
            try:
                stopping = [asyncio.wait_for(self.trainer_procs.stop(), TIMEOUT)] if self.owns_trainer_procs else []
                await asyncio.gather(self.service.close(), *stopping)
            finally:
                if self.hosts is not None:
                    self.hosts.kill()  # the job's hosts, and anything still on them


async def run_async(job: Job, on_step=None, timeout: float = 1800, loops_per_generator: int = 2) -> dict:
    """Both loops at once: rollout loops (two per replica keep each one busy) and chapter 09's training loop."""
    config, stop = job.config, asyncio.Event()
    if job.pacer is not None:  # numbering from the learner's version now (a job may run more than once)
        await ask(job.pacer.start, await ask(job.trainer.flush, timeout=2 * TIMEOUT))
    pacer = PacerClient(job.pacer) if job.pacer is not None else None
    rollouts = [continuous_rollouts(job.service, job.buffer, job.task, stop, worker, config.seed, pacer)
                for worker in range(loops_per_generator * config.generators)]
    training = continuous_training(job.trainer, job.buffer, config.steps, config.groups_per_step, stop, on_step)
    *counts, results = await asyncio.wait_for(asyncio.gather(*rollouts, training), timeout)
    ledger = await ask(job.buffer.close)
    pacing = await ask(job.pacer.counts) if job.pacer is not None else None
    return {"results": results, "rollouts": counts, "ledger": ledger, "pacing": pacing}


async def run_sync(job: Job, on_step=None) -> dict:
    """Lock step, for comparison: generate a batch with the newest weights, train, wait for the sync."""
    config, results = job.config, []
    rng = random.Random(config.seed)
    for step in range(config.steps):
        prompts = [job.task.sample(rng) for _ in range(config.groups_per_step)]
        batch = await asyncio.gather(*(job.service.route("generate", p, f"s{step}-{i}") for i, p in enumerate(prompts)))
        result = await ask(job.trainer.train, [score(job.task, r) for r in batch])
        await wait_for_version(job.store, result["version"])
        results.append(result)
        if on_step is not None:
            on_step(result)
    return {"results": results, "rollouts": [], "ledger": None}


def killing_at(job: Job, step: int, on_step=None):
    """Wrap `on_step` so that right after `step` it SIGKILLs generator replica 0's process."""
    kills = []

    def wrapped(result: dict) -> None:
        if result["version"] == step:
            async def kill() -> None:
                pid = await kill_replica(job.service, 0)
                print(f"  ** after step {step}: SIGKILL generator replica 0 (pid {pid}) **")

            kills.append(asyncio.get_running_loop().create_task(kill()))  # kept, so it is not collected early
        if on_step is not None:
            on_step(result)

    return wrapped


async def train_async(config: RunConfig, mode: str = "async", on_step=None, name: str = "grpo", kill_at: int = 0,
                      hosts: HostsSpec | None = None, answer_counts: list[int] | None = None) -> dict:
    """Start a job, run it in `mode`, sync the weights one last time, stop it. Answers the figures (with
    `answer_counts`, also the policy's greedy answers to "Count to N:" before and after training)."""
    job = Job.start(config, name, hosts)
    try:
        await job.warm_up()
        before = await ask(job.trainer.answers, answer_counts) if answer_counts else None
        if kill_at > 0:
            on_step = killing_at(job, kill_at, on_step)
        if hosts is not None and hosts.kill_host_at > 0:
            on_step = killing_host_at(job, hosts.kill_host_at, on_step)
        started = time.time()
        run = await (run_async(job, on_step) if mode == "async" else run_sync(job, on_step))
        run["seconds"] = time.time() - started
        run["final"] = await job.final_sync()
        if answer_counts:
            run["answers"] = {"before": before, "after": await ask(job.trainer.answers, answer_counts)}
        run["spans"] = await job.spans()
        run["service"] = job.service.snapshot()
        if job.hosts is not None:
            run["hosts"] = await host_report(job, run["spans"])
        return run
    finally:
        await job.stop()


def train(config: RunConfig, mode: str = "async", on_step=None, name: str = "grpo", kill_at: int = 0,
          hosts: HostsSpec | None = None, answer_counts: list[int] | None = None) -> dict:
    return asyncio.run(train_async(config, mode, on_step, name, kill_at, hosts, answer_counts))


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
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}.ch10_qwen_grpo",
                                     description="Async GRPO on a Qwen2 policy, from your chapters' parts.")
    parser.add_argument("--mode", choices=["async", "sync"], default="async")
    parser.add_argument("--compare", action="store_true", help="run sync, then async, on the same config")
    parser.add_argument("--steps", type=int, default=RunConfig.steps)
    parser.add_argument("--model", default=None, help="hub id or local path (default: the tiny offline Qwen2)")
    parser.add_argument("--dtype", default=RunConfig.dtype)
    parser.add_argument("--generators", type=int, default=RunConfig.generators)
    parser.add_argument("--max-lag", type=int, default=RunConfig.max_lag)
    parser.add_argument("--pacing", choices=["admission", "drop"], default=RunConfig.pacing,
                        help="admission: start a group only if it will be trained within --max-lag (no waste); "
                             "drop: start every group, drop the ones that went stale")
    parser.add_argument("--lr", type=float, default=RunConfig.lr)
    parser.add_argument("--group-size", type=int, default=RunConfig.group_size, help="G: responses per prompt")
    parser.add_argument("--kl-coef", type=float, default=RunConfig.kl_coef)
    parser.add_argument("--loss-mean", choices=["sequence", "token"], default=RunConfig.loss_mean,
                        help="average the loss per response, then over responses; or over every token alike")
    parser.add_argument("--advantage-std", action=argparse.BooleanOptionalAction, default=RunConfig.advantage_std,
                        help="divide each advantage by its group's std (--no-advantage-std: reward - group mean)")
    parser.add_argument("--max-grad-norm", type=float, default=RunConfig.max_grad_norm,
                        help="clip the gradient's total norm to this before each step (0: no clip)")
    parser.add_argument("--seed", type=int, default=RunConfig.seed)
    parser.add_argument("--show-every", type=int, default=20)
    parser.add_argument("--kill-at", type=int, default=0, metavar="STEP",
                        help="SIGKILL a generator replica after this step; training carries on")
    parser.add_argument("--trace", help="write the timeline as Chrome trace JSON (open in ui.perfetto.dev)")
    add_host_flags(parser)
    args = parser.parse_args()
    hosts = hosts_from_args(parser, args)
    if args.max_grad_norm < 0:
        parser.error(f"--max-grad-norm {args.max_grad_norm}: a norm is 0 or more (0 turns the clip off)")
    if hosts is not None and (missing := missing_scheduler(hosts.scheduler)):
        parser.error(missing)
    config = RunConfig(model=args.model, seed=args.seed, steps=args.steps, max_lag=args.max_lag, pacing=args.pacing,
                       generators=args.generators, kl_coef=args.kl_coef, dtype=args.dtype, lr=args.lr,
                       loss_mean=args.loss_mean, advantage_std=args.advantage_std, group_size=args.group_size,
                       max_grad_norm=args.max_grad_norm or None)
    modes = ["sync", "async"] if args.compare else [args.mode]
    print(f"Chapter 10: GRPO on {config.model or 'a tiny Qwen2 (random init)'}, task 'Count to N', "
          f"{config.generators} generators, {config.steps} steps of {config.groups_per_step}x{config.group_size} "
          f"samples, max lag {config.max_lag}, lr {config.lr:g}, {config.loss_mean}-mean loss, advantages "
          f"{'/ std' if config.advantage_std else 'without std'}, KL {config.kl_coef:g}, gradient norm clipped at "
          f"{config.max_grad_norm if config.max_grad_norm else 'no limit'}, device {pick_device()}\n")
    figures = {}
    for mode in modes:
        figures[mode] = show_run(config, mode, args.show_every, args.trace if mode == modes[-1] else None,
                                 args.kill_at, hosts)
    if args.compare:
        s, a = figures["sync"], figures["async"]
        from koans.bench.weight_sync import _hardware

        machine = _hardware()
        COMPARE.write_text(json.dumps({"sync": s["samples_per_s"], "async": a["samples_per_s"],
                                       "machine": f"{machine['cpu']}, {machine['cores']} cores, GPU {machine['gpu']}"}))
        print(f"\nasync vs sync: {a['samples_per_s']:.1f} vs {s['samples_per_s']:.1f} samples/s = "
              f"{a['samples_per_s'] / s['samples_per_s']:.2f}x")
        for mode in modes:
            print(f"  busy {mode:>5}: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in figures[mode]["busy"].items()))


def show_run(config: RunConfig, mode: str, show_every: int, trace: str | None, kill_at: int = 0,
             hosts: HostsSpec | None = None) -> dict:
    print(f"--- {mode} ---" + (f" on {hosts.describe()}" if hosts else ""))
    rewards: list[float] = []

    def on_step(result: dict) -> None:
        rewards.append(result["reward"])
        if result["version"] % show_every == 0 or result["version"] == 1:
            recent = rewards[-show_every:]
            ex = result["example"]
            print(f"  step {result['version']:>4}  running mean reward {sum(recent) / len(recent):.2f}  "
                  f"lags {dict(sorted(Counter(result['lags']).items()))}\n"
                  f"      {ex['prompt']!r} -> {ex['response']!r}  reward {ex['reward']:.2f}  (policy v{ex['version']})")

    run = train(config, mode, on_step, name=f"grpo_{mode}", kill_at=kill_at, hosts=hosts, answer_counts=ANSWER_COUNTS)
    figures = summary(run, config)
    tenth = max(1, len(rewards) // 10)
    print(f"\n{len(rewards)} steps in {run['seconds']:.1f} s, {figures['samples_per_s']:.1f} samples/s; mean reward "
          f"first 10% {sum(rewards[:tenth]) / tenth:.2f} -> last 10% {sum(rewards[-tenth:]) / tenth:.2f}")
    print("reward per step:\n" + ascii_curve(rewards))
    print("policy lag of trained groups:\n" + histogram(figures["lags"], "lag "))
    if run["ledger"] is not None:
        ledger, generated = run["ledger"], sum(run["rollouts"])
        wasted = len(ledger.refused_stale) + len(ledger.dropped_stale)
        print(f"groups: generated {generated} = trained {len(ledger.trained)} + refused stale "
              f"{len(ledger.refused_stale)} + dropped stale {len(ledger.dropped_stale)} + unused at stop "
              f"{len(ledger.unused_at_stop)}; wasted (generated, never trained for staleness) {wasted} = "
              f"{100 * wasted / max(1, generated):.1f}%")
        if run.get("pacing") is not None:
            print(f"pacing: admission (--pacing drop: generate, then drop the stale); {run['pacing']['held_back']} "
                  "starts held back until the generator held newer weights (nothing generated for them)")
    service = run["service"]
    if service["replica_failures"]:
        print(f"service: {service['replica_failures']} replica death(s), {service['retries']} retried request(s), "
              f"{service['failed']} failed, {service['recoveries']} recovered; generations {service['generations']}")
    final = run["final"]
    same = all(f == final["trainer"] for f in final["generators"].values())
    print(f"final weights: version {final['version']} on every generator {sorted(final['generator_versions'].values())}; "
          f"bit-equal to the trainer's: {same}")
    if "hosts" in run:
        print(describe_hosts(run["hosts"], service))
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
    print(show_answers(run["answers"]))
    return figures


#: "Count to N:" for these N ends the demo, before and after training. Training asks for 2..9 (CountingTask's
#: default); N=1 shows whether the policy reads N or only counts on until the shortest answer it was paid for.
ANSWER_COUNTS = list(range(1, 10))


def show_answers(answers: dict, width: int = 20) -> str:
    """The policy's greedy answers (the first `width` characters), before and after training, with their rewards."""
    lines = ["greedy answers (the most likely token at each step), before -> after training:"]
    for n in answers["after"]:
        prompt = Prompt(f"Count to {n}:", list(range(1, n + 1)))
        before, after = answers["before"][n], answers["after"][n]
        lines.append(f"  'Count to {n}:' {before[:width]!r:>{width + 2}} ({CountingTask.reward(prompt, before):.2f})"
                     f" -> {after[:width]!r} ({CountingTask.reward(prompt, after):.2f})")
    return "\n".join(lines)
