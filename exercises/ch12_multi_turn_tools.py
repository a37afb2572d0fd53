"""Chapter 12 (elective): multi-turn episodes with tools.

An episode is no longer one prompt and one answer. The policy writes a turn; if the turn
calls a tool, the environment's reply joins the sequence, and the policy goes on:

    tokens   find c\\n  ? c \\n  =7\\n  ! 7 <eos>
    who      prompt    policy  tool    policy
    mask               1 1 1   0 0 0   1 1 1        the tool's tokens are context, never trained
    version            4 4 4   - - -   5 5 5        new weights may arrive between two turns

Four things change, and each is a TODO:
  1. the sequence is built from token ids, turn by turn: a transcript re-encoded from its
     text would not be the tokens the policy sampled (tokenizers merge across turns);
  2. each token records who wrote it (the mask), and a policy token its log-probability and
     the policy version that sampled it;
  3. an episode's lag is that of its oldest policy token, and chapter 09's bound uses it
     (or, finer, each token is bounded on its own: its old tokens masked, its fresh ones trained);
  4. tools are a pool of workers behind chapter 06's Service; round robin queues requests
     behind a slow worker, routing to the least loaded one does not.

Your TODOs:
  1. Episode.append_turn         one turn's tokens, with who wrote them, log-probabilities and versions
  2. Episode.version             the version of the oldest policy token
  3. run_episode                 the loop: generate, call the tool, append its reply; stop in time
  4. LeastLoadedService.next_replica   the healthy replica with the fewest requests in flight
  5. Episode.trainable_mask      (stretch) staleness per token: train an episode's fresh tokens, not its old ones

Given, safe to skip: ch12_tools.py (the task, the tools, the tokenizer), ch12_plumbing.py (the
generator of turns, the loops, the demo).
Check: koans check 12   Demo: python -m exercises.ch12_multi_turn_tools   Read: docs/12_multi_turn_tools.md
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from koans.learn.demo import run_demo

from .ch06_plumbing import InFlight
from .ch06_service import Service
from .ch12_tools import Limits, VaultPrompt, VaultTask


@dataclass
class Turn:
    """What the generator answers for one policy turn: its tokens, their log-probabilities, and the
    policy version that sampled them."""

    ids: list[int]
    logprobs: list[float]
    version: int


@dataclass
class Episode:
    """Everything after the prompt, token by token, with who wrote each token."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # policy turns and tool replies, in order
    mask: list[float] = field(default_factory=list)  # 1.0: the policy chose it; 0.0: the environment wrote it
    logprobs: list[float] = field(default_factory=list)  # a policy token's log-probability when sampled; else 0.0
    versions: list[int] = field(default_factory=list)  # the policy version that sampled it; -1 for the environment's
    ended: str = ""  # why it stopped: "answer", "turns" or "tokens"

    def append_turn(self, ids: list[int], logprobs: list[float] | None = None, version: int | None = None) -> None:
        """Append one turn: the policy's (with its log-probabilities and version), or the environment's (without)."""
        # Every list keeps one entry per token of self.ids. A policy turn comes with a log-probability
        # per token and the version that sampled it; an environment turn (a tool reply) with neither.
        # A turn given log-probabilities is the policy's, whatever its version (0 included); one whose
        # log-probabilities do not match its tokens one for one is refused (ValueError), nothing appended.
        raise NotImplementedError("TODO(ch12): append the turn's tokens, and per token: who wrote it, its log-probability, its version")

    @property
    def version(self) -> int:
        """The policy version of this episode, for the staleness bound: that of its oldest policy token."""
        # Weights may change between two turns, so the tokens of one episode may come from several
        # versions, in any order (each turn may come from another generator). The episode is only as
        # fresh as its oldest one; version 0 is a version like any other. It is asked only of episodes
        # that hold a policy token (every episode starts with one).
        raise NotImplementedError("TODO(ch12): the version of the oldest policy token (the environment's tokens have none)")

    def trainable_mask(self, learner_version: int, max_token_staleness: int) -> list[float]:
        """Staleness per token (stretch): the mask to train with, less the policy tokens sampled more than
        `max_token_staleness` versions before `learner_version`. The episode is kept; its old tokens are not."""
        # One entry per token. A policy token is kept when the learner's version minus its own is at most
        # max_token_staleness (exactly at the bound too; a token newer than the learner's is kept); an older
        # one is 0. The environment's tokens stay 0. A new list: the episode's own mask stays as it was.
        raise NotImplementedError("TODO(ch12): the mask, with every policy token older than the bound set to 0")


async def run_episode(policy, tools, task: VaultTask, prompt: VaultPrompt, limits: Limits = Limits()) -> Episode:
    """One episode, turn by turn, from token ids.

      policy.route("generate_turn", ids, max_new) -> Turn: the policy's next turn after the token ids
          `ids` (prompt and episode so far), at most max_new tokens, ending with a stop token
      task.decode(ids) -> str; task.parse(text) -> ("call", request) or ("answer", text)
      tools.route("call", prompt.table, request) -> the tool's reply, as text
      task.reply_ids(reply) -> the reply's token ids, as the environment writes them
    """
    episode = Episode(task.prompt_ids(prompt))
    # The sequence is only ever token ids: the policy's turns as sampled (their stop token too), the tools'
    # replies whole, as reply_ids gives them. Never re-encode text. A turn that is not a tool call is the
    # answer: the episode ends ("answer"). It also ends after limits.max_turns policy turns ("turns", even if
    # max_tokens is reached by then; the last turn's tool call is still answered), and before a turn when it
    # holds limits.max_tokens tokens or more after its prompt ("tokens"); a policy turn never has more than
    # limits.max_new tokens, nor more than the room left. Set episode.ended to the reason. The tool is asked
    # for what the policy's turn requests (task.parse). A failed tool call fails the episode (it raises; never
    # an empty reply in its place); a cancelled episode stays cancelled (asyncio.CancelledError reaches its
    # caller). The tools' Service alone bounds a call's time (its call_timeout): add no timeout of your own.
    raise NotImplementedError("TODO(ch12): turn by turn until an answer; each tool call through `tools`, its reply appended")


class LeastLoadedService(Service):
    """Chapter 06's Service, routing each request to a replica with the fewest requests in flight.

    With round robin, every replica gets its turn, a slow one too: requests queue behind it
    while the others idle. Counting what each replica has in flight sends new work where it
    will start soonest. (Each Replica's `in_flight` is kept by the given code below.)
    """

    def next_replica(self, exclude: set[int] = frozenset()):
        """The healthy replica not in `exclude` with the fewest requests in flight; None if there is none."""
        # Among equals, the first at or after self.cursor (wrapping around) wins, and the cursor moves
        # just past it, as in chapter 06. With no candidate: None, and the cursor stays.
        raise NotImplementedError("TODO(ch12): the fewest requests in flight among the healthy replicas not excluded; ties: round robin")

    # --- given: counting the requests in flight (ch06_plumbing.InFlight) ----------------------------

    def _start_replica(self, index: int, generation: int):
        replica = super()._start_replica(index, generation)
        replica.actor = InFlight(replica.actor, replica)
        return replica


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from .ch12_plumbing import main  # the demo: given code, safe to skip

    run_demo(main)
