"""Chapter 09: two loops and a buffer. Run: pytest tests/test_ch09_async_loops.py"""

import asyncio
import time

import pytest
import torch

from koans.testing import STARTUP_TIMEOUT, TIMEOUT, StandIn, checking

SEEDS = [0, 1, 2]


@pytest.fixture
def procs(shared_procs):
    return shared_procs(procs=3)


@pytest.fixture
def buffer(chapter, procs, test_tag):
    name = "buffer_" + test_tag
    return procs.slice(procs=0).spawn(name, chapter.ReplayBuffer, 1)


@pytest.fixture
def make_actors(plumbing, procs, test_tag):
    """Factory: a full set of actors with names of this test's own; learners closed at teardown."""
    made = []

    def make(max_lag=1, seed=0, watchful=False):
        tag = f"_{test_tag}_{len(made)}"
        actors = plumbing.spawn_actors(procs, generators=2, max_lag=max_lag, seed=seed, tag=tag, watchful=watchful)
        made.append(actors)
        return actors

    yield make
    for actors in made:
        try:
            actors.learner.close.call_one().get(timeout=TIMEOUT)
        except Exception:
            pass  # never started; the test has said why


def group(chapter, name, version):
    return chapter.Group(name, version, torch.zeros(8), torch.zeros(4, dtype=torch.long), torch.zeros(4), torch.ones(4))


def ids(groups):
    return [g.id for g in groups]


# --- TODO 1: ReplayBuffer.put -----------------------------------------------------------------


@pytest.mark.todo("ReplayBuffer.put")
def test_put_keeps_fresh_groups(chapter, buffer):
    accepted = [buffer.put.call_one(group(chapter, f"g{i}", 0)).get(timeout=STARTUP_TIMEOUT) for i in range(3)]
    assert accepted == [True, True, True]
    assert buffer.waiting.call_one().get(timeout=TIMEOUT) == 3


@pytest.mark.todo("ReplayBuffer.put")
def test_put_refuses_a_group_that_is_already_too_stale(chapter, buffer):
    buffer.advance.call_one(5).get(timeout=STARTUP_TIMEOUT)  # the learner is at version 5; max lag is 1
    assert buffer.put.call_one(group(chapter, "v3", 3)).get(timeout=TIMEOUT) is False
    assert buffer.put.call_one(group(chapter, "v4", 4)).get(timeout=TIMEOUT) is True
    ledger = buffer.close.call_one().get(timeout=TIMEOUT)
    assert (ledger.refused_stale, ledger.unused_at_stop) == (["v3"], ["v4"])


@pytest.mark.todo("ReplayBuffer.put")
def test_put_wakes_whoever_waits_for_groups(chapter, plumbing, procs, test_tag):
    probe = procs.slice(procs=0).spawn("probe_" + test_tag, plumbing.ArrivalProbe, 1)
    woken = probe.woken_within.call_one(TIMEOUT)  # waits on self.arrived, as a waiting sample does
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while probe.listeners.call_one().get(timeout=STARTUP_TIMEOUT) == 0:
        assert time.monotonic() < deadline, "the probe never started waiting"
        time.sleep(0.01)
    assert probe.put.call_one(group(chapter, "g0", 0)).get(timeout=TIMEOUT) is True
    with checking("ReplayBuffer.put"):
        assert woken.get(timeout=2 * TIMEOUT), (
            "put kept the group but woke nobody: a sample waiting for groups would sleep on until its timeout. "
            "A kept group must notify self.arrived")


# --- TODO 2: ReplayBuffer.sample ----------------------------------------------------------------


@pytest.mark.todo("ReplayBuffer.sample")
def test_sample_hands_out_the_oldest_groups_once(chapter, buffer):
    for i in range(5):
        buffer.put.call_one(group(chapter, f"g{i}", 0)).get(timeout=STARTUP_TIMEOUT)
    assert ids(buffer.sample.call_one(2, 0).get(timeout=TIMEOUT)) == ["g0", "g1"]
    assert ids(buffer.sample.call_one(2, 0).get(timeout=TIMEOUT)) == ["g2", "g3"], "each group is handed out once"
    ledger = buffer.close.call_one().get(timeout=TIMEOUT)
    assert (ledger.trained, ledger.unused_at_stop) == (["g0", "g1", "g2", "g3"], ["g4"])


@pytest.mark.todo("ReplayBuffer.sample")
def test_sample_drops_groups_that_went_stale_while_waiting(chapter, buffer):
    for name, version in [("a", 0), ("b", 0), ("c", 1), ("d", 2)]:
        buffer.put.call_one(group(chapter, name, version)).get(timeout=STARTUP_TIMEOUT)
    batch = buffer.sample.call_one(2, 2).get(timeout=TIMEOUT)  # learner at 2, max lag 1: versions 0 are too old
    assert ids(batch) == ["c", "d"]
    assert all(2 - g.version <= 1 for g in batch)
    assert buffer.close.call_one().get(timeout=TIMEOUT).dropped_stale == ["a", "b"]


@pytest.mark.todo("ReplayBuffer.sample", "ReplayBuffer.put")
def test_a_waiting_sample_does_not_block_puts(chapter, buffer):
    events = []
    waiting = buffer.sample.call_one(3, 0, TIMEOUT)  # the buffer is empty: this waits
    for i in range(3):
        accepted = buffer.put.call_one(group(chapter, f"g{i}", 0)).get(timeout=STARTUP_TIMEOUT)
        events.append(f"put g{i} -> {accepted}")
    events.append(f"sample -> {ids(waiting.get(timeout=TIMEOUT) or [])}")
    with checking("ReplayBuffer.sample"):  # put's own part (waking the waiter) has a test of its own above
            assert events == ["put g0 -> True", "put g1 -> True", "put g2 -> True", "sample -> ['g0', 'g1', 'g2']"], (
            "puts must go through while sample waits (a @concurrent_endpoint, so give up the condition's lock "
            "while you wait), and a sample woken by them hands out the three groups"
        )


@pytest.mark.todo("ReplayBuffer.sample")
def test_sample_gives_none_when_nothing_comes_within_the_callers_timeout(buffer):
    answer = buffer.sample.call_one(1, 0, 0.3).get(timeout=10)  # 10 s: far longer than 0.3 s, far shorter than a default
    assert answer is None, "nothing came within the caller's timeout: sample answers None"


@pytest.mark.todo("ReplayBuffer.sample")
def test_groups_that_turn_stale_while_sample_waits_are_dropped(chapter, plumbing, procs, test_tag):
    """Waiting for two groups with one in the buffer; meanwhile the learner moves on two versions, so the one
    it holds turns stale. A group arriving then wakes sample: it must not hand out the stale one."""
    buffer = procs.slice(procs=0).spawn("probe_" + test_tag, plumbing.ArrivalProbe, 1)  # the chapter's buffer
    buffer.put.call_one(group(chapter, "old", 0)).get(timeout=STARTUP_TIMEOUT)
    waiting = buffer.sample.call_one(2, 0, TIMEOUT)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while buffer.sleepers.call_one().get(timeout=TIMEOUT) == 0:  # until sample is asleep, waiting for a group
        assert time.monotonic() < deadline, "sample never waited for a second group"
        time.sleep(0.01)
    buffer.advance.call_one(2).get(timeout=TIMEOUT)  # the learner is at 2 now; max lag 1: "old" is too stale
    for name in ("new1", "new2"):
        assert buffer.put.call_one(group(chapter, name, 2)).get(timeout=TIMEOUT) is True
    batch = waiting.get(timeout=2 * TIMEOUT)
    assert batch is not None and ids(batch) == ["new1", "new2"], (
        f"sample handed out {ids(batch) if batch else batch}: drop what went stale on every wake, not only once "
        "before waiting")
    assert buffer.close.call_one().get(timeout=TIMEOUT).dropped_stale == ["old"]


@pytest.mark.todo("ReplayBuffer.sample")
def test_the_learner_version_never_goes_down(chapter, buffer):
    buffer.advance.call_one(5).get(timeout=STARTUP_TIMEOUT)
    buffer.put.call_one(group(chapter, "v4", 4)).get(timeout=TIMEOUT)
    assert ids(buffer.sample.call_one(1, 3).get(timeout=TIMEOUT)) == ["v4"]  # a late caller, with an old version
    with checking("ReplayBuffer.sample"):
        assert buffer.put.call_one(group(chapter, "v3", 3)).get(timeout=TIMEOUT) is False, (
            "the learner is at 5, so a group of version 3 is too stale; a sample asking with version 3 must not "
            "take the buffer's version back down (keep the larger)")


# --- TODO 3: continuous_training, against stand-ins: precise, and quick ---------------------------


@pytest.mark.todo("continuous_training")
def test_the_training_loop_asks_for_the_current_version_and_retries_when_nothing_came(chapter):
    answers = iter([None, ["a"], ["b"], None, None, ["c"], ["d"]])
    buffer = StandIn(sample=lambda count, learner_version, timeout=None: next(answers))
    trained = []

    def train(batch):  # a learner resumed at version 100: its versions are its own, not a count of steps
        trained.append(batch)
        return {"version": 100 + len(trained), "ids": batch}

    learner, stop, seen = StandIn(train=train), asyncio.Event(), []
    results = asyncio.run(chapter.continuous_training(learner, buffer, 3, 4, stop, on_step=seen.append))
    assert [r["version"] for r in results] == [101, 102, 103], "exactly `steps` steps; a None sample is not a step"
    assert trained == [["a"], ["b"], ["c"]]
    assert [args for args in buffer.sample.calls] == [(4, 0), (4, 0), (4, 101), (4, 102), (4, 102), (4, 102)], (
        "each sample asks for batch_groups groups against the version the last train answered (0 at first)"
    )
    assert seen == results, "on_step sees every step's result, in order"
    with checking("continuous_training", hint=4):
        assert stop.is_set(), "at the end, stop is set so that the rollout loops end"


@pytest.mark.todo("continuous_training")
def test_the_training_loop_sets_stop_even_when_training_fails(chapter):
    def train(batch):
        raise RuntimeError("the learner crashed")

    buffer, learner, stop = StandIn(sample=lambda count, learner_version, timeout=None: ["a"]), StandIn(train=train), asyncio.Event()
    with pytest.raises(RuntimeError, match="crashed"):
        asyncio.run(chapter.continuous_training(learner, buffer, 3, 4, stop))
    with checking("continuous_training", hint=4):
        assert stop.is_set(), "stop must be set in a finally: otherwise the rollout loops would run forever"


# --- The given rollout loop, on real actors -------------------------------------------------------


@pytest.mark.todo("ReplayBuffer.put")
def test_rollouts_fill_the_buffer_until_stopped(chapter, make_actors):
    actors = make_actors()

    async def scenario():
        stop = asyncio.Event()
        loop = asyncio.create_task(chapter.continuous_rollouts(actors.generators[0], actors.queue, actors.scorer, stop))
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while await actors.buffer.waiting.call_one() < 8:
            assert time.monotonic() < deadline and not loop.done(), "the rollout loop stopped filling the buffer"
            await asyncio.sleep(0.05)
        stop.set()
        return await asyncio.wait_for(loop, TIMEOUT)

    rollouts = asyncio.run(scenario())
    assert rollouts >= 2
    assert actors.buffer.waiting.call_one().get(timeout=TIMEOUT) == 4 * rollouts, (
        "each finished rollout puts its 4 scored groups into the buffer; the loop returns how many it made"
    )


# --- Both loops together, on real actors ---------------------------------------------------------


@pytest.mark.todo("continuous_training")
def test_rollouts_go_on_while_the_learner_trains(plumbing, make_actors):
    """Each training step waits (a bounded while) for a rollout to be queued before it ends. Loops that
    run at once give it one at every step; loops in lock step cannot, and the step says so."""
    actors = make_actors(watchful=True)
    run = asyncio.run(plumbing.run_async(actors, steps=6, batch_groups=4, timeout=STARTUP_TIMEOUT * 3))
    assert [r["version"] for r in run["results"]] == list(range(1, 7))
    overlaps = actors.learner.overlaps.call_one().get(timeout=TIMEOUT)
    assert overlaps and all(overlaps), (
        f"rollouts queued during each training step: {overlaps}. A step that saw none means the loops took "
        "turns: does each of your loops await its calls, so that the other runs meanwhile?"
    )
    trains = [s for s in run["spans"] if s.kind == "train"]
    generates = [s for s in run["spans"] if s.kind == "generate"]
    assert any(g.start < t.end and t.start < g.end for t in trains for g in generates), (
        "no generate span overlaps a train span"
    )


@pytest.mark.todo("continuous_training")
@pytest.mark.parametrize("seed", SEEDS)
def test_every_group_is_trained_or_dropped_exactly_once_and_lag_is_bounded(plumbing, make_actors, seed):
    run = asyncio.run(plumbing.run_async(make_actors(max_lag=1, seed=seed), steps=10, batch_groups=4,
                                        timeout=STARTUP_TIMEOUT * 3))
    ledger = run["ledger"]
    lists = [ledger.trained, ledger.refused_stale, ledger.dropped_stale, ledger.unused_at_stop]
    everything = [i for ids_ in lists for i in ids_]
    assert len(everything) == len(set(everything)), "a group was counted twice"
    assert set(everything) == plumbing.produced_ids(run), "a group was lost (or came from nowhere)"
    trained_in_steps = [i for r in run["results"] for i in r["ids"]]
    assert sorted(trained_in_steps) == sorted(ledger.trained) and len(trained_in_steps) == 10 * 4
    lags = [lag for r in run["results"] for lag in r["lags"]]
    assert all(0 <= lag <= 1 for lag in lags), f"policy lag beyond max_lag=1: {sorted(set(lags))}"


@pytest.mark.todo("continuous_training")
def test_on_policy_when_max_lag_is_zero(plumbing, make_actors):
    run = asyncio.run(plumbing.run_async(make_actors(max_lag=0), steps=6, batch_groups=4, timeout=STARTUP_TIMEOUT * 3))
    assert {lag for r in run["results"] for lag in r["lags"]} == {0}, "max_lag=0 trains only on the newest policy"


@pytest.mark.todo("continuous_training")
def test_stop_ends_both_loops_and_empties_the_buffer(plumbing, make_actors):
    actors = make_actors()
    run = asyncio.run(plumbing.run_async(actors, steps=3, batch_groups=4, timeout=STARTUP_TIMEOUT * 3))
    assert len(run["results"]) == 3 and all(count >= 1 for count in run["rollouts"]), "both loops ran, then ended"
    assert actors.buffer.waiting.call_one().get(timeout=TIMEOUT) == 0, "close() counted what was left, and emptied it"
