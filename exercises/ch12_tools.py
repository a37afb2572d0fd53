"""Chapter 12, given: the vault task, its tools and its tokenizer. You may skip this file; nothing
in it is a TODO, and docs/12_multi_turn_tools.md explains the task.

  VaultTask      "find c" -> the policy calls the tool "?c", reads "=7", answers "!7"; a reward with
                 partial credit; the tokenizer, and how turns and tool replies are written
  ToolWorker     a tool server, one of a pool behind chapter 06's Service: answers a call after a
                 latency with a slow tail (and a worker may be slow on purpose)
  tools_tokenizer  a character tokenizer that also merges "\\n=" into one token: re-encoding a
                 transcript changes its tokens where it merges across what were separate turns (real
                 tokenizers merge at other boundaries; Qwen2's and GPT-2's split "\\n=" itself)

One episode, as text (the policy writes the lines marked >, the tool the one marked <):

    find c        the prompt: the table is hidden, one digit per letter a-e
  > ?c            a tool call: look up c
  < =7            the tool's reply (and a newline)
  > !7            the answer

A policy turn ends at a stop token (a newline or <eos>) or after Limits.max_new tokens. The base
policy writes "?c" and a newline, "!7" and <eos>; a trained one may fill its tokens instead ("?ea",
"!56"): the tool reads only the character after "?", the reward only the digit after "!".
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from dataclasses import dataclass

from koans.learn.timeline import Recorder
from monarch.actor import Actor, concurrent_endpoint, context, endpoint

from .ch06_plumbing import replica_label

NAMES = "abcde"  # the table's keys
CALL, REPLY, ANSWER = "?", "=", "!"  # how a tool call, a tool reply and an answer begin
STOP = "\n"  # a policy turn ends with it (or with <eos>)
CHARS = "0123456789abcdefin ?=!\n"  # the digits, and the letters of "find a".."find e"
SPECIALS = ["<pad>", "<eos>", "<unk>"]
MERGED = ["\n="]  # tokens of more than one character: a turn's end and the next reply's start, as one
TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"


def tools_tokenizer():
    """One token per character, except "\\n=" (a newline followed by "="), which is one token.

    A policy turn may end with "\\n" and a tool reply starts with "=", each sampled or encoded on
    its own; the same text encoded in one piece merges them. So the trained tokens are the sampled
    ones only if the transcript is built from token ids, never re-encoded from its text.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIALS + list(CHARS) + MERGED)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    pieces = "|".join(re.escape(token) for token in MERGED)
    core.pre_tokenizer = pre_tokenizers.Split(Regex(f"{pieces}|[\\s\\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                        unk_token="<unk>")
    tokenizer.chat_template = TEMPLATE
    return tokenizer


@dataclass(frozen=True)
class VaultPrompt:
    """One question: the letter asked for, and the hidden table's seed (the tools know the table)."""

    text: str  # "find c"
    name: str  # "c"
    table: int  # seed of the hidden table

    @property
    def answer(self) -> str:
        return str(table_of(self.table)[self.name])


def table_of(seed: int) -> dict[str, int]:
    """The hidden table of one prompt: a digit for each of the letters a-e."""
    rng = random.Random(seed)
    return {name: rng.randrange(10) for name in NAMES}


@dataclass(frozen=True)
class Limits:
    """When an episode stops, whatever the policy does: after max_turns policy turns, or when it holds
    max_tokens tokens after its prompt. max_new: the most tokens one policy turn may have."""

    max_turns: int = 4
    max_tokens: int = 40
    max_new: int = 3


class VaultTask:
    """Look a letter up in a hidden table with a tool, then answer its digit.

    Reward, out of 1 (partial credit, so that learning shows early): 0.2 for a first turn that is a
    tool call, 0.2 more if it asks for the prompt's letter; 0.2 for a last turn that is an answer
    ("!" and a digit; what follows the digit is ignored), 0.4 more if it is the right digit. So "?c"
    then "!7" scores 1.0; "!7" alone, guessed, 0.6 (one time in ten); a wrong letter, then its
    value answered, 0.4.
    """

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer or tools_tokenizer()
        self.stop_ids = [self.tokenizer.convert_tokens_to_ids(STOP), self.tokenizer.eos_token_id]

    def sample(self, rng: random.Random) -> VaultPrompt:
        name = rng.choice(NAMES)
        return VaultPrompt(f"find {name}", name, rng.randrange(10**9))

    def prompt_ids(self, prompt: VaultPrompt) -> list[int]:
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], tokenize=False,
                                                  add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        """A turn's text (special tokens left out)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @staticmethod
    def parse(turn: str) -> tuple[str, str]:
        """("call", the letter asked for) for a tool call like "?c" (the tool reads the one character after
        "?" and ignores the rest of the turn); else ("answer", the turn's text)."""
        if turn.startswith(CALL):
            return "call", turn[len(CALL):len(CALL) + 1]
        return "answer", turn.strip()

    @staticmethod
    def reply_text(value: str) -> str:
        """What a tool answers, as the policy reads it: "=7" and the turn's end."""
        return f"{REPLY}{value}{STOP}"

    def reply_ids(self, reply: str) -> list[int]:
        """The token ids of a tool's reply, encoded on its own (as the environment writes it)."""
        return self.tokenizer(reply, add_special_tokens=False)["input_ids"]

    def turn_spans(self, ids: list[int], mask: list[float]) -> list[tuple[str, int, int]]:
        """The episode's turns, in order, as ("policy" or "tool", first token, end): a turn changes with
        the mask, and a policy turn also ends with its stop token."""
        spans: list[list] = []
        for position, owner in enumerate(mask):
            who = "policy" if owner else "tool"
            last = spans[-1] if spans else None
            if last and last[0] == who and not (who == "policy" and ids[position - 1] in self.stop_ids):
                last[2] = position + 1
            else:
                spans.append([who, position, position + 1])
        return [(who, start, end) for who, start, end in spans]

    def turns(self, ids: list[int], mask: list[float]) -> list[tuple[str, str]]:
        """The episode's turns, in order: ("policy" or "tool", its text)."""
        return [(who, self.tokenizer.decode(ids[start:end])) for who, start, end in self.turn_spans(ids, mask)]

    def reward(self, prompt: VaultPrompt, ids: list[int], mask: list[float]) -> float:
        said = [text.replace("<eos>", "") for who, text in self.turns(ids, mask) if who == "policy"]
        if not said:
            return 0.0
        score = 0.0
        kind, what = self.parse(said[0])
        if kind == "call":
            score += 0.2 + (0.2 if what == prompt.name else 0.0)
        kind, what = self.parse(said[-1])
        if kind == "answer" and what.startswith(ANSWER):
            score += 0.2 + (0.4 if what[len(ANSWER):len(ANSWER) + 1] == prompt.answer else 0.0)
        return score


@dataclass(frozen=True)
class ToolLatency:
    """How long a tool call takes: `base` seconds, and one call in `tail_every` takes `tail` seconds (a
    costly request, on any worker). On a worker made slow, the ordinary calls take `slow_base` seconds."""

    base: float = 0.1
    tail: float = 1.0
    tail_every: int = 10
    slow_base: float = 1.0

    def of(self, rng: random.Random, slow: bool) -> float:
        if rng.randrange(self.tail_every) == 0:
            return self.tail
        return self.slow_base if slow else self.base


class ToolWorker(Actor):
    """A tool server: looks a letter up in a prompt's hidden table. A read: calling it twice does no harm,
    so a Service may retry a call on another worker (a tool that changed something could not be).
    It serves `slots` calls at once; more wait for a free slot, in the order they came."""

    def __init__(self, latency: ToolLatency = ToolLatency(), seed: int = 0, slots: int = 4):
        self.latency, self.free = latency, asyncio.Semaphore(slots)
        self.rng = random.Random(seed * 1000 + os.getpid())
        self.slow = False
        self.calls = 0
        self.recorder = Recorder(replica_label(str(context().actor_instance.name), "tool"))

    @concurrent_endpoint
    async def call(self, table: int, request: str) -> str:
        """The reply to a tool call: "=<digit>" for a letter of the table, "=?" for anything else."""
        self.calls += 1
        async with self.free:
            with self.recorder.span("tool", request=request, slow=self.slow):
                await asyncio.sleep(self.latency.of(self.rng, self.slow))
        value = table_of(table).get(request)
        return VaultTask.reply_text("?" if value is None else str(value))

    @endpoint
    async def make_slow(self, slow: bool) -> None:
        """This worker's ordinary calls take latency.slow_base seconds (one slow worker in a pool)."""
        self.slow = slow

    @endpoint
    async def whoami(self) -> int:
        return os.getpid()

    @endpoint
    async def timeline(self) -> list:
        return self.recorder.spans

    @endpoint
    async def calls_made(self) -> int:
        return self.calls
