"""Chapter 11: plausible wrong answers (see mutants/README.md).

effective_sample_size is given code now (chapter 11 keeps to four TODOs), so its mutants are gone.
"""

from koans.maintain.mutants import Mutant

LOSS = None  # set below to LOSS_NOW: every loss mutant breaks one clause of today's contract

WITHHOLD = '''
    centred = rewards - rewards.mean()
    std = rewards.std() if len(rewards) > 1 else torch.zeros(())
    lags = learner_version - torch.as_tensor(versions)
    withheld = (lags > max_lag)[:, None]
    return centred / (std + eps), torch.where(withheld, torch.zeros_like(mask), mask)
'''

# The reference loss as it stands, for mutants of its later clauses
LOSS_NOW = '''
    weights = (truncated_importance_weights(proximal_logps, behaviour_logps, mask, cap) if weights is None
               else weights.detach())
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
'''

LOSS = LOSS_NOW

MASKED = '''
    ratio = torch.exp(proximal_logps - behaviour_logps).detach()
    inside = (ratio >= low) & (ratio <= high) & mask.bool()
    return torch.where(inside, ratio, torch.zeros_like(ratio))
'''

MUTANTS = [
    Mutant("truncated_importance_weights", "the ratio upside down: behaviour over proximal", '''
        weights = torch.exp(behaviour_logps - proximal_logps)
        if cap is not None:
            weights = weights.clamp(max=cap)
        return weights * mask
    ''', clause='upside down'),
    Mutant("truncated_importance_weights", "caps from below instead of above", '''
        weights = torch.exp(proximal_logps - behaviour_logps)
        if cap is not None:
            weights = weights.clamp(min=1 / cap)
        return weights * mask
    ''', clause='is capped at 2'),
    Mutant("truncated_importance_weights", "leaves padding's weights in", '''
        weights = torch.exp(proximal_logps - behaviour_logps)
        if cap is not None:
            weights = weights.clamp(max=cap)
        return weights
    ''', clause='padding weighs exactly 0'),
    Mutant("decoupled_ppo_loss", "the ratio to the behaviour policy, as in chapter 10",
           LOSS.replace("logps - proximal_logps.detach()", "logps - behaviour_logps"), clause='the proximal policy, not the behaviour one'),
    Mutant("decoupled_ppo_loss", "forgets the weights", LOSS.replace("objective = weights * torch.min(", "objective = torch.min("), clause='w the truncated weights'),
    Mutant("decoupled_ppo_loss", "clips the weighted objective's ratio at w * (1 +- clip)", LOSS.replace(
        "ratio.clamp(1 - clip, 1 + clip) * per_token_advantage)", "(weights * ratio).clamp(1 - clip, 1 + clip) * per_token_advantage / weights.clamp(min=1e-8))"), clause='w multiplies outside the min'),
    Mutant("AdmissionWindow.admit", "`>=` where the bound allows a lag equal to max_lag", '''
        number = self.admitted
        if number // self.batch_groups - generator_version >= self.max_lag:
            self.refused += 1
            return None
        self.admitted += 1
        return number
    ''', clause='a lag equal to max_lag is allowed'),
    Mutant("AdmissionWindow.admit", "judges the lag by the group's number, not its training step", '''
        number = self.admitted
        if number - generator_version > self.max_lag:
            self.refused += 1
            return None
        self.admitted += 1
        return number
    ''', clause='trained at versions'),
    Mutant("AdmissionWindow.admit", "counts a refusal as an admission", '''
        number = self.admitted
        self.admitted += 1
        if number // self.batch_groups - generator_version > self.max_lag:
            self.refused += 1
            return None
        return number
    ''', clause='a refusal counts in refused only'),
    Mutant("truncated_importance_weights", "lets a gradient flow through the weights (no detach; a learner's)", '''
        weights = torch.exp(proximal_logps - behaviour_logps)
        if cap is not None:
            weights = weights.clamp(max=cap)
        return weights * mask
    ''', clause='no gradient flows through them'),
    Mutant("decoupled_ppo_loss", "the mean weight over every token, padding included",
           LOSS.replace('"mean_weight": float(masked_mean(weights, mask))', '"mean_weight": float(weights.mean())'), clause='real tokens only'),
    Mutant("truncated_importance_weights", "exp(diff).clamp(max=cap) * mask: NaN on -inf padding when cap=None "
           "(a learner's)", '''
        weights = torch.exp(proximal_logps - behaviour_logps).detach()
        if cap is not None:
            weights = weights.clamp(max=cap)
        return weights * mask
    ''', clause='do not multiply by the mask'),
    Mutant("decoupled_ppo_loss", "the caller's cap not passed on: None or 5 silently become 2.0 (a learner's)",
           LOSS.replace("truncated_importance_weights(proximal_logps, behaviour_logps, mask, cap)",
                        "truncated_importance_weights(proximal_logps, behaviour_logps, mask)"), clause="the caller's cap"),
    Mutant("decoupled_ppo_loss", "a per-row mean without a floor: NaN on an all-padding row (a learner's)",
           LOSS.replace("loss = -masked_mean(objective, mask)",
                        "loss = -((objective * mask).sum(dim=1) / mask.sum(dim=1)).mean()"), clause='never 0/0'),
    Mutant("decoupled_ppo_loss", "the mean weight as a 0-d tensor, not a Python float",
           LOSS.replace('"mean_weight": float(masked_mean(weights, mask))', '"mean_weight": masked_mean(weights, mask)'), clause='python float'),
    Mutant("decoupled_ppo_loss", "the clip hard-coded to 0.8/1.2, whatever the caller's clip",
           LOSS.replace("ratio.clamp(1 - clip, 1 + clip)", "ratio.clamp(0.8, 1.2)").replace(
               "(ratio < 1 - clip) | (ratio > 1 + clip)", "(ratio < 0.8) | (ratio > 1.2)"), clause="the caller's clip"),
    Mutant("decoupled_ppo_loss", "the caller's weights ignored: the truncated ones computed anyway",
           LOSS.replace("if weights is None\n               else weights.detach())", "if True else None)"), clause="when the caller passes weights"),
    Mutant("masked_importance_weights", "truncates to the band instead of masking: clamp(low, high)",
           MASKED.replace("inside = (ratio >= low) & (ratio <= high) & mask.bool()", "inside = mask.bool()").replace(
               "torch.where(inside, ratio,", "torch.where(inside, ratio.clamp(low, high),"), clause='not pulled back'),
    Mutant("masked_importance_weights", "strict inequalities: a ratio at an end of the band is dropped",
           MASKED.replace("(ratio >= low) & (ratio <= high)", "(ratio > low) & (ratio < high)"), clause='both ends of the band are inside it'),
    Mutant("masked_importance_weights", "the band hard-coded to [0.5, 2], whatever the caller's",
           MASKED.replace("(ratio >= low) & (ratio <= high)", "(ratio >= 0.5) & (ratio <= 2.0)"), clause="the caller's low and high"),
    Mutant("masked_importance_weights", "multiplies by the band and the mask: NaN on -inf padding", '''
        ratio = torch.exp(proximal_logps - behaviour_logps).detach()
        return ratio * ((ratio >= low) & (ratio <= high)).float() * mask
    ''', clause='use torch.where'),
    Mutant("masked_importance_weights", "the ratio upside down: behaviour over proximal",
           MASKED.replace("torch.exp(proximal_logps - behaviour_logps)",
                          "torch.exp(behaviour_logps - proximal_logps)"), clause='upside down'),
    Mutant("masked_importance_weights", "no detach: a gradient flows through the weights",
           MASKED.replace(".detach()", ""), clause='detach the ratio'),
    Mutant("masked_importance_weights", "forgets the padding: the ratio kept wherever it is in the band",
           MASKED.replace(" & mask.bool()", ""), clause='every wrong weight is on padding'),
    # From a second independent set (each one caught by a clause test added for it):
    Mutant('truncated_importance_weights', 'only the proximal side detached: a gradient flows through behaviour_logps', '''
        weights = torch.exp(proximal_logps.detach() - behaviour_logps)
        if cap is not None:
            weights = weights.clamp(max=cap)
        return torch.where(mask.bool(), weights, torch.zeros_like(weights))  # padding: 0, even where the ratio is nan
    ''', clause='detach the whole weight'),
    Mutant('decoupled_ppo_loss', '`if clip:` instead of `if clip is None`: clip=0.0 is taken as no clip', '''
        weights = (truncated_importance_weights(proximal_logps, behaviour_logps, mask, cap) if weights is None
                   else weights.detach())
        ratio = torch.exp(torch.where(mask.bool(), logps - proximal_logps.detach(), torch.zeros_like(logps)))
        per_token_advantage = advantages[:, None]
        if not clip:
            objective = weights * ratio * per_token_advantage
            clipped = torch.zeros_like(ratio)
        else:
            objective = weights * torch.min(ratio * per_token_advantage,
                                            ratio.clamp(1 - clip, 1 + clip) * per_token_advantage)
            clipped = ((ratio < 1 - clip) | (ratio > 1 + clip)).float()
        loss = -masked_mean(objective, mask)
        return loss, {"ess": effective_sample_size(weights, mask), "clip_fraction": float(masked_mean(clipped, mask)),
                      "mean_weight": float(masked_mean(weights, mask))}
    ''', clause='only none means none'),
    Mutant('decoupled_ppo_loss', 'clip_fraction counts a ratio exactly at 1 - clip or 1 + clip as clipped', '''
        weights = (truncated_importance_weights(proximal_logps, behaviour_logps, mask, cap) if weights is None
                   else weights.detach())
        ratio = torch.exp(torch.where(mask.bool(), logps - proximal_logps.detach(), torch.zeros_like(logps)))
        per_token_advantage = advantages[:, None]
        if clip is None:
            objective = weights * ratio * per_token_advantage
            clipped = torch.zeros_like(ratio)
        else:
            objective = weights * torch.min(ratio * per_token_advantage,
                                            ratio.clamp(1 - clip, 1 + clip) * per_token_advantage)
            clipped = ((ratio <= 1 - clip) | (ratio >= 1 + clip)).float()
        loss = -masked_mean(objective, mask)
        return loss, {"ess": effective_sample_size(weights, mask), "clip_fraction": float(masked_mean(clipped, mask)),
                      "mean_weight": float(masked_mean(weights, mask))}
    ''', clause='edge'),
]


# Caught since the fifth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('truncated_importance_weights', "ratio of probabilities exp(a) / exp(b): both underflow to 0 for very unlikely tokens, giving nan on real tokens; breaks 'per-token weights min(p_proximal / p_behaviour, cap)' for extreme log-probabilities", '''
    weights = (proximal_logps.exp() / behaviour_logps.exp()).detach()
    if cap is not None:
        weights = weights.clamp(max=cap)
    return torch.where(mask.bool(), weights, torch.zeros_like(weights))
''', clause='exp of the difference'),
    # The same underflow, where the two other ratios are taken:
    Mutant("masked_importance_weights", "the ratio as exp(a) / exp(b): both underflow to 0 for tokens unlikely under both policies, "
           "and 0 / 0 is nan, outside any band: they weigh 0", '''
ratio = (proximal_logps.exp() / behaviour_logps.exp()).detach()
inside = (ratio >= low) & (ratio <= high) & mask.bool()
return torch.where(inside, ratio, torch.zeros_like(ratio))
''', clause='exp of the difference'),
    Mutant("decoupled_ppo_loss", "r as exp(logps) / exp(proximal_logps): nan for tokens unlikely under both policies", '''
weights = (truncated_importance_weights(proximal_logps, behaviour_logps, mask, cap) if weights is None
           else weights.detach())
ratio = logps.exp() / proximal_logps.detach().exp()
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
''', clause='exp of the difference'),
]


# Caught since the sixth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('truncated_importance_weights', "detaches only inside the cap branch: with cap=None a gradient flows through the weights (breaks 'no gradient flows through them, even when an input carries one', for cap=None)", '''
    weights = torch.exp(proximal_logps - behaviour_logps)
    if cap is not None:
        weights = weights.clamp(max=cap).detach()
    return torch.where(mask.bool(), weights, torch.zeros_like(weights))
''', clause='with cap=none a gradient flows'),
]

# The tenth independent set (input classes) found that the loss itself was NaN on -inf padding; the contract
# now says padding counts nothing whatever it holds, and this is the answer that breaks it.
MUTANTS += [
    Mutant("decoupled_ppo_loss", "takes r on padding too, so -inf there makes the loss and its gradient nan "
           "(breaks: padding counts nothing, -inf included)", '''
    weights = (truncated_importance_weights(proximal_logps, behaviour_logps, mask, cap) if weights is None
               else weights.detach())
    ratio = torch.exp(logps - proximal_logps.detach())
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
''', clause='padding counts nothing'),
]

# The eleventh independent set (language and library pitfalls) found these; each now has a clause test.
MUTANTS += [
    Mutant("truncated_importance_weights", "`if cap:` where None was meant: a cap of 0.0 caps nothing (breaks: only "
           "None is no cap)", '''
    weights = torch.exp(proximal_logps - behaviour_logps).detach()
    if cap:
        weights = weights.clamp(max=cap)
    return torch.where(mask.bool(), weights, torch.zeros_like(weights))
''', clause='only none means no cap'),
    Mutant("truncated_importance_weights", "masked_fill_ on .detach() views of the inputs: the caller's padding "
           "log-probabilities are rewritten (breaks: the inputs stay as they were)", '''
    padding = ~mask.bool()
    proximal = proximal_logps.detach()
    behaviour = behaviour_logps.detach()
    proximal.masked_fill_(padding, 0.0)
    behaviour.masked_fill_(padding, 0.0)
    weights = torch.exp(proximal - behaviour)
    if cap is not None:
        weights = weights.clamp(max=cap)
    return weights.masked_fill(padding, 0.0)
''', clause="changed its caller's"),
    Mutant("decoupled_ppo_loss", "unsqueeze_ on the advantages: the caller's tensor becomes [N, 1] (breaks: the "
           "inputs stay as they were)", '''
    weights = (truncated_importance_weights(proximal_logps, behaviour_logps, mask, cap) if weights is None
               else weights.detach())
    ratio = torch.exp(torch.where(mask.bool(), logps - proximal_logps.detach(), torch.zeros_like(logps)))
    per_token_advantage = advantages.unsqueeze_(1)
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
''', clause="changed its caller's"),
    Mutant("masked_importance_weights", "sub_ and exp_ on the caller's proximal_logps: it becomes the ratio "
           "(breaks: the inputs stay as they were)", '''
    with torch.no_grad():
        ratio = proximal_logps.sub_(behaviour_logps).exp_()
    inside = (ratio >= low) & (ratio <= high) & mask.bool()
    return torch.where(inside, ratio, torch.zeros_like(ratio))
''', clause="changed its caller's"),
    Mutant("decoupled_ppo_loss", "the proximal log-probabilities not detached: with proximal_logps = logps (one "
           "update per batch) r is 1 with no gradient (breaks: no gradient through proximal_logps; a learner's)",
           LOSS_NOW.replace("logps - proximal_logps.detach()", "logps - proximal_logps"), clause='detach it'),
    Mutant("decoupled_ppo_loss", "the caller's weights used with their gradient (breaks: w is a constant, the "
           "caller's too)", LOSS_NOW.replace("else weights.detach())", "else weights)"), clause="the caller's weights too"),
    Mutant("AdmissionWindow.admit", "the lag as a distance (abs): a generator ahead of the window is refused "
           "(breaks: the lag is signed; a learner's)", '''
        number = self.admitted
        if abs(number // self.batch_groups - generator_version) > self.max_lag:
            self.refused += 1
            return None
        self.admitted += 1
        return number
''', clause='taken as a distance'),
    # withhold_stale: each breaks one clause of its contract
    Mutant("withhold_stale", "the baseline over the fresh members only: the withheld reward drops out of the mean "
           "and std (what dropping does)", WITHHOLD.replace(
               "    centred = rewards - rewards.mean()\n    std = rewards.std() if len(rewards) > 1 else torch.zeros(())\n",
               "    fresh = rewards[learner_version - torch.as_tensor(versions) <= max_lag]\n"
               "    centred = rewards - (fresh.mean() if len(fresh) else 0.0)\n"
               "    std = fresh.std() if len(fresh) > 1 else torch.zeros(())\n"), clause="stays in its group's baseline"),
    Mutant("withhold_stale", "a member at exactly max_lag withheld too (>=)", WITHHOLD.replace("lags > max_lag",
                                                                                               "lags >= max_lag"), clause='within the bound'),
    Mutant("withhold_stale", "the lag the wrong way round: version - learner_version",
           WITHHOLD.replace("learner_version - torch.as_tensor(versions)", "torch.as_tensor(versions) - learner_version"), clause='lags are'),
    Mutant("withhold_stale", "the withheld member's advantage zeroed instead of its mask row (its padding still "
           "counts, and a KL term would still train it)", '''
    centred = rewards - rewards.mean()
    std = rewards.std() if len(rewards) > 1 else torch.zeros(())
    withheld = (learner_version - torch.as_tensor(versions)) > max_lag
    advantages = centred / (std + eps)
    return torch.where(withheld, torch.zeros_like(advantages), advantages), mask.clone()
''', clause='its mask row, not its advantage'),
    Mutant("withhold_stale", "the rows zeroed in the caller's mask (mask[withheld] = 0)", '''
    centred = rewards - rewards.mean()
    std = rewards.std() if len(rewards) > 1 else torch.zeros(())
    withheld = (learner_version - torch.as_tensor(versions)) > max_lag
    mask[withheld] = 0.0
    return centred / (std + eps), mask
''', clause="changed its caller's"),
    Mutant("withhold_stale", "the withheld members dropped from the answer (fewer rows)", '''
    centred = rewards - rewards.mean()
    std = rewards.std() if len(rewards) > 1 else torch.zeros(())
    kept = (learner_version - torch.as_tensor(versions)) <= max_lag
    return (centred / (std + eps))[kept], mask[kept]
''', clause='one per member'),
    Mutant("withhold_stale", "eps hard-coded to 1e-4, whatever the caller's", WITHHOLD.replace("(std + eps)",
                                                                                              "(std + 1e-4)"), clause="the caller's eps"),
    Mutant("withhold_stale", "the population std (unbiased=False)", WITHHOLD.replace("rewards.std()",
                                                                                    "rewards.std(unbiased=False)"), clause='sample std'),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
STUDY_LOSS = LOSS_NOW
MUTANTS += [
    Mutant("decoupled_ppo_loss", "clip_fraction over padding too",
           STUDY_LOSS.replace('"clip_fraction": float(masked_mean(clipped, mask))', '"clip_fraction": float(clipped.mean())'),
           clause="padding | real tokens"),
    Mutant("truncated_importance_weights", "masked_fill_ on the caller's tensors", '''
        proximal_logps.masked_fill_(~mask.bool(), 0.0)
        behaviour_logps.masked_fill_(~mask.bool(), 0.0)
        weights = torch.exp(proximal_logps - behaviour_logps).detach()
        if cap is not None:
            weights = weights.clamp(max=cap)
        return torch.where(mask.bool(), weights, torch.zeros_like(weights))
    ''', clause="changed its caller's"),
]
