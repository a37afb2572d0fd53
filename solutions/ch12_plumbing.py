"""Chapter 12 plumbing: a generator of turns, tool pools, the episode loops, training on episodes
with chapter 10's trainer, and the demo. You may skip this file; nothing in it is a TODO.

    TurnGenerator        chapter 10's generator replica, sampling one policy turn at a time (it
                         pulls the newest weights first, so weights may change between turns)
    ToolsConfig          chapter 10's RunConfig for the vault task (its tokenizer, tools, limits)
    as_rollout           the G episodes of one prompt as one chapter 10 Rollout: what the buffer
                         and the trainer take (the mask leaves the tools' tokens out of the loss)
    start_tools          a pool of tool workers behind a Service (least loaded, or round robin)
    run_async / run_sync episode loops and chapter 09's training loop at once, or lock step
    main                 the demo: python -m exercises.ch12_multi_turn_tools --help
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import torch
from koans.learn.report import ascii_curve, histogram
from koans.learn.timeline import merge, write_chrome_trace
from koans.learn.viz import DEFAULT_TRACE as LAST_TRACE
from monarch.actor import endpoint

from .ch06_service import Service
from .ch07_plumbing import ask, wait_for_version
from .ch09_async_loops import continuous_training
from .ch10_plumbing import Generator, Job
from .ch10_policy import build_random_model, neutral_generation_config
from .ch10_qwen_grpo import PACING_WAIT_S, TIMEOUT, Rollout, RunConfig, pick_device, response_logprobs
from .ch12_multi_turn_tools import Episode, LeastLoadedService, Turn, run_episode
from .ch12_tools import ANSWER, CALL, REPLY, STOP, Limits, ToolLatency, ToolWorker, VaultPrompt, VaultTask, tools_tokenizer


@dataclass(frozen=True)
class ToolsConfig(RunConfig):
    """A chapter 10 run of the vault task: the policy is the tiny Qwen2 with the tools tokenizer, random, or the
    warm-started base policy saved at `base` (see warm_start)."""

    groups_per_step: int = 4
    group_size: int = 8
    kl_coef: float = 0.0  # chapter 10's first recipe, on which this chapter's figures were measured
    loss_mean: str = "sequence"
    max_grad_norm: float | None = None
    steps: int = 150
    limits: Limits = Limits()
    tools: int = 3  # tool workers in the pool
    slots: int = 4  # calls a tool worker serves at once
    router: str = "least_loaded"  # or "round_robin"
    latency: ToolLatency = ToolLatency()
    loops: int = 6  # episode loops at once (each runs G episodes of one prompt at a time)
    # Generate, then drop what went stale (chapter 09's buffer): a group's slowest tool call decides when it lands,
    # and under admission ("admission") a straggler holds its number, and with it every group after it.
    pacing: str = "drop"
    base: str | None = None  # a directory written by warm_start; None: random weights

    def load_policy(self):
        tokenizer = tools_tokenizer()
        if self.base is None:
            model = build_random_model(tokenizer, self.seed)
        else:
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging

            logging.disable_progress_bar()  # one line per process and load, and nothing in it worth reading
            model = AutoModelForCausalLM.from_pretrained(self.base)
        model.generation_config = neutral_generation_config(model.generation_config)
        return model.to(device=pick_device(), dtype=getattr(torch, self.dtype)), tokenizer


def warm_start(directory: str, seed: int = 0, steps: int = 500, lr: float = 3e-3) -> str:
    """A base policy, as pretraining would leave one: it can use the tool, but rarely does.

    Supervised (cross-entropy on the policy's tokens) on episodes of two kinds: a tool call, the tool's
    reply and the answer read from it ("?c", "=7", "!7"), or a guess ("!4"). Half are tool calls for the
    first 4/5 of the steps (it learns to read a reply), one in twenty for the rest (it learns to guess).
    RL then learns which pays. Saved to `directory`, and reused if it is already there."""
    from pathlib import Path

    from transformers.utils import logging

    if (Path(directory) / "config.json").exists():
        return directory
    logging.disable_progress_bar()
    model, tokenizer = build_random_model(tools_tokenizer(), seed), tools_tokenizer()
    task, rng = VaultTask(tokenizer), random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    for step in range(steps):
        rows, tool_share = [], 0.5 if step < steps * 4 // 5 else 0.05
        for _ in range(32):
            prompt = task.sample(rng)
            episode = Episode(task.prompt_ids(prompt))
            if rng.random() < tool_share:
                episode.append_turn(encode(f"{CALL}{prompt.name}{STOP}"), [0.0] * 3, 0)
                episode.append_turn(task.reply_ids(task.reply_text(prompt.answer)))
                episode.append_turn(encode(f"{ANSWER}{prompt.answer}") + [tokenizer.eos_token_id], [0.0] * 3, 0)
            else:
                episode.append_turn(encode(f"{ANSWER}{rng.randrange(10)}") + [tokenizer.eos_token_id], [0.0] * 3, 0)
            rows.append(episode)
        width = max(len(e.prompt_ids + e.ids) for e in rows)
        ids = torch.tensor([e.prompt_ids + e.ids + [tokenizer.pad_token_id] * (width - len(e.prompt_ids + e.ids))
                            for e in rows])
        trained = torch.tensor([[0.0] * len(e.prompt_ids) + e.mask + [0.0] * (width - len(e.prompt_ids + e.ids))
                                for e in rows])
        logits = model(ids).logits[:, :-1]
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (losses * trained[:, 1:]).sum() / trained[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(directory)
    return directory


class TurnGenerator(Generator):
    """A generator replica that samples one turn: after `ids`, until a stop token or max_new tokens."""

    @endpoint
    async def generate_turn(self, ids: list[int], max_new: int) -> Turn:
        self._load()
        with self.recorder.span("sync") as info:
            info["loaded"] = await self.reader.pull_and_load()  # new weights, between two turns if need be
            info["version"], info["transport"] = self.reader.version, self.reader.last_transport
        with self.recorder.span("generate", version=self.reader.version), torch.no_grad():
            prompt = torch.tensor([ids], device=self.model.device)
            out = self.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, temperature=1.0,
                                      top_k=0, top_p=1.0, max_new_tokens=max_new, eos_token_id=self._stop_ids(),
                                      pad_token_id=self.tokenizer.pad_token_id)
            new = out[:, prompt.shape[1]:]  # one row: it ends at its first stop token, unpadded
            logps = response_logprobs(self.model, prompt, torch.ones_like(prompt), new, torch.ones_like(new, dtype=torch.float))
        return Turn(new[0].tolist(), logps[0].float().tolist(), self.reader.version)

    @endpoint
    async def save_policy(self, directory: str) -> int:
        """Save the weights this replica samples with (from_pretrained reads them back); answers their version."""
        from transformers.utils import logging

        self._load()
        logging.disable_progress_bar()
        self.model.save_pretrained(directory)
        return self.reader.version

    def _stop_ids(self) -> list[int]:
        return VaultTask(self.tokenizer).stop_ids


def as_rollout(episodes: list[Episode], prompt: VaultPrompt, rollout_id: str, task: VaultTask) -> Rollout:
    """The G episodes of one prompt as one chapter 10 Rollout, scored. Its version is that of its oldest
    episode: the staleness bound holds for every token trained on."""
    pad = task.tokenizer.pad_token_id
    width = max(len(e.ids) for e in episodes)

    def rows(values, fill, dtype):
        return torch.tensor([v + [fill] * (width - len(v)) for v in values], dtype=dtype)

    rewards = torch.tensor([task.reward(prompt, e.ids, e.mask) for e in episodes])
    texts = [" | ".join(f"{who}: {text!r}" for who, text in task.turns(e.ids, e.mask)) for e in episodes]
    return Rollout(rollout_id, min(e.version for e in episodes), prompt, torch.tensor(episodes[0].prompt_ids),
                   rows([e.ids for e in episodes], pad, torch.long), rows([e.mask for e in episodes], 0.0, torch.float),
                   rows([e.logprobs for e in episodes], 0.0, torch.float), texts, rewards,
                   attention=rows([[1.0] * len(e.ids) for e in episodes], 0.0, torch.float))


def start_tools(config: ToolsConfig, name: str = "tools", router: str | None = None):
    """A pool of `config.tools` tool workers behind a Service: least loaded (LeastLoadedService) or round robin
    (chapter 06's)."""
    kind = LeastLoadedService if (router or config.router) == "least_loaded" else Service
    return kind(ToolWorker, config.latency, config.seed, config.slots, replicas=config.tools, name=name, call_timeout=TIMEOUT)


@dataclass
class Episodes:
    """What the episode loops made: every episode's turns, tokens, latency; for the demo's figures."""

    latencies: list[float] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)  # (policy version, policy turns) per episode
    ended: Counter = field(default_factory=Counter)
    shown: deque = field(default_factory=lambda: deque(maxlen=2))  # the last few (prompt, episode)
    mixed: tuple | None = None  # the last (prompt, episode) whose weights changed between its turns


async def one_group(job: Job, tools, task: VaultTask, prompt: VaultPrompt, limits: Limits, made: Episodes) -> list[Episode]:
    """G episodes of one prompt, at once (their tool calls overlap)."""

    async def timed() -> Episode:
        started = time.monotonic()
        episode = await run_episode(job.service, tools, task, prompt, limits)
        made.latencies.append(time.monotonic() - started)
        made.turns.append((episode.version, sum(1 for who, _ in task.turns(episode.ids, episode.mask) if who == "policy")))
        made.ended[episode.ended] += 1
        return episode

    episodes = await asyncio.gather(*(timed() for _ in range(job.config.group_size)))
    made.shown.append((prompt, episodes[0]))
    for episode in episodes:
        if len({version for version in episode.versions if version >= 0}) > 1:
            made.mixed = (prompt, episode)
    return episodes


async def continuous_episodes(job: Job, tools, task: VaultTask, stop: asyncio.Event, worker: int,
                              made: Episodes) -> int:
    """One loop: a prompt, its G episodes, scored into the buffer; until `stop` is set. Answers the groups made.

    With the job's pacer (chapter 10's admission), a group starts only if it will be trained within the bound:
    its turns are sampled by the newest published weights or newer, so the bound is asked of that version."""
    config, rng, count = job.config, random.Random(job.config.seed * 1000 + worker), 0
    while not stop.is_set():
        ticket = None
        if job.pacer is not None:
            published = (await ask(job.store.stats))["latest_version"]
            ticket = await ask(job.pacer.admit, published)
            if ticket is None:  # held back: this group would be too stale by its training step
                await asyncio.sleep(PACING_WAIT_S)
                continue
        made_it = False
        try:
            prompt = task.sample(rng)
            episodes = await one_group(job, tools, task, prompt, config.limits, made)
            count += 1
            rollout = as_rollout(episodes, prompt, f"w{worker}-{count}", task)
            await asyncio.wait_for(job.buffer.put.call_one(rollout), TIMEOUT)
            made_it = True
        finally:
            if ticket is not None:
                await ask(job.pacer.done, ticket, made_it)
    return count


async def run_async(job: Job, tools, task: VaultTask, on_step=None, timeout: float = 1800,
                    loops: int | None = None) -> dict:
    """Episode loops and chapter 09's training loop at once: tool latency hides behind training.
    `loops`: the depth, groups in flight (default: job.config.loops)."""
    stop, made = asyncio.Event(), Episodes()
    if job.pacer is not None:  # admission numbers from the learner's version now (a job may run more than once)
        await ask(job.pacer.start, await ask(job.trainer.flush, timeout=2 * TIMEOUT))
    loops = [continuous_episodes(job, tools, task, stop, worker, made) for worker in range(loops or job.config.loops)]
    training = continuous_training(job.trainer, job.buffer, job.config.steps, job.config.groups_per_step, stop, on_step)
    *counts, results = await asyncio.wait_for(asyncio.gather(*loops, training), timeout)
    return {"results": results, "groups": counts, "ledger": await ask(job.buffer.close), "episodes": made}


async def run_sync(job: Job, tools, task: VaultTask, on_step=None) -> dict:
    """Lock step: a batch of groups (every episode at once), train, wait for the new weights, again.
    Each step waits for its slowest episode: a slow tool call holds up the whole step."""
    config, rng, made, results = job.config, random.Random(job.config.seed), Episodes(), []
    phases = {"episodes": [], "train": [], "weights": []}  # seconds of each step spent on each
    for step in range(config.steps):
        started = time.monotonic()
        prompts = [task.sample(rng) for _ in range(config.groups_per_step)]
        groups = await asyncio.gather(*(one_group(job, tools, task, p, config.limits, made) for p in prompts))
        batch = [as_rollout(g, p, f"s{step}-{i}", task) for i, (g, p) in enumerate(zip(groups, prompts))]
        sampled = time.monotonic()
        result = await ask(job.trainer.train, batch)
        trained = time.monotonic()
        await wait_for_version(job.store, result["version"])
        for phase, seconds in zip(phases, (sampled - started, trained - sampled, time.monotonic() - trained)):
            phases[phase].append(seconds)
        results.append(result)
        if on_step is not None:
            on_step(result)
    return {"results": results, "groups": [], "ledger": None, "episodes": made, "phases": phases}


# --- the demo ------------------------------------------------------------------------------------------


def transcript(task: VaultTask, prompt: VaultPrompt, episode: Episode) -> str:
    """One episode, turn by turn: who wrote what, the mask of its tokens, and the versions of the policy's."""
    lines = [f"    prompt  {prompt.text!r}   (hidden: {prompt.name} = {prompt.answer})"]
    for who, start, end in task.turn_spans(episode.ids, episode.mask):
        text = task.tokenizer.decode(episode.ids[start:end])
        versions = sorted({v for v in episode.versions[start:end] if v >= 0})
        tag = f"version {','.join(map(str, versions))}" if versions else ""
        mask = " ".join(str(int(m)) for m in episode.mask[start:end])
        lines.append(f"    {who:<6}  {text!r:<14} mask {mask:<14}{tag}")
    return "\n".join(lines)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class TrainedCaller:
    """Stands in for a policy that has learned the task ("?c", then the digit the tool gave), and answers at once:
    with it, an episode's latency is its tool calls' alone, which is what routing changes."""

    def __init__(self, task: VaultTask):
        self.task = task

    async def route(self, endpoint: str, ids: list[int], max_new: int) -> Turn:
        text = self.task.decode(ids)
        replies = [line for line in text.splitlines() if line.startswith(REPLY)]
        turn = f"{ANSWER}{replies[-1][len(REPLY):]}" if replies else f"{CALL}{text.split()[1]}{STOP}"
        ids = self.task.tokenizer(turn, add_special_tokens=False)["input_ids"]
        return Turn(ids, [0.0] * len(ids), 0)


async def compare_routers(config: ToolsConfig, task: VaultTask, clients: int = 8, episodes: int = 12) -> dict:
    """Episode latency on a pool with one slow worker, routed round robin, then least loaded: `clients` loops
    at once, each running `episodes` episodes one after the other (a steady load, as in training). The
    workers serve one call at a time (a sandbox each), so that calls sent to the slow one queue there."""
    figures, config = {}, dataclasses.replace(config, slots=1)
    for router in ("round_robin", "least_loaded"):
        tools = start_tools(config, name=f"tools_{router}", router=router)
        try:
            await asyncio.wait_for(tools.fanout("whoami"), TIMEOUT)  # every worker is up before the clock starts
            await ask(tools.replicas[0].actor.make_slow, True)  # worker 0: latency.slow_base a call
            made, caller = Episodes(), TrainedCaller(task)

            async def client(seed: int) -> None:
                rng = random.Random(seed)
                for _ in range(episodes):
                    started = time.monotonic()
                    await run_episode(caller, tools, task, task.sample(rng), config.limits)
                    made.latencies.append(time.monotonic() - started)

            await asyncio.wait_for(asyncio.gather(*(client(seed) for seed in range(clients))), 600)
            figures[router] = {"p50": percentile(made.latencies, 0.5), "p99": percentile(made.latencies, 0.99),
                               "episodes": len(made.latencies),
                               "calls": (await tools.fanout("calls_made"))}
        finally:
            await tools.close()
    return figures


async def train(config: ToolsConfig, mode: str, on_step=None, name: str = "tools_grpo", save_to: str | None = None) -> dict:
    """One training run, "async" (episode loops and training at once) or "sync" (lock step), on a job of its own.
    `save_to`: a directory to save the trained policy in."""
    job = Job.start(config, name, generator=TurnGenerator)
    tools, task = start_tools(config, name=f"{name}_tools"), VaultTask()
    try:
        await job.warm_up()
        started = time.time()
        run = await (run_async(job, tools, task, on_step) if mode == "async" else run_sync(job, tools, task, on_step))
        run["seconds"] = time.time() - started
        run["spans"] = merge(*[await ask(job.trainer.timeline)], *(await job.service.fanout("timeline")).values(),
                             *(await tools.fanout("timeline")).values())
        if save_to is not None:
            await job.final_sync()
            await ask(job.service.replicas[0].actor.save_policy, save_to)
        return run
    finally:
        await tools.close()
        await job.stop()


def episodes_per_second(config: ToolsConfig, run: dict) -> float:
    return len(run["results"]) * config.groups_per_step * config.group_size / run["seconds"]


#: Tools that answer at once: the rate a depth reaches when nothing waits (its "0 ms rate").
NO_LATENCY = ToolLatency(base=0.0, tail=0.0, tail_every=10, slow_base=0.0)


def trained_policy(seed: int = 0, quiet: bool = True) -> str:
    """The directory of a policy trained on the vault task (it calls the tool, then answers): the demo's, if it
    has run, else trained now (the warm start, then ToolsConfig.steps async steps). Comparisons start from it."""
    trained = LAST_TRACE.with_name(f"ch12_trained_seed{seed}")
    if not (trained / "config.json").exists():
        base = warm_start(str(LAST_TRACE.with_name(f"ch12_base_seed{seed}")), seed)
        if not quiet:
            print(f"training a policy to compare with ({ToolsConfig.steps} steps), saved to {trained}", flush=True)
        LAST_TRACE.parent.mkdir(exist_ok=True)
        asyncio.run(train(ToolsConfig(seed=seed, base=base), "async", name="tools_base", save_to=str(trained)))
    return str(trained)


async def depth_sweep(config: ToolsConfig, depths: list[int], steps: int = 30, zero: bool = True,
                      name: str = "tools_depth", quiet: bool = False) -> list[dict]:
    """One job: at the tools' latency (and first with tools that answer at once, if `zero`), `steps` steps in lock
    step, then `steps` async at each depth (episode loops, each one group of G episodes in flight). One row per
    latency and mode: episodes per second, and the lag of every group trained against the bound."""
    config = dataclasses.replace(config, steps=steps)
    job = Job.start(config, name, generator=TurnGenerator)
    task, rows, dropped_before, version = VaultTask(), [], 0, 0
    try:
        job.start_loading()
        await job.warm_up()
        for label, latency in ((("none", NO_LATENCY),) if zero else ()) + (("tools", config.latency),):
            tools = start_tools(dataclasses.replace(config, latency=latency), name=f"{name}_{label}")
            try:
                await asyncio.wait_for(tools.fanout("whoami"), TIMEOUT)  # every worker is up before the clock starts
                for depth in [0, *depths]:  # 0: lock step
                    await ask(job.buffer.advance, version)
                    started = time.monotonic()
                    run = await (run_sync(job, tools, task) if depth == 0 else run_async(job, tools, task, loops=depth))
                    seconds = time.monotonic() - started
                    version = run["results"][-1]["version"]
                    await wait_for_version(job.store, version)  # the next run starts from published weights
                    dropped = 0
                    if run["ledger"] is not None:  # the buffer's ledger counts every run so far
                        total = len(run["ledger"].refused_stale) + len(run["ledger"].dropped_stale)
                        dropped, dropped_before = total - dropped_before, total
                    lags = [lag for result in run["results"] for lag in result["lags"]]
                    row = {"latency": label, "mode": "sync" if depth == 0 else "async", "depth": depth or None,
                           "episodes_per_s": steps * config.groups_per_step * config.group_size / seconds,
                           "max_lag": max(lags), "mean_lag": sum(lags) / len(lags), "max_lag_bound": config.max_lag,
                           "dropped": dropped, "groups_per_step": config.groups_per_step,
                           "group_size": config.group_size, "steps": steps}
                    rows.append(row)
                    if depth == 0:  # where lock step's time goes: the median step, phase by phase
                        row["phases_s"] = {phase: statistics.median(seconds) for phase, seconds in run["phases"].items()}
                    if not quiet:
                        what = "lock step" if depth == 0 else f"async, depth {depth:>2}"
                        print(f"  tool latency {label:<5} {what:<16} {row['episodes_per_s']:6.1f} episodes/s   lag max "
                              f"{row['max_lag']} mean {row['mean_lag']:.2f} (bound {config.max_lag}), dropped {dropped}",
                              flush=True)
                        if depth == 0:
                            print("    a lock-step step, median: " + ", ".join(
                                f"{phase} {seconds:.3f} s" for phase, seconds in row["phases_s"].items()), flush=True)
            finally:
                await tools.close()
    finally:
        await job.stop()
    return rows


def depth_table(rows: list[dict]) -> str:
    """Per depth at the tools' latency: episodes/s, its share of the same depth's rate with tools that answer at
    once, the ratio to lock step, and the lag of what was trained against the bound."""
    at = {(r["latency"], r["depth"]): r for r in rows}
    sync = at[("tools", None)]["episodes_per_s"]
    lines = ["depth       episodes/s  of 0 ms  x lock step  lag max / mean (bound)  dropped"]
    for row in (r for r in rows if r["latency"] == "tools"):
        zero = at.get(("none", row["depth"]))
        share = f"{row['episodes_per_s'] / zero['episodes_per_s']:>7.0%}" if zero else f"{'-':>7}"
        label = "lock step" if row["depth"] is None else f"{row['depth']:>9}"
        lines.append(f"{label:<9} {row['episodes_per_s']:>12.1f}  {share} {row['episodes_per_s'] / sync:>11.2f}x  "
                     f"{row['max_lag']:>7} / {row['mean_lag']:.2f} ({row['max_lag_bound']}){row['dropped']:>15}")
    first = rows[0]
    lines.append(f"depth: episode loops, each one group of {first['group_size']} episodes in flight (lock step: "
                 f"{first['groups_per_step']} groups a batch); lag: versions behind the learner of each group trained")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__package__}.ch12_multi_turn_tools",
                                     description="Multi-turn episodes with tools: async GRPO on the vault task, then "
                                                 "async against lock step, then two routers against a slow tool worker.")
    parser.add_argument("--steps", type=int, default=ToolsConfig.steps, help="training steps of the async run")
    parser.add_argument("--compare-steps", type=int, default=30,
                        help="steps of each run of the side-by-side lock step / async comparison (0: skip it)")
    parser.add_argument("--seed", type=int, default=ToolsConfig.seed)
    parser.add_argument("--depth", type=int, default=ToolsConfig.loops,
                        help=f"async episode loops, each one group in flight (default: {ToolsConfig.loops})")
    parser.add_argument("--sweep-depth", default=None, metavar="D,D,...",
                        help="only this: lock step, then async at each depth, with the tools' latency and with none, "
                             "from a trained policy (the demo's, or one trained first), e.g. 4,8,12,16")
    parser.add_argument("--max-lag", type=int, default=ToolsConfig.max_lag,
                        help=f"the staleness bound: a group more versions behind is never trained (default "
                             f"{ToolsConfig.max_lag})")
    parser.add_argument("--pacing", choices=("drop", "admission"), default=ToolsConfig.pacing,
                        help="drop: generate, then drop what went stale (default); admission: start a group only if "
                             "it will be trained within the bound (chapter 10's pacer)")
    parser.add_argument("--show-every", type=int, default=25, help="print the mean reward every N steps")
    args = parser.parse_args()
    if args.sweep_depth:
        depths = [int(x) for x in args.sweep_depth.split(",")]
        config = ToolsConfig(seed=args.seed, base=trained_policy(args.seed, quiet=False), loops=args.depth,
                             max_lag=args.max_lag, pacing=args.pacing)
        steps = args.compare_steps or 30
        print(f"Depth: lock step, then async at depth {', '.join(map(str, depths))}, {steps} steps each, with tools "
              f"that answer at once and with the tools' latency ({config.latency.base * 1000:.0f} ms a call; one in "
              f"{config.latency.tail_every} takes {config.latency.tail * 1000:.0f} ms); bound max lag {config.max_lag}, "
              f"pacing {config.pacing}\n", flush=True)
        print("\n" + depth_table(asyncio.run(depth_sweep(config, depths, steps))))
        return
    task, started = VaultTask(), time.time()
    base = LAST_TRACE.with_name(f"ch12_base_seed{args.seed}")
    made_before = (base / "config.json").exists()
    base = warm_start(str(base), args.seed)
    config = ToolsConfig(steps=args.steps, seed=args.seed, base=base, loops=args.depth, max_lag=args.max_lag,
                         pacing=args.pacing)
    latency = config.latency
    print(f"Chapter 12: GRPO on the vault task, {config.steps} steps of {config.groups_per_step} prompts x "
          f"{config.group_size} episodes, {config.generators} generators, {config.tools} tool workers (a call takes "
          f"{latency.base * 1000:.0f} ms; one in {latency.tail_every} takes {latency.tail * 1000:.0f} ms), device "
          f"{pick_device()}")
    made = f"reused from {base}" if made_before else f"made in {time.time() - started:.0f} s, saved to {base}"
    print(f"The base policy ({made}): a supervised warm start taught it to call the tool and read its reply, "
          f"and to guess far more often\n")

    print("1. Training, async: episode loops fill the buffer while the trainer trains")
    rewards: list[float] = []

    def on_step(result: dict) -> None:
        rewards.append(result["reward"])
        if result["version"] % args.show_every == 0 or result["version"] == 1:
            recent = rewards[-args.show_every:]
            print(f"  step {result['version']:>4}  mean reward {sum(recent) / len(recent):.2f}  "
                  f"lags {dict(sorted(Counter(result['lags']).items()))}", flush=True)

    trained = str(LAST_TRACE.with_name(f"ch12_trained_seed{args.seed}"))
    run = asyncio.run(train(config, "async", on_step, save_to=trained))
    tenth = max(1, len(rewards) // 10)
    made: Episodes = run["episodes"]
    print(f"\n{len(rewards)} steps in {run['seconds']:.1f} s ({episodes_per_second(config, run):.1f} episodes/s); mean "
          f"reward of the first 10% of steps {sum(rewards[:tenth]) / tenth:.2f} -> last 10% {sum(rewards[-tenth:]) / tenth:.2f}")
    print("reward per step:\n" + ascii_curve(rewards))
    for label, first, last in (("first", 0, tenth), ("last", len(rewards) - tenth, len(rewards) + 1)):
        turns = Counter(n for version, n in made.turns if first <= version < last)
        print(f"policy turns per episode, the {label} 10% of steps:\n" + histogram(turns, "turns "))
    print(f"episodes ended by: {dict(made.ended)}")
    print("\nthe last episodes made: the tool's tokens have mask 0; each policy token, the version that sampled it")
    for prompt, episode in made.shown:
        print(transcript(task, prompt, episode))
    if made.mixed is not None and all(made.mixed[1] is not episode for _, episode in made.shown):
        print("  and the last one whose generator loaded new weights between two of its turns:")
        print(transcript(task, *made.mixed))
    LAST_TRACE.parent.mkdir(exist_ok=True)
    trace = LAST_TRACE.with_name("ch12_timeline.json")
    write_chrome_trace(run["spans"], str(trace))
    print(f"timeline, tool calls included: koans viz --trace {trace}")

    if args.compare_steps:
        short = dataclasses.replace(config, steps=args.compare_steps, base=trained)
        print(f"\n2. Async against lock step: {short.steps} steps each, both from the policy just trained")
        speed = {mode: episodes_per_second(short, asyncio.run(train(short, mode, name=f"tools_{mode}")))
                 for mode in ("sync", "async")}
        print(f"  lock step  {speed['sync']:6.1f} episodes/s   (each step waits for its slowest episode, then for training)")
        print(f"  async      {speed['async']:6.1f} episodes/s   = {speed['async'] / speed['sync']:.2f}x lock step")

    print(f"\n3. Routing around a slow tool worker ({latency.slow_base * 1000:.0f} ms a call, not {latency.base * 1000:.0f}): "
          f"workers that serve one call at a time, "
          f"8 loops of episodes at once, and a stand-in for a trained policy that answers at once")
    routers = asyncio.run(compare_routers(config, task))
    rr, ll = routers["round_robin"], routers["least_loaded"]
    for label, figure in (("round robin ", rr), ("least loaded", ll)):
        print(f"  {label}  episode latency p50 {figure['p50'] * 1000:5.0f} ms  p99 {figure['p99'] * 1000:5.0f} ms   "
              f"calls per worker {list(figure['calls'].values())}")
    print(f"  least loaded's p99 is {ll['p99'] / rr['p99']:.2f}x round robin's, and its p50 {ll['p50'] / rr['p50']:.2f}x: "
          "it trades the typical episode's time for the tail's")
