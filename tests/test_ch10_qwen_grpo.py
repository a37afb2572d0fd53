"""Chapter 10: async GRPO on a Qwen2 policy. Run: pytest tests/test_ch10_qwen_grpo.py"""

import asyncio
import importlib
import json
import math
import random
from pathlib import Path

import pytest
import torch
from monarch.actor import this_proc

from koans.testkit.testing import STARTUP_TIMEOUT, TIMEOUT, backward, small_grpo_config


def close(actual, expected, tol=1e-4):
    return torch.allclose(torch.as_tensor(actual, dtype=torch.float32),
                          torch.as_tensor(expected, dtype=torch.float32), atol=tol)


def same(actual, expected, tol=1e-4) -> bool:
    """close(), and False where the shapes or types differ: for choosing what a failure message says."""
    try:
        return close(actual, expected, tol)
    except (RuntimeError, TypeError, ValueError):
        return False


#: Random inputs (fixed seeds) with non-default parameters, and the reference answers to them, stored by
#: the course's maintainers (`python -m tests.data.make_snapshots`, in the course's repository).
SNAPSHOTS = json.loads((Path(__file__).parent / "data" / "ch10_snapshots.json").read_text())


def tensor(values):
    return torch.tensor(values, dtype=torch.float32)


def worst(actual, expected) -> float:
    return float((torch.as_tensor(actual, dtype=torch.float32) - tensor(expected)).abs().max())


# --- TODO 1: group_advantages -----------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   1. (reward - its row's mean) / (its row's std + eps), each row alone -> test_each_group_is_normalised_on_its_own
#   2. the sample (unbiased) std                                    -> test_advantages_by_hand
#   3. eps is added to the std (the caller's eps)                   -> test_a_group_of_equal_rewards_teaches_nothing,
#                                                                      test_advantages_on_random_groups
#   4. a group of equal rewards: 0 (to rounding), finite            -> test_a_group_of_equal_rewards_teaches_nothing
#   5. a group of one response: 0, finite                           -> test_a_group_of_one_teaches_nothing
#   6. all of it on many random groups, sizes 1 to 8, eps 1e-4 to 0.5 -> test_advantages_on_random_groups
#   7. the caller's rewards are left as they were (a new tensor)  -> test_the_rewards_are_left_as_they_were


@pytest.mark.todo("group_advantages")
def test_advantages_by_hand(chapter):
    # mean 0.5; unbiased std sqrt(4 * 0.25 / 3) = 0.57735; so +-0.5 / 0.57735 = +-0.86603
    advantages = chapter.group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), eps=0.0)
    got = advantages.tolist() if isinstance(advantages, torch.Tensor) else advantages
    why = ("NaN: with one group (one row), the mean and std run along each row (dim=-1), not down the batch"
           if isinstance(advantages, torch.Tensor) and advantages.isnan().any() else
           "that is the population std (n): use the sample std (n - 1, torch.std's default)"
           if isinstance(advantages, torch.Tensor) and same(advantages.abs(), [[1.0] * 4])
           else "(reward - mean) / (std + eps) per group, with the sample std (n - 1)")
    assert close(advantages, [[0.86603, -0.86603, -0.86603, 0.86603]]), (
        f"rewards [[1, 0, 0, 1]], eps 0: advantages {got}, expected +-0.86603 (mean 0.5, sample std 0.57735): {why}")


@pytest.mark.todo("group_advantages")
@pytest.mark.hint(2)
def test_each_group_is_normalised_on_its_own(chapter):
    rewards = torch.tensor([[1.0, 2.0, 3.0], [10.0, 30.0, 20.0]])  # std 1 and std 10
    got = chapter.group_advantages(rewards, eps=0.0)
    whole_batch = " (that is one mean and std over the whole batch)" \
        if same(got, (rewards - rewards.mean()) / rewards.std()) else ""
    assert close(got, [[-1.0, 0.0, 1.0], [-1.0, 1.0, 0.0]]), (
        f"rewards {rewards.tolist()}, eps 0: advantages {got.tolist() if isinstance(got, torch.Tensor) else got}, "
        f"expected [[-1, 0, 1], [-1, 1, 0]]{whole_batch}: each row is its own group, with its own mean and std")


@pytest.mark.todo("group_advantages")
@pytest.mark.hint(3)
def test_a_group_of_equal_rewards_teaches_nothing(chapter):
    advantages = chapter.group_advantages(torch.tensor([[0.7, 0.7, 0.7, 0.7], [0.0, 1.0, 0.0, 1.0]]))
    assert torch.isfinite(advantages).all(), "eps keeps a zero std from dividing by zero"
    assert close(advantages[0], [0.0, 0.0, 0.0, 0.0]), (
        f"rewards [0.7, 0.7, 0.7, 0.7]: advantages {advantages[0].tolist()}, expected 0 each: a group of equal rewards "
        "teaches nothing: (reward - its row's mean) / (its row's std + eps), each row its own group")
    assert close(advantages[1], [-0.86588, 0.86588, -0.86588, 0.86588]), "eps=1e-4 is added to the std"


@pytest.mark.todo("group_advantages")
@pytest.mark.hint(3)
def test_a_group_of_one_teaches_nothing(chapter):
    advantages = chapter.group_advantages(torch.tensor([[0.7], [0.0]]))
    assert torch.isfinite(advantages).all() and close(advantages, [[0.0], [0.0]]), (
        f"{advantages.tolist()}: a group of one response has nothing to be compared with: its advantage is 0, and "
        "finite (the sample std of one value is NaN: it must not reach the answer)")


@pytest.mark.todo("group_advantages")
def test_the_rewards_are_left_as_they_were(chapter):
    rewards = torch.tensor([[1.0, 0.0, 0.5], [0.2, 0.2, 0.9]])
    kept = rewards.clone()
    chapter.group_advantages(rewards)
    assert torch.equal(rewards, kept), (
        f"the rewards passed in became {rewards.tolist()}: group_advantages answers a new tensor and leaves its input "
        "as it was (the caller still logs and averages those rewards); no in-place operations on it")


@pytest.mark.todo("group_advantages")
def test_advantages_on_random_groups(chapter):
    for number, case in enumerate(SNAPSHOTS["group_advantages"]):
        rewards = tensor(case["rewards"])
        got = chapter.group_advantages(rewards, eps=case["eps"])
        assert got.shape == rewards.shape and torch.allclose(got, tensor(case["expected"]), atol=1e-5), (
            f"case {number} ({tuple(rewards.shape)} rewards, eps={case['eps']}): off by up to "
            f"{worst(got, case['expected']):.5f}: each row's (reward - mean) / (sample std + eps), with the caller's eps"
            + (" (eps goes outside the root: std + eps, not sqrt(var + eps))" if same(
                got, (rewards - rewards.mean(-1, keepdim=True)) / (rewards.var(-1, keepdim=True) + case["eps"]).sqrt())
               else "")
            + (f" (a group of {rewards.shape[1]} has a sample std; only a group of one has none, and its advantage is 0)"
               if rewards.shape[1] > 1 and same(got, (rewards - rewards.mean(-1, keepdim=True)) / case["eps"]) else ""))


# --- TODO 2: grpo_loss ------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   1. ratio = p_new / p_old, objective min(ratio * A, clip(ratio) * A) per token -> test_clipped_objective_by_hand
#   2. a token clipped in its advantage's direction gets no gradient -> test_no_gradient_flows_through_a_clipped_token
#   3. loss = -masked_mean: per response, then over responses; padding nowhere
#                                                          -> test_masked_mean_counts_each_response_once_and_skips_padding
#   4. the caller's clip bounds the objective              -> test_the_callers_clip_bounds_the_objective
#   5. clip_fraction counts against the caller's clip; a ratio exactly on the band's edge is inside it
#                                                          -> test_clip_fraction_counts_against_the_callers_clip,
#                                                             test_a_ratio_exactly_on_the_bands_edge_is_not_clipped
#   6. clip_fraction is a masked_mean: per response, then over responses -> test_clip_fraction_is_a_mean_per_response
#   7. the k3 KL, a masked mean, added times kl_coef; off with kl_coef 0 (or no ref_logps): kl 0.0
#                                                          -> test_kl_penalty_to_the_reference
#   8. the KL term's gradient reaches logps                -> test_the_kl_penalty_carries_a_gradient
#   9. both stats are Python floats                        -> test_the_stats_are_python_floats
#  10. values and gradients on many random batches, clip 0.05 to 0.3, kl_coef 0 to 2
#                                                          -> test_grpo_loss_on_random_batches
#  11. the inputs stay as they were                       -> test_grpo_loss_leaves_its_inputs_as_they_were


def one_token(ratio, advantage):
    """Single-token responses whose probability ratio new/old is `ratio`."""
    old = torch.zeros(len(ratio), 1)
    return torch.log(torch.tensor(ratio)).reshape(-1, 1), old, torch.tensor(advantage), torch.ones(len(ratio), 1)


@pytest.mark.todo("grpo_loss")
@pytest.mark.parametrize("ratio, advantage, expected_objective", [
    (1.1, 1.0, 1.1),  # inside the clip range: the plain ratio * A
    (0.9, -1.0, -0.9),
    (1.5, 1.0, 1.2),  # too far up with A > 0: clipped to 1 + 0.2
    (0.5, -1.0, -0.8),  # too far down with A < 0: clipped to 1 - 0.2
    (0.5, 1.0, 0.5),  # the min keeps the lower, unclipped, value
    (1.5, -1.0, -1.5),
])
def test_clipped_objective_by_hand(chapter, ratio, advantage, expected_objective):
    logps, old, advantages, mask = one_token([ratio], [advantage])
    loss, stats = chapter.grpo_loss(logps, old, advantages, mask, clip=0.2)
    assert close(loss, -expected_objective), (
        f"ratio {ratio} (logps - old_logps = log {ratio}), advantage {advantage}, clip 0.2: loss {float(loss):.4f}, "
        f"expected {-expected_objective:g}: the ratio is p_new / p_old = exp(logps - old_logps), and the objective "
        "min(ratio * A, clamp(ratio, 1 - clip, 1 + clip) * A), the pessimistic one; the loss is its negative")
    assert stats["clip_fraction"] == (0.0 if 0.8 <= ratio <= 1.2 else 1.0), (
        f"ratio {ratio}, advantage {advantage}, clip 0.2: clip_fraction {stats['clip_fraction']!r}, expected "
        f"{0.0 if 0.8 <= ratio <= 1.2 else 1.0}: it is the masked mean of \"ratio outside [1 - clip, 1 + clip]\" "
        "= [0.8, 1.2], over every real token")


def advantage_shape_problem(chapter) -> str:
    """'' if grpo_loss gives each response's advantage to every token of its row; else what goes wrong. Asked on
    2 responses of 3 tokens, where an advantage that is not spread over its row's tokens fails to broadcast."""
    logps = torch.zeros(2, 3)
    try:
        loss, _ = chapter.grpo_loss(logps, torch.zeros(2, 3), torch.tensor([1.0, -3.0]), torch.ones(2, 3), clip=0.2)
    except RuntimeError as err:
        if "size of tensor" not in str(err) and "must match" not in str(err):
            return ""
        return (f" (on 2 responses of 3 tokens grpo_loss raised {type(err).__name__}: {err}. advantages holds one "
                "value per response, shape [N]; the per-token objective is [N, T]: each response's advantage must "
                "reach every token of its row, which needs a token axis on the advantages)")
    if not close(loss, 1.0):  # ratio 1 everywhere: the mean of -A per response is -(1 - 3) / 2 = 1
        return (f" (on 2 responses of 3 tokens with advantages [1, -3] and ratio 1, the loss is {float(loss):.4f}, "
                "not 1.0: each response's advantage must reach every token of its own row, shape [N] against [N, T])")
    return ""


@pytest.mark.todo("grpo_loss")
@pytest.mark.hint(3)
def test_no_gradient_flows_through_a_clipped_token(chapter):
    logps, old, advantages, mask = one_token([1.5, 1.1], [1.0, 1.0])
    logps.requires_grad_(True)
    problem = advantage_shape_problem(chapter)
    assert not problem, "grpo_loss mixes responses' advantages" + problem
    loss, _ = chapter.grpo_loss(logps, old, advantages, mask, clip=0.2)
    backward(loss)
    assert logps.grad[0, 0] == 0.0, "ratio 1.5 with A > 0 is clipped: no push further"
    assert close(logps.grad[1, 0], -1.1 / 2), "d(-ratio * A / 2)/d logp = -ratio * A / 2"


@pytest.mark.todo("grpo_loss")
@pytest.mark.hint(1)
def test_masked_mean_counts_each_response_once_and_skips_padding(chapter):
    # response 0: two tokens with ratio 1.1, then padding; response 1: one token with ratio 0.9.
    # Padding holds wild values that must not count. Per response: 1.1 and 0.9; mean 1.0.
    # (A mean over all real tokens would give (1.1 + 1.1 + 0.9) / 3 = 1.0333.)
    ratios = torch.tensor([[1.1, 1.1, 50.0], [0.9, 50.0, 0.01]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, stats = chapter.grpo_loss(torch.log(ratios), torch.zeros(2, 3), torch.tensor([1.0, 1.0]), mask)
    assert close(loss, -1.0), "average per response over its own tokens, then over responses"
    assert stats["clip_fraction"] == 0.0, "padding's wild ratios are not counted as clipped"


@pytest.mark.todo("grpo_loss")
def test_kl_penalty_to_the_reference(chapter):
    logps, old, advantages, mask = one_token([1.0, 1.0], [1.0, -1.0])  # objective mean: 0
    ref = logps + math.log(2.0)  # ref - logp = log 2: k3 = 2 - log 2 - 1 = 0.30685
    loss, stats = chapter.grpo_loss(logps, old, advantages, mask, ref_logps=ref, kl_coef=0.5)
    assert close(stats["kl"], 0.30685), (
        f"kl {stats['kl']}: with ref - logp = log 2 on every token, k3 = exp(ref - logp) - (ref - logp) - 1 = 0.30685")
    assert close(loss, 0.5 * 0.30685), (
        f"loss {float(loss):.5f}: the objective's mean is 0 here, so the loss is kl_coef * kl = 0.5 * 0.30685")
    loss_off, stats_off = chapter.grpo_loss(logps, old, advantages, mask, ref_logps=ref, kl_coef=0.0)
    assert close(loss_off, 0.0) and stats_off["kl"] == 0.0, "kl_coef 0 (the default) turns the KL off"
    loss_none, stats_none = chapter.grpo_loss(logps, old, advantages, mask, kl_coef=0.5)
    assert close(loss_none, 0.0) and stats_none["kl"] == 0.0, "without ref_logps there is no KL, whatever kl_coef"
    # With padding: the reference differs wildly there, and must count nowhere.
    padded = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    logps2, old2 = torch.zeros(2, 2), torch.zeros(2, 2)
    ref2 = torch.tensor([[math.log(2.0), 9.0], [math.log(2.0), -9.0]])
    _, stats2 = chapter.grpo_loss(logps2, old2, torch.tensor([1.0, -1.0]), padded, ref_logps=ref2, kl_coef=0.5)
    assert close(stats2["kl"], 0.30685), "the KL is a masked mean too: padding counts nowhere"


@pytest.mark.todo("grpo_loss")
@pytest.mark.parametrize("clip, ratio, advantage, expected_objective", [
    (0.1, 1.15, 1.0, 1.1),  # outside [0.9, 1.1] with A > 0: clipped to 1.1
    (0.3, 1.25, 1.0, 1.25),  # inside [0.7, 1.3]: the plain ratio
    (0.3, 0.75, -1.0, -0.75),  # inside [0.7, 1.3]: the plain ratio
])
def test_the_callers_clip_bounds_the_objective(chapter, clip, ratio, advantage, expected_objective):
    logps, old, advantages, mask = one_token([ratio], [advantage])
    loss, _ = chapter.grpo_loss(logps, old, advantages, mask, clip=clip)
    assert close(loss, -expected_objective), (
        f"clip={clip}, ratio {ratio}, advantage {advantage}: loss {float(loss):.4f}, not {-expected_objective}: the "
        f"clip range is [1 - clip, 1 + clip] = [{1 - clip:.1f}, {1 + clip:.1f}] with the caller's clip, not 0.8/1.2")


@pytest.mark.todo("grpo_loss")
@pytest.mark.parametrize("clip, ratio, clipped", [(0.1, 1.15, 1.0), (0.3, 1.25, 0.0), (0.3, 0.75, 0.0), (0.05, 0.9, 1.0)])
@pytest.mark.hint(3)
def test_clip_fraction_counts_against_the_callers_clip(chapter, clip, ratio, clipped):
    logps, old, advantages, mask = one_token([ratio], [1.0])
    _, stats = chapter.grpo_loss(logps, old, advantages, mask, clip=clip)
    assert stats["clip_fraction"] == clipped, (
        f"clip={clip}, ratio {ratio}: clip_fraction {stats['clip_fraction']}, not {clipped}: a ratio counts as clipped "
        f"when outside [1 - clip, 1 + clip] = [{1 - clip:.2f}, {1 + clip:.2f}], the caller's clip, not 0.8/1.2")


@pytest.mark.todo("grpo_loss")
@pytest.mark.parametrize("log_ratio", [0.25, -0.25])
def test_a_ratio_exactly_on_the_bands_edge_is_not_clipped(chapter, log_ratio):
    ratio = float(torch.exp(torch.tensor(log_ratio)))  # what float32 gives for exp(logps - old_logps)
    clip = ratio - 1 if log_ratio > 0 else 1 - ratio  # so that the band's edge is exactly this ratio
    _, stats = chapter.grpo_loss(torch.full((1, 2), log_ratio), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2),
                                 clip=clip)
    assert stats["clip_fraction"] == 0.0, (
        f"ratio {ratio} with clip={clip:.6f} sits exactly on the edge of [1 - clip, 1 + clip], which is inside the band: "
        f"clip_fraction counts only ratios outside it (< and >), got {stats['clip_fraction']}")


@pytest.mark.todo("grpo_loss")
@pytest.mark.hint(3)
def test_clip_fraction_is_a_mean_per_response(chapter):
    # response 0: one token, clipped (ratio 1.5); response 1: three tokens, none clipped (ratio 1).
    # Per response: 1/1 and 0/3, mean 0.5. (A mean over tokens would give 1/4.)
    ratios = torch.tensor([[1.5, 1.0, 1.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    _, stats = chapter.grpo_loss(torch.log(ratios), torch.zeros(2, 3), torch.tensor([1.0, 1.0]), mask)
    assert stats["clip_fraction"] == pytest.approx(0.5), (
        f"clip_fraction {stats['clip_fraction']}: like the loss, a masked_mean: per response (1/1 and 0/3), then over "
        "responses: 0.5; each response counts once, however long")


@pytest.mark.todo("grpo_loss")
def test_the_kl_penalty_carries_a_gradient(chapter):
    logps, old, _, mask = one_token([1.0, 1.0], [0.0, 0.0])  # advantages 0: only the KL pushes
    logps.requires_grad_(True)
    ref = logps.detach() + math.log(2.0)
    loss, _ = chapter.grpo_loss(logps, old, torch.zeros(2), mask, ref_logps=ref, kl_coef=0.5)
    backward(loss)
    # d/d logp of kl_coef * k3 = kl_coef * (1 - exp(ref - logp)) = 0.5 * (1 - 2), over 2 responses: -0.25 each
    assert logps.grad is not None and close(logps.grad, [[-0.25], [-0.25]]), (
        f"gradient {None if logps.grad is None else logps.grad.tolist()}, not -0.25 per token: the KL term is part "
        "of the loss and pulls logps towards the reference: keep it a tensor computed from logps (no .detach(), no "
        ".item()), or --kl-coef does nothing")


@pytest.mark.todo("grpo_loss")
def test_the_stats_are_python_floats(chapter):
    logps, old, advantages, mask = one_token([1.5, 1.0], [1.0, -1.0])
    for ref, kl_coef in ((None, 0.0), (logps + 0.5, 0.2)):
        _, stats = chapter.grpo_loss(logps, old, advantages, mask, ref_logps=ref, kl_coef=kl_coef)
        kinds = {name: type(value).__name__ for name, value in stats.items()}
        assert kinds == {"clip_fraction": "float", "kl": "float"}, (
            f"stats {kinds}: both are Python floats (float(...)), not tensors: they are logged and sent between "
            "actors, and a tensor holds on to its graph")


@pytest.mark.todo("grpo_loss")
def test_grpo_loss_on_random_batches(chapter):
    for number, case in enumerate(SNAPSHOTS["grpo_loss"]):
        logps = tensor(case["logps"]).requires_grad_(True)
        ref = None if case["ref_logps"] is None else tensor(case["ref_logps"])
        loss, stats = chapter.grpo_loss(logps, tensor(case["old_logps"]), tensor(case["advantages"]),
                                        tensor(case["mask"]), clip=case["clip"], ref_logps=ref, kl_coef=case["kl_coef"])
        where = f"case {number} (clip={case['clip']}, kl_coef={case['kl_coef']}, ref_logps given: {ref is not None})"
        assert stats["kl"] == pytest.approx(case["kl"], abs=1e-5), (
            f"{where}: kl {stats['kl']}, expected {case['kl']}: when the penalty is on, the masked mean of k3 = "
            "exp(ref - logp) - (ref - logp) - 1, per response then over responses, like the loss; else 0.0")
        assert close(loss, case["loss"], 1e-5), f"{where}: loss {float(loss):.6f}, expected {case['loss']:.6f}"
        assert stats["clip_fraction"] == pytest.approx(case["clip_fraction"], abs=1e-6), (
            f"{where}: clip_fraction {stats['clip_fraction']}, expected {case['clip_fraction']}")
        backward(loss)
        assert logps.grad is not None and close(logps.grad, case["grad"], 1e-5), (
            f"{where}: the gradient wrt logps is off by up to "
            f"{worst(logps.grad if logps.grad is not None else torch.zeros(1), case['grad']):.6f}: it flows through "
            "the unclipped tokens' ratio and through the KL term, never through old_logps or padding")


@pytest.mark.todo("grpo_loss")
def test_grpo_loss_leaves_its_inputs_as_they_were(chapter):
    torch.manual_seed(10)
    inputs = {"logps": (torch.randn(3, 4) - 1).requires_grad_(), "old_logps": torch.randn(3, 4) - 1,
              "advantages": torch.tensor([0.5, -1.0, 2.0]),
              "mask": torch.tensor([[1.0] * 4, [1.0, 1.0, 0, 0], [1.0, 0, 0, 0]]),
              "ref_logps": torch.randn(3, 4) - 1}
    before = {key: value.detach().clone() for key, value in inputs.items()}
    loss, _ = chapter.grpo_loss(**inputs, clip=0.2, kl_coef=0.1)
    backward(loss)
    changed = [key for key in before if not (before[key].shape == inputs[key].shape
                                              and torch.equal(before[key], inputs[key].detach()))]
    assert not changed, (
        f"grpo_loss changed its caller's {', '.join(changed)}: an in-place operation (unsqueeze_, mul_, clamp_, ...) "
        "on an input rewrites the caller's tensor, and the caller goes on using its inputs (policy_loss reads logps "
        "and mask again for its KL term). The inputs stay as they were: use the out-of-place forms")


# --- TODO 3: response_token_logprobs -----------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   1. log-probabilities: a log-softmax over the vocabulary (<= 0, a distribution per position)
#                                                   -> test_each_response_token_is_read_off_the_position_before_it
#   2. response token t is read at position P + t - 1 -> test_each_response_token_is_read_off_the_position_before_it
#   3. P from the shapes, also when every row ends in padding -> test_the_prompt_length_comes_from_the_shapes
#   4. 0 exactly where mask is 0                     -> test_padding_after_the_response_answers_zero
#   5. float32, whatever the logits' dtype           -> test_bfloat16_logits_over_a_real_vocabulary_are_read_in_float32
#   6. finite for large logits (no log of a softmax that rounds to 0) -> test_large_logits_give_finite_log_probabilities
#   7. the gradient reaches the logits that predicted each real token, none from padding
#                                                   -> test_the_gradient_reaches_the_logits
#   8. values and gradients on random batches (logits up to 200 wide, every row padded)
#                                                   -> test_response_token_logprobs_on_random_batches
#   9. the model's own probability, as feeding it token by token gives
#                                                   -> test_log_probabilities_of_a_real_model_match_feeding_it_token_by_token


def toy_logits():
    """B=1, two prompt positions, three response tokens, a vocabulary of 4: each position's logits differ."""
    return torch.tensor([[[0.0, 1.0, 2.0, 3.0],  # position 0 (prompt): predicts the prompt's second token
                          [3.0, 0.0, 0.0, 0.0],  # position 1 (last prompt token): predicts response token 0
                          [0.0, 3.0, 0.0, 0.0],  # position 2 (response token 0): predicts response token 1
                          [0.0, 0.0, 3.0, 0.0],  # position 3 (response token 1): predicts response token 2
                          [1.0, 1.0, 1.0, 9.0]]])  # position 4 (response token 2): predicts what follows; unused


@pytest.mark.todo("response_token_logprobs")
@pytest.mark.hint(2)
def test_each_response_token_is_read_off_the_position_before_it(chapter):
    responses, mask = torch.tensor([[0, 1, 2]]), torch.ones(1, 3)
    got = chapter.response_token_logprobs(toy_logits(), responses, mask)
    # What each response position answers for every token of the vocabulary: a distribution, if these are
    # log-probabilities. The diagnosis goes from the first thing to check to the last.
    every = torch.stack([chapter.response_token_logprobs(toy_logits(), torch.full((1, 3), v), mask)[0]
                         for v in range(4)], dim=-1).float()  # [3 positions, 4 tokens]
    assert (every <= 1e-6).all(), (
        f"{every.tolist()}: values above 0 are no log-probabilities (log p <= 0): take a log-softmax of the logits "
        "(raw logits, a probability's log with its sign lost, or a negated log-softmax all give values above 0)")
    total = torch.logsumexp(every, dim=-1)
    assert close(total, [0.0, 0.0, 0.0]), (
        f"at each response position, exp of the answers summed over the vocabulary gives {total.exp().tolist()}, "
        "not 1: the log-softmax must run over the vocabulary, the last dimension (dim=-1), not over the positions")
    # Read at its own position P + t, each token would get log(1 / (e^3 + 3)) = -3.13920, the last
    # log(e^1 / (3e + e^9)) = -8.00101; read where it is predicted, log(e^3 / (e^3 + 3)) = -0.13920 each.
    assert not close(got, [[-3.13920, -3.13920, -8.00101]]), (
        "off by one: each token was read at its own position, P + t: the logits at position i predict token i+1, "
        "so response token t is read at position P + t - 1")
    assert close(got, [[-0.13920, -0.13920, -0.13920]]), (
        f"{got.tolist()} are log-probabilities, but not those of the logits that predict each token: response token "
        "t is read at position P + t - 1 (the logits at position i predict token i+1)")
    other = chapter.response_token_logprobs(toy_logits(), torch.tensor([[3, 3, 3]]), mask)
    # token 3 has logit 0 at positions 1-3: log(1 / (e^3 + 3)) = -3.13920
    assert close(other, [[-3.13920, -3.13920, -3.13920]]), (
        f"responses [[3, 3, 3]]: {other.tolist()}, expected -3.13920 each (logit 0 against e^3 + 3): each token's "
        "log-probability is the log-softmax at position P + t - 1, read at that token's id")


@pytest.mark.todo("response_token_logprobs")
@pytest.mark.hint(3)
def test_padding_after_the_response_answers_zero(chapter):
    logits = toy_logits().repeat(2, 1, 1)
    responses = torch.tensor([[0, 1, 2], [0, 3, 3]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    got = chapter.response_token_logprobs(logits, responses, mask)
    assert got.shape == (2, 3) and got.dtype == torch.float32, (
        f"shape {tuple(got.shape)}, dtype {getattr(got, 'dtype', None)}: expected (2, 3) float32: one log-probability "
        "per response token, the responses' [B, T], in float32")
    assert close(got, [[-0.13920, -0.13920, -0.13920], [-0.13920, 0.0, 0.0]]), "masked positions answer exactly 0"
    assert (got[1, 1:] == 0).all(), (
        f"row 1's padding (mask 0) answers {got[1, 1:].tolist()}: positions where mask is 0 answer exactly 0, "
        "not just close to it")


@pytest.mark.todo("response_token_logprobs")
@pytest.mark.hint(2)
def test_the_prompt_length_comes_from_the_shapes(chapter):
    logits = toy_logits().repeat(2, 1, 1)  # P = 5 positions - 3 response tokens = 2, whatever the mask says
    responses = torch.tensor([[0, 1, 2], [0, 1, 2]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # every row ends in padding
    try:
        got = chapter.response_token_logprobs(logits, responses, mask)
    except Exception as err:
        raise AssertionError(f"every row ends in padding here, and it failed ({type(err).__name__}: {err}): the "
                             "prompt's length P comes from the shapes (logits' positions minus the response's "
                             "width), never from the mask") from err
    assert close(got, [[-0.13920, -0.13920, 0.0], [-0.13920, 0.0, 0.0]]), (
        f"{got.tolist()}: misaligned when every row ends in padding: P is the logits' positions minus the "
        "response's width (5 - 3 = 2), never worked out from the mask")


@pytest.mark.todo("response_token_logprobs")
@pytest.mark.hint(3)
def test_large_logits_give_finite_log_probabilities(chapter):
    logits = torch.tensor([[[0.0, 1000.0, 2000.0],  # position 0 (the prompt's last): predicts response token 0
                            [500.0, 0.0, 0.0],  # position 1: predicts response token 1
                            [0.0, 0.0, 0.0]]])  # position 2: unused
    got = chapter.response_token_logprobs(logits, torch.tensor([[0, 1]]), torch.ones(1, 2))
    # token 0 at position 0: 0 - 2000 - log(1 + e^-1000 + e^-2000) = -2000; token 1 at position 1: 0 - 500 - log(...) = -500
    assert torch.isfinite(got).all() and close(got, [[-2000.0, -500.0]]), (
        f"{got.tolist()}: a softmax rounds e^-2000 to 0, and its log is -inf (then NaN in the loss): use log_softmax, "
        "which subtracts the largest logit first, never the log of a softmax")


@pytest.mark.todo("response_token_logprobs")
def test_the_gradient_reaches_the_logits(chapter):
    logits = toy_logits().requires_grad_(True)
    got = chapter.response_token_logprobs(logits, torch.tensor([[0, 1, 2]]), torch.tensor([[1.0, 0.0, 0.0]]))
    assert got.requires_grad, "the log-probabilities carry no gradient: the trainer learns through them (no no_grad)"
    got.sum().backward()
    # d log p(token 0 | position 1) / d logits[1] = onehot(0) - softmax([3, 0, 0, 0]):
    # softmax = [e^3, 1, 1, 1] / (e^3 + 3) = [0.87005, 0.04332, 0.04332, 0.04332]
    assert close(logits.grad[0, 1], [0.12995, -0.04332, -0.04332, -0.04332]), (
        f"gradient at position 1 {logits.grad[0, 1].tolist()}: response token 0's log-probability moves the logits "
        "that predicted it (onehot - softmax)")
    others = torch.cat([logits.grad[0, :1], logits.grad[0, 2:]])
    assert (others == 0).all(), "the padding tokens (mask 0) send no gradient anywhere; nor does the prompt position"


@pytest.mark.todo("response_token_logprobs")
def test_response_token_logprobs_on_random_batches(chapter):
    for number, case in enumerate(SNAPSHOTS["response_token_logprobs"]):
        logits = tensor(case["logits"]).requires_grad_(True)
        responses, mask = torch.tensor(case["responses"]), tensor(case["mask"])
        got = chapter.response_token_logprobs(logits, responses, mask)
        where = (f"case {number} (logits {tuple(logits.shape)}, up to {float(logits.detach().abs().max()):.0f}; "
                 f"mask {mask.tolist()})")
        assert got.shape == responses.shape and close(got.detach(), case["expected"], 1e-4), (
            f"{where}: off by up to {worst(got.detach(), case['expected']):.5f}")
        (got * tensor(case["weights"])).sum().backward()
        assert close(logits.grad, case["grad"], 1e-5), (
            f"{where}: the gradient wrt the logits is off by up to {worst(logits.grad, case['grad']):.6f}")


@pytest.mark.todo("response_token_logprobs")
def test_bfloat16_logits_over_a_real_vocabulary_are_read_in_float32(chapter):
    """A policy in bf16 gives bf16 logits. A log-softmax over Qwen2.5's 151,936 tokens done in bf16 is off by
    hundredths of a nat: a spurious ratio of a few percent, next to a clip of 0.2."""
    logits = (3 * torch.randn(1, 4, 151_936, generator=torch.Generator().manual_seed(0))).to(torch.bfloat16)
    responses, mask = torch.tensor([[5, 77, 151_000]]), torch.ones(1, 3)
    got = chapter.response_token_logprobs(logits, responses, mask)
    expected = tensor(SNAPSHOTS["bfloat16"]["expected"])  # read in float32 by the reference
    assert got.dtype == torch.float32, (
        f"bfloat16 logits gave {got.dtype} log-probabilities: the answer is float32, whatever the logits' dtype")
    assert torch.allclose(got, expected, atol=1e-4), (
        f"off by up to {float((got - expected).abs().max()):.4f} nats: compute the log-softmax in float32")


@pytest.mark.todo("response_token_logprobs")
def test_log_probabilities_of_a_real_model_match_feeding_it_token_by_token(chapter, plumbing):
    model, tokenizer = chapter.load_policy(None, seed=0)
    prompt_ids = torch.tensor(plumbing.prompt_ids(tokenizer, chapter.CountingTask().sample(random.Random(2))))
    prompts = prompt_ids.expand(2, -1)
    responses = torch.randint(0, len(tokenizer), (2, 4), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    with torch.no_grad():
        fast = chapter.response_logprobs(model, prompts, torch.ones_like(prompts), responses, mask)
        for row in range(2):
            for t in range(4):
                if mask[row, t] == 0:
                    assert fast[row, t] == 0, (
                        f"row {row}, response token {t} is padding (mask 0), but answers {fast[row, t].item()!r}: "
                        "positions where mask is 0 answer exactly 0")
                    continue
                prefix = torch.cat([prompt_ids, responses[row, :t]])[None]
                expected = torch.log_softmax(model(prefix).logits[0, -1].float(), dim=-1)[responses[row, t]]
                assert close(fast[row, t], expected), f"row {row}, response token {t}: not the model's own probability"


# --- The given task, masking and padding (what the trainer depends on) ---------------------------


def test_the_counting_reward_by_hand(chapter):
    task, four = chapter.CountingTask(), chapter.Prompt("Count to 4:", [1, 2, 3, 4])
    assert [task.reward(four, text) for text in ("1 2 3 4", "1, 2, 3, 4", "123", "123456", "no digits", "4321")] == \
        [1.0, 1.0, 3 / 4, 4 / 6, 0.0, 0.0], "only digits count, position by position, over the longer list"
    counts = {len(task.sample(random.Random(seed)).answer) for seed in range(200)}
    assert counts == set(range(2, 10)), "prompts cover every count from 2 to 9"


@pytest.fixture(scope="module")
def policy(chapter):
    """The chapter's given policy module (ch10_policy.py): the model, the tokenizer, the task."""
    return importlib.import_module(f"{chapter.__package__}.ch10_policy")


def test_the_response_mask_keeps_the_policys_choices_up_to_the_first_eos(policy):
    eos, pad = 1, 0
    responses = torch.tensor([[5, 6, eos, pad, pad], [pad, 5, eos, 7, eos], [5, 6, 7, 8, 9]])
    assert policy.response_mask(responses, eos).tolist() == [
        [1, 1, 1, 0, 0],  # the EOS is a choice, and is trained; what follows is padding
        [1, 1, 1, 0, 0],  # a pad token the policy chose before its EOS counts
        [1, 1, 1, 1, 1],  # no EOS: every token was chosen
    ], (f"response_mask gave {policy.response_mask(responses, eos).tolist()}: the given code keeps every token up to "
        "and including the first EOS (a pad chosen before it too), and all of them when there is no EOS")


def test_left_padding_aligns_every_prompt_to_the_right(plumbing):
    ids, attention = plumbing.pad_left([torch.tensor([7, 8, 9]), torch.tensor([5])], pad_id=0)
    assert ids.tolist() == [[7, 8, 9], [0, 0, 5]] and attention.tolist() == [[1, 1, 1], [0, 0, 1]], (
        f"pad_left gave ids {ids.tolist()}, attention {attention.tolist()}: the given code pads each shorter row on "
        "the left, with attention 0 on the padding and 1 on the real tokens")


# --- Given code: the main job's pacing (AdmissionCount) -------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_pacing_starts_a_group_only_if_it_will_be_trained_within_the_lag_bound(plumbing):
    count = plumbing.AdmissionCount(max_lag=1, batch_groups=2, clock=FakeClock())
    on_version_0 = [count.admit(0) for _ in range(5)]
    assert on_version_0 == [0, 1, 2, 3, None], (
        "groups 0-3 are trained at versions 0 and 1 (2 a step): within lag 1 of version 0; group 4 is not")
    assert [count.admit(1), count.admit(1), count.admit(1)] == [4, 5, None], (
        "on version 1, groups 4 and 5 (trained at version 2, lag 1) may start, and the next (version 3, lag 2) "
        "may not: expected [4, 5, None]")
    assert count.held_back == 2, "each refusal is counted"


def test_a_group_that_never_reaches_the_buffer_gives_its_place_back(plumbing):
    count = plumbing.AdmissionCount(max_lag=0, batch_groups=2, clock=FakeClock())
    assert [count.admit(0), count.admit(0), count.admit(0)] == [0, 1, None], (
        "max_lag 0, 2 groups a step: on version 0 only groups 0 and 1 (trained at version 0) may start; expected "
        "[0, 1, None]")
    count.lose(0)
    assert count.admit(0) == 1, "group 1 moves up to be trained first, so one more fits into version 0's step"
    count.arrived(1)
    count.lose(1)
    assert count.admit(0) is None, "a group already in the buffer is not lost: its place stays taken"


def test_a_number_out_ten_times_longer_than_any_group_took_is_taken_back(plumbing):
    clock = FakeClock()
    count = plumbing.AdmissionCount(max_lag=0, batch_groups=1, clock=clock)
    assert count.admit(0) == 0, "the first group a generator on version 0 asks for is number 0"
    clock.now = 4.9
    assert count.admit(0) is None, "out 4.9 s: not yet lost (5 s at least)"
    clock.now = 5.0
    assert count.admit(0) == 0, "out 5 s: taken back, and its place given again"
    clock.now = 7.0
    count.arrived(0)  # took 2 s: patience is now 20 s
    assert count.admit(1) == 1, "a generator on version 1 may start group 1, trained at version 1 (lag 0)"
    clock.now = 26.0
    assert count.admit(1) is None, "out 19 s, when a group once took 2 s: not yet lost"
    clock.now = 27.0
    assert count.admit(1) == 1, (
        "out 20 s, ten times the 2 s group 0 took: group 1's number is taken back, and given again (1)")


def test_a_new_run_numbers_its_groups_from_the_learners_version(plumbing):
    count = plumbing.AdmissionCount(max_lag=1, batch_groups=2, clock=FakeClock())
    assert [count.admit(0) for _ in range(4)] == [0, 1, 2, 3], (
        "groups 0-3 are trained at versions 0 and 1, within lag 1 of version 0: all four start, numbered 0 to 3")
    count.restart(3)
    assert count.admit(1) is None, "the learner is at version 3: a group started on version 1 would lag 2"
    assert [count.admit(2), count.admit(2), count.admit(2)] == [6, 7, None], (
        "after restart(3) the groups are numbered from 6 (3 steps of 2): on version 2, groups 6 and 7 (trained at "
        "version 3) may start, group 8 (version 4, lag 2) may not; expected [6, 7, None]")


def test_a_sampled_group_decodes_exactly_its_masked_tokens(chapter, plumbing, policy):
    model, tokenizer = chapter.load_policy(None, seed=0)
    prompt = chapter.CountingTask().sample(random.Random(4))
    torch.manual_seed(1)
    group = plumbing.sample_group(model, tokenizer, prompt, group_size=4, max_new_tokens=6)
    assert group["prompt_ids"].tolist() == plumbing.prompt_ids(tokenizer, prompt), (
        f"sample_group's prompt_ids {group['prompt_ids'].tolist()}: the given code answers the prompt as prompt_ids "
        f"makes it, {plumbing.prompt_ids(tokenizer, prompt)}")
    assert group["responses"].shape == group["mask"].shape == (4, group["responses"].shape[1]), (
        f"responses {tuple(group['responses'].shape)}, mask {tuple(group['mask'].shape)}: sample_group (given code) "
        "answers one row per response (4), and a mask of the responses' shape")
    for row, mask, text in zip(group["responses"], group["mask"], group["texts"]):
        assert text == tokenizer.decode(row[mask.bool()], skip_special_tokens=True), (
            f"text {text!r}, but the masked tokens decode to "
            f"{tokenizer.decode(row[mask.bool()], skip_special_tokens=True)!r}: sample_group's (given code) texts are "
            "exactly each response's masked tokens, decoded")
        assert torch.equal(mask, policy.response_mask(row[None], tokenizer.eos_token_id)[0]), (
            f"mask {mask.tolist()} for response {row.tolist()}: sample_group's (given code) mask is response_mask's, "
            "every token up to and including the first EOS")


# --- Loading through from_pretrained, and one step on it ----------------------------------------


@pytest.fixture(scope="module")
def saved_tiny_model(chapter, tmp_path_factory):
    """The tiny Qwen2 and its tokenizer, saved like a hub model, in a temp dir."""
    path = tmp_path_factory.mktemp("tiny_qwen2")
    model, tokenizer = chapter.load_policy(None, seed=0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.todo("group_advantages", "grpo_loss", "response_token_logprobs")
def test_from_pretrained_loads_the_same_policy_and_a_grpo_step_trains_it(chapter, plumbing, saved_tiny_model):
    built, _ = chapter.load_policy(None, seed=0)
    model, tokenizer = chapter.load_policy(saved_tiny_model)
    fingerprint = plumbing.state_fingerprint
    assert fingerprint(model.state_dict()) == fingerprint(built.state_dict()), (
        "the model loaded from the saved checkpoint has other weights than load_policy(None, seed=0) builds: "
        "load_policy (given code) builds the same weights for the same seed, and loads a checkpoint as it was saved")
    assert tokenizer.apply_chat_template([{"role": "user", "content": "Count to 3:"}], tokenize=False,
                                         add_generation_prompt=True) == "Count to 3:\n", "the chat template came along"
    task = chapter.CountingTask()
    torch.manual_seed(0)
    prompts = [task.sample(random.Random(seed)) for seed in (0, 5)]  # two prompts of different lengths
    groups = [plumbing.sample_group(model, tokenizer, p, group_size=8, max_new_tokens=6) for p in prompts]
    rewards = torch.tensor([[task.reward(p, text) for text in g["texts"]] for p, g in zip(prompts, groups)])
    assert (rewards.std(dim=1) > 0).all(), "this seed gives both groups rewards that differ (else nothing to learn)"
    with torch.no_grad():  # the generator's view: each group alone, its prompt unpadded
        old = [chapter.response_logprobs(model, g["prompt_ids"].expand(8, -1), torch.ones(8, len(g["prompt_ids"]),
               dtype=torch.long), g["responses"], g["mask"]) for g in groups]
    width = max(g["responses"].shape[1] for g in groups)
    right = lambda t, v: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=v)  # noqa: E731
    padded_prompts, attention = plumbing.pad_left([g["prompt_ids"] for g in groups for _ in range(8)],
                                                 tokenizer.pad_token_id)
    responses = torch.cat([right(g["responses"], tokenizer.pad_token_id) for g in groups])
    mask = torch.cat([right(g["mask"], 0.0) for g in groups])
    old_logps = torch.cat([right(o, 0.0) for o in old])
    logps = chapter.response_logprobs(model, padded_prompts, attention, responses, mask)  # the trainer's view
    assert close(logps.detach(), old_logps), "trainer (a padded batch) and generator compute the same log-probs"
    advantages = chapter.group_advantages(rewards).reshape(-1)
    loss, stats = chapter.grpo_loss(logps, old_logps, advantages, mask)
    assert stats["clip_fraction"] == 0.0, "before any update the ratio is 1 everywhere"
    backward(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads), "the loss reaches the weights"


def test_a_checkpoints_generation_config_does_not_change_what_is_sampled(chapter, plumbing, tmp_path, monkeypatch):
    """A hub checkpoint's generation_config.json may ask `generate` for a repetition penalty, a
    temperature, top-k or top-p. The stored log-probabilities come from the model's own distribution
    (response_logprobs), so the tokens must be sampled from exactly that distribution."""
    model, tokenizer = chapter.load_policy(None, seed=0)
    model.generation_config.update(do_sample=True, repetition_penalty=1.3, temperature=0.7, top_k=20, top_p=0.8)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    from transformers import GenerationConfig

    assert GenerationConfig.from_pretrained(tmp_path).repetition_penalty == 1.3, "the checkpoint asks for a penalty"
    model, tokenizer = chapter.load_policy(str(tmp_path))
    sampled_from = []  # the distribution of each step's draw, as `generate` hands it to torch.multinomial
    draw = torch.multinomial

    def recording_draw(probs, *args, **kwargs):
        sampled_from.append(probs.clone())
        return draw(probs, *args, **kwargs)

    monkeypatch.setattr(torch, "multinomial", recording_draw)
    torch.manual_seed(0)
    group = plumbing.sample_group(model, tokenizer, chapter.CountingTask().sample(random.Random(1)), group_size=4,
                                  max_new_tokens=6)
    monkeypatch.undo()
    prompts, responses, mask = group["prompt_ids"].expand(4, -1), group["responses"], group["mask"]
    with torch.no_grad():  # the model's own log-probabilities, which the generator stores (response_logprobs)
        logits = model(torch.cat([prompts, responses], dim=1)).logits[:, prompts.shape[1] - 1:-1].float()
    own = torch.log_softmax(logits, dim=-1).gather(-1, responses[..., None]).squeeze(-1)
    assert len(sampled_from) >= responses.shape[1], (
        f"`generate` drew {len(sampled_from)} times through torch.multinomial for {responses.shape[1]} response "
        "tokens: sample_group (given code) samples every token, one draw per step at least")
    for t in range(responses.shape[1]):
        drawn = torch.log(sampled_from[t].gather(1, responses[:, t:t + 1]).squeeze(1))
        live = mask[:, t].bool()
        assert close(drawn[live], own[live, t]), (
            f"response token {t}: drawn with log-probabilities {drawn[live].tolist()}, but the model gives "
            f"{own[live, t].tolist()}: `generate` applied the checkpoint's generation_config")


# --- Given code: the rollout loop's prompts ------------------------------------------------------------------


class PromptRecorder:
    """Stands in for the generator service: records each prompt it is asked for, answers a one-response group."""

    def __init__(self, chapter, stop_after: int, stop):
        self.chapter, self.stop_after, self.stop, self.prompts = chapter, stop_after, stop, []

    async def route(self, endpoint, prompt, rollout_id, paced=False):
        self.prompts.append(prompt.text)
        if len(self.prompts) >= self.stop_after:
            self.stop.set()
        ids = torch.tensor([[1, 2]])
        return self.chapter.Rollout(rollout_id, 0, prompt, torch.tensor([5]), ids, torch.ones(1, 2),
                                    torch.zeros(1, 2), ["12"])


def prompts_of(chapter, worker, seed=0, count=12):
    from koans.testkit.testing import StandIn

    stop = asyncio.Event()
    service = PromptRecorder(chapter, count, stop)
    made = asyncio.run(chapter.continuous_rollouts(service, StandIn(put=lambda r: True), chapter.CountingTask(), stop,
                                                   worker, seed))
    assert made == count, f"the loop made {made} rollouts for {count} prompts: each one is put in the buffer, counted"
    return service.prompts


def test_each_rollout_loop_samples_its_own_varied_prompts(chapter):
    first, again, other = prompts_of(chapter, worker=0), prompts_of(chapter, worker=0), prompts_of(chapter, worker=1)
    assert len(set(first)) > 1, f"worker 0 asked for {first}: one loop's prompts vary from one rollout to the next"
    assert first == again, "a loop's prompts are reproducible: the same seed and worker give the same sequence"
    assert first != other, (f"workers 0 and 1 both asked for {first}: each loop draws from its own random stream "
                            "(seeded by the run's seed and its worker number), or two generators do the same work")
    assert prompts_of(chapter, worker=0, seed=1) != first, "another run's seed gives other prompts"


# --- The whole trainer, on real actors ----------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def started_job(chapter, plumbing, module_aio):
    """A trainer (in this process: one process fewer to start) and two generator replicas, started before the
    first test and told to load their models at once, so they do while the tests before `job` run."""
    job = plumbing.Job.start(small_grpo_config(chapter), name="t10", trainer_procs=this_proc())
    job.start_loading()
    try:
        yield job
    finally:
        module_aio.run(job.stop())


@pytest.fixture(scope="module")
def job(started_job, module_aio):
    module_aio.run(started_job.warm_up())
    return started_job


@pytest.mark.todo("group_advantages", "grpo_loss", "response_token_logprobs")
def test_the_rollout_loop_generates_scores_and_fills_the_buffer(chapter, plumbing, job, module_aio, test_tag):
    buffer = job.trainer_procs.spawn(f"buffer_{test_tag}", plumbing.ReplayBuffer, 1)

    async def run_until_three():
        stop = asyncio.Event()
        loop = asyncio.create_task(chapter.continuous_rollouts(job.service, buffer, job.task, stop, worker=3))
        for _ in range(int(STARTUP_TIMEOUT / 0.05)):
            if loop.done() or await buffer.waiting.call_one() >= 3:
                break
            await asyncio.sleep(0.05)
        stop.set()
        made = await asyncio.wait_for(loop, TIMEOUT)
        return made, await asyncio.wait_for(buffer.sample.call_one(made, 0), TIMEOUT)

    made, batch = module_aio.run(run_until_three())
    assert made >= 3 and batch is not None and [r.id for r in batch] == [f"w3-{n}" for n in range(1, made + 1)], (
        f"the rollout loop made {made} groups and the buffer handed back "
        f"{None if batch is None else [r.id for r in batch]}: expected at least 3, all handed back oldest first, "
        "w3-1, w3-2, ...: continuous_rollouts (given code) puts every group it makes into the buffer (chapter 09)")
    for rollout in batch:
        assert close(rollout.rewards, [job.task.reward(rollout.prompt, text) for text in rollout.texts]), (
            f"{rollout.id}: rewards {rollout.rewards!r}, expected the task's reward of each text: "
            f"{[job.task.reward(rollout.prompt, text) for text in rollout.texts]} (score, given code, sets them)")
        assert rollout.logps.shape == rollout.mask.shape and (rollout.logps[rollout.mask == 0] == 0).all(), (
            f"{rollout.id}: log-probabilities of shape {tuple(rollout.logps.shape)} for a mask of shape "
            f"{tuple(rollout.mask.shape)}: either the shapes differ or a padded position (mask 0) is not 0: "
            "response_token_logprobs answers one value per response token, exactly 0 where mask is 0")
        assert (rollout.logps[rollout.mask == 1] < 0).all(), "a sampled token's log-probability is below 0"


@pytest.fixture(scope="module")
def short_run(plumbing, job, module_aio):
    """Both loops for 6 steps; then one final sync."""

    async def run():
        before = await job.service.fanout("fingerprint")  # the generators start as copies of the trainer's weights
        result = await plumbing.run_async(job, timeout=4 * STARTUP_TIMEOUT)
        result["final"] = await job.final_sync()
        result["before"] = before
        return result

    return module_aio.run(run())


@pytest.mark.todo("group_advantages", "grpo_loss", "response_token_logprobs")
def test_a_short_run_finishes_every_step_within_the_lag_bound(short_run):
    assert [r["version"] for r in short_run["results"]] == [1, 2, 3, 4, 5, 6], (
        f"the steps answered versions {[r['version'] for r in short_run['results']]}, expected [1, 2, 3, 4, 5, 6]: "
        "6 steps, each one train call that publishes the next version (chapter 09's continuous_training)")
    assert all(len(r["ids"]) == 2 for r in short_run["results"]), "each step trains on groups_per_step groups"
    lags = [lag for r in short_run["results"] for lag in r["lags"]]
    assert lags and max(lags) <= 1, f"max_lag=1, but lags {lags}"
    trained_versions = [r["version"] - 1 - lag for r in short_run["results"] for lag in r["lags"]]
    assert max(trained_versions) >= 1, "later steps train on groups generated with weights the trainer published"
    ids = [i for r in short_run["results"] for i in r["ids"]]
    assert len(ids) == len(set(ids)), "no group is trained on twice"
    assert all(math.isfinite(r["loss"]) and 0.0 <= r["clip_fraction"] <= 1.0 for r in short_run["results"]), (
        f"(loss, clip_fraction) per step: {[(r['loss'], r['clip_fraction']) for r in short_run['results']]}: every "
        "loss must be finite (a NaN or inf comes from group_advantages, grpo_loss or response_token_logprobs) and "
        "every clip_fraction, a masked mean of clipped-or-not, within [0, 1]")


@pytest.mark.todo("group_advantages", "grpo_loss", "response_token_logprobs")
def test_generators_hold_the_trainers_weights_after_the_final_sync(short_run):
    final = short_run["final"]
    assert sorted(final["generator_versions"].values()) == [6, 6], (
        f"after the final sync the trainer is at version {final['version']!r} and the generators hold "
        f"{sorted(final['generator_versions'].values())}: expected 6 everywhere (6 steps), each generator loading "
        "the trainer's last version")
    assert final["trainer"] not in short_run["before"].values(), (
        "training left the weights where the generators started: equal weights at the end would prove no load")
    assert list(final["generators"].values()) == [final["trainer"]] * 2, "bit-equal weights everywhere"


@pytest.mark.gpu
@pytest.mark.todo("group_advantages", "grpo_loss", "response_token_logprobs")
@pytest.mark.time_limit(600)
def test_a_qwen2_5_0_5b_shaped_policy_trains_on_one_gpu(chapter, plumbing, aio):
    """Trainer and both generators share the GPU; staging="auto" puts the slots on it, so the
    generators load by CUDA IPC."""
    config = small_grpo_config(chapter, model="random:qwen2.5-0.5b", dtype="bfloat16", steps=3, max_new_tokens=8)
    job = plumbing.Job.start(config, name="t10gpu")

    async def scenario():
        await job.warm_up()
        before = await job.service.fanout("fingerprint")
        run = await plumbing.run_async(job, timeout=8 * STARTUP_TIMEOUT)
        return run, await job.final_sync(), await job.spans(), before

    try:
        run, final, spans, before = aio.run(scenario())
        assert [r["version"] for r in run["results"]] == [1, 2, 3], (
            f"the steps answered versions {[r['version'] for r in run['results']]}, expected [1, 2, 3]: 3 steps, "
            "each one train call that publishes the next version")
        assert final["trainer"] not in before.values(), "training moved the weights, so equality below proves a load"
        assert list(final["generators"].values()) == [final["trainer"]] * 2, (
            f"the generators' weight fingerprints {list(final['generators'].values())} differ from the trainer's "
            f"{final['trainer']!r}: after the final sync every generator holds the trainer's weights, bit for bit")
        transports = {s.info.get("transport") for s in spans if s.kind == "sync" and s.info.get("loaded")}
        assert transports == {"cuda_ipc"}, f"one GPU shared: the generators should load by CUDA IPC, not {transports}"
    finally:
        aio.run(job.stop())
