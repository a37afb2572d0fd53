"""Chapter 11 (elective): what staleness costs, how to correct for it, and where async wins.

Chapter 09 bounds staleness by refusing and dropping old groups, and chapter
10's clipped ratio keeps a lag of one harmless. Systems that run far ahead
of the trainer combine a bound with a *correction*. Three policies are in play
for every token:

    behaviour  the (old) policy that generated the response: logps from the generator
    proximal   the trainer's policy before this update: a forward pass, no gradient
    current    the policy being updated: the only one with a gradient

  truncated importance sampling: weight each token by how much more likely the
      proximal policy finds it than the behaviour policy did, capped at C:
          w = min(exp(logp_proximal - logp_behaviour), C)
  decoupled PPO: clip the ratio against the *proximal* policy, not the old one,
      and let w alone carry the correction for staleness:
          objective = w * min(r * A, clip(r, 1 - eps, 1 + eps) * A),  r = exp(logp - logp_proximal)
  effective sample size: (sum w)^2 / sum w^2 over the batch, divided by the count.
      1.0 when every weight is equal; about 1/n when one token dominates: the
      early warning that a batch is too stale to learn from.
  admission without waste: instead of generating freely and dropping what
      turns stale, let a generator start a group only if the group will be
      trained while its lag is still within the bound. Nothing is made to be
      thrown away.
  withholding: when a group's members finish with different weights, a
      member past the bound is neither trained nor thrown away. Its reward
      still counts in the group's mean and std (its siblings' baseline); its
      row of the mask is zeroed, so none of its tokens gets a gradient.

Staleness is not the only reason the behaviour and proximal numbers differ.
Even at lag 0, the sampler (an inference engine: bf16, other kernels, fp8
weights) and the trainer compute different probabilities for the same
weights: a *mismatch*. The same weight, proximal over behaviour, measures it;
masked importance sampling keeps a token's weight only while it stays inside
a band [low, high] and drops the token (weight 0) once it leaves it.

The lab (`python -m exercises.ch11_staleness --sweep`) trains the counting task
of chapter 10 at max lag 0, 1, 2, 4 and 8 with each correction; `--mismatch`
trains it at lag 0 with a sampler whose numbers differ from the trainer's; and
`--env-latency-ms 0,20,50,100` measures async against lock step when every
rollout waits on an environment, as a code sandbox or a remote judge makes it wait.

Your TODOs:
  1. truncated_importance_weights   w per token, capped, 0 on padding
  2. decoupled_ppo_loss             the clipped ratio against the proximal policy, weighted by w
  3. AdmissionWindow.admit          start a group only if it will be trained within the lag bound
  4. masked_importance_weights      the mismatch correction: w inside the band, 0 outside it
  5. withhold_stale                 a stale member's reward stays in its group's baseline; its tokens get no gradient

Given: effective_sample_size (read it: the loss reports it). Safe to skip: ch11_plumbing.py (the labs,
the latency experiment, the comparison with chapter 09).
Check: koans check 11   Lab: python -m exercises.ch11_staleness --sweep   Read: docs/11_staleness.md
"""

from __future__ import annotations

import os

import torch
from koans.learn.demo import run_demo

from .ch10_qwen_grpo import masked_mean


def truncated_importance_weights(proximal_logps: torch.Tensor, behaviour_logps: torch.Tensor, mask: torch.Tensor,
                                 cap: float | None = 2.0) -> torch.Tensor:
    """[N, T] per-token weights min(p_proximal / p_behaviour, cap); exactly 0 where mask is 0."""
    # >>> TODO(ch11): each token's importance weight, proximal over behaviour, capped at `cap`; 0 on padding
    # The weights are a constant of the loss: no gradient flows through them, even when an input
    # carries one. cap=None means no cap (None only: a cap of 0 caps every weight at 0). Padding weighs
    # exactly 0 whatever its log-probabilities hold (-inf included, where the ratio is inf or nan). A real
    # token both policies find very unlikely (log-probabilities near -200) still gets its true, finite
    # weight. The inputs stay as they were.
    weights = torch.exp(proximal_logps - behaviour_logps).detach()
    if cap is not None:
        weights = weights.clamp(max=cap)
    return torch.where(mask.bool(), weights, torch.zeros_like(weights))  # padding: 0, even where the ratio is nan
    # <<< TODO


def effective_sample_size(weights: torch.Tensor, mask: torch.Tensor) -> float:
    """(sum w)^2 / sum w^2 over the tokens where mask is 1, divided by their count: in (0, 1]."""
    # Given: only tokens with mask 1 count. Equal weights give 1.0; one weight far above the others
    # gives about 1 / (number of tokens). No tokens, or only zero weights: 1.0.
    kept = weights[mask.bool()]
    if kept.numel() == 0 or float((kept * kept).sum()) == 0.0:
        return 1.0
    return float(kept.sum() ** 2 / (kept * kept).sum() / kept.numel())


def decoupled_ppo_loss(logps: torch.Tensor, proximal_logps: torch.Tensor, behaviour_logps: torch.Tensor,
                       advantages: torch.Tensor, mask: torch.Tensor, clip: float | None = 0.2,
                       cap: float | None = 2.0, weights: torch.Tensor | None = None):
    """Decoupled PPO: the ratio to the proximal policy, clipped; each token weighted by w.

    logps (being trained), proximal_logps, behaviour_logps, mask: [N, T]; advantages: [N].
    clip=None: no clip, which is plain truncated importance sampling.
    weights: [N, T] weights to use as w instead (those of masked_importance_weights, say); None: the truncated ones.
    Returns (loss, {"ess": float, "clip_fraction": float, "mean_weight": float}).
    """
    # >>> TODO(ch11): w * PPO's clipped objective against the proximal policy; its negative masked mean
    # w: the caller's `weights` when given, else truncated_importance_weights'; r = p_current / p_proximal
    # per token, finite for tokens near -200 too; the objective per token is
    # w * min(r * A, clip(r, 1 - clip, 1 + clip) * A), or w * r * A when clip is None.
    # loss = -masked_mean(objective, mask). Stats, each like the loss a masked_mean (per response, then
    # over responses): "clip_fraction" of r outside [1 - clip, 1 + clip] (0.0 without a clip),
    # "mean_weight" of w; and "ess", the effective_sample_size of w. The caller's clip and cap (None
    # included) are the ones used. Padding counts nothing, whatever its log-probabilities hold (-inf
    # too): never NaN, in the loss or its gradient. A response that is all padding adds 0 to the mean over
    # responses but still counts as one (as in masked_mean). Stats: Python floats. The inputs stay as they were.
    # No gradient flows through proximal_logps or w (the caller's weights too), even when an input carries
    # one: with one update per batch, a caller may pass logps itself as proximal_logps.
    weights = (truncated_importance_weights(proximal_logps, behaviour_logps, mask, cap) if weights is None
               else weights.detach())
    # r is taken only where mask is 1: exp(-inf - -inf) on padding is nan, and nan * 0 is nan, gradient too
    ratio = torch.exp(torch.where(mask.bool(), logps - proximal_logps.detach(), torch.zeros_like(logps)))
    per_token_advantage = advantages[:, None]
    if clip is None:
        objective = weights * ratio * per_token_advantage
        clipped = torch.zeros_like(ratio)
    else:
        objective = weights * torch.min(ratio * per_token_advantage,
                                        ratio.clamp(1 - clip, 1 + clip) * per_token_advantage)
        clipped = ((ratio < 1 - clip) | (ratio > 1 + clip)).float()
    loss = -masked_mean(objective, mask)
    return loss, {"ess": effective_sample_size(weights, mask), "clip_fraction": float(masked_mean(clipped, mask)),
                  "mean_weight": float(masked_mean(weights, mask))}
    # <<< TODO


def masked_importance_weights(proximal_logps: torch.Tensor, behaviour_logps: torch.Tensor, mask: torch.Tensor,
                              low: float = 0.5, high: float = 2.0) -> torch.Tensor:
    """[N, T] per-token weights p_proximal / p_behaviour where that ratio lies in [low, high]; else exactly 0.

    At lag 0 the ratio measures the mismatch alone: the sampler's numbers against the trainer's for the
    same weights. A token inside the band is corrected by its weight; a token outside it is dropped.
    """
    if not 0.0 <= low <= 1.0 <= high:
        raise ValueError(f"the band [{low}, {high}] must hold 1, so that on-policy tokens are kept: "
                         "need 0 <= low <= 1 <= high")
    # >>> TODO(ch11): the ratio inside [low, high] (ends included); exactly 0 outside it and on padding
    # Outside the band the weight is 0, not the nearest end of the band (that would be truncation). Like
    # truncated_importance_weights: no gradient flows through the weights, padding weighs exactly 0
    # whatever its log-probabilities hold (-inf included), and tokens near -200 get their true ratio.
    # The inputs stay as they were.
    # The caller's low and high are the band.
    ratio = torch.exp(proximal_logps - behaviour_logps).detach()
    inside = (ratio >= low) & (ratio <= high) & mask.bool()
    return torch.where(inside, ratio, torch.zeros_like(ratio))
    # <<< TODO


def withhold_stale(rewards: torch.Tensor, versions: list[int], mask: torch.Tensor, learner_version: int,
                   max_lag: int, eps: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor]:
    """One group whose members finished with different weights -> ([G] advantages, [G, T] mask to train with).

    rewards [G]; versions: the policy version that generated each member; mask [G, T]. A member whose
    lag (learner_version - its version) is over max_lag is withheld rather than dropped: it finished with
    its group, so its reward stays in the group's baseline and shapes its fresher siblings' advantages,
    but none of its tokens is trained.
    """
    # >>> TODO(ch11): the advantages of the whole group; the rows of the members over the lag bound masked out
    # The advantages are chapter 10's, over every member's reward (the withheld ones' too: mean and the
    # sample std, eps added to the std), one per member. A member at exactly max_lag is trained. A
    # withheld member's row of the mask is all 0; every other row is the caller's row as it was. New
    # tensors: the inputs stay as they were.
    centred = rewards - rewards.mean()
    std = rewards.std() if len(rewards) > 1 else torch.zeros(())
    lags = learner_version - torch.as_tensor(versions)
    withheld = (lags > max_lag)[:, None]
    return centred / (std + eps), torch.where(withheld, torch.zeros_like(mask), mask)
    # <<< TODO


class AdmissionWindow:
    """Admission control for asynchronous generation: a group may be started only if it will be
    trained before it is more than `max_lag` versions old. Groups are trained in the order they were
    admitted, `batch_groups` per training step, so the group admitted as number k (0, 1, 2, ...) is
    trained in step k // batch_groups, by the learner at version k // batch_groups. A generator
    holds weights no newer than the learner's: at best exactly the learner's current version. The
    window's count can start behind them, though (a run resumed with a fresh window).
    """

    def __init__(self, max_lag: int, batch_groups: int):
        if max_lag < 0 or batch_groups < 1:
            raise ValueError(f"need max_lag >= 0 and batch_groups >= 1, got {max_lag} and {batch_groups}")
        self.max_lag, self.batch_groups = max_lag, batch_groups
        self.admitted = 0  # groups admitted so far; the next one gets this number
        self.refused = 0  # requests turned down (nothing was generated for them: no waste)
        self.arrived: dict[int, object] = {}  # finished groups, by number, not yet trained
        self.trained = 0  # groups handed to the learner, in admission order

    def admit(self, generator_version: int) -> int | None:
        """The number of the group a generator holding `generator_version` may start now, or None."""
        # >>> TODO(ch11): admit the next group only if its lag when trained stays within max_lag; else None
        # The next group's number is self.admitted; it will be trained at version number // batch_groups,
        # and its lag then is that version minus generator_version (below 0 when generator_version is past
        # that version: within max_lag too). Count an admission in self.admitted and a refusal in self.refused.
        number = self.admitted
        if number // self.batch_groups - generator_version > self.max_lag:
            self.refused += 1
            return None
        self.admitted += 1
        return number
        # <<< TODO

    def put(self, number: int, group) -> None:
        """A generator finished the group it was admitted for as `number`."""
        self.arrived[number] = group

    def next_batch(self) -> list | None:
        """The next `batch_groups` groups in admission order, once all of them have arrived; else None."""
        wanted = range(self.trained, self.trained + self.batch_groups)
        if not all(n in self.arrived for n in wanted):
            return None
        self.trained += self.batch_groups
        return [self.arrived.pop(n) for n in wanted]

    @property
    def learner_version(self) -> int:
        return self.trained // self.batch_groups


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from .ch11_plumbing import main  # the lab: given code, safe to skip

    run_demo(main)
