"""Chapter 12 (elective): multi-turn episodes with tools. Run: pytest tests/test_ch12_multi_turn_tools.py

The episode loop is tested against a scripted policy and tools that answer at once, so that
each turn's tokens are known; the routing against replicas whose load is set by hand; then a
killed tool worker and a short run of the whole trainer, on real actors.
"""

import asyncio
import importlib
import threading
import time

import pytest
from monarch.actor import Actor, endpoint, this_proc

from koans.testkit.testing import STARTUP_TIMEOUT, TIMEOUT


@pytest.fixture(scope="module")
def tools_module(chapter):
    """The chapter's given task, tools and tokenizer (ch12_tools.py)."""
    return importlib.import_module(f"{chapter.__package__}.ch12_tools")


@pytest.fixture(scope="module")
def task(tools_module):
    return tools_module.VaultTask()


def encode(task, text):
    return task.tokenizer(text, add_special_tokens=False)["input_ids"]


class ScriptedPolicy:
    """Stands in for the generator service: answers each turn from a script, and records what it was shown."""

    def __init__(self, chapter, task, turns, version=4, every_turn=None):
        self.chapter, self.task = chapter, task
        self.turns, self.version, self.every_turn = list(turns), version, every_turn
        self.shown: list[list[int]] = []  # a copy of what each turn was shown, as it was then
        self.given: list[list[int]] = []  # the list object itself that each turn was given
        self.max_new: list[int] = []

    async def route(self, endpoint, ids, max_new):
        assert endpoint == "generate_turn", f"the policy is asked for {endpoint!r}"
        self.shown.append(list(ids))
        self.given.append(ids)
        self.max_new.append(max_new)
        await asyncio.sleep(0)
        text = self.every_turn or self.turns.pop(0)
        ids = encode(self.task, text.replace("<eos>", ""))[:max_new]
        if text.endswith("<eos>"):
            ids.append(self.task.tokenizer.eos_token_id)
        version = self.version + len(self.shown) - 1  # new weights between turns: each turn one version newer
        return self.chapter.Turn(ids, [-0.5] * len(ids), version)


class Tools:
    """Stands in for the tool service: answers from the prompt's table, and records each call."""

    def __init__(self, tools_module):
        self.tools_module, self.calls, self.tables = tools_module, [], []

    async def route(self, endpoint, table, request):
        assert endpoint == "call", f"the tools are asked for {endpoint!r}"
        self.calls.append(request)
        self.tables.append(table)
        await asyncio.sleep(0)
        value = self.tools_module.table_of(table).get(request)
        return self.tools_module.VaultTask.reply_text("?" if value is None else str(value))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AssertionError(f"run_episode used tools.{name}: call the tools only through tools.route('call', "
                             "table, request): the Service picks a live worker and retries on another")


def prompt_for(tools_module, name="c"):
    return tools_module.VaultPrompt(f"find {name}", name, 12345)


def run(chapter, policy, tools, task, prompt, limits=None, limit_s=10.0):
    arguments = (policy, tools, task, prompt) + ((limits,) if limits is not None else ())
    return asyncio.run(asyncio.wait_for(chapter.run_episode(*arguments), limit_s))


# --- TODO 1: Episode.append_turn -----------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   1. the turn's tokens go on self.ids in order, the environment's too (context the policy reads)
#                                                         -> test_a_policy_turn_is_trained_and_a_tool_reply_is_context
#   2. mask per token: 1.0 for a policy turn, 0.0 for the environment's -> test_a_policy_turn_is_trained_and_a_tool_reply_is_context
#   3. logprobs per token: the policy's own, 0.0 for the environment's  -> test_a_policy_turn_is_trained_and_a_tool_reply_is_context
#   4. versions per token: the turn's version, -1 for the environment's -> test_a_policy_turn_is_trained_and_a_tool_reply_is_context
#   5. every list keeps one entry per token of self.ids                  -> test_every_list_keeps_one_entry_per_token
#   6. a turn given log-probabilities is the policy's, version 0 included
#                                                         -> test_a_policy_turn_sampled_by_version_0_is_the_policys
#   7. log-probabilities that do not match the tokens one for one (fewer, more, or none): ValueError, nothing appended
#                                                         -> test_log_probabilities_that_do_not_match_the_tokens_are_refused
#   8. who wrote a turn is told by its log-probabilities alone: mask 1 for each of a policy turn's tokens (a
#      log-probability of 0.0 too); a turn without is the environment's (version -1) whatever version it came
#      with; the one-for-one check holds without a version too
#                                                         -> test_who_wrote_a_turn_is_told_by_its_log_probabilities_alone
#   9. the episode's lists are its own: the caller's lists are never kept or grown
#                                                         -> test_the_callers_lists_are_never_the_episodes_own


@pytest.mark.todo("Episode.append_turn")
def test_a_policy_turn_is_trained_and_a_tool_reply_is_context(chapter):
    episode = chapter.Episode([7, 8])
    episode.append_turn([10, 11, 12], [-0.1, -0.2, -0.3], version=4)
    episode.append_turn([20, 21])  # a tool's reply
    episode.append_turn([30], [-0.4], version=5)
    assert episode.ids == [10, 11, 12, 20, 21, 30] and episode.prompt_ids == [7, 8], (
        f"ids {episode.ids!r}, prompt_ids {episode.prompt_ids!r}, expected [10, 11, 12, 20, 21, 30] and [7, 8]: each "
        "turn's tokens go on self.ids (not on prompt_ids), in order, the tool's reply too (context the policy reads)")
    assert [len(episode.mask), len(episode.logprobs), len(episode.versions)] == [6] * 3, (
        f"mask, logprobs and versions have {len(episode.mask)}, {len(episode.logprobs)} and {len(episode.versions)} "
        "entries for 6 tokens: one entry per token, not per turn")
    assert episode.mask == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0], "the environment's tokens are context: mask 0, out of the loss"
    assert all(type(owner) is float for owner in episode.mask), (
        f"mask {episode.mask!r}: its entries are floats, 1.0 and 0.0, as the field says (a tensor made from ints "
        "is an integer tensor)")
    assert episode.logprobs == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4], (
        f"logprobs {episode.logprobs!r}, expected [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4]: a policy token keeps its own "
        "log-probability, one per token; the environment's tokens get 0.0")
    assert episode.versions == [4, 4, 4, -1, -1, 5], "each policy token keeps the version that sampled it; -1 elsewhere"


@pytest.mark.todo("Episode.append_turn")
def test_who_wrote_a_turn_is_told_by_its_log_probabilities_alone(chapter):
    episode = chapter.Episode([1])
    episode.append_turn([5, 6], [0.0, -0.3], version=2)  # a certain token (log-probability 0) is still the policy's
    try:
        episode.append_turn([2, 2], version=7)  # no log-probabilities: the environment's, whatever version it came with
    except (TypeError, ValueError) as err:
        pytest.fail(f"append_turn([2, 2], version=7) raised {err!r}: a turn without log-probabilities is the "
                    "environment's whatever its version; who wrote a turn is told by its log-probabilities alone")
    assert episode.mask == [1.0, 1.0, 0.0, 0.0] and episode.versions == [2, 2, -1, -1], (
        f"mask {episode.mask}, versions {episode.versions}: a turn with log-probabilities is the policy's, each of "
        "its tokens mask 1 (a log-probability of 0.0 too); a turn without is the environment's: mask 0, version -1")
    with pytest.raises(ValueError):
        episode.append_turn([8, 9], [-0.1])  # log-probabilities that do not match, and no version: refused all the same
        raise AssertionError("2 tokens with 1 log-probability and no version were accepted: a turn given "
                             "log-probabilities is the policy's, and the one-for-one check holds for it")


@pytest.mark.todo("Episode.append_turn")
def test_the_callers_lists_are_never_the_episodes_own(chapter):
    episode = chapter.Episode([1])
    first, first_logprobs = [5, 6], [-0.1, -0.2]
    episode.append_turn(first, first_logprobs, version=1)
    episode.append_turn([2, 2])
    episode.append_turn([7], [-0.3], version=1)
    assert (first, first_logprobs) == ([5, 6], [-0.1, -0.2]), (
        f"the first turn's lists became {first} and {first_logprobs}: the episode keeps lists of its own and "
        "appends copies of each turn's tokens, never the caller's list itself")
    assert episode.ids == [5, 6, 2, 2, 7], (
        f"ids {episode.ids!r}, expected [5, 6, 2, 2, 7]: the episode's own ids hold every turn's tokens, in order")


@pytest.mark.todo("Episode.append_turn")
def test_every_list_keeps_one_entry_per_token(chapter):
    episode = chapter.Episode([1])
    for turn in ([5], [6, 7, 8], [9, 10]):
        episode.append_turn(turn, [-1.0] * len(turn), version=2)
        episode.append_turn([3, 3])
        assert len(episode.ids) == len(episode.mask) == len(episode.logprobs) == len(episode.versions), (
            f"after a policy turn of {len(turn)} tokens and a tool reply of 2: ids, mask, logprobs and versions have "
            f"{len(episode.ids)}, {len(episode.mask)}, {len(episode.logprobs)} and {len(episode.versions)} entries: "
            "every list keeps one entry per token of self.ids")


@pytest.mark.todo("Episode.append_turn")
def test_a_policy_turn_sampled_by_version_0_is_the_policys(chapter):
    episode = chapter.Episode([1])
    episode.append_turn([5, 6], [-0.1, -0.2], version=0)  # the initial weights are version 0
    assert episode.mask == [1.0, 1.0] and episode.versions == [0, 0] and episode.logprobs == [-0.1, -0.2], (
        f"mask {episode.mask}, versions {episode.versions}: a turn given log-probabilities is the policy's, whatever "
        "its version; version 0 (the initial weights) is falsy but a version: tell who wrote a turn by its "
        "log-probabilities (`is not None`), not by `if version:`, or the first step's turns are never trained")


@pytest.mark.todo("Episode.append_turn")
def test_log_probabilities_that_do_not_match_the_tokens_are_refused(chapter):
    episode = chapter.Episode([1])
    episode.append_turn([5], [-0.1], version=1)
    try:
        episode.append_turn([6, 7, 8], [-0.1, -0.2], version=1)
    except ValueError:
        pass
    else:
        raise AssertionError("3 tokens came with 2 log-probabilities and were accepted: a policy turn must bring one "
                             "log-probability per token; refuse it with ValueError")
    assert (episode.ids, episode.mask, episode.logprobs, episode.versions) == ([5], [1.0], [-0.1], [1]), (
        "a refused turn appends nothing: check before changing any list, so they stay one entry per token")
    for ids, logprobs, what in (([6], [-0.1, -0.2], "1 token came with 2 log-probabilities"),
                                ([6, 7], [], "2 tokens came with an empty list of log-probabilities")):
        with pytest.raises(ValueError):
            episode.append_turn(ids, logprobs, version=1)
            raise AssertionError(f"{what} and were accepted: one for one means neither fewer nor more, and an empty "
                                 "list is log-probabilities too (a policy turn: test `is not None`, not its truth)")
    assert episode.ids == [5], "a refused turn appends nothing"


# --- TODO 2: Episode.version -----------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   1. the smallest version among the policy tokens (the oldest), not the newest
#                                                         -> test_an_episode_is_as_old_as_its_oldest_policy_token
#   2. the environment's tokens (-1) never count          -> test_an_episode_is_as_old_as_its_oldest_policy_token
#   3. version 0 counts like any other                    -> test_version_0_is_a_version_like_any_other
#   4. the policy tokens are those of mask 1, whatever their position or log-probability, and versions may come
#      in any order (each turn from another generator); each read sees the episode as it is then
#                                                         -> test_the_oldest_policy_token_wherever_it_sits
#   (It is asked only of episodes that hold a policy token: no clause, so no test, for one that holds none.)


@pytest.mark.todo("Episode.version")
def test_an_episode_is_as_old_as_its_oldest_policy_token(chapter):
    episode = chapter.Episode([1])
    episode.append_turn([5, 6], [-1.0, -1.0], version=4)
    episode.append_turn([2, 2, 2])  # tool tokens have no version (-1): they do not count
    episode.append_turn([7], [-1.0], version=6)  # the generator loaded v6 between the two turns
    assert episode.version == 4, (
        f"version {episode.version}: the episode's lag is that of its oldest policy token (v4), not its newest, "
        "and the environment's tokens have no version")
    fresh = chapter.Episode([1])
    fresh.append_turn([2, 2])
    fresh.append_turn([5], [-1.0], version=9)
    assert fresh.version == 9, "a tool reply before the first policy turn changes nothing"


@pytest.mark.todo("Episode.version")
def test_version_0_is_a_version_like_any_other(chapter):
    episode = chapter.Episode([1])
    episode.append_turn([5, 6], [-1.0, -1.0], version=0)  # sampled by the initial weights
    episode.append_turn([2, 2])
    episode.append_turn([7], [-1.0], version=2)
    assert episode.version == 0, (
        f"version {episode.version}: a token sampled by version 0 is a policy token like any other; only the "
        "environment's tokens (mask 0, version -1) are left out: pick the policy's tokens by the mask, not by a "
        "version above 0")


@pytest.mark.todo("Episode.version")
def test_the_oldest_policy_token_wherever_it_sits(chapter):
    episode = chapter.Episode([1])
    episode.append_turn([5, 6], [-1.0, -1.0], version=5)
    assert episode.version == 5, (
        f"version {episode.version!r} after one policy turn sampled by v5: the episode's version is that of its "
        "oldest policy token, here 5")
    episode.append_turn([2, 2])
    episode.append_turn([7], [0.0], version=3)  # a certain token (log-probability 0), from a generator behind
    if episode.version != 3:
        def unread(last_logprob):  # the same turns, in an episode never read before
            fresh = chapter.Episode([1])
            for turn in ([5, 6], [-1.0, -1.0], 5), ([2, 2], None, None), ([7], [last_logprob], 3):
                fresh.append_turn(*turn)
            return fresh.version
        why = ("the version is that of the episode as it is now, worked out from its lists at each read, not kept "
               "from the first read" if unread(0.0) == 3 else
               "a policy token is one of mask 1, even when its log-probability is 0" if unread(-1.0) == 3 else
               "turns may come from generators at different versions: a later turn can be older, so take the "
               "oldest of every policy token")
        pytest.fail(f"version {episode.version} after a turn from v3: {why}")
    episode.append_turn([2])
    episode.append_turn([8], [-0.5], version=4)
    assert episode.version == 3, (
        f"version {episode.version}: the oldest policy token is the second turn's (v3): turns may come from "
        "generators at different versions, so the first turn is not always the oldest; and a policy token is one "
        "of mask 1, even when its log-probability is 0")


# --- TODO 5: Episode.trainable_mask -----------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   1. a policy token is kept when learner_version - its version <= max_token_staleness, exactly at the bound too
#                                                         -> test_each_policy_token_is_bounded_on_its_own
#   2. an older policy token is 0, and only it: the episode's fresh tokens are still trained
#                                                         -> test_each_policy_token_is_bounded_on_its_own
#   3. the environment's tokens stay 0, whatever the bound   -> test_the_environments_tokens_are_never_trained
#   4. a token newer than the learner's version is kept      -> test_the_callers_bound_is_the_bound_per_token
#   5. the caller's learner_version and max_token_staleness are the bound
#                                                         -> test_the_callers_bound_is_the_bound_per_token
#   6. one entry per token, in a new list: the episode's own mask stays as it was
#                                                         -> test_the_episodes_own_mask_stays_as_it_was


def episode_of(chapter, mask, versions):
    """An episode with these lists, built directly (not through append_turn: this TODO's tests stand alone)."""
    episode = chapter.Episode([1])
    episode.ids = list(range(10, 10 + len(mask)))
    episode.mask, episode.versions, episode.logprobs = list(mask), list(versions), [-1.0] * len(mask)
    return episode


# policy v3 v3 | tool | policy v5 | tool | policy v6 v6: turns sampled by three versions of the weights
PARTIAL = ([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0], [3, 3, -1, -1, 5, -1, 6, 6])


@pytest.mark.todo("Episode.trainable_mask")
def test_each_policy_token_is_bounded_on_its_own(chapter):
    episode = episode_of(chapter, *PARTIAL)
    mask = episode.trainable_mask(learner_version=7, max_token_staleness=2)
    expected = [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]  # lags 4 4 - - 2 - 1 1: the v3 turn is over the bound
    if list(mask) == expected:
        return
    if list(mask) == [0.0] * 8:
        why = "the whole episode was dropped by its oldest token: bound each token on its own, keep the fresh ones"
    elif list(mask)[4] == 0.0 and list(mask)[6] == 1.0:
        wider = list(episode_of(chapter, *PARTIAL).trainable_mask(learner_version=7, max_token_staleness=3))
        why = ("a token at exactly the bound (v5: lag 2) is within it, and is kept" if wider[4] == 1.0 else
               "the bound is the caller's max_token_staleness (here 2; with 3 the v5 token, lag 2, is still dropped)")
    elif list(mask)[:2] == [1.0, 1.0]:
        why = "the v3 tokens are 4 versions behind the learner, over the bound of 2: they are 0"
    else:
        why = "each policy token is kept when learner_version - its version <= max_token_staleness"
    pytest.fail(f"mask {list(mask)}, expected {expected}: {why}")


@pytest.mark.todo("Episode.trainable_mask")
def test_the_environments_tokens_are_never_trained(chapter):
    episode = episode_of(chapter, *PARTIAL)
    for bound in (0, 3, 100):
        mask = list(episode.trainable_mask(learner_version=6, max_token_staleness=bound))
        tool_entries = [mask[i] for i in (2, 3, 5)]
        assert len(mask) == 8 and tool_entries == [0.0, 0.0, 0.0], (
            f"bound {bound}: mask {mask}: the tool's tokens (positions 2, 3, 5, mask 0, version -1) are context and "
            "stay 0 whatever the bound; start from the episode's mask, not from 1 for every fresh-enough version")


@pytest.mark.todo("Episode.trainable_mask")
@pytest.mark.parametrize("learner_version, bound, expected", [
    (6, 0, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0]),
    (5, 0, [0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]),  # the v6 tokens are newer than the learner: kept
    (9, 6, [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0]),
    (9, 3, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0])])
def test_the_callers_bound_is_the_bound_per_token(chapter, learner_version, bound, expected):
    mask = list(episode_of(chapter, *PARTIAL).trainable_mask(learner_version, bound))
    lags = [learner_version - v if owner else None for owner, v in zip(*PARTIAL)]
    assert mask == expected, (
        f"learner_version {learner_version}, max_token_staleness {bound}: policy tokens' lags {lags}, mask {mask}, "
        f"expected {expected}: a token is kept when its lag is at most the caller's bound; a lag below 0 (a token "
        "newer than the learner's version) is within it")


@pytest.mark.todo("Episode.trainable_mask")
def test_the_episodes_own_mask_stays_as_it_was(chapter):
    episode = episode_of(chapter, *PARTIAL)
    mask = episode.trainable_mask(learner_version=7, max_token_staleness=2)
    assert episode.mask == PARTIAL[0] and episode.versions == PARTIAL[1], (
        f"the episode's mask is now {episode.mask}: trainable_mask answers a new list and leaves the episode as it "
        "was (a later step, with another learner version, asks again)")
    assert mask is not episode.mask and len(mask) == len(episode.ids), (
        "one entry per token, in a list of its own (not the episode's mask)")


def test_the_trainer_attends_to_every_token_a_tool_reply_included(chapter, plumbing, task):
    """as_rollout (given): the mask says what is trained (the policy's tokens); the attention says what the model
    reads (every token, the tool's replies too: the next turn depends on them). Padding is neither."""
    import random

    prompt = task.sample(random.Random(0))
    long = episode_of(chapter, [1.0, 1.0, 0.0, 0.0, 1.0], [4, 4, -1, -1, 5])
    short = episode_of(chapter, [1.0, 1.0], [5, 5])
    for episode in (long, short):
        episode.prompt_ids = task.prompt_ids(prompt)
    rollout = plumbing.as_rollout([long, short], prompt, "r-1", task)
    assert rollout.mask.tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0, 0.0]], (
        f"mask {rollout.mask.tolist()}: 1 on the policy's tokens only, 0 on the tool's reply and on padding")
    assert rollout.attention is not None and rollout.attention.tolist() == [[1.0] * 5, [1.0, 1.0, 0.0, 0.0, 0.0]], (
        f"attention {None if rollout.attention is None else rollout.attention.tolist()}: the trainer attends to every "
        "real token, the tool's reply too (it is context the policy read), and to no padding")


# --- TODO 3: run_episode ---------------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   1. each turn is generated after the prompt and the episode so far, as token ids (the tool's replies too: the
#      policy reads them)                                 -> test_the_sequence_is_the_tokens_sampled_and_the_tools_replies_never_re_encoded,
#                                                            test_every_turn_sees_the_whole_episode_so_far_and_the_prompt_stays_as_it_was
#   2. the policy's turns as sampled (stop token too), the replies as reply_ids gives them, never re-encoded
#                                                         -> test_the_sequence_is_the_tokens_sampled_and_the_tools_replies_never_re_encoded
#   3. each policy turn keeps its log-probabilities and the version that sampled it, per token
#                                                         -> test_each_turn_keeps_its_log_probabilities_and_version
#   4. the tool is asked, with the prompt's table, for what the policy's turn requests, as task.parse reads it
#                                                         -> test_the_tool_is_asked_for_what_the_policy_requested
#   5. a turn that is no tool call is the answer: "answer", even on the last turn allowed, and however it is
#      written (the reward, not the episode, judges its form)
#                                                         -> test_an_episode_ends_at_its_answer_its_turn_limit_or_its_token_limit, 
#                                                            test_an_answer_on_the_last_turn_allowed_is_the_answer,
#                                                            test_any_turn_that_is_no_tool_call_is_the_answer
#   6. exactly limits.max_turns policy turns (the last one's tool call answered too), then "turns"
#                                                         -> test_an_episode_ends_at_its_answer_its_turn_limit_or_its_token_limit
#  13. the last turn allowed ends it as "turns", even when the budget is spent too ("tokens" is said only before
#      a turn)                                            -> test_the_last_turn_allowed_ends_it_as_turns_even_with_the_budget_spent
#  14. the room left is max_tokens minus the tokens held, not minus what earlier turns were allowed
#                                                         -> test_the_budget_counts_the_tokens_written_not_the_tokens_allowed
#  15. a turn that fills the budget is read like any other: an answer is the answer, a tool call is answered
#                                                         -> test_a_turn_that_fills_the_budget_is_still_read
#   7. "tokens" before a turn once it holds max_tokens tokens after its prompt (the prompt does not count),
#      exactly max_tokens included
#                                                         -> test_an_episode_ends_at_its_answer_its_turn_limit_or_its_token_limit, 
#                                                            test_exactly_max_tokens_ends_it_before_another_turn,
#                                                            test_one_token_of_room_is_still_room_for_a_turn
#   8. a turn asks for at most min(max_new, room left)     -> test_an_episode_ends_at_its_answer_its_turn_limit_or_its_token_limit
#   9. tool calls go through the Service (which retries on another worker)
#                                                         -> test_a_tool_worker_that_dies_costs_the_episode_nothing
#  10. a failed tool call fails the episode: no empty reply in its place -> test_a_failed_tool_call_fails_the_episode
#  11. no timeout of its own: the tools' Service bounds a call -> test_a_slow_tool_call_is_waited_for
#  12. the episode's prompt ids are left as they were (each turn's input is a new list)
#                                                         -> test_every_turn_sees_the_whole_episode_so_far_and_the_prompt_stays_as_it_was
#  16. a tool's reply is appended whole, even past max_tokens (the limits bound the policy's turns)
#                                                         -> test_a_reply_longer_than_the_room_left_is_appended_whole
#  17. a cancelled episode stays cancelled: asyncio.CancelledError reaches the caller, and nothing more is asked
#                                                         -> test_a_cancelled_episode_stays_cancelled


@pytest.mark.todo("run_episode")
def test_the_sequence_is_the_tokens_sampled_and_the_tools_replies_never_re_encoded(chapter, task, tools_module):
    prompt = prompt_for(tools_module)
    value = prompt.answer
    policy, tools = ScriptedPolicy(chapter, task, ["?c\n", f"!{value}<eos>"]), Tools(tools_module)
    episode = run(chapter, policy, tools, task, prompt)
    call, reply = encode(task, "?c\n"), task.reply_ids(task.reply_text(value))
    answer = encode(task, f"!{value}") + [task.tokenizer.eos_token_id]
    assert tools.calls == ["c"], f"one tool call, for the letter the policy asked: {tools.calls}"
    re_encoded = (" (the same text in other tokens: the sequence was encoded again from text; append turn.ids and "
                  "reply_ids as they are)" if episode.ids != call + reply + answer
                  and task.decode(episode.ids) == task.decode(call + reply + answer) else "")
    assert episode.ids == call + reply + answer, (
        f"{episode.ids}: the policy's turns as sampled (their stop token too) and the tool's reply as "
        f"reply_ids gives it, one after the other{re_encoded}")
    assert policy.shown[1] != task.prompt_ids(prompt) + call, (
        "the second turn was generated without the tool's reply: the policy reads it (mask 0 keeps the reply out of "
        "the loss, not out of the context): show the policy the prompt and every token of the episode so far")
    shown, expected = policy.shown[1], task.prompt_ids(prompt) + call + reply
    assert shown == expected, (
        f"the second turn was generated after {shown}, expected {expected} (the prompt's ids, then every token so "
        "far): " + ("the prompt is missing: a turn is generated after the prompt and the episode so far"
                    if shown == call + reply else
                    "the prompt comes first, once" if shown[-len(call + reply):] == call + reply else
                    "these are not the very tokens so far: never the transcript's text encoded again (this tokenizer "
                    "merges a turn's end with the reply's start: '\\n=' is one token)"))
    assert episode.mask == [1.0] * len(call) + [0.0] * len(reply) + [1.0] * len(answer), (
        f"mask {episode.mask!r}, expected 1.0 for the call's {len(call)} tokens, 0.0 for the reply's {len(reply)}, 1.0 "
        f"for the answer's {len(answer)}: each policy turn is appended as the policy's (with its log-probabilities), "
        "the tool's reply as the environment's (without)")
    assert episode.ended == "answer" and task.reward(prompt, episode.ids, episode.mask) == 1.0, (
        f"ended {episode.ended!r}, expected 'answer' with reward 1.0: the last turn, '!{value}', is no tool call, so "
        "it is the answer, and the episode ends with it ('answer')")


@pytest.mark.todo("run_episode")
def test_every_turn_sees_the_whole_episode_so_far_and_the_prompt_stays_as_it_was(chapter, task, tools_module):
    prompt = prompt_for(tools_module)
    turns = ["?a\n", "?b\n", "?d\n", f"!{prompt.answer}<eos>"]
    policy, tools = ScriptedPolicy(chapter, task, turns), Tools(tools_module)
    episode = run(chapter, policy, tools, task, prompt, tools_module.Limits(max_turns=5, max_tokens=60, max_new=6))
    assert tools.calls == ["a", "b", "d"], (
        f"the tool was asked for {tools.calls}; the turns asked for a, b and d (the prompt is about c): ask it for "
        "what task.parse reads off each turn")
    prompt_ids = task.prompt_ids(prompt)
    so_far, expected = [], []
    for letter in "abd":
        expected.append(prompt_ids + so_far)
        so_far = so_far + encode(task, f"?{letter}\n") + task.reply_ids(task.reply_text(str(tools_module.table_of(prompt.table)[letter])))
    expected.append(prompt_ids + so_far)
    assert episode.prompt_ids == prompt_ids, (
        "the episode's prompt ids changed while it ran: build each turn's input as a new list (prompt_ids + ids); "
        "`+=` on episode.prompt_ids grows the prompt itself")
    for number, (shown, wanted) in enumerate(zip(policy.shown, expected), 1):
        assert shown == wanted, (
            f"turn {number} was generated after {len(shown)} tokens, not the prompt and the episode so far "
            f"({len(wanted)}): every turn sees exactly the prompt and every token since, once")
    assert len(policy.shown) == 4 and episode.ended == "answer", (
        f"{len(policy.shown)} turns, ended {episode.ended!r}; expected 4 turns, ended 'answer': three tool calls, each "
        "answered, then a turn that is no tool call, which is the answer and ends the episode")
    assert [list(given) for given in policy.given] == policy.shown, (
        "a list a turn was given changed after that turn: every turn's input is a new list (the prompt and the "
        "episode so far), never one running list grown in place under an earlier turn (a policy may keep it)")


@pytest.mark.todo("run_episode")
def test_an_episode_ends_at_its_answer_its_turn_limit_or_its_token_limit(chapter, task, tools_module):
    limits = tools_module.Limits(max_turns=3, max_tokens=40, max_new=6)
    prompt = prompt_for(tools_module)
    answered = run(chapter, ScriptedPolicy(chapter, task, ["!3<eos>"]), Tools(tools_module), task, prompt, limits)
    assert answered.ended == "answer" and len(answered.ids) == 3, "a turn that is no tool call is the answer"
    tools = Tools(tools_module)
    forever = run(chapter, ScriptedPolicy(chapter, task, [], every_turn="?a\n"), tools, task, prompt, limits)
    assert forever.ended == "turns" and len(tools.calls) == 3, (
        f"ended {forever.ended!r} after {len(tools.calls)} tool calls: max_turns=3 means 3 policy turns, each read "
        "and its tool call answered (the last one too), then 'turns'")
    policy = ScriptedPolicy(chapter, task, [], every_turn="?bbbbb")  # turns of 6 tokens that never stop
    long = run(chapter, policy, Tools(tools_module), task, prompt, tools_module.Limits(max_turns=9, max_tokens=13,
                                                                                       max_new=6))
    # 6 tokens, a reply of 3 (9); then only 4 fit under 13 (13), a reply (16): no room, so no more turns
    assert len(forever.ids) == 3 * (3 + 3) and forever.mask[-1] == 0.0, (
        "the last turn's tool call is answered too: its reply ends the episode")
    assert long.ended == "tokens", f"it holds {len(long.ids)} tokens: the token limit ends it, before a turn"
    assert len(long.ids) >= 13, (
        f"it ended 'tokens' holding {len(long.ids)} tokens after a prompt of {len(long.prompt_ids)}, under "
        "max_tokens=13: the limit counts the tokens after the prompt (episode.ids), not the prompt's")
    assert policy.max_new == [6, 4], (
        f"asked for {policy.max_new} new tokens: never more than max_new, nor than the room left under max_tokens")


@pytest.mark.todo("run_episode")
def test_each_turn_keeps_its_log_probabilities_and_version(chapter, task, tools_module):
    prompt = prompt_for(tools_module)
    policy = ScriptedPolicy(chapter, task, ["?c\n", f"!{prompt.answer}<eos>"], version=0)  # v0, then v1
    episode = run(chapter, policy, Tools(tools_module), task, prompt)
    call, reply = len(encode(task, "?c\n")), len(task.reply_ids(task.reply_text(prompt.answer)))
    answer = len(episode.ids) - call - reply
    assert episode.versions == [0] * call + [-1] * reply + [1] * answer, (
        f"versions {episode.versions}: each policy turn keeps the version of the Turn that sampled it (here v0, "
        "then v1): pass turn.logprobs and turn.version on to append_turn")
    assert episode.logprobs == [-0.5] * call + [0.0] * reply + [-0.5] * answer, (
        "each policy token keeps its log-probability from the Turn; the tool's are 0.0")
    assert episode.version == 0, (
        f"version {episode.version!r}, expected 0: an episode's version is that of its oldest policy token, here the "
        "first turn's v0 (version 0 counts like any other; the tool's -1 does not)")


@pytest.mark.todo("run_episode")
def test_the_tool_is_asked_for_what_the_policy_requested(chapter, task, tools_module):
    prompt = prompt_for(tools_module, "c")
    tools = Tools(tools_module)
    # the second call is "?ea": the tool reads one letter, so it asks for "e" (what task.parse answers)
    episode = run(chapter, ScriptedPolicy(chapter, task, ["?a\n", "?ea", "!0<eos>"]), tools, task, prompt)
    assert tools.calls == ["a", "e"] and tools.tables == [prompt.table] * 2, (
        f"the tool was asked {tools.calls} about tables {tools.tables}: the policy asked for 'a', then 'e' (its turn "
        "'?ea'; the prompt is about 'c'): send the request task.parse reads off the policy's turn, with the "
        "prompt's table")
    value = tools_module.table_of(prompt.table)["a"]
    assert episode.ids[len(encode(task, "?a\n")):][:3] == task.reply_ids(task.reply_text(str(value))), (
        f"ids {episode.ids!r}: right after the turn '?a\\n' comes the tool's reply for 'a' ('={value}\\n'), appended "
        "as reply_ids gives it, never re-encoded")


@pytest.mark.todo("run_episode")
def test_an_answer_on_the_last_turn_allowed_is_the_answer(chapter, task, tools_module):
    prompt = prompt_for(tools_module)
    policy, tools = ScriptedPolicy(chapter, task, ["?c\n", f"!{prompt.answer}<eos>"]), Tools(tools_module)
    episode = run(chapter, policy, tools, task, prompt, tools_module.Limits(max_turns=2, max_tokens=40, max_new=3))
    assert len(policy.shown) == 2 and episode.ended == "answer", (
        f"{len(policy.shown)} turns, ended {episode.ended!r}: the second of max_turns=2 turns is read like any "
        "other; it is an answer, so the episode ended with its answer, not at the turn limit")
    assert task.reward(prompt, episode.ids, episode.mask) == 1.0, (
        f"ids {episode.ids!r}, mask {episode.mask!r}: the reward is not 1.0. The episode should hold the call "
        "'?c\\n' (mask 1), the tool's reply (mask 0), then the answer (mask 1): turns as sampled, replies as "
        "reply_ids gives them")


@pytest.mark.todo("run_episode")
@pytest.mark.parametrize("turn", ["7<eos>", "I do not know\n", "=5\n"], ids=["bare-digit", "words", "reply-like"])
def test_any_turn_that_is_no_tool_call_is_the_answer(chapter, task, tools_module, turn):
    policy, tools = ScriptedPolicy(chapter, task, [turn, "?c\n", "!1<eos>"]), Tools(tools_module)
    episode = run(chapter, policy, tools, task, prompt_for(tools_module), tools_module.Limits(max_turns=3))
    assert (len(policy.shown), episode.ended, tools.calls) == (1, "answer", []), (
        f"the first turn, {turn!r}, is no tool call (task.parse says 'answer'), yet the episode went on for "
        f"{len(policy.shown)} turns and ended {episode.ended!r}: a turn that is not a tool call is the answer, "
        "whatever its form; the reward judges it")


@pytest.mark.todo("run_episode")
def test_exactly_max_tokens_ends_it_before_another_turn(chapter, task, tools_module):
    policy = ScriptedPolicy(chapter, task, [], every_turn="?bbbbb")  # turns of 6 tokens, each a tool call
    limits = tools_module.Limits(max_turns=9, max_tokens=9, max_new=6)
    episode = run(chapter, policy, Tools(tools_module), task, prompt_for(tools_module), limits)
    # 6 tokens, a reply of 3: exactly 9 = max_tokens, so no room: no second turn
    assert policy.max_new == [6] and episode.ended == "tokens" and len(episode.ids) == 9, (
        f"asked for {policy.max_new} new tokens, ended {episode.ended!r} at {len(episode.ids)} tokens: an episode "
        "that holds exactly max_tokens tokens has no room left (room 0): it ends ('tokens') before another turn")


@pytest.mark.todo("run_episode")
def test_one_token_of_room_is_still_room_for_a_turn(chapter, task, tools_module):
    policy = ScriptedPolicy(chapter, task, [], every_turn="?bbbbb")  # turns of 6 tokens, each a tool call
    limits = tools_module.Limits(max_turns=9, max_tokens=10, max_new=6)
    episode = run(chapter, policy, Tools(tools_module), task, prompt_for(tools_module), limits)
    # 6 tokens, a reply of 3: 9 of 10, so room 1: a second turn of at most 1 token
    assert policy.max_new[:2] == [6, 1] and episode.ended == "tokens", (
        f"asked for {policy.max_new} new tokens, ended {episode.ended!r} at {len(episode.ids)} tokens: with 9 of "
        "max_tokens=10 held, one token of room is left, so the episode takes another turn, of at most 1 token; "
        "it ends ('tokens') only once it holds max_tokens or more")


@pytest.mark.todo("run_episode")
def test_the_last_turn_allowed_ends_it_as_turns_even_with_the_budget_spent(chapter, task, tools_module):
    policy = ScriptedPolicy(chapter, task, [], every_turn="?bbbbb")  # 6 tokens and a reply of 3: 9 a turn
    limits = tools_module.Limits(max_turns=1, max_tokens=9, max_new=6)
    episode = run(chapter, policy, Tools(tools_module), task, prompt_for(tools_module), limits)
    assert (len(episode.ids), episode.ended) == (9, "turns"), (
        f"ended {episode.ended!r} at {len(episode.ids)} tokens: the one turn allowed was taken, so the reason is "
        "'turns'; 'tokens' is said before a turn, and no turn was left to take")


@pytest.mark.todo("run_episode")
def test_a_turn_that_fills_the_budget_is_still_read(chapter, task, tools_module):
    prompt = prompt_for(tools_module)
    answer = f"!{prompt.answer}<eos>"
    limits = tools_module.Limits(max_turns=3, max_tokens=len(encode(task, answer)), max_new=6)
    answered = run(chapter, ScriptedPolicy(chapter, task, [answer]), Tools(tools_module), task, prompt, limits)
    assert answered.ended == "answer", (
        f"ended {answered.ended!r}: the one turn filled the budget exactly, and it is an answer, so the episode "
        "ended with its answer; 'tokens' is said only before a turn, when no room is left for it")
    tools = Tools(tools_module)
    limits = tools_module.Limits(max_turns=3, max_tokens=len(encode(task, "?c\n")), max_new=6)
    called = run(chapter, ScriptedPolicy(chapter, task, ["?c\n"]), tools, task, prompt, limits)
    assert tools.calls == ["c"] and called.ended == "tokens", (
        f"tool calls {tools.calls}, ended {called.ended!r}: a tool call that fills the budget is still answered (its "
        "reply appended); then no room is left, so the episode ends ('tokens') before the next turn")


@pytest.mark.todo("run_episode")
def test_the_budget_counts_the_tokens_written_not_the_tokens_allowed(chapter, task, tools_module):
    policy = ScriptedPolicy(chapter, task, [], every_turn="?b")  # short turns: far fewer tokens than max_new
    limits = tools_module.Limits(max_turns=3, max_tokens=30, max_new=12)
    episode = run(chapter, policy, Tools(tools_module), task, prompt_for(tools_module), limits)
    per_turn = len(episode.ids) // 3
    assert policy.max_new == [12, 12, 12] and episode.ended == "turns", (
        f"asked for {policy.max_new} new tokens, ended {episode.ended!r}: each turn wrote {per_turn - 3} tokens and "
        "got a reply of 3, so the room left is max_tokens minus the tokens the episode holds, not minus what "
        "each turn was allowed")


class LongReplyTools(Tools):
    """Tools whose reply is longer than any room an episode has left."""

    async def route(self, endpoint, table, request):
        self.calls.append(request)
        await asyncio.sleep(0)
        return self.tools_module.VaultTask.reply_text("12345678901234567890")


@pytest.mark.todo("run_episode")
def test_a_reply_longer_than_the_room_left_is_appended_whole(chapter, task, tools_module):
    policy, tools = ScriptedPolicy(chapter, task, ["?c\n", "!7<eos>"]), LongReplyTools(tools_module)
    limits = tools_module.Limits(max_turns=3, max_tokens=8, max_new=6)
    episode = run(chapter, policy, tools, task, prompt_for(tools_module), limits)
    reply = task.reply_ids(tools_module.VaultTask.reply_text("12345678901234567890"))
    turn = encode(task, "?c\n")
    assert episode.ids[len(turn):] == reply, (
        f"the tool's reply of {len(reply)} tokens, with room for {limits.max_tokens - len(turn)}, became "
        f"{len(episode.ids) - len(turn)} tokens in the episode: a reply is context the environment wrote, appended "
        "whole, as reply_ids gives it (the limits bound the policy's turns, and max_tokens is checked before each)")
    assert episode.ended == "tokens" and len(policy.shown) == 1, (
        f"ended {episode.ended!r} after {len(policy.shown)} turns: past max_tokens, no room is left for another "
        "turn, so the episode ends ('tokens')")


class HangingTools(Tools):
    """Tools whose call never answers: the episode waits in it until it is cancelled."""

    async def route(self, endpoint, table, request):
        self.calls.append(request)
        await asyncio.Event().wait()


@pytest.mark.todo("run_episode")
def test_a_cancelled_episode_stays_cancelled(chapter, task, tools_module):
    policy, tools = ScriptedPolicy(chapter, task, [], every_turn="?c\n"), HangingTools(tools_module)

    async def cancel_during_the_tool_call():
        episode = asyncio.ensure_future(chapter.run_episode(policy, tools, task, prompt_for(tools_module)))
        for _ in range(1000):  # steps of the event loop, not seconds: until the tool call is in flight
            if tools.calls or episode.done():
                break
            await asyncio.sleep(0)
        if episode.done():
            episode.result()  # it ended (or raised) before it could be cancelled: show that
        assert tools.calls, "the episode never called the tool, though its first turn is a tool call"
        episode.cancel()
        try:
            outcome = await asyncio.wait_for(episode, 10)
        except asyncio.CancelledError:
            return "cancelled"
        return outcome

    outcome = asyncio.run(cancel_during_the_tool_call())
    ended = getattr(outcome, "ended", outcome)
    assert outcome == "cancelled", (
        f"run_episode was cancelled while it waited for the tool, and returned an episode (ended {ended!r}) "
        "instead: a cancelled episode stays cancelled (let asyncio.CancelledError out). A caller's timeout "
        "(asyncio.wait_for, asyncio.timeout) works by cancelling, so a returned episode would reach it as if it "
        "were finished, half-made")
    assert len(policy.shown) == 1 and tools.calls == ["c"], "after the cancel, nothing more was asked"


class BrokenTools(Tools):
    """Tools whose every call fails, as the Service's call fails once no worker is left."""

    async def route(self, endpoint, table, request):
        self.calls.append(request)
        await asyncio.sleep(0)
        raise RuntimeError("no healthy tool worker left")


@pytest.mark.todo("run_episode")
def test_a_failed_tool_call_fails_the_episode(chapter, task, tools_module):
    prompt = prompt_for(tools_module)
    policy, tools = ScriptedPolicy(chapter, task, ["?c\n", "!7<eos>"]), BrokenTools(tools_module)
    try:
        episode = run(chapter, policy, tools, task, prompt)
    except RuntimeError as failure:
        assert "no healthy tool worker" in str(failure), f"the tools' own error should come through, not {failure!r}"
    else:
        raise AssertionError(
            f"the tool call failed, yet the episode went on ({episode.ids}, ended {episode.ended!r}): a reply "
            "that never came must not be trained on as an empty one; let the error out of run_episode")
    assert tools.calls == ["c"], (
        f"the tool was asked for {tools.calls!r}, expected ['c']: the turn '?c\\n' asks for 'c' once, and when that "
        "call fails the episode fails with it: nothing more is asked")


class SlowTools(Tools):
    """Tools whose call takes `seconds` on the event loop's clock: the clock is moved on, nobody waits."""

    def __init__(self, tools_module, seconds):
        super().__init__(tools_module)
        self.seconds = seconds

    async def route(self, endpoint, table, request):
        loop = asyncio.get_running_loop()
        clock = loop.time
        loop.time = lambda: clock() + self.seconds  # from now on, the loop's clock is `seconds` later
        for _ in range(3):
            await asyncio.sleep(0)  # timers due by then fire here
        return await super().route(endpoint, table, request)


@pytest.mark.todo("run_episode")
def test_a_slow_tool_call_is_waited_for(chapter, task, tools_module):
    prompt = prompt_for(tools_module)
    policy, tools = ScriptedPolicy(chapter, task, ["?c\n", f"!{prompt.answer}<eos>"]), SlowTools(tools_module, 3600.0)
    try:
        episode = run(chapter, policy, tools, task, prompt, limit_s=3660.0)  # the hour, and 60 s more
    except (asyncio.TimeoutError, TimeoutError) as failure:
        raise AssertionError(
            "a tool call that took an hour (on the loop's clock) timed out inside run_episode: the tools' Service "
            "bounds a call with its own call_timeout (the caller's choice); add no timeout of your own around it"
        ) from failure
    assert episode.ended == "answer" and task.reward(prompt, episode.ids, episode.mask) == 1.0, (
        f"ended {episode.ended!r}, ids {episode.ids!r}: either it did not end 'answer' or its reward is not 1.0. "
        "The slow call's reply is waited for and appended like any other; the next turn, the answer, ends it")


@pytest.mark.todo("run_episode")
def test_a_tool_worker_that_dies_costs_the_episode_nothing(chapter, task, tools_module, aio):
    """Tool calls go through the Service (chapter 06), which retries a call on another worker when one dies."""
    tools = chapter.LeastLoadedService(tools_module.ToolWorker, tools_module.ToolLatency(base=0.01, tail_every=10**9),
                                       replicas=2, name="ch12_dying_tools_", call_timeout=TIMEOUT, auto_recover=False)

    async def scenario():
        await asyncio.wait_for(tools.fanout("whoami"), STARTUP_TIMEOUT)  # both workers are up
        service_plumbing = importlib.import_module(f"{chapter.__package__}.ch06_plumbing")
        killed = await service_plumbing.kill_replica(tools, 0)
        prompt = prompt_for(tools_module, "e")
        episode = await asyncio.wait_for(
            chapter.run_episode(ScriptedPolicy(chapter, task, ["?e\n", f"!{prompt.answer}<eos>"]), tools, task,
                                prompt), STARTUP_TIMEOUT)
        return killed, prompt, episode

    try:
        killed, prompt, episode = aio.run(scenario())
    finally:
        aio.run(tools.close())
    assert killed > 0, (
        f"kill_replica answered {killed!r}, not a process id: the test's setup (given code) did not kill tool "
        "worker 0, so this scenario did not run as meant")
    assert task.reward(prompt, episode.ids, episode.mask) == 1.0, (
        "the tool call reached a live worker: call the tools through their Service (tools.route), which retries")


# --- TODO 4: LeastLoadedService.next_replica ----------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   1. the replica with the fewest requests in flight     -> test_the_replica_with_the_fewest_requests_in_flight_is_picked
#   2. never an unhealthy one, nor one in `exclude`       -> test_the_replica_with_the_fewest_requests_in_flight_is_picked
#   3. none left: None, and the cursor stays              -> test_the_replica_with_the_fewest_requests_in_flight_is_picked, 
#                                                            test_the_cursor_moves_just_past_the_pick
#   4. ties: the first at or after self.cursor, round robin -> test_ties_go_round_robin
#   5. ... wrapping around past the last replica, up to the one just before the cursor
#                                                         -> test_ties_wrap_around_past_the_last_replica
#   6. the cursor moves just past the replica picked (not one step on from where it was)
#                                                         -> test_the_cursor_moves_just_past_the_pick
#   7. (given code) a request counts while in flight      -> test_requests_in_flight_are_counted_while_they_run
#   8. with a replica down, the others take turns: every replica is walked, the cursor by replica index
#                                                         -> test_with_a_replica_down_the_others_take_turns


@pytest.fixture
def pool(chapter):
    """A LeastLoadedService's routing state alone (no processes): four healthy replicas, none busy."""
    replica = importlib.import_module(f"{chapter.__package__}.ch06_plumbing").Replica
    service = chapter.LeastLoadedService.__new__(chapter.LeastLoadedService)
    service.replicas = [replica(index, None, None) for index in range(4)]
    service.cursor = 0
    return service


@pytest.mark.todo("LeastLoadedService.next_replica")
def test_the_replica_with_the_fewest_requests_in_flight_is_picked(pool):
    for replica, load in zip(pool.replicas, (2, 0, 3, 1)):
        replica.in_flight = load
    assert pool.next_replica().index == 1, "replica 1 has nothing in flight"
    assert pool.next_replica(exclude={1}).index == 3, "then the one with a single request"
    pool.replicas[3].healthy = False
    assert pool.next_replica(exclude={1}).index == 0, "an unhealthy replica is never picked, however idle"
    assert pool.next_replica(exclude={0, 1, 2}) is None, "nobody left"


@pytest.mark.todo("LeastLoadedService.next_replica")
def test_ties_go_round_robin(pool):
    for replica, served in zip(pool.replicas, (5, 0, 9, 2)):
        replica.served = served  # what each has served in the past plays no part: only requests in flight count
    picks = []
    for _ in range(6):
        picks.append(pool.next_replica().index)  # nothing in flight anywhere: all tie
    assert picks == [0, 1, 2, 3, 0, 1], (
        f"all tie (nothing in flight), and the picks were {picks}: a tie goes to the first replica at or after the "
        "cursor, wrapping past the last to 0, and the cursor moves just past the pick; past `served` counts play "
        "no part")
    pool.replicas[2].in_flight = 1
    assert [pool.next_replica().index for _ in range(3)] == [3, 0, 1], (
        "the busy one is passed over; the rest take turns: after each pick, the cursor moves just past the replica "
        "picked (not one step on from where it was)")


@pytest.mark.todo("LeastLoadedService.next_replica")
def test_ties_wrap_around_past_the_last_replica(pool):
    pool.cursor = 2
    for replica, load in zip(pool.replicas, (0, 0, 1, 0)):
        replica.in_flight = load
    picked = pool.next_replica().index
    assert picked == 3, (
        f"replica {picked}: from cursor 2 the order is 2, 3, 0, 1; replica 2 is busy, so 3 (the first idle one at "
        "or after the cursor) wins the tie, not the lowest index")
    pool.cursor = 3
    pool.replicas[3].in_flight = 1
    picked = pool.next_replica().index
    assert picked == 0, (
        f"replica {picked}: from cursor 3, past the last replica the order wraps around to 0: 3 (busy), 0, 1, 2")
    pool.cursor = 2
    for replica, load in zip(pool.replicas, (1, 0, 1, 1)):
        replica.in_flight = load
    picked = pool.next_replica().index
    assert picked == 1, (
        f"replica {picked}: from cursor 2 the order is 2, 3, 0, 1; the wrap-around reaches every replica, the one "
        "just before the cursor too, and replica 1 is the least loaded")


@pytest.mark.todo("LeastLoadedService.next_replica")
def test_the_cursor_moves_just_past_the_pick(pool):
    for replica, load in zip(pool.replicas, (2, 0, 3, 1)):
        replica.in_flight = load
    assert pool.next_replica().index == 1 and pool.cursor == 2, (
        f"picked replica 1 from cursor 0, and the cursor is now {pool.cursor}: it moves just past the replica "
        "picked (2), so that the next tie starts after it, not one step on from where it was")
    assert pool.next_replica(exclude={0, 1, 2, 3}) is None and pool.cursor == 2, (
        f"with no replica to pick, the cursor stays where it was (it is now {pool.cursor})")
    pool.replicas[1].in_flight = 5
    assert pool.next_replica().index == 3 and pool.cursor % len(pool.replicas) == 0, (
        f"picked replica 3, the last: the cursor moves just past it, which wraps around to 0 (it is {pool.cursor})")


@pytest.mark.todo("LeastLoadedService.next_replica")
def test_with_a_replica_down_the_others_take_turns(pool):
    pool.replicas[0].healthy = False
    picks = [pool.next_replica().index for _ in range(6)]
    assert picks == [1, 2, 3, 1, 2, 3], (
        f"replica 0 down, nothing in flight: picks {picks}, not 1, 2, 3, 1, 2, 3. The walk goes over every replica "
        "from the cursor (a healthy one past the number of healthy replicas too), and the cursor moves just past "
        "the replica picked, by its index, not by its place among the candidates")


RELEASE = threading.Event()


class HeldTool(Actor):
    """A tool worker in this process (so it sees the test's Event): a call for "hold" runs until
    the test lets it go; any other call answers at once."""

    @endpoint
    async def call(self, table: int, request: str) -> str:
        deadline = time.monotonic() + TIMEOUT
        while request == "hold" and not RELEASE.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return request


@pytest.mark.todo("LeastLoadedService.next_replica")
def test_requests_in_flight_are_counted_while_they_run(chapter, aio, test_tag):
    """The given counting: a request held by one worker keeps it busy, so the next ones go elsewhere."""

    class ToolsHere(chapter.LeastLoadedService):  # replicas in this process: none to start or stop
        def _new_procs(self, index):
            return this_proc()

        async def _stop(self, procs):
            pass

    RELEASE.clear()
    tools = ToolsHere(HeldTool, replicas=2, name=f"{test_tag}_", call_timeout=TIMEOUT, auto_recover=False)

    async def scenario():
        held = asyncio.create_task(tools.route("call", 1, "hold"))  # replica 0 (the cursor's)
        while tools.replicas[0].in_flight == 0 and not held.done():
            await asyncio.sleep(0.01)
        served = [await tools.route("call", 1, "quick") for _ in range(3)]
        busy = [r.in_flight for r in tools.replicas]
        RELEASE.set()
        await asyncio.wait_for(held, TIMEOUT)
        return served, busy, [r.in_flight for r in tools.replicas], tools.snapshot()["per_replica"]

    try:
        served, busy, after, per_replica = aio.run(asyncio.wait_for(scenario(), 2 * TIMEOUT))
    finally:
        RELEASE.set()
        aio.run(tools.close())
    assert served == ["quick"] * 3, (
        f"the three quick calls answered {served!r}, expected 'quick' each: each is routed to a worker, which "
        "echoes its request")
    assert busy == [1, 0] and after == [0, 0], "a request counts while in flight, and no longer once answered"
    assert per_replica == {0: 1, 1: 3}, f"while one worker held a request, the others went to the idle one: {per_replica}"


# --- The whole trainer on episodes, on real actors -------------------------------------------------------


@pytest.mark.todo("Episode.append_turn", "Episode.version", "run_episode", "LeastLoadedService.next_replica")
@pytest.mark.time_limit(300)
def test_a_short_run_trains_on_episodes_within_the_lag_bound(chapter, plumbing, tools_module, aio):
    config = plumbing.ToolsConfig(steps=4, groups_per_step=2, group_size=4, generators=1, tools=2, loops=2,
                                  latency=tools_module.ToolLatency(base=0.01, tail_every=10**9))
    job = plumbing.Job.start(config, "t12", trainer_procs=this_proc(), generator=plumbing.TurnGenerator)
    job.start_loading()
    tools, task = plumbing.start_tools(config, name="t12_tools"), tools_module.VaultTask()

    async def scenario():
        await job.warm_up()
        run = await plumbing.run_async(job, tools, task, timeout=4 * STARTUP_TIMEOUT)
        return run, await job.final_sync()

    try:
        run, final = aio.run(scenario())
    finally:
        async def close_both():
            await asyncio.gather(tools.close(), job.stop())

        aio.run(close_both())
    assert [r["version"] for r in run["results"]] == [1, 2, 3, 4], (
        f"the training steps published versions {[r['version'] for r in run['results']]!r}, expected [1, 2, 3, 4]: "
        "steps=4, each step one version newer")
    lags = [lag for r in run["results"] for lag in r["lags"]]
    assert lags and max(lags) <= config.max_lag, f"the oldest token of every group trained on is within the bound: {lags}"
    made = run["episodes"]
    assert sum(made.ended.values()) >= 4 * 2 * 4 and set(made.ended) <= {"answer", "turns", "tokens"}, (
        f"episodes ended by {dict(made.ended)!r}: expected at least 32 episodes (4 steps x 2 groups x 4), each ended "
        "'answer', 'turns' or 'tokens': run_episode sets episode.ended to the reason it stopped")
    assert list(final["generators"].values()) == [final["trainer"]], "the generator holds the trainer's last weights"
