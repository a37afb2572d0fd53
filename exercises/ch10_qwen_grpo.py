"""Chapter 10: an async GRPO trainer for a Qwen2 policy, from the parts you built.

Your service (06), weight sync (07) and buffer and training loop (09) run it;
this chapter adds the learning. GRPO in three lines:
  1. For each prompt, sample a *group* of G responses and score them.
  2. A response's advantage: (reward - group mean) / (group std + eps).
  3. Raise each of its tokens' log-probability in proportion to the advantage,
     weighted by the ratio p_now / p_generator (the generator may be a version
     behind), and clipped: a token whose ratio already left [0.8, 1.2] in its
     advantage's direction (above 1.2 with a positive advantage, below 0.8
     with a negative one) gets no gradient; one that left the other way keeps
     it. One optimizer step per batch measures the ratio before the weights
     move, so at lag 0 it is 1 and the clip never acts.

Step 3 reads each response token's log-probability off one forward pass over
prompt + response. The logits at position i predict the token at i + 1:

    position:   ...  P-2   P-1 |  P     P+1   P+2       (P prompt tokens, then the response)
    token:      ...  ":"   "\n" |  "1"   " "   "2"
    logits at P-1 predict "1", at P predict " ", at P+1 predict "2"

Your TODOs:
  1. group_advantages         normalise rewards within each group
  2. grpo_loss                the clipped policy-gradient loss, masked to the response tokens
  3. response_token_logprobs  each response token's log-probability, from the logits before it

Given, safe to skip: ch10_policy.py (model, tokenizer, counting task), ch10_plumbing.py (actors, job, demo).
Check: koans check 10   Demo: python -m exercises.ch10_qwen_grpo (--compare)   Read: docs/10_qwen_grpo.md
"""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass

import torch
from koans.learn.demo import run_demo

from .ch10_policy import CountingTask, Prompt, load_policy

TIMEOUT = 60.0
PACING_WAIT_S = 0.05  # how long a rollout loop waits when the pacer holds its next group back


def pick_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; sent to every actor, so all build the same policy."""

    model: str | None = None  # None: the tiny offline Qwen2; else a hub id or local path
    seed: int = 0
    steps: int = 800
    groups_per_step: int = 8  # prompts per training batch
    group_size: int = 16  # G: responses per prompt
    max_new_tokens: int = 10
    lr: float = 5e-4
    clip: float = 0.2
    kl_coef: float = 0.03  # > 0: a KL penalty towards the initial policy (from a random start: an entropy floor)
    loss_mean: str = "token"  # "sequence": each response's tokens, then the responses; "token": all tokens alike
    advantage_std: bool = True  # divide by the group's std (GRPO); False: reward - group mean (Dr. GRPO)
    max_grad_norm: float | None = 1.0  # clip the gradient's total norm to this before each step; None: no clip
    max_lag: int = 1
    pacing: str = "admission"  # start a group only if it is trained within max_lag; "drop": drop the stale (ch09)
    generators: int = 2
    lease_timeout_s: float = 10.0  # a dead generator's lease blocks a staging slot this long (ch07)
    dtype: str = "float32"

    def load_policy(self):
        """(model, tokenizer) on this process's device; every actor that calls it gets the same weights."""
        return load_policy(self.model, self.seed, pick_device(), getattr(torch, self.dtype))


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
    attention: torch.Tensor | None = None  # [G, T] 1.0 on every real token, if not just the mask's (ch12: tool replies)
    ticket: int | None = None  # the pacer's, while the group is on its way to the buffer (given code)


def score(task: CountingTask, rollout: Rollout) -> Rollout:
    """Fill in `rollout.rewards` from the task's reward of each response."""
    rollout.rewards = torch.tensor([task.reward(rollout.prompt, text) for text in rollout.texts])
    return rollout


# --- GRPO's arithmetic ---------------------------------------------------------------------


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """[B, G] rewards, one row per group -> [B, G] advantages."""
    # A group is a row. Its std is the sample (unbiased) one. A group whose rewards are all equal
    # teaches nothing: its advantages are 0 (to float rounding), and finite; so does a group of one
    # response. The rewards passed in stay as they were.
    raise NotImplementedError("TODO(ch10): each reward's advantage: (reward - its group's mean) / (its group's std + eps)")


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over the positions where `mask` is 1: per row, then over rows.

    Each response counts once, however long it is; padding counts nowhere.
    """
    per_row = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    return per_row.mean()


def grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              clip: float = 0.2, ref_logps: torch.Tensor | None = None, kl_coef: float = 0.0):
    """The clipped policy-gradient loss over response tokens, and numbers to watch.

    logps (being trained), old_logps (the generator's), mask, ref_logps: [N, T] per token;
    advantages: [N], one per response. Returns (loss, {"clip_fraction": float, "kl": float}).
    """
    # Per token: ratio = p_new / p_old; objective = min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A),
    # A being the token's response's advantage. loss = -masked_mean(objective, mask). With ref_logps and
    # kl_coef > 0, add kl_coef * masked_mean(k3), k3 = exp(ref - logp) - (ref - logp) - 1 per token.
    # clip_fraction: masked mean of "ratio outside [1 - clip, 1 + clip]"; kl: the masked k3 mean when the
    # penalty is on (ref_logps given and kl_coef > 0), else 0.0. `clip` is the caller's, in the objective
    # and in clip_fraction alike. The KL term is part of the loss: its gradient reaches logps. Both stats
    # are Python floats, each a masked_mean like the loss (per response, then over responses). The inputs
    # stay as they were.
    raise NotImplementedError("TODO(ch10): PPO's clipped objective per token, its negative masked mean; optional KL; two stats")


def response_token_logprobs(logits: torch.Tensor, responses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] log-probability of each response token, 0 where `mask` is 0.

    logits: [B, P + T, V] from one forward pass over prompt + response;
    responses: [B, T] token ids; mask: [B, T], 1.0 on the tokens the policy chose.
    """
    # Response token t sits at position P + t, and is predicted by the logits at position P + t - 1
    # (see the picture at the top); P comes from the shapes (every row may end in padding). Log-probabilities:
    # a log-softmax over the vocabulary, in float32, finite however large the logits. Positions where mask
    # is 0 (padding after EOS) answer exactly 0. The gradient reaches the logits.
    raise NotImplementedError("TODO(ch10): the log-probability each response token got from the logits that predicted it")


def response_logprobs(model, prompts: torch.Tensor, prompt_attention: torch.Tensor, responses: torch.Tensor,
                      mask: torch.Tensor, response_attention: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T] log p(response token t | prompt, tokens < t), from one forward pass of `model`.

    Prompts may be left-padded: positions count only the real tokens. The
    generator (with no gradient, one group unpadded) and the trainer (a
    left-padded batch) both use this function, so the two agree up to rounding:
    to about 1e-6 in float32, less closely in bfloat16. The response tokens
    attended to are those of `mask`, or of `response_attention` when some are
    context without being the policy's (chapter 12's tool replies).
    """
    full = torch.cat([prompts, responses], dim=1)
    seen = mask if response_attention is None else response_attention
    attention = torch.cat([prompt_attention, seen.to(prompt_attention.dtype)], dim=1)
    positions = (attention.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=full, attention_mask=attention, position_ids=positions).logits
    return response_token_logprobs(logits, responses, mask)


# --- The trainer's two choices (given): how the loss averages, whether the advantage divides by the std ---


def centered_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """[B, G] rewards -> [B, G] advantages without the std: reward - its group's mean (Dr. GRPO, nanochat)."""
    return rewards - rewards.mean(dim=1, keepdim=True)


def token_mean_scale(mask: torch.Tensor) -> torch.Tensor:
    """[N] factors R * n_r / total: R responses, n_r tokens in response r, total tokens in all.

    The clipped objective is positively homogeneous in the advantage
    (min(ratio * cA, clip(ratio) * cA) = c * min(ratio * A, clip(ratio) * A) for c > 0),
    so grpo_loss's mean per response, then over responses, of advantages scaled by
    these factors equals the mean over every token of the batch of the unscaled ones.
    """
    lengths = mask.sum(dim=1)
    return lengths * len(lengths) / lengths.sum().clamp(min=1.0)


def policy_loss(logps: torch.Tensor, old_logps: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor,
                config: RunConfig, ref_logps: torch.Tensor | None = None):
    """The trainer's loss for `config`'s choices, from grpo_loss. rewards: [B, G]; the rest as grpo_loss's.

    advantage_std: group_advantages, else centered_advantages. loss_mean "sequence":
    grpo_loss as it is; "token": every token of the batch weighs the same, through
    token_mean_scale, and so does the KL term's (computed here: grpo_loss's is per response).
    The stats stay grpo_loss's (per response, then over responses), but for the token-mean KL.
    """
    if config.loss_mean not in ("sequence", "token"):
        raise ValueError(f"loss_mean must be 'sequence' or 'token', got {config.loss_mean!r}")
    advantages = (group_advantages(rewards) if config.advantage_std else centered_advantages(rewards)).reshape(-1)
    if config.loss_mean == "sequence":
        return grpo_loss(logps, old_logps, advantages, mask, config.clip, ref_logps, config.kl_coef)
    loss, stats = grpo_loss(logps, old_logps, advantages * token_mean_scale(mask), mask, config.clip)
    if ref_logps is not None and config.kl_coef > 0:
        log_ratio = ref_logps - logps
        kl = ((torch.exp(log_ratio) - log_ratio - 1) * mask).sum() / mask.sum().clamp(min=1.0)
        loss = loss + config.kl_coef * kl
        stats["kl"] = float(kl.detach())
    return loss, stats


# --- The rollout loop (given) ----------------------------------------------------------------


async def continuous_rollouts(service, buffer, task: CountingTask, stop: asyncio.Event, worker: int = 0,
                              seed: int = 0, pacer=None) -> int:
    """One rollout loop: prompt, generate through the service, score, put; until `stop` is set.

    A `pacer` (the main job's) holds back a group that would be too stale by its training step.
    Answers the number of rollouts made; their ids are f"w{worker}-{n}", n = 1, 2, ...
    """
    rng = random.Random(seed * 1000 + worker)
    made = 0
    while not stop.is_set():
        rollout = await service.route("generate", task.sample(rng), f"w{worker}-{made + 1}", paced=pacer is not None)
        if rollout is None:  # held back by the pacer: nothing was generated
            await asyncio.sleep(PACING_WAIT_S)
            continue
        put = asyncio.wait_for(buffer.put.call_one(score(task, rollout)), TIMEOUT)
        await (pacer.put_then_done(put, rollout.ticket) if pacer is not None else put)
        made += 1
    return made


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from .ch10_plumbing import main  # starting the job and the demo: given code, safe to skip

    run_demo(main)
