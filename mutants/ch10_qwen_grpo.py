"""Chapter 10: plausible wrong answers (see mutants/README.md)."""

from koans.course.manifest import PROJECT_ROOT
from koans.maintain.mutants import Mutant

LOSS = '''
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
    return loss, {"clip_fraction": float(masked_mean(clipped, mask)), "kl": float(kl.detach())}
'''

ADVANTAGES = '''
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + eps)
'''

ALIGN = '''
    prompt_length = logits.shape[1] - responses.shape[1]
    predictions = logits[:, prompt_length - 1 : -1].float()
    logps = torch.log_softmax(predictions, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    return logps * mask
'''

MUTANTS = [
    Mutant("group_advantages", "the population std instead of the sample one", '''
        mean = rewards.mean(dim=1, keepdim=True)
        std = rewards.std(dim=1, keepdim=True, unbiased=False)
        return (rewards - mean) / (std + eps)
    ''', clause='sample std'),
    Mutant("group_advantages", "normalises over the batch (dim 0) instead of each group", '''
        mean = rewards.mean(dim=0, keepdim=True)
        std = rewards.std(dim=0, keepdim=True)
        return (rewards - mean) / (std + eps)
    ''', clause='along each row'),
    Mutant("group_advantages", "one mean and std over the whole batch", '''
        return (rewards - rewards.mean()) / (rewards.std() + eps)
    ''', clause='its own mean and std'),
    Mutant("group_advantages", "forgets eps, so an equal group divides by zero", '''
        mean = rewards.mean(dim=1, keepdim=True)
        return (rewards - mean) / rewards.std(dim=1, keepdim=True)
    ''', clause='eps keeps a zero std'),
    Mutant("grpo_loss", "a one-sided clip (only from above)", LOSS.replace("ratio.clamp(1 - clip, 1 + clip)",
                                                                          "ratio.clamp(max=1 + clip)"), clause='clamp(ratio, 1 - clip, 1 + clip)'),
    Mutant("grpo_loss", "a token mean over the batch instead of a per-response mean",
           LOSS.replace("loss = -masked_mean(objective, mask)", "loss = -(objective * mask).sum() / mask.sum()"), clause='per response over its own tokens'),
    Mutant("grpo_loss", "the max of the two objectives instead of the min", LOSS.replace("torch.min(", "torch.max("), clause='the pessimistic one'),
    Mutant("grpo_loss", "a ratio of log-probabilities, not of probabilities",
           LOSS.replace("ratio = torch.exp(logps - old_logps)", "ratio = logps / old_logps"), clause='exp(logps - old_logps)'),
    Mutant("grpo_loss", "counts padding in the clip fraction",
           LOSS.replace("float(masked_mean(clipped, mask))", "float(clipped.mean())"), clause="padding's wild ratios"),
    Mutant("response_token_logprobs", "no shift: reads each token's own position",
           ALIGN.replace("logits[:, prompt_length - 1 : -1]", "logits[:, prompt_length:]"), clause='off by one'),
    Mutant("response_token_logprobs", "log-softmax over the positions instead of the vocabulary",
           ALIGN.replace("torch.log_softmax(predictions, dim=-1)", "torch.log_softmax(predictions, dim=1)"), clause='over the vocabulary'),
    Mutant("response_token_logprobs", "forgets the mask", ALIGN.replace("return logps * mask", "return logps"), clause='masked positions answer exactly 0'),
    Mutant("response_token_logprobs", "raw logits instead of log-probabilities",
           ALIGN.replace("torch.log_softmax(predictions, dim=-1)", "predictions"), clause='log-softmax of the logits'),
    Mutant("grpo_loss", "the KL penalty averaged over padding too", LOSS.replace(
        "kl = masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)", "kl = (torch.exp(log_ratio) - log_ratio - 1).mean()"), clause='the kl is a masked mean too'),
    Mutant("grpo_loss", "the k3 estimator the other way round (logp - ref)", LOSS.replace(
        "log_ratio = ref_logps - logps", "log_ratio = logps - ref_logps"), clause='k3 = exp(ref - logp)'),
    Mutant("response_token_logprobs", "a log-softmax in the logits' own dtype: bf16 stays bf16 (a learner's)",
           ALIGN.replace("predictions = logits[:, prompt_length - 1 : -1].float()",
                         "predictions = logits[:, prompt_length - 1 : -1]"), clause='in float32'),
    Mutant("group_advantages", "a group of one gives NaN (the sample std of one value), not a finite 0 (a learner's)",
           ADVANTAGES.replace("rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)",
                              "rewards.std(dim=1, keepdim=True)"), clause='its advantage is 0'),
    Mutant("group_advantages", "eps inside the square root: sqrt(var + eps), not std + eps",
           ADVANTAGES.replace("return (rewards - mean) / (std + eps)",
                              "return (rewards - mean) / torch.sqrt(std ** 2 + eps)"), clause='eps goes outside the root'),
    Mutant("grpo_loss", "the clip hard-coded to 0.8/1.2, in the loss and in clip_fraction (a learner's)",
           LOSS.replace("ratio.clamp(1 - clip, 1 + clip)", "ratio.clamp(0.8, 1.2)").replace(
               "(ratio < 1 - clip) | (ratio > 1 + clip)", "(ratio < 0.8) | (ratio > 1.2)"), clause="the caller's clip"),
    Mutant("grpo_loss", "the clip hard-coded to 0.8/1.2 in clip_fraction only (a learner's)",
           LOSS.replace("(ratio < 1 - clip) | (ratio > 1 + clip)", "(ratio < 0.8) | (ratio > 1.2)"), clause="the caller's clip"),
    Mutant("grpo_loss", "clip_fraction as a mean over the batch's tokens, not per response (a learner's)",
           LOSS.replace("float(masked_mean(clipped, mask))", "float((clipped * mask).sum() / mask.sum())"), clause='per response'),
    Mutant("grpo_loss", "clip_fraction as a 0-d tensor, not a Python float (a learner's)",
           LOSS.replace('"clip_fraction": float(masked_mean(clipped, mask))', '"clip_fraction": masked_mean(clipped, mask)'), clause='python floats'),
    Mutant("grpo_loss", "the KL from logps.detach(): no gradient, --kl-coef does nothing (a learner's)",
           LOSS.replace("log_ratio = ref_logps - logps", "log_ratio = ref_logps - logps.detach()"), clause='no .detach()'),
    Mutant("grpo_loss", "the KL added as .item(): no gradient, --kl-coef does nothing (a learner's)", LOSS.replace(
        "kl = masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)",
        "kl = masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask).item()").replace(
        '"kl": float(kl.detach())', '"kl": float(kl)'), clause='no .item()'),
    Mutant("grpo_loss", "the KL penalty as a token mean over the batch, not per response", LOSS.replace(
        "kl = masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)",
        "kl = ((torch.exp(log_ratio) - log_ratio - 1) * mask).sum() / mask.sum()"), clause='per response then over responses'),
    Mutant("response_token_logprobs", "log(softmax(x)): -inf, then NaN, on large logits (a learner's)",
           ALIGN.replace("torch.log_softmax(predictions, dim=-1)", "torch.log(torch.softmax(predictions, dim=-1))"), clause='log_softmax'),
    Mutant("response_token_logprobs", "the prompt length worked out from the mask: misaligned when every row is "
           "padded (a learner's)", ALIGN.replace("prompt_length = logits.shape[1] - responses.shape[1]",
                                                "prompt_length = logits.shape[1] - int(mask.sum(dim=1).max())"), clause='from the shapes'),
    Mutant("response_token_logprobs", "no gradient: computed under torch.no_grad()", ALIGN.replace(
        "    logps = torch.log_softmax(", "    with torch.no_grad():\n        logps = torch.log_softmax("), clause='no no_grad'),
    Mutant("response_token_logprobs", "a negated log-softmax: values above 0",
           ALIGN.replace("torch.log_softmax(predictions, dim=-1)", "-torch.log_softmax(predictions, dim=-1)"), clause='log p <= 0'),
    Mutant("group_advantages", "centres the caller's rewards in place, so they are lost to the caller", '''
        mean = rewards.mean(dim=1, keepdim=True)
        std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
        rewards -= mean
        return rewards / (std + eps)
    ''', clause='leaves its input as it was'),
    Mutant("grpo_loss", "counts a ratio exactly on the band's edge as clipped (<=, >=)",
           LOSS.replace("(ratio < 1 - clip) | (ratio > 1 + clip)", "(ratio <= 1 - clip) | (ratio >= 1 + clip)"), clause='inside the band'),
]

# The eleventh independent set (language and library pitfalls) found these; each now has a clause test.
MUTANTS += [
    Mutant("grpo_loss", "unsqueeze_ on the advantages: the caller's tensor becomes [N, 1] (breaks: the inputs stay "
           "as they were)", '''
    ratio = torch.exp(logps - old_logps)
    per_token_advantage = advantages.unsqueeze_(1)
    objective = torch.min(ratio * per_token_advantage, ratio.clamp(1 - clip, 1 + clip) * per_token_advantage)
    loss = -masked_mean(objective, mask)
    kl = torch.zeros(())
    if ref_logps is not None and kl_coef > 0:
        log_ratio = ref_logps - logps
        kl = masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)
        loss = loss + kl_coef * kl
    clipped = ((ratio < 1 - clip) | (ratio > 1 + clip)).float()
    return loss, {"clip_fraction": float(masked_mean(clipped, mask)), "kl": float(kl.detach())}
''', clause='inputs stay as they were'),
    # From a mechanical set (one operator at one site of the solution; each caught by a test extended for it):
    Mutant("group_advantages", "a group of two is taken for a group of one: its std is 0, so eps alone divides",
           ADVANTAGES.replace("rewards.shape[1] > 1", "rewards.shape[1] > 2"), clause='has a sample std'),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
STUDY_LOSS = (PROJECT_ROOT / "solutions" / "ch10_qwen_grpo.py").read_text().split("    ratio = torch.exp(logps - old_logps)\n", 1)[1].split("    # <<< TODO")[0]
STUDY_LOSS = "    ratio = torch.exp(logps - old_logps)\n" + STUDY_LOSS
MUTANTS += [
    Mutant("response_token_logprobs", "answers float64", '''
        prompt_length = logits.shape[1] - responses.shape[1]
        predictions = logits[:, prompt_length - 1 : -1].double()
        logps = torch.log_softmax(predictions, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
        return logps * mask
    ''', clause="float32 | dtype"),
    Mutant("grpo_loss", "the ratio from logps.detach()",
           STUDY_LOSS.replace("ratio = torch.exp(logps - old_logps)", "ratio = torch.exp(logps.detach() - old_logps)"),
           clause="gradient | detach"),
    Mutant("grpo_loss", "advantages not unsqueezed",
           STUDY_LOSS.replace("per_token_advantage = advantages[:, None]", "per_token_advantage = advantages"),
           clause="token axis | [:, none] | shape"),
]
