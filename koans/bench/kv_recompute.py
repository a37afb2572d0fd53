"""What recomputing the KV cache after a weight update costs, next to decoding a turn with the cache kept.

    python -m koans.bench.kv_recompute [--shapes tiny,0.5b] [--contexts 13,47] [--new 3] [--repeats N]

When new weights arrive in the middle of an episode, a generator that keeps a KV cache must choose:
keep it (the next turn's tokens attend to keys and values computed under the old weights), or
recompute it (a prefill of the whole context under the new weights). This times both, one thread,
no gradient, on a randomly initialised Qwen2 (nothing to download):

  keep        decode a turn of `new` tokens, one forward each, on a kept cache of `context` tokens
  prefill     one forward over the whole `context` (what recomputing adds before that turn)

and the ratio prefill / keep, from the best time of each forward over `repeats` rounds (50 for tiny,
3 for 0.5b; a round times the prefill, then each decoding step). Chapter 12's episodes are short:
a 7-token prompt, a 3-token call, a 3-token reply (13 tokens before the answer turn), at most 40
tokens after the prompt (47), and turns of at most 3 tokens.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def build(shape_name: str, seed: int = 0):
    from exercises.ch10_policy import QWEN2_5_0_5B_SHAPE
    from exercises.ch12_tools import tools_tokenizer
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = tools_tokenizer()
    torch.manual_seed(seed)
    if shape_name == "tiny":  # chapter 12's policy, as ToolsConfig.load_policy builds it from random weights
        from exercises.ch10_policy import build_random_model

        return build_random_model(tokenizer, seed).eval()
    config = Qwen2Config(**QWEN2_5_0_5B_SHAPE, tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    model = model.to_empty(device="cpu")  # skips transformers' slow init: any values time the same
    model.tie_weights()  # the output layer is the embedding again, as in the real model
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.02, 0.02)
    model.model.rotary_emb.__init__(config)  # its buffer, filled again (to_empty left it uninitialised)
    return model.eval()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@torch.no_grad()
def measure(model, context: int, new: int, repeats: int) -> dict:
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    ids = torch.randint(0, min(vocab, 27), (1, context))

    def prefill():
        return model(input_ids=ids, use_cache=True, cache=DynamicCache(config=model.config), logits_to_keep=1)

    kept = prefill().cache
    token = torch.zeros((1, 1), dtype=torch.long)

    def step(k: int):  # one decoding step on the kept cache: the (k+1)-th token of the turn
        return lambda: model(input_ids=token, cache=kept, position_ids=torch.tensor([[context + k]]), use_cache=True,
                             logits_to_keep=1)

    def one_round() -> list[float]:
        times = [timed(prefill)] + [timed(step(k)) for k in range(new)]
        kept.crop(-new)  # back to the kept context, for the next round
        return times

    one_round()  # warm-up
    # Each forward timed alone, in turns, and the best of each taken (as timeit does): on a shared
    # machine other processes only ever add time, and a turn of three forwards is often preempted.
    rounds = [one_round() for _ in range(repeats)]
    prefill_s, *steps_s = (min(r[i] for r in rounds) for i in range(new + 1))
    keep_s = sum(steps_s)
    return dict(context=context, new=new, prefill_ms=prefill_s * 1e3, keep_ms=keep_s * 1e3,
                ratio=prefill_s / keep_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="tiny,0.5b")
    parser.add_argument("--contexts", default="13,47")
    parser.add_argument("--new", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=0, help="default: 50 for tiny, 3 for 0.5b")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; torch {torch.__version__}, {args.threads} thread(s), float32")
    print(f"{'shape':<6} {'params':>8} {'context':>8} {'prefill ms':>11} {'keep ms':>9} {'prefill / keep':>15}")
    for shape in args.shapes.split(","):
        model = build(shape)
        params = sum(p.numel() for p in model.parameters())
        for context in (int(c) for c in args.contexts.split(",")):
            r = measure(model, context, args.new, args.repeats or (50 if shape == "tiny" else 3))
            print(f"{shape:<6} {params / 1e6:>7.2f}M {context:>8} {r['prefill_ms']:>11.2f} {r['keep_ms']:>9.2f}"
                  f" {r['ratio']:>14.2f}x")
        del model
    print(f"keep: {args.new} tokens decoded one by one on a kept cache; prefill: one forward over the context "
          f"(what recomputing adds). Best of each forward's times.")


if __name__ == "__main__":
    main()
