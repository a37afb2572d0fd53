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

from koans.testing import STARTUP_TIMEOUT, TIMEOUT


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
        self.shown: list[list[int]] = []
        self.max_new: list[int] = []

    async def route(self, endpoint, ids, max_new):
        assert endpoint == "generate_turn", f"the policy is asked for {endpoint!r}"
        self.shown.append(list(ids))
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
        self.tools_module, self.calls = tools_module, []

    async def route(self, endpoint, table, request):
        assert endpoint == "call", f"the tools are asked for {endpoint!r}"
        self.calls.append(request)
        await asyncio.sleep(0)
        value = self.tools_module.table_of(table).get(request)
        return self.tools_module.VaultTask.reply_text("?" if value is None else str(value))


def prompt_for(tools_module, name="c"):
    return tools_module.VaultPrompt(f"find {name}", name, 12345)


def run(chapter, policy, tools, task, prompt, limits=None, limit_s=10.0):
    arguments = (policy, tools, task, prompt) + ((limits,) if limits is not None else ())
    return asyncio.run(asyncio.wait_for(chapter.run_episode(*arguments), limit_s))


# --- TODO 1: Episode.append_turn -----------------------------------------------------------------------


@pytest.mark.todo("Episode.append_turn")
def test_a_policy_turn_is_trained_and_a_tool_reply_is_context(chapter):
    episode = chapter.Episode([7, 8])
    episode.append_turn([10, 11, 12], [-0.1, -0.2, -0.3], version=4)
    episode.append_turn([20, 21])  # a tool's reply
    episode.append_turn([30], [-0.4], version=5)
    assert episode.ids == [10, 11, 12, 20, 21, 30] and episode.prompt_ids == [7, 8]
    assert episode.mask == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0], "the environment's tokens are context: mask 0, out of the loss"
    assert episode.logprobs == [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4]
    assert episode.versions == [4, 4, 4, -1, -1, 5], "each policy token keeps the version that sampled it; -1 elsewhere"


@pytest.mark.todo("Episode.append_turn")
def test_every_list_keeps_one_entry_per_token(chapter):
    episode = chapter.Episode([1])
    for turn in ([5], [6, 7, 8], [9, 10]):
        episode.append_turn(turn, [-1.0] * len(turn), version=2)
        episode.append_turn([3, 3])
        assert len(episode.ids) == len(episode.mask) == len(episode.logprobs) == len(episode.versions)


# --- TODO 2: Episode.version -----------------------------------------------------------------------------


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


# --- TODO 3: run_episode ---------------------------------------------------------------------------------


@pytest.mark.todo("run_episode")
def test_the_sequence_is_the_tokens_sampled_and_the_tools_replies_never_re_encoded(chapter, task, tools_module):
    prompt = prompt_for(tools_module)
    value = prompt.answer
    policy, tools = ScriptedPolicy(chapter, task, ["?c\n", f"!{value}<eos>"]), Tools(tools_module)
    episode = run(chapter, policy, tools, task, prompt)
    call, reply = encode(task, "?c\n"), task.reply_ids(task.reply_text(value))
    answer = encode(task, f"!{value}") + [task.tokenizer.eos_token_id]
    assert tools.calls == ["c"], f"one tool call, for the letter the policy asked: {tools.calls}"
    assert episode.ids == call + reply + answer, (
        f"{episode.ids}: the policy's turns as sampled (their stop token too) and the tool's reply as "
        "reply_ids gives it, one after the other")
    assert policy.shown[1] == task.prompt_ids(prompt) + call + reply, (
        "the second turn is generated after the very tokens so far: not after the transcript's text encoded "
        "again (this tokenizer merges a turn's end with the reply's start: '\\n=' is one token)")
    assert episode.mask == [1.0] * len(call) + [0.0] * len(reply) + [1.0] * len(answer)
    assert episode.ended == "answer" and task.reward(prompt, episode.ids, episode.mask) == 1.0


@pytest.mark.todo("run_episode")
def test_an_episode_ends_at_its_answer_its_turn_limit_or_its_token_limit(chapter, task, tools_module):
    limits = tools_module.Limits(max_turns=3, max_tokens=40, max_new=6)
    prompt = prompt_for(tools_module)
    answered = run(chapter, ScriptedPolicy(chapter, task, ["!3<eos>"]), Tools(tools_module), task, prompt, limits)
    assert answered.ended == "answer" and len(answered.ids) == 3, "a turn that is no tool call is the answer"
    tools = Tools(tools_module)
    forever = run(chapter, ScriptedPolicy(chapter, task, [], every_turn="?a\n"), tools, task, prompt, limits)
    assert forever.ended == "turns" and len(tools.calls) == 3, (
        "a policy that only ever calls tools still stops: after limits.max_turns policy turns")
    policy = ScriptedPolicy(chapter, task, [], every_turn="?bbbbb")  # turns of 6 tokens that never stop
    long = run(chapter, policy, Tools(tools_module), task, prompt, tools_module.Limits(max_turns=9, max_tokens=13,
                                                                                       max_new=6))
    # 6 tokens, a reply of 3 (9); then only 4 fit under 13 (13), a reply (16): no room, so no more turns
    assert long.ended == "tokens", f"it holds {len(long.ids)} tokens: the token limit ends it, before a turn"
    assert policy.max_new == [6, 4], (
        f"asked for {policy.max_new} new tokens: never more than max_new, nor than the room left under max_tokens")


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
    assert killed > 0
    assert task.reward(prompt, episode.ids, episode.mask) == 1.0, (
        "the tool call reached a live worker: call the tools through their Service (tools.route), which retries")


# --- TODO 4: LeastLoadedService.next_replica ----------------------------------------------------------


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
    picks = []
    for _ in range(6):
        picks.append(pool.next_replica().index)  # nothing in flight anywhere: all tie
    assert picks == [0, 1, 2, 3, 0, 1], f"ties broken round robin from the cursor: {picks}"
    pool.replicas[2].in_flight = 1
    assert [pool.next_replica().index for _ in range(3)] == [3, 0, 1], "the busy one is passed over; the rest take turns"


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
    assert served == ["quick"] * 3
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
    assert [r["version"] for r in run["results"]] == [1, 2, 3, 4]
    lags = [lag for r in run["results"] for lag in r["lags"]]
    assert lags and max(lags) <= config.max_lag, f"the oldest token of every group trained on is within the bound: {lags}"
    made = run["episodes"]
    assert sum(made.ended.values()) >= 4 * 2 * 4 and set(made.ended) <= {"answer", "turns", "tokens"}
    assert list(final["generators"].values()) == [final["trainer"]], "the generator holds the trainer's last weights"
