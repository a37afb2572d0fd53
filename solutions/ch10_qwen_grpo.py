"""Chapter 10: an async GRPO trainer for a Qwen2 policy, from the parts you built.

Everything of the earlier chapters meets here:

      continuous_rollouts (one loop per generator replica)
        prompt --> Service.route("generate")  --> score --> ReplayBuffer.put
                   (ch06: round robin, retry,      (task      (ch09: policy versions,
                    recovery of dead replicas)      reward)    staleness bound)
                        |                                          |
           generator replicas pull new weights              continuous_training
           before each rollout (ch07 SnapshotReader)          sample --> Trainer.train
                        ^                                          |  (GRPO step)
                        +------ WeightStore <-- WeightPublisher <--+  (ch07: publish version v+1)

GRPO (Group Relative Policy Optimization) in three lines:
  1. For each prompt, sample a *group* of G responses and score them.
  2. A response's advantage is how much better it did than its group:
     (reward - group mean) / (group std + eps). No value network needed.
  3. Push up the log-probability of every token of a response in proportion
     to its advantage, with PPO's clipped importance ratio, because the
     generator's policy may be a version or two older than the trainer's.

The policy is a Hugging Face Qwen2 causal LM. By default a tiny one, built
offline with random weights, learns the counting task of ch10_policy.py on a
CPU in a minute or two; --model loads a real one (e.g. Qwen2.5-0.5B-Instruct).

Your TODOs:
  1. group_advantages      normalise rewards within each group
  2. grpo_loss             the clipped policy-gradient loss, masked to the response tokens
  3. continuous_rollouts   generate through the service, score, put into the buffer, until stopped
  4. continuous_training   sample, train, count the steps; stop everything when done

Check:     pytest tests/test_ch10_qwen_grpo.py     (or: koans check 10)
Run demo:  python -m solutions.ch10_qwen_grpo      (also: --compare, --mode sync, --trace run.json)
Read:      docs/10_qwen_grpo.md
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass

import torch
from koans.demo import run_demo
from koans.timeline import Recorder
from monarch.actor import Actor, endpoint

from .ch06_service import Service
from .ch07_weight_sync import SnapshotReader, WeightPublisher, WeightStore, state_fingerprint
from .ch09_async_loops import ReplayBuffer
from .ch10_policy import CountingTask, Prompt, load_policy, pad_left, response_logprobs, sample_group

TIMEOUT = 60.0


def pick_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; sent to every actor, so all build the same policy."""

    model: str | None = None  # None: the tiny offline Qwen2; else a hub id or local path
    seed: int = 0
    steps: int = 600
    groups_per_step: int = 8  # prompts per training batch
    group_size: int = 8  # G: responses per prompt
    max_new_tokens: int = 10
    lr: float = 5e-4
    clip: float = 0.2
    kl_coef: float = 0.0  # > 0: a KL penalty towards the initial policy
    max_lag: int = 1
    generators: int = 2
    dtype: str = "float32"

    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def load_policy(self):
        """(model, tokenizer) on this process's device; every actor that calls it gets the same weights."""
        return load_policy(self.model, self.seed, pick_device(), self.torch_dtype())


@dataclass
class Rollout:
    """One group: G responses to one prompt, from one policy version. The buffer's unit."""

    id: str
    version: int  # policy version that generated it
    prompt: Prompt
    prompt_ids: torch.Tensor  # [P]
    responses: torch.Tensor  # [G, T] token ids
    mask: torch.Tensor  # [G, T] 1.0 on tokens the policy chose (up to and including EOS)
    logps: torch.Tensor  # [G, T] log-probabilities under the generating policy
    texts: list[str]
    rewards: torch.Tensor | None = None  # [G], set when scored


def score(task: CountingTask, rollout: Rollout) -> Rollout:
    """Fill in `rollout.rewards` from the task's reward of each response."""
    rollout.rewards = torch.tensor([task.reward(rollout.prompt, text) for text in rollout.texts])
    return rollout


# --- GRPO's arithmetic ---------------------------------------------------------------------


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """[B, G] rewards -> [B, G] advantages: (reward - its group's mean) / (its group's std + eps).

    A group whose rewards are all equal teaches nothing: its advantages are 0.
    """
    # >>> TODO(ch10): normalise each row (one group) by its own mean and std
    # Use the unbiased std (torch's default), over dim=1 with keepdim=True.
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)
    # <<< TODO


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is 1: per row, then over rows.

    Each response counts once, however long it is; padding counts nowhere.
    """
    per_row = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return per_row.mean()


def grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              clip: float = 0.2, ref_logps: torch.Tensor | None = None, kl_coef: float = 0.0):
    """The clipped policy-gradient loss over response tokens, and a few numbers to watch.

    logps, old_logps, mask, ref_logps: [N, T] per token; advantages: [N], one per response.
    ratio = exp(logps - old_logps) compares the policy being trained with the one that
    generated the response. PPO's objective per token is min(ratio * A, clip(ratio) * A);
    the loss is its negative masked mean. With ref_logps and kl_coef > 0, add
    kl_coef * the masked mean of the k3 KL estimate: exp(ref - logp) - (ref - logp) - 1.
    Returns (loss, {"clip_fraction": ..., "kl": ...}).
    """
    # >>> TODO(ch10): per-token clipped objective, negated, averaged with masked_mean (padding excluded)
    # advantages is per response: advantages[:, None] broadcasts it to every token of that response.
    # clip_fraction: masked mean of (ratio outside [1 - clip, 1 + clip]) as floats; kl is 0.0 unless used.
    ratio = torch.exp(logps - old_logps)
    per_token_advantage = advantages[:, None]
    objective = torch.min(ratio * per_token_advantage, ratio.clamp(1 - clip, 1 + clip) * per_token_advantage)
    loss = -masked_mean(objective, mask)
    kl = torch.zeros(())
    if ref_logps is not None and kl_coef > 0:
        log_ratio = ref_logps - logps
        kl = masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)
        loss = loss + kl_coef * kl
    clipped = ((ratio < 1 - clip) | (ratio > 1 + clip)).float()
    return loss, {"clip_fraction": float(masked_mean(clipped, mask)), "kl": float(kl)}
    # <<< TODO


# --- The actors (given) --------------------------------------------------------------------


class Generator(Actor):
    """A generator replica: samples groups with its copy of the policy; pulls new weights first.

    The model loads at the first call, not in __init__: an error there (a bad
    --model path) then comes back to the caller as a clear endpoint error,
    where an exception in __init__ would only show as a dead actor.
    """

    def __init__(self, store: WeightStore, config: RunConfig):
        self.store, self.config = store, config
        self.model = self.tokenizer = self.reader = None
        self.recorder = Recorder(f"generator{os.getpid()}")

    def _load(self) -> None:
        if self.model is None:
            torch.set_num_threads(1)
            self.model, self.tokenizer = self.config.load_policy()
            self.model.eval()
            self.reader = SnapshotReader(self.store, self.model.state_dict())

    @endpoint
    def generate(self, prompt: Prompt, rollout_id: str) -> Rollout:
        """Pull the newest weights if there are any, then sample one group for `prompt`."""
        self._load()
        with self.recorder.span("sync") as info:
            info["loaded"] = self.reader.pull_and_load()  # the new version, or None if there was none
            info["version"] = self.reader.version
        with self.recorder.span("generate", version=self.reader.version):
            group = sample_group(self.model, self.tokenizer, prompt, self.config.group_size,
                                 self.config.max_new_tokens)
        return Rollout(rollout_id, self.reader.version, prompt, group["prompt_ids"], group["responses"],
                       group["mask"], group["logps"], group["texts"])

    @endpoint
    def sync(self) -> int:
        """Pull the newest weights now; answer the version held."""
        self._load()
        self.reader.pull_and_load()
        return self.reader.version

    @endpoint
    def fingerprint(self) -> str:
        self._load()
        return state_fingerprint(self.model.state_dict())

    @endpoint
    def whoami(self) -> int:
        return os.getpid()

    @endpoint
    def timeline(self) -> list:
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
                "old_logps": torch.cat([right(r.logps, 0.0) for r in rollouts]).to(device),
                "rewards": torch.stack([r.rewards for r in rollouts]).to(device)}

    @endpoint
    def train(self, rollouts: list[Rollout]) -> dict:
        """One GRPO step on `rollouts`, then publish version+1. Answers what happened."""
        self._load()
        with self.recorder.span("train", version=self.version) as info:
            b = self._batch(rollouts)
            advantages = group_advantages(b["rewards"]).reshape(-1)
            logps = response_logprobs(self.model, b["prompts"], b["prompt_attention"], b["responses"], b["mask"])
            ref_logps = None
            if self.reference is not None:
                with torch.no_grad():
                    ref_logps = response_logprobs(self.reference, b["prompts"], b["prompt_attention"],
                                                  b["responses"], b["mask"])
            loss, stats = grpo_loss(logps, b["old_logps"], advantages, b["mask"], self.config.clip,
                                    ref_logps, self.config.kl_coef)
            self.publisher.wait_staged()  # the last version's snapshot is copied: weights may change
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            lags = [self.version - r.version for r in rollouts]
            self.version += 1
            info.update(loss=loss.item(), groups=len(rollouts), samples=len(rollouts) * self.config.group_size)
        with self.recorder.span("sync", version=self.version):
            self.publisher.publish(self.model.state_dict(), version=self.version)
        first = rollouts[0]
        example = {"prompt": first.prompt.text, "response": first.texts[0], "reward": float(first.rewards[0]),
                   "version": first.version}
        return {"version": self.version, "loss": loss.item(), "reward": b["rewards"].mean().item(),
                "lags": lags, "ids": [r.id for r in rollouts], "example": example, **stats}

    @endpoint
    def flush(self) -> int:
        """Wait until the newest version is staged and committed; answer it.

        publish() skips a version when every slot is busy (a generator is still
        reading). Training moves on then, but the last version must get out:
        publish it again until a slot is free.
        """
        self._load()
        self.publisher.flush()
        deadline = time.monotonic() + TIMEOUT
        while self.publisher.version < self.version:
            if time.monotonic() > deadline:
                raise TimeoutError(f"version {self.version}: no staging slot came free in {TIMEOUT} s")
            time.sleep(0.01)  # readers hold a slot only while they copy from it
            self.publisher.publish(self.model.state_dict(), version=self.version)
            self.publisher.flush()
        return self.version

    @endpoint
    def fingerprint(self) -> str:
        self._load()
        return state_fingerprint(self.model.state_dict())

    @endpoint
    def timeline(self) -> list:
        return self.recorder.spans

    @endpoint
    def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()


# --- The two loops -------------------------------------------------------------------------


async def continuous_rollouts(service: Service, buffer: ReplayBuffer, task: CountingTask, stop: asyncio.Event,
                              worker: int = 0, seed: int = 0) -> int:
    """One rollout loop: prompt, generate (through the service), score, put; until `stop` is set.

    Returns the number of rollouts made. Rollout ids are f"w{worker}-{n}", n = 1, 2, ...
    """
    # >>> TODO(ch10): until stop.is_set(): sample a prompt, generate, score, put into the buffer; count
    # Prompts: rng = random.Random(seed * 1000 + worker); prompt = task.sample(rng).
    # service.route blocks, so run it in a thread (the event loop must keep running the other loops):
    #   rollout = await asyncio.to_thread(service.route, "generate", prompt, rollout_id)
    # Then score(task, rollout) and: await buffer.put.call_one(rollout)
    rng = random.Random(seed * 1000 + worker)
    made = 0
    while not stop.is_set():
        prompt = task.sample(rng)
        rollout = await asyncio.to_thread(service.route, "generate", prompt, f"w{worker}-{made + 1}")
        await buffer.put.call_one(score(task, rollout))
        made += 1
    return made
    # <<< TODO


async def continuous_training(trainer: Trainer, buffer: ReplayBuffer, steps: int, groups_per_step: int,
                              stop: asyncio.Event, on_step=None) -> list[dict]:
    """Sample a batch within the lag bound, train on it; `steps` times. Then set `stop`.

    `on_step(result)`, if given, sees each step's result. Returns all results.
    """
    # >>> TODO(ch10): like chapter 09's training loop, with this chapter's Trainer
    #   batch = await buffer.sample.call_one(groups_per_step, version)   (None: none in time; try again)
    #   result = await trainer.train.call_one(batch); version = result["version"]
    # Set `stop` in a finally, so the rollout loops end even if training fails.
    results, version = [], 0
    try:
        while len(results) < steps:
            batch = await buffer.sample.call_one(groups_per_step, version)
            if batch is None:
                continue
            result = await trainer.train.call_one(batch)
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
    from .ch10_run import main  # starting the job and the demo: given code, in its own file

    run_demo(main)
