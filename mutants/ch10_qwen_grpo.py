"""Chapter 10: plausible wrong answers (see mutants/README.md)."""

from koans.mutants import Mutant

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
    return loss, {"clip_fraction": float(masked_mean(clipped, mask)), "kl": float(kl)}
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
    '''),
    Mutant("group_advantages", "normalises over the batch (dim 0) instead of each group", '''
        mean = rewards.mean(dim=0, keepdim=True)
        std = rewards.std(dim=0, keepdim=True)
        return (rewards - mean) / (std + eps)
    '''),
    Mutant("group_advantages", "one mean and std over the whole batch", '''
        return (rewards - rewards.mean()) / (rewards.std() + eps)
    '''),
    Mutant("group_advantages", "forgets eps, so an equal group divides by zero", '''
        mean = rewards.mean(dim=1, keepdim=True)
        return (rewards - mean) / rewards.std(dim=1, keepdim=True)
    '''),
    Mutant("grpo_loss", "a one-sided clip (only from above)", LOSS.replace("ratio.clamp(1 - clip, 1 + clip)",
                                                                          "ratio.clamp(max=1 + clip)")),
    Mutant("grpo_loss", "a token mean over the batch instead of a per-response mean",
           LOSS.replace("loss = -masked_mean(objective, mask)", "loss = -(objective * mask).sum() / mask.sum()")),
    Mutant("grpo_loss", "the max of the two objectives instead of the min", LOSS.replace("torch.min(", "torch.max(")),
    Mutant("grpo_loss", "a ratio of log-probabilities, not of probabilities",
           LOSS.replace("ratio = torch.exp(logps - old_logps)", "ratio = logps / old_logps")),
    Mutant("grpo_loss", "counts padding in the clip fraction",
           LOSS.replace("float(masked_mean(clipped, mask))", "float(clipped.mean())")),
    Mutant("response_token_logprobs", "no shift: reads each token's own position",
           ALIGN.replace("logits[:, prompt_length - 1 : -1]", "logits[:, prompt_length:]")),
    Mutant("response_token_logprobs", "log-softmax over the positions instead of the vocabulary",
           ALIGN.replace("torch.log_softmax(predictions, dim=-1)", "torch.log_softmax(predictions, dim=1)")),
    Mutant("response_token_logprobs", "forgets the mask", ALIGN.replace("return logps * mask", "return logps")),
    Mutant("response_token_logprobs", "raw logits instead of log-probabilities",
           ALIGN.replace("torch.log_softmax(predictions, dim=-1)", "predictions")),
    Mutant("grpo_loss", "the KL penalty averaged over padding too", LOSS.replace(
        "kl = masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)", "kl = (torch.exp(log_ratio) - log_ratio - 1).mean()")),
    Mutant("grpo_loss", "the k3 estimator the other way round (logp - ref)", LOSS.replace(
        "log_ratio = ref_logps - logps", "log_ratio = logps - ref_logps")),
    Mutant("response_token_logprobs", "a log-softmax in the logits' own dtype: bf16 stays bf16 (a learner's)",
           ALIGN.replace("predictions = logits[:, prompt_length - 1 : -1].float()",
                         "predictions = logits[:, prompt_length - 1 : -1]")),
]
