"""Chapter 10, given: the policy, its tokenizer, the task and its reward. You may skip this file;
nothing in it is a TODO, and docs/10_qwen_grpo.md explains the task. What it holds:

  load_policy(None)          a tiny Qwen2 (random init) and a character tokenizer, built offline
  load_policy("random:qwen2.5-0.5b")   Qwen2.5-0.5B's shape, random weights (GPU benchmarks)
  load_policy("path/or/id")  any Hugging Face causal LM with its tokenizer and chat template,
                             through from_pretrained (e.g. Qwen/Qwen2.5-0.5B-Instruct)
  CountingTask               "Count to 5:" -> "1 2 3 4 5", a reward in [0, 1]
  sample_group               G sampled answers to one prompt (token ids, mask, text)

Both the tiny and the real model go through the same code: a chat template
turns the task's message into the prompt text, and `generate` samples from
exactly the model's distribution, so the log-probabilities computed for what
it sampled are those of the policy that acted.

Why that needs care: `generate` reshapes the distribution with every logits
processor its generation config asks for, and a hub checkpoint brings its own
(generation_config.json: often a repetition penalty, a temperature, top-k and
top-p). The generator stores log-probabilities from a plain forward pass
(`response_logprobs`, the same function the trainer uses), so sampling from a
reshaped distribution would store numbers that are not those of the tokens'
distribution. There are two ways out: sample from the model's own distribution,
or store log-probabilities of the processed scores. This file does the first.
`load_policy` replaces the checkpoint's generation config with one that keeps
only its special tokens, and `sample_group` asks for temperature 1 with no
top-k and no top-p (transformers' own default top-k is 50). The second way
would make the stored log-probabilities those of another distribution than the
one the trainer computes and optimises: the ratio would differ from 1 before
any update, and the clip would act on that gap instead of on the policy's change.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

import torch

CHARS = "0123456789 \n:,Cnotu"  # what the counting task's prompts and answers use
SPECIALS = ["<pad>", "<eos>", "<unk>"]
# The tiny tokenizer's chat template: each message's text on its own line. After the
# prompt comes the answer, then <eos>. (Real models bring their own template.)
TINY_CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def build_tiny_tokenizer():
    """A character tokenizer (one token per character), made with `tokenizers`, as a HF tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIALS + list(CHARS))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")  # every character
    core.decoder = decoders.Fuse()  # join characters back without spaces
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


#: The tiny default: ~0.1 M parameters, trains on a CPU in a minute or two.
TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128)
#: Qwen2.5-0.5B's shape (its config.json), for GPU benchmarks with random weights: nothing to download.
QWEN2_5_0_5B_SHAPE = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                          rope_theta=1000000.0)
RANDOM_MODELS = {"random:tiny": TINY_SHAPE, "random:qwen2.5-0.5b": QWEN2_5_0_5B_SHAPE}


def build_random_model(tokenizer, seed: int = 0, shape: dict = TINY_SHAPE):
    """A randomly initialised Qwen2 causal LM of the given shape (the vocabulary defaults to the tokenizer's)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**{"vocab_size": len(tokenizer), **shape}, tie_word_embeddings=True,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None)
    return Qwen2ForCausalLM(config)


def load_policy(model: str | None = None, seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """(model, tokenizer). `model`: None for the tiny offline Qwen2; "random:qwen2.5-0.5b" for
    that shape with random weights (benchmarks); else a hub id or a local path (from_pretrained).

    Every process that calls this with the same arguments gets the same
    weights: a random model from the seed, a real model from its files.
    """
    if model is None or model in RANDOM_MODELS:
        tokenizer = build_tiny_tokenizer()
        policy = build_random_model(tokenizer, seed, RANDOM_MODELS[model or "random:tiny"])
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        policy = AutoModelForCausalLM.from_pretrained(model, dtype=dtype)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # prompts end where answers start, in every row
    policy.generation_config = neutral_generation_config(policy.generation_config)
    return policy.to(device=device, dtype=dtype), tokenizer


def neutral_generation_config(loaded):
    """A generation config that keeps only `loaded`'s special tokens.

    `generate` fills every setting the caller leaves unset from the model's
    generation config, so a checkpoint's repetition penalty (or min-p, banned
    n-grams, suppressed tokens...) would reshape the distribution sampled from.
    With this config, nothing but the model decides what is sampled.
    """
    from transformers import GenerationConfig

    return GenerationConfig(bos_token_id=loaded.bos_token_id, eos_token_id=loaded.eos_token_id,
                            pad_token_id=loaded.pad_token_id)


@dataclass(frozen=True)
class Prompt:
    text: str  # what the user says
    answer: list[int]  # the numbers a perfect response lists, in order


class CountingTask:
    """"Count to 5:" -> "1 2 3 4 5". Chosen because learning shows (docs/10_qwen_grpo.md).

    The reward is dense: the share of positions where the response says the
    right digit, over the longer of the two lists. Only digits count, so
    "1, 2, 3" and "123" are the same answer. For "Count to 4:", "123" scores
    3/4, "123456" scores 4/6 and anything without digits 0.
    """

    def __init__(self, shortest: int = 2, longest: int = 9):
        if not 1 <= shortest <= longest <= 9:
            raise ValueError(f"counts must satisfy 1 <= shortest <= longest <= 9 (one digit each), "
                             f"got shortest={shortest}, longest={longest}")
        self.shortest, self.longest = shortest, longest

    def sample(self, rng: random.Random) -> Prompt:
        last = rng.randint(self.shortest, self.longest)
        return Prompt(f"Count to {last}:", list(range(1, last + 1)))

    @staticmethod
    def reward(prompt: Prompt, response: str) -> float:
        said = [int(digit) for digit in re.findall(r"\d", response)]
        right = sum(a == b for a, b in zip(said, prompt.answer))
        return right / max(len(said), len(prompt.answer))


def prompt_ids(tokenizer, prompt: Prompt) -> list[int]:
    """The prompt as the model sees it: the chat template applied to one user message."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def response_mask(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1.0 for the tokens the policy chose: up to and including the first EOS; 0.0 after it.

    The EOS counts (choosing to stop is an action the policy is trained on);
    the padding `generate` appends after it does not. Do not mask by the pad
    id: a policy may choose the pad token itself, and that choice is trained.
    """
    is_eos = (responses == eos_id).int()
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos
    return (eos_before == 0).float()


def pad_left(rows: list[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack 1-D token rows of different lengths, padded on the left: (ids, attention mask)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = row
        attention[i, width - len(row):] = 1
    return ids, attention


@torch.no_grad()
def greedy_answers(model, tokenizer, counts, max_new_tokens: int = 16) -> dict[int, str]:
    """{N: the policy's greedy answer to "Count to N:"}: the most likely token at each step, up to EOS.

    Greedy shows what the policy has settled on; a sample (what training sees) varies from call to call.
    """
    answers = {}
    for n in counts:
        ids = torch.tensor([prompt_ids(tokenizer, Prompt(f"Count to {n}:", list(range(1, n + 1))))],
                           device=model.device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        response = out[:, ids.shape[1]:]
        mask = response_mask(response, tokenizer.eos_token_id)
        known = torch.where(response < len(tokenizer), response, tokenizer.unk_token_id or 0)
        answers[n] = tokenizer.decode(known[0][mask[0].bool()], skip_special_tokens=True)
    return answers


@torch.no_grad()
def sample_group(model, tokenizer, prompt: Prompt, group_size: int, max_new_tokens: int = 16) -> dict:
    """`group_size` sampled responses to one prompt: prompt ids, response ids, mask and decoded text.

    Sampled from the model's own distribution: temperature 1, no top-k, no
    top-p, and (for a model from `load_policy`) no processor from a checkpoint.
    """
    ids = torch.tensor([prompt_ids(tokenizer, prompt)] * group_size, device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                         top_p=1.0, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    responses = out[:, ids.shape[1]:]
    mask = response_mask(responses, tokenizer.eos_token_id)
    known = torch.where(responses < len(tokenizer), responses, tokenizer.unk_token_id or 0)  # a random 0.5B's vocab
    texts = [tokenizer.decode(r[m.bool()], skip_special_tokens=True) for r, m in zip(known, mask)]
    return {"prompt_ids": ids[0].cpu(), "responses": responses.cpu(), "mask": mask.cpu(), "texts": texts}
