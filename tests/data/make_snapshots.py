"""Maintainers: regenerate the expected values that tests/test_ch10_qwen_grpo.py and tests/test_ch11_staleness.py
read from tests/data/ch10_snapshots.json and ch11_snapshots.json.

    python -m tests.data.make_snapshots

The inputs are drawn here from fixed seeds and stored with the answers of solutions/, so that the tests compare
with stored numbers and hold no reference code. Run it again only when a contract changes on purpose, and
check the diff of the .json files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from solutions import ch10_qwen_grpo as ch10
from solutions import ch11_staleness as ch11

HERE = Path(__file__).parent


def values(tensor: torch.Tensor) -> list:
    return tensor.detach().to(torch.float64).tolist()


def padded_mask(generator: torch.Generator, rows: int, width: int, every_row_padded: bool = False,
                empty_row: bool = False) -> torch.Tensor:
    """1.0 on each row's first `length` tokens: lengths from 1 to width (width - 1 when every row is padded)."""
    top = width - 1 if every_row_padded else width
    lengths = torch.randint(1, top + 1, (rows,), generator=generator)
    if empty_row:
        lengths[-1] = 0
    return (torch.arange(width)[None, :] < lengths[:, None]).float()


def group_advantage_cases() -> list[dict]:
    cases = []
    for seed, (rows, group, eps) in enumerate([(3, 4, 0.05), (2, 8, 1e-4), (4, 1, 1e-4), (3, 2, 0.3), (3, 5, 0.05),
                                               (2, 3, 1e-4), (5, 1, 0.3), (2, 6, 0.5)]):
        generator = torch.Generator().manual_seed(seed)
        if seed % 2:
            rewards = torch.tensor([0.0, 0.25, 0.5, 1.0])[torch.randint(0, 4, (rows, group), generator=generator)]
        else:
            rewards = torch.rand(rows, group, generator=generator) * 3 - 1
        if group > 1:
            rewards[0] = rewards[0, 0]  # a group of equal rewards in every case
        cases.append({"rewards": values(rewards), "eps": eps,
                      "expected": values(ch10.group_advantages(rewards, eps=eps))})
    return cases


def policy_inputs(generator: torch.Generator, rows: int, width: int, mask: torch.Tensor) -> dict:
    """Log-probabilities (<= 0) of the policy being trained, of an older one, of a reference; advantages."""
    logps = -(torch.randn(rows, width, generator=generator).abs() * 1.5)
    old = logps + 0.25 * torch.randn(rows, width, generator=generator)  # ratios on both sides of the clip
    ref = logps + 0.3 * torch.randn(rows, width, generator=generator)
    wild = 4 * torch.randn(rows, width, generator=generator)  # padding holds values that must count nowhere
    padding = mask == 0
    return {"logps": torch.where(padding, wild, logps), "old": torch.where(padding, -wild, old),
            "ref": torch.where(padding, wild.flip(1), ref), "advantages": torch.randn(rows, generator=generator)}


def grpo_loss_cases() -> list[dict]:
    cases = []
    settings = [(4, 5, 0.1, 0.0, True), (4, 5, 0.3, 0.5, True), (3, 6, 0.2, 0.1, True), (1, 4, 0.05, 1.0, True),
                (4, 5, 0.25, 0.5, False), (5, 3, 0.15, 0.0, False), (3, 6, 0.1, 0.25, True), (4, 4, 0.3, 2.0, True)]
    for seed, (rows, width, clip, kl_coef, with_ref) in enumerate(settings):
        generator = torch.Generator().manual_seed(100 + seed)
        mask = padded_mask(generator, rows, width, empty_row=(seed == 6))
        inputs = policy_inputs(generator, rows, width, mask)
        logps = inputs["logps"].clone().requires_grad_(True)
        ref = inputs["ref"] if with_ref else None
        loss, stats = ch10.grpo_loss(logps, inputs["old"], inputs["advantages"], mask, clip=clip, ref_logps=ref,
                                     kl_coef=kl_coef)
        loss.backward()
        cases.append({"logps": values(inputs["logps"]), "old_logps": values(inputs["old"]),
                      "advantages": values(inputs["advantages"]), "mask": values(mask), "clip": clip,
                      "ref_logps": values(ref) if with_ref else None, "kl_coef": kl_coef,
                      "loss": float(loss.detach()), "grad": values(logps.grad), "clip_fraction": stats["clip_fraction"],
                      "kl": stats["kl"]})
    return cases


def response_logprob_cases() -> list[dict]:
    cases = []
    settings = [(2, 3, 4, 7, 1.0, False), (3, 1, 3, 5, 5.0, True), (1, 4, 2, 11, 1.0, False),
                (2, 2, 5, 6, 50.0, True), (3, 2, 3, 9, 3.0, True), (2, 5, 1, 4, 200.0, False)]
    for seed, (rows, prompt, width, vocab, scale, every_row_padded) in enumerate(settings):
        generator = torch.Generator().manual_seed(200 + seed)
        logits = scale * torch.randn(rows, prompt + width, vocab, generator=generator)
        responses = torch.randint(0, vocab, (rows, width), generator=generator)
        mask = padded_mask(generator, rows, width, every_row_padded=every_row_padded and width > 1)
        weights = torch.randn(rows, width, generator=generator)  # the gradient of sum(weights * logps)
        leaf = logits.clone().requires_grad_(True)
        out = ch10.response_token_logprobs(leaf, responses, mask)
        (out * weights).sum().backward()
        cases.append({"logits": values(logits), "responses": responses.tolist(), "mask": values(mask),
                      "weights": values(weights), "expected": values(out), "grad": values(leaf.grad)})
    return cases


def bfloat16_case() -> dict:
    """The bf16 test's logits are drawn in the test (151,936 tokens wide: too big to store); their answer is here."""
    logits = (3 * torch.randn(1, 4, 151_936, generator=torch.Generator().manual_seed(0))).to(torch.bfloat16)
    responses, mask = torch.tensor([[5, 77, 151_000]]), torch.ones(1, 3)
    return {"responses": responses.tolist(), "expected": values(ch10.response_token_logprobs(logits, responses, mask))}


def importance_weight_cases() -> list[dict]:
    cases = []
    for seed, (rows, width, cap, minus_inf) in enumerate([(3, 5, None, False), (3, 5, 1.5, False), (2, 6, 5.0, True),
                                                          (4, 4, None, True), (2, 3, 2.0, True), (3, 4, 0.8, False)]):
        generator = torch.Generator().manual_seed(300 + seed)
        mask = padded_mask(generator, rows, width)
        proximal = -(torch.randn(rows, width, generator=generator).abs())
        behaviour = proximal + 0.8 * torch.randn(rows, width, generator=generator)
        if minus_inf:  # padding as some generators write it: log-probability -inf
            behaviour = behaviour.masked_fill(mask == 0, -math.inf)
            proximal = proximal.masked_fill((mask == 0) & (torch.arange(width) % 2 == 0), -math.inf)
        cases.append({"proximal": values(proximal), "behaviour": values(behaviour), "mask": values(mask), "cap": cap,
                      "expected": values(ch11.truncated_importance_weights(proximal, behaviour, mask, cap))})
    return cases


def decoupled_cases() -> list[dict]:
    cases = []
    settings = [(4, 5, 0.1, None), (3, 6, 0.3, 5.0), (4, 4, None, 1.5), (2, 5, None, None), (3, 5, 0.2, 2.0),
                (4, 6, 0.15, 3.0)]
    for seed, (rows, width, clip, cap) in enumerate(settings):
        generator = torch.Generator().manual_seed(500 + seed)
        mask = padded_mask(generator, rows, width, empty_row=(seed in (1, 4)))
        inputs = policy_inputs(generator, rows, width, mask)
        proximal = inputs["logps"] + 0.2 * torch.randn(rows, width, generator=generator)
        behaviour = inputs["old"] - 0.5 * torch.rand(rows, width, generator=generator)  # stale: weights above 1 too
        logps = inputs["logps"].clone().requires_grad_(True)
        loss, stats = ch11.decoupled_ppo_loss(logps, proximal, behaviour, inputs["advantages"], mask, clip=clip,
                                              cap=cap)
        loss.backward()
        cases.append({"logps": values(inputs["logps"]), "proximal": values(proximal), "behaviour": values(behaviour),
                      "advantages": values(inputs["advantages"]), "mask": values(mask), "clip": clip, "cap": cap,
                      "loss": float(loss.detach()), "grad": values(logps.grad), **stats})
    return cases


def masked_weight_cases() -> list[dict]:
    cases = []
    for seed, (rows, width, low, high, minus_inf) in enumerate([(3, 5, 0.5, 2.0, False), (3, 6, 0.8, 1.25, True),
                                                                (4, 4, 0.2, 5.0, False), (2, 5, 0.0, 3.0, True),
                                                                (3, 4, 1.0, 1.5, False), (4, 5, 0.6, 1.0, True)]):
        generator = torch.Generator().manual_seed(600 + seed)
        mask = padded_mask(generator, rows, width)
        proximal = -(torch.randn(rows, width, generator=generator).abs())
        behaviour = proximal + 0.8 * torch.randn(rows, width, generator=generator)
        if minus_inf:
            behaviour = behaviour.masked_fill(mask == 0, -math.inf)
            proximal = proximal.masked_fill((mask == 0) & (torch.arange(width) % 2 == 0), -math.inf)
        cases.append({"proximal": values(proximal), "behaviour": values(behaviour), "mask": values(mask), "low": low,
                      "high": high, "expected": values(ch11.masked_importance_weights(proximal, behaviour, mask, low,
                                                                                      high))})
    return cases


def decoupled_with_weights_cases() -> list[dict]:
    """decoupled_ppo_loss given the masked weights (the mismatch correction) instead of its truncated ones."""
    cases = []
    for seed, (rows, width, clip, band) in enumerate([(4, 5, 0.2, (0.5, 2.0)), (3, 6, None, (0.6, 1.6)),
                                                      (4, 4, 0.1, (0.2, 5.0))]):
        generator = torch.Generator().manual_seed(700 + seed)
        mask = padded_mask(generator, rows, width, empty_row=(seed == 1))
        inputs = policy_inputs(generator, rows, width, mask)
        proximal = inputs["logps"] + 0.2 * torch.randn(rows, width, generator=generator)
        behaviour = proximal + 0.6 * torch.randn(rows, width, generator=generator)  # a sampler's other numbers
        weights = ch11.masked_importance_weights(proximal, behaviour, mask, *band)
        logps = inputs["logps"].clone().requires_grad_(True)
        loss, stats = ch11.decoupled_ppo_loss(logps, proximal, behaviour, inputs["advantages"], mask, clip=clip,
                                              weights=weights)
        loss.backward()
        cases.append({"logps": values(inputs["logps"]), "proximal": values(proximal), "behaviour": values(behaviour),
                      "advantages": values(inputs["advantages"]), "mask": values(mask), "clip": clip,
                      "weights": values(weights), "loss": float(loss.detach()), "grad": values(logps.grad), **stats})
    return cases


def main() -> None:
    ch10_data = {"group_advantages": group_advantage_cases(), "grpo_loss": grpo_loss_cases(),
                 "response_token_logprobs": response_logprob_cases(), "bfloat16": bfloat16_case()}
    ch11_data = {"truncated_importance_weights": importance_weight_cases(),
                 "decoupled_ppo_loss": decoupled_cases(),
                 "masked_importance_weights": masked_weight_cases(),
                 "decoupled_ppo_loss_with_weights": decoupled_with_weights_cases()}
    for name, data in (("ch10_snapshots.json", ch10_data), ("ch11_snapshots.json", ch11_data)):
        (HERE / name).write_text(json.dumps(data, indent=None) + "\n")
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
