"""Chapter 09: two loops and a buffer. Run: pytest tests/test_ch09_async_loops.py"""

import asyncio
import time
import types

import pytest
import torch
from monarch.actor import ActorError

from koans.testkit.testing import (NEVER, STARTUP_TIMEOUT, TIMEOUT, AwaitedStandIn, StandIn, StuckForever, checking,
                           run_on_virtual_clock)

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


def here(buffer, name):
    """Endpoint `name` of a ReplayBuffer made in this process, as a plain coroutine function (its code alone)."""
    method = type(buffer).__dict__[name]._method
    return getattr(method, "__wrapped__", method).__get__(buffer)  # a @concurrent_endpoint wraps its code


# --- TODO 1: ReplayBuffer.put ---
# Contract, clause by clause (the test that holds each):
#   1. a fresh group is kept, at the end of self.groups, and put answers True -> test_put_keeps_fresh_groups,
#                                                                         test_put_keeps_groups_in_the_order_they_came
#   2. a group already too stale (lag > max_lag, not >=) is refused: False, its id in
#      ledger.refused_stale (not dropped_stale), nothing kept; version 0 included
#                                                                     -> test_put_refuses_a_group_that_is_already_too_stale
#      the bound is the buffer's own max_lag, whatever it is (0 and 2 too) -> test_put_judges_by_the_buffers_own_max_lag
#   6. the lag is signed: a group newer than the learner version the buffer knows (a generator pulled the
#      newest weights before the learner's next sample said so) is fresh, with max_lag 0 too
#                                                                     -> test_put_keeps_a_group_newer_than_the_learner_it_knows
#   3. a kept group wakes whoever waits on self.arrived                -> test_put_wakes_whoever_waits_for_groups
#   4. it wakes every waiter, not just one (each may wait for something else) -> test_put_wakes_every_waiter_not_just_one
#   5. a put goes through while a sample waits, and wakes it            -> test_a_waiting_sample_does_not_block_puts
#   (given code it runs with: a rollout in flight at stop is finished; the generator's random stream is
#    seeded once, not per rollout)                                      -> test_rollouts_fill_the_buffer_until_stopped


@pytest.mark.todo("ReplayBuffer.put")
def test_put_keeps_fresh_groups(chapter, buffer):
    accepted = [buffer.put.call_one(group(chapter, f"g{i}", 0)).get(timeout=STARTUP_TIMEOUT) for i in range(3)]
    assert accepted == [True, True, True], (
        f"put answered {accepted!r} for three fresh groups (version 0, learner at 0), not [True, True, True]: a fresh "
        "group is kept and put answers True")
    assert buffer.waiting.call_one().get(timeout=TIMEOUT) == 3, (
        "put kept three groups, yet the buffer does not hold 3: each kept group goes, once, at the end of self.groups")


@pytest.mark.todo("ReplayBuffer.put")
def test_put_keeps_groups_in_the_order_they_came(chapter):
    buffer = chapter.ReplayBuffer(1)  # in this process: its code alone

    async def put_three():  # versions out of order: generators run at different speeds
        return [await here(buffer, "put")(group(chapter, f"g{i}", version)) for i, version in enumerate((1, 0, 1))]

    assert run_on_virtual_clock(put_three()) == [True, True, True], (
        "put did not answer True for each of three fresh groups (versions 1, 0, 1; learner at 0, max_lag 1): a fresh "
        "group is kept, and put answers True")
    assert ids(buffer.groups) == ["g0", "g1", "g2"], (
        f"self.groups holds {ids(buffer.groups)}: a kept group goes to the end, in the order groups came (not by "
        "version), so the oldest stays first and sample hands out the oldest")


@pytest.mark.todo("ReplayBuffer.put")
def test_put_refuses_a_group_that_is_already_too_stale(chapter, buffer):
    buffer.advance.call_one(5).get(timeout=STARTUP_TIMEOUT)  # the learner is at version 5; max lag is 1
    assert buffer.put.call_one(group(chapter, "v3", 3)).get(timeout=TIMEOUT) is False, (
        "a group of version 3 is 2 versions behind the learner at 5, more than max_lag 1: put refuses it and answers "
        "False")
    assert buffer.put.call_one(group(chapter, "v0", 0)).get(timeout=TIMEOUT) is False, (
        "a group from the initial weights (version 0) is 5 versions behind: version 0 is a version like any other")
    assert buffer.put.call_one(group(chapter, "v4", 4)).get(timeout=TIMEOUT) is True, (
        "the learner is at 5, max lag 1: a group of version 4 is exactly max_lag behind and is kept (only a lag "
        "greater than max_lag is too stale)")
    ledger = buffer.close.call_one().get(timeout=TIMEOUT)
    dropped = (" (they are in dropped_stale, which is for groups that sample drops after they went stale)"
               if ledger.dropped_stale == ["v3", "v0"] else "")
    assert (ledger.refused_stale, ledger.unused_at_stop) == (["v3", "v0"], ["v4"]), (
        f"refused_stale {ledger.refused_stale}, unused_at_stop {ledger.unused_at_stop}: a group that put refuses goes "
        f"into ledger.refused_stale{dropped}")


@pytest.mark.todo("ReplayBuffer.put")
@pytest.mark.parametrize("max_lag", [0, 2])
def test_put_judges_by_the_buffers_own_max_lag(chapter, max_lag):
    buffer = chapter.ReplayBuffer(max_lag)  # in this process: its code alone

    async def put_two():  # the learner at 3: lag max_lag is kept, one more is refused
        await here(buffer, "advance")(3)
        return [await here(buffer, "put")(group(chapter, f"lag{lag}", 3 - lag)) for lag in (max_lag, max_lag + 1)]

    answers = run_on_virtual_clock(put_two())
    assert answers == [True, False], (
        f"ReplayBuffer(max_lag={max_lag}) with the learner at 3: put answered {answers} for groups {max_lag} and "
        f"{max_lag + 1} versions behind, not [True, False]. The bound is the buffer's own self.max_lag")


@pytest.mark.todo("ReplayBuffer.put")
def test_put_keeps_a_group_newer_than_the_learner_it_knows(chapter):
    buffer = chapter.ReplayBuffer(0)  # in this process: its code alone; max_lag 0, the strictest bound

    async def put_newer():  # the buffer has heard of version 2; a generator already holds version 3's weights
        await here(buffer, "advance")(2)
        return await here(buffer, "put")(group(chapter, "ahead", 3))

    kept = run_on_virtual_clock(put_newer())
    assert kept is True and ids(buffer.groups) == ["ahead"], (
        f"put answered {kept!r} for a version-3 group with the buffer's learner at 2 and max_lag 0: its lag is "
        "2 - 3 = -1, newer than anything the learner has trained on, so it is fresh (the lag is signed, not a "
        "distance: _too_stale says so)")


@pytest.mark.todo("ReplayBuffer.put")
def test_put_wakes_whoever_waits_for_groups(chapter, plumbing, procs, test_tag):
    probe = procs.slice(procs=0).spawn("probe_" + test_tag, plumbing.ArrivalProbe, 1)
    woken = probe.woken_within.call_one(TIMEOUT)  # waits on self.arrived, as a waiting sample does
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while probe.listeners.call_one().get(timeout=STARTUP_TIMEOUT) == 0:
        assert time.monotonic() < deadline, "the probe never started waiting"
        time.sleep(0.01)
    assert probe.put.call_one(group(chapter, "g0", 0)).get(timeout=TIMEOUT) is True, (
        "put did not answer True for a fresh group (version 0, learner at 0): a kept group makes put answer True")
    with checking("ReplayBuffer.put"):
        assert woken.get(timeout=2 * TIMEOUT), (
            "put kept the group but woke nobody: a sample waiting for groups would sleep on until its timeout. "
            "A kept group must notify self.arrived")


@pytest.mark.todo("ReplayBuffer.put")
def test_put_wakes_every_waiter_not_just_one(chapter):
    """Two waiters asleep on self.arrived, one put: both must wake. notify() wakes only the first; if that one
    waits for more groups than there are, it sleeps again, and the second, which one group would satisfy,
    sleeps on until its timeout."""
    buffer = chapter.ReplayBuffer(1)
    woken = []

    async def waiter(name):
        async with buffer.arrived:
            await buffer.arrived.wait()
        woken.append(name)

    async def scenario():
        waiters = [asyncio.create_task(waiter(name)) for name in ("first", "second")]
        await asyncio.sleep(1)  # both are asleep on self.arrived now
        kept = await here(buffer, "put")(group(chapter, "g0", 0))
        await asyncio.sleep(1)  # whoever was woken has run by now
        for task in waiters:
            task.cancel()
        return kept

    kept = run_on_virtual_clock(scenario())
    assert kept is True, (
        f"put answered {kept!r} for a fresh group (version 0, learner at 0): a kept group makes put answer True")
    assert sorted(woken) == ["first", "second"], (
        f"two waiters slept on self.arrived and one put woke {woken or 'neither'}: a kept group must wake every "
        "waiter (notify_all), since each may wait for something different")


# --- TODO 2: ReplayBuffer.sample ---
# Contract, clause by clause (the test that holds each):
#   1. the `count` oldest groups, in order, each handed out once, ids to ledger.trained
#                                                                      -> test_sample_hands_out_the_oldest_groups_once
#   2. groups too stale for the learner's version are dropped into ledger.dropped_stale, even by a sample that
#      then answers None                                               -> test_sample_drops_groups_that_went_stale_while_waiting,
#                                                                         test_a_sample_that_times_out_still_drops_what_is_stale,
#                                                                         test_the_ledger_keeps_every_group_dropped
#   3. also those that turn stale while it waits (checked on every wake)
#                                                                      -> test_groups_that_turn_stale_while_sample_waits_are_dropped
#   4. self.learner_version takes the larger of the two: it never goes down -> test_the_learner_version_never_goes_down
#      and it is stored: from then on, put judges by it                -> test_the_version_a_sample_brings_is_the_buffers_from_then_on
#   5. a waiting sample lets puts through (it gives up the lock while it waits), and a put wakes it
#                                                                      -> test_a_waiting_sample_does_not_block_puts
#   6. None when `count` groups do not come within the caller's timeout (the caller's, not a default)
#                                                                      -> test_sample_gives_none_when_nothing_comes_within_the_callers_timeout,
#                                                                         test_a_timeout_of_zero_gives_up_at_once
#   7. that timeout counts from the call, in all: arrivals that wake it while too few do not restart it
#                                                                      -> test_a_sample_waits_its_timeout_in_all_however_often_arrivals_wake_it
#   8. a cancelled wait is no timeout: the cancel goes on up, never answered as None
#                                                                      -> test_a_cancelled_sample_is_cancelled_not_none
#   9. groups already there are handed out at once, whatever the timeout (0 too)
#                                                                      -> test_groups_already_there_are_handed_out_whatever_the_timeout


@pytest.mark.todo("ReplayBuffer.sample")
def test_sample_hands_out_the_oldest_groups_once(chapter, buffer):
    for i in range(5):
        buffer.put.call_one(group(chapter, f"g{i}", 0)).get(timeout=STARTUP_TIMEOUT)
    first = ids(buffer.sample.call_one(2, 0).get(timeout=TIMEOUT))
    assert first == ["g0", "g1"], (
        f"the first sample(2) of g0..g4 handed out {first}: groups go out oldest first (the front of self.groups), "
        "in the order they came")
    assert ids(buffer.sample.call_one(2, 0).get(timeout=TIMEOUT)) == ["g2", "g3"], "each group is handed out once"
    ledger = buffer.close.call_one().get(timeout=TIMEOUT)
    assert (ledger.trained, ledger.unused_at_stop) == (["g0", "g1", "g2", "g3"], ["g4"]), (
        f"ledger.trained {ledger.trained}, unused_at_stop {ledger.unused_at_stop} after two sample(2) of g0..g4: "
        "expected g0..g3 trained and g4 left. Add the id of each group handed out to ledger.trained, and take it out "
        "of self.groups")


@pytest.mark.todo("ReplayBuffer.sample")
def test_sample_drops_groups_that_went_stale_while_waiting(chapter, buffer):
    for name, version in [("a", 0), ("b", 0), ("c", 1), ("d", 2)]:
        buffer.put.call_one(group(chapter, name, version)).get(timeout=STARTUP_TIMEOUT)
    batch = buffer.sample.call_one(2, 2).get(timeout=TIMEOUT)  # learner at 2, max lag 1: versions 0 are too old
    assert ids(batch) == ["c", "d"], (
        f"sample(2, learner_version=2) of a, b (v0), c (v1), d (v2) handed out {ids(batch)}: with max_lag 1 the "
        "version-0 groups are too stale for a learner at 2. The version a sample brings becomes "
        "self.learner_version (it never goes down) before staleness is judged; the oldest fresh ones go out")
    assert all(2 - g.version <= 1 for g in batch), (
        f"sample handed out versions {[g.version for g in batch]} to a learner at 2 with max_lag 1: every group "
        "handed out is within max_lag of the learner's version")
    dropped = buffer.close.call_one().get(timeout=TIMEOUT).dropped_stale
    assert dropped == ["a", "b"], (
        f"dropped_stale {dropped}: a group too stale for the learner is removed from self.groups and recorded in "
        "ledger.dropped_stale, not just passed over")


@pytest.mark.todo("ReplayBuffer.sample", "ReplayBuffer.put")
def test_a_waiting_sample_does_not_block_puts(chapter, plumbing, procs, test_tag):
    """A sample waits for three groups while a probe, beside it, also waits on self.arrived. Three puts: if the
    probe was never woken, put is at fault (it woke nobody); if it was, whatever else went wrong is sample's."""
    buffer = procs.slice(procs=0).spawn("probe_" + test_tag, plumbing.ArrivalProbe, 1)  # the chapter's buffer
    woken = buffer.woken_within.call_one(TIMEOUT)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while buffer.listeners.call_one().get(timeout=STARTUP_TIMEOUT) == 0:
        assert time.monotonic() < deadline, "the probe never started waiting"
        time.sleep(0.01)
    # The buffer is empty: this waits. Its own timeout outlasts a put's wait (STARTUP_TIMEOUT), so a sample that
    # blocks the buffer's loop while it waits makes the puts time out, which names it, not put.
    waiting = buffer.sample.call_one(3, 0, 3 * TIMEOUT)
    events = []
    for i in range(3):
        try:
            accepted = buffer.put.call_one(group(chapter, f"g{i}", 0)).get(timeout=STARTUP_TIMEOUT)
        except TimeoutError as err:
            with checking("ReplayBuffer.sample"):
                raise AssertionError(
                    f"put g{i} got no answer while a sample waited: the waiting sample keeps the buffer to itself. "
                    "While it waits it must give up the condition's lock (wait on self.arrived, in a "
                    "@concurrent_endpoint)") from err
        events.append(f"put g{i} -> {accepted}")
    try:
        probe_was_woken = woken.get(timeout=2 * TIMEOUT)
    except ActorError as err:
        with checking("ReplayBuffer.sample"):
            raise AssertionError(
                "the probe's wait on self.arrived failed, its lock released under it: a sample that waits on the "
                "condition without holding its lock (async with self.arrived) gives up a lock another task holds"
            ) from err
    with checking("ReplayBuffer.put"):
        assert events == ["put g0 -> True", "put g1 -> True", "put g2 -> True"], events
        assert probe_was_woken, (
            "three groups were put while a probe waited on self.arrived, and none of the puts woke it: a kept "
            "group must notify self.arrived (so the waiting sample sleeps on too)")
    events.append(f"sample -> {ids(waiting.get(timeout=2 * TIMEOUT) or [])}")
    with checking("ReplayBuffer.sample"):  # put woke the probe: the sample was woken too
        assert events[-1] == "sample -> ['g0', 'g1', 'g2']", (
            f"{events[-1]}: the puts went through and woke the waiters on self.arrived, but the waiting sample "
            "did not hand out the three groups. On each wake, check again whether `count` groups are there")


@pytest.mark.todo("ReplayBuffer.sample")
def test_sample_gives_none_when_nothing_comes_within_the_callers_timeout(buffer):
    try:
        # 10 s: far longer than 0.3 s, far shorter than a default
        answer = buffer.sample.call_one(1, 0, 0.3).get(timeout=10)
    except TimeoutError:
        pytest.fail("sample(1, 0, timeout=0.3) on an empty buffer gave no answer within 10 s: it waits at most the "
                    "timeout its caller passes (its third argument), then answers None; not a timeout of its own")
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
        assert buffer.put.call_one(group(chapter, name, 2)).get(timeout=TIMEOUT) is True, (
            "put did not answer True for a fresh group (version 2, learner at 2): a kept group makes put answer True")
    batch = waiting.get(timeout=2 * TIMEOUT)
    assert batch is not None, (
        "sample answered None though two fresh groups came while it waited (a put woke it each time): on each "
        "wake, drop what went stale, then check again whether `count` groups are there")
    assert ids(batch) == ["new1", "new2"], (
        f"sample handed out {ids(batch)}: the learner moved on while it waited, so 'old' turned stale. Drop what "
        "went stale on every wake, not only once before waiting")
    assert buffer.close.call_one().get(timeout=TIMEOUT).dropped_stale == ["old"], (
        "ledger.dropped_stale should be ['old']: 'old' turned stale while sample waited, so sample removes it from "
        "self.groups and records its id in ledger.dropped_stale")


@pytest.mark.todo("ReplayBuffer.sample")
def test_the_learner_version_never_goes_down(chapter, buffer):
    buffer.advance.call_one(5).get(timeout=STARTUP_TIMEOUT)
    buffer.put.call_one(group(chapter, "v4", 4)).get(timeout=TIMEOUT)
    assert ids(buffer.sample.call_one(1, 3).get(timeout=TIMEOUT)) == ["v4"], (  # a late caller, with an old version
        "sample(1) with an old learner version (3; the buffer knows 5) did not hand out v4, the one fresh group "
        "there: the learner version sample keeps is the larger of the two, and v4 is within max_lag of it")
    with checking("ReplayBuffer.sample"):
        assert buffer.put.call_one(group(chapter, "v3", 3)).get(timeout=TIMEOUT) is False, (
            "the learner is at 5, so a group of version 3 is too stale; a sample asking with version 3 must not "
            "take the buffer's version back down (keep the larger)")


@pytest.mark.todo("ReplayBuffer.sample")
def test_the_version_a_sample_brings_is_the_buffers_from_then_on(chapter):
    buffer = chapter.ReplayBuffer(1)  # in this process: its code alone

    async def scenario():
        empty = await here(buffer, "sample")(1, 5, 1.0)  # nothing there: None after 1 s (virtual)
        return empty, [await here(buffer, "put")(group(chapter, f"v{v}", v)) for v in (3, 4)]

    empty, answers = run_on_virtual_clock(scenario())
    assert empty is None, (
        f"sample(1, learner_version=5, timeout=1.0) on an empty buffer answered {empty!r}: nothing came within the "
        "caller's timeout, so it answers None")
    assert answers == [False, True], (
        f"after sample(1, learner_version=5), put answered {answers} for groups of versions 3 and 4, not "
        "[False, True]: the version a sample brings becomes self.learner_version, so put refuses what is too "
        "stale for the learner from then on")


@pytest.mark.todo("ReplayBuffer.sample")
def test_a_sample_that_times_out_still_drops_what_is_stale(chapter):
    buffer = chapter.ReplayBuffer(1)

    async def scenario():
        for name, version in [("old", 0), ("new", 3)]:
            await here(buffer, "put")(group(chapter, name, version))
        return await here(buffer, "sample")(2, 3, 1.0)  # one fresh group of the two asked for: None

    assert run_on_virtual_clock(scenario()) is None, (
        "sample(2, learner_version=3, timeout=1.0), with one fresh group there and one stale, did not answer None: "
        "two fresh groups never came within the caller's timeout")
    assert (ids(buffer.groups), buffer.ledger.dropped_stale) == (["new"], ["old"]), (
        f"sample(2, learner_version=3) timed out with {ids(buffer.groups)} left and dropped_stale "
        f"{buffer.ledger.dropped_stale}: a group too stale for the learner is dropped (into "
        "ledger.dropped_stale) whether or not the sample then gets its batch")


@pytest.mark.todo("ReplayBuffer.sample")
def test_a_sample_waits_its_timeout_in_all_however_often_arrivals_wake_it(chapter):
    """sample(3, timeout=10 s) while one group comes every 4 s (on a virtual clock: no real time passes). Each
    arrival wakes it, with too few groups. The timeout runs from the call: None at t=10, before the third."""
    buffer = chapter.ReplayBuffer(1)

    async def scenario():
        loop = asyncio.get_running_loop()

        async def timed_sample():
            answer = await here(buffer, "sample")(3, 0, 10.0)
            return answer, loop.time()

        waiting = asyncio.create_task(timed_sample())
        for i in range(5):
            await asyncio.sleep(4)
            if waiting.done():
                break
            await here(buffer, "put")(group(chapter, f"g{i}", 0))
        return await waiting

    try:
        answer, at = run_on_virtual_clock(scenario())
    except StuckForever:
        pytest.fail("sample(3, timeout=10) never answered: wait at most `timeout` seconds in all")
    got = ids(answer) if answer else answer
    assert (got, at) == (None, pytest.approx(10.0)), (
        f"sample(3, timeout=10), one group arriving every 4 s: it answered {got} at t={at:g} s, not None at "
        "t=10. The timeout counts from the call, in all: a wake-up by a group that leaves it short does not "
        "start a new full timeout")


@pytest.mark.todo("ReplayBuffer.sample")
def test_a_timeout_of_zero_gives_up_at_once(chapter):
    buffer = chapter.ReplayBuffer(1)  # in this process, on a virtual clock: no real time passes

    async def timed_sample():
        answer = await here(buffer, "sample")(1, 0, 0.0)
        return answer, asyncio.get_running_loop().time()

    try:
        answer, at = run_on_virtual_clock(timed_sample())
    except StuckForever:
        pytest.fail("sample(1, 0, timeout=0.0) on an empty buffer never answered: 0 s is the caller's timeout too")
    assert (answer, at) == (None, pytest.approx(0.0)), (
        f"sample(1, 0, timeout=0.0) on an empty buffer answered {answer!r} at t={at:g} s, not None at t=0: a timeout "
        "of 0 is the caller's timeout like any other (0.0 is falsy: ask whether a value is None, not whether it is "
        "truthy)")


@pytest.mark.todo("ReplayBuffer.sample")
def test_the_ledger_keeps_every_group_dropped(chapter):
    buffer = chapter.ReplayBuffer(1)

    async def two_samples_that_drop():
        for name, version in [("a", 0), ("b", 3)]:
            await here(buffer, "put")(group(chapter, name, version))
        first = await here(buffer, "sample")(1, 3, 1.0)  # drops a (lag 3), hands out b
        for name, version in [("c", 3), ("d", 6)]:
            await here(buffer, "put")(group(chapter, name, version))
        second = await here(buffer, "sample")(1, 6, 1.0)  # drops c (lag 3), hands out d
        return ids(first), ids(second)

    assert run_on_virtual_clock(two_samples_that_drop()) == (["b"], ["d"]), (
        "the two samples of one group did not hand out b, then d: each first drops the groups too stale for the "
        "learner's version (a for a learner at 3, c for one at 6), then hands out the oldest fresh one")
    assert buffer.ledger.dropped_stale == ["a", "c"], (
        f"two samples each dropped one stale group (a, then c); ledger.dropped_stale is {buffer.ledger.dropped_stale}: "
        "the ledger keeps every id ever dropped, so add to the list (a new list each time loses the earlier ones)")


@pytest.mark.todo("ReplayBuffer.sample")
def test_a_cancelled_sample_is_cancelled_not_none(chapter):
    buffer = chapter.ReplayBuffer(1)  # in this process: its code alone

    async def cancel_a_waiting_sample():
        waiting = asyncio.ensure_future(here(buffer, "sample")(2, 0, 60.0))
        await asyncio.sleep(1.0)  # on the virtual clock: the sample waits for groups that never come
        waiting.cancel()
        try:
            return await waiting
        except asyncio.CancelledError:
            return "cancelled"

    outcome = run_on_virtual_clock(cancel_a_waiting_sample())
    assert outcome == "cancelled", (
        f"a sample cancelled while it waited answered {outcome!r}: a cancel is no timeout. Catch the timeout alone "
        "(None: the groups did not come in time), and let asyncio.CancelledError go on up to whoever cancelled")


@pytest.mark.todo("ReplayBuffer.sample")
def test_groups_already_there_are_handed_out_whatever_the_timeout(chapter):
    buffer = chapter.ReplayBuffer(1)

    async def scenario():
        for name in ("a", "b"):
            await here(buffer, "put")(group(chapter, name, 0))
        return await here(buffer, "sample")(2, 0, 0.0)

    answer = run_on_virtual_clock(scenario())
    assert answer is not None and ids(answer) == ["a", "b"], (
        f"two fresh groups were there when sample(2, 0, timeout=0.0) was called, and it answered {answer!r}: groups "
        "already there need no waiting, so they are handed out at once, whatever the timeout. (asyncio.wait_for("
        "..., 0) gives up before its coroutine even starts: it never looks. docs/09_async_loops.md, 'Waiting "
        "without taking turns', says what does.)")


# --- TODO 3: continuous_training ---
# Contract, clause by clause (the test that holds each):
#   1. each sample asks for batch_groups groups against the learner's version: 0 first, then the version
#      the last train answered (not a count of its own)  -> test_the_training_loop_asks_for_the_current_version_and_retries_when_nothing_came
#   2. a None sample is not a step: ask again; exactly `steps` steps; on_step sees each result, in order
#                                                        -> test_the_training_loop_asks_for_the_current_version_and_retries_when_nothing_came
#      steps=0 is none: nothing sampled, nothing trained, stop set  -> test_zero_steps_sample_and_train_nothing
#   3. every call (sample, train) is awaited at most TIMEOUT; one with no answer by then ends the run (TimeoutError)
#                                                        -> test_the_training_loop_waits_for_each_call_at_most_TIMEOUT,
#                                                           test_a_run_may_last_longer_than_TIMEOUT_when_every_call_answers_in_time
#   4. stop is set when the steps are done                -> test_the_training_loop_asks_for_the_current_version_and_retries_when_nothing_came
#   5. stop is set when training fails                    -> test_the_training_loop_sets_stop_even_when_training_fails
#   6. stop is set when the loop is cancelled (a cancellation is no Exception) -> test_a_cancelled_training_loop_still_sets_stop
#   7. calls are awaited, never waited on with a blocking .get(): the rollout loops run meanwhile
#                                                        -> test_the_training_loop_waits_for_each_call_at_most_TIMEOUT,
#                                                           test_rollouts_go_on_while_the_learner_trains
#   8. with real actors: every group trained or dropped once, lag within max_lag
#                                                        -> test_every_group_is_trained_or_dropped_exactly_once_and_lag_is_bounded,
#                                                           test_on_policy_when_max_lag_is_zero, test_stop_ends_both_loops_and_empties_the_buffer


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
    assert trained == [["a"], ["b"], ["c"]], (
        f"the learner trained on {trained}, not [['a'], ['b'], ['c']]: train each batch the buffer answers, once; a "
        "None sample is not trained but asked again")
    assert [args for args in buffer.sample.calls] == [(4, 0), (4, 0), (4, 101), (4, 102), (4, 102), (4, 102)], (
        "each sample asks for batch_groups groups against the version the last train answered (0 at first)"
    )
    assert seen == results, "on_step sees every step's result, in order"
    with checking("continuous_training", hint=4):
        assert stop.is_set(), "at the end, stop is set so that the rollout loops end"


@pytest.mark.todo("continuous_training")
def test_zero_steps_sample_and_train_nothing(chapter):
    buffer = StandIn(sample=lambda count, learner_version, timeout=None: ["a"])
    learner, stop = StandIn(train=lambda batch: {"version": 1}), asyncio.Event()
    results = asyncio.run(chapter.continuous_training(learner, buffer, 0, 4, stop))
    assert (results, len(buffer.sample.calls), len(learner.train.calls)) == ([], 0, 0), (
        f"continuous_training(steps=0) sampled {len(buffer.sample.calls)} and trained {len(learner.train.calls)} "
        "times: `steps` steps means none for 0. Check the count before each step, not after it (a sampled batch "
        "that is never trained is lost: the buffer counts it as trained)")
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


@pytest.mark.todo("continuous_training")
@pytest.mark.parametrize("silent", ["sample", "train"])
def test_the_training_loop_waits_for_each_call_at_most_TIMEOUT(chapter, silent):
    """A buffer or a learner that never answers (its process hung): continuous_training gives up after
    TIMEOUT with TimeoutError, and sets stop. On a virtual clock: no real time passes. The stand-ins refuse
    a blocking .get(): the rollout loops share this event loop."""
    endpoints = {"sample": lambda count, learner_version, timeout=None: ["a"], "train": lambda batch: {"version": 1}}
    endpoints[silent] = NEVER
    buffer, learner = AwaitedStandIn(sample=endpoints["sample"]), AwaitedStandIn(train=endpoints["train"])
    stop = asyncio.Event()

    async def scenario():
        try:
            await chapter.continuous_training(learner, buffer, 3, 4, stop)
        except TimeoutError:
            return asyncio.get_running_loop().time()
        return None

    try:
        gave_up_at = run_on_virtual_clock(scenario())
    except StuckForever:
        asked = len(getattr(buffer if silent == "sample" else learner, silent).calls)
        if asked > 1:
            pytest.fail(f"{silent}() never answered, and continuous_training asked it {asked} times: a call with no "
                        "answer by TIMEOUT ends the run (let the TimeoutError out); only None from sample means ask "
                        "again")
        pytest.fail(f"{silent}() never answered, and continuous_training waited for it forever: await every call "
                    "at most TIMEOUT (a hung actor must end the run, not freeze it)")
    assert gave_up_at == pytest.approx(chapter.TIMEOUT), (
        f"{silent}() never answered: continuous_training should raise TimeoutError after TIMEOUT "
        f"({chapter.TIMEOUT:g} s); it {'returned' if gave_up_at is None else f'gave up at {gave_up_at:g} s'}")
    with checking("continuous_training", hint=4):
        assert stop.is_set(), "a timeout ended training: stop must be set all the same"


class AfterAWhile:
    """An endpoint that answers fn(*args) `seconds` after each call (on the test's clock)."""

    def __init__(self, seconds, fn):
        self.seconds, self.fn, self.calls = seconds, fn, []

    def call_one(self, *args):
        self.calls.append(args)
        return self._answer(args)

    async def _answer(self, args):
        await asyncio.sleep(self.seconds)
        return self.fn(*args)


@pytest.mark.todo("continuous_training")
def test_a_run_may_last_longer_than_TIMEOUT_when_every_call_answers_in_time(chapter):
    """Four steps whose calls each take 0.4 * TIMEOUT (on a virtual clock): the run lasts 3.2 * TIMEOUT, and
    no call waits past TIMEOUT. TIMEOUT bounds each call, not the whole run."""
    step = 0.4 * chapter.TIMEOUT
    buffer = types.SimpleNamespace(sample=AfterAWhile(step, lambda count, version, timeout=None: ["g"]))
    learner = types.SimpleNamespace(train=AfterAWhile(step, lambda batch: {"version": len(learner.train.calls)}))
    stop = asyncio.Event()

    async def scenario():
        try:
            results = await chapter.continuous_training(learner, buffer, 4, 1, stop)
        except TimeoutError:
            return "TimeoutError", asyncio.get_running_loop().time()
        return len(results), asyncio.get_running_loop().time()

    outcome, at = run_on_virtual_clock(scenario())
    assert (outcome, at) == (4, pytest.approx(8 * step)), (
        f"four steps whose every call answered in 0.4 * TIMEOUT ended with {outcome} at t={at / chapter.TIMEOUT:g} * "
        "TIMEOUT, not 4 results at 3.2 * TIMEOUT: TIMEOUT bounds each call (sample, train) on its own, not the whole "
        "run, which lasts as long as its steps take")


@pytest.mark.todo("continuous_training")
def test_a_cancelled_training_loop_still_sets_stop(chapter):
    """Whoever runs the loops may cancel training (asyncio.wait_for around a run, Ctrl-C). A cancellation
    raises CancelledError, which is not an Exception: only a finally sees it."""
    buffer, learner = AwaitedStandIn(sample=NEVER), AwaitedStandIn(train=lambda batch: {"version": 1})
    stop = asyncio.Event()

    async def scenario():
        training = asyncio.create_task(chapter.continuous_training(learner, buffer, 3, 4, stop))
        await asyncio.sleep(1)  # it waits for a sample now
        training.cancel()
        try:
            await training
        except asyncio.CancelledError:
            return "cancelled"
        return "not cancelled"

    outcome = run_on_virtual_clock(scenario())
    assert outcome == "cancelled", "a cancelled continuous_training must let the CancelledError through"
    with checking("continuous_training", hint=4):
        assert stop.is_set(), (
            "continuous_training was cancelled and left stop unset: the rollout loops would run on forever. "
            "A cancellation is not an Exception (except Exception misses it): set stop in a finally")


# --- The given rollout loop, on real actors -------------------------------------------------------


@pytest.mark.todo("ReplayBuffer.put")
def test_rollouts_fill_the_buffer_until_stopped(chapter, make_actors):
    actors = make_actors()

    async def scenario():
        stop = asyncio.Event()
        loop = asyncio.create_task(chapter.continuous_rollouts(actors.generators[0], actors.queue, actors.scorer, stop))
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while await asyncio.wait_for(actors.buffer.waiting.call_one(), TIMEOUT) < 8:
            if loop.done():
                await loop  # it ended by an error: that error, raised here, names its cause (perhaps a TODO of ch07)
            assert not loop.done(), "the rollout loop returned before stop was set"
            assert time.monotonic() < deadline, (
                f"the buffer holds {await asyncio.wait_for(actors.buffer.waiting.call_one(), TIMEOUT)} groups after "
                f"{STARTUP_TIMEOUT:g} s of rollouts: does put keep each fresh group?")
            await asyncio.sleep(0.05)
        stop.set()
        return await asyncio.wait_for(loop, TIMEOUT)

    rollouts = asyncio.run(scenario())
    assert rollouts >= 2, (
        f"the buffer held at least 8 groups, yet the rollout loop made only {rollouts!r} rollouts of 4 groups: put "
        "keeps each group it accepts once, at the end of self.groups")
    assert actors.buffer.waiting.call_one().get(timeout=TIMEOUT) == 4 * rollouts, (
        "each finished rollout puts its 4 scored groups into the buffer; the loop returns how many it made"
    )
    queued = actors.queue.rollouts_queued.call_one().get(timeout=TIMEOUT)
    assert queued == rollouts, (
        f"{queued} rollouts were queued, {rollouts} counted: the rollout in flight when stop was set is finished "
        "(scored into the buffer), never left half done")
    groups = [g for _ in range(2) for g in actors.generators[0].generate.call_one().get(timeout=TIMEOUT)]
    assert len({tuple(g.state.tolist()) for g in groups}) == len(groups), (
        "two rollouts drew the same states: the generator's random stream is seeded once, not at every rollout")


def test_a_rollout_in_flight_when_stop_is_set_is_finished_queued_and_counted(chapter):
    """The given loop, on stand-ins: stop is set while the third rollout is being generated. That rollout is
    finished (queued, scored) and counted; no fourth one starts."""
    from koans.testkit.testing import StandIn

    stop, made = asyncio.Event(), []

    def generate():
        made.append(len(made) + 1)
        if len(made) == 3:
            stop.set()  # the training loop finished while this rollout was being generated
        return [f"groups of rollout {len(made)}"]

    generator, queue, scorer = StandIn(generate=generate), StandIn(put=lambda groups: None), StandIn(score_next=dict)
    rollouts = asyncio.run(chapter.continuous_rollouts(generator, queue, scorer, stop))
    queued = [args[0] for args in queue.put.calls]
    assert len(made) == 3, f"{len(made)} rollouts were generated: none starts once stop is set"
    assert queued == [["groups of rollout 1"], ["groups of rollout 2"], ["groups of rollout 3"]], (
        f"queued {queued}: the rollout in flight when stop was set is finished and queued, not dropped")
    assert len(scorer.score_next.calls) == 3 and rollouts == 3, (
        f"{len(scorer.score_next.calls)} scored, {rollouts} counted, for 3 generated: every rollout generated is "
        "scored into the buffer and counted in what the loop returns")


# --- Both loops together, on real actors ---------------------------------------------------------


@pytest.mark.todo("continuous_training")
def test_rollouts_go_on_while_the_learner_trains(plumbing, make_actors):
    """Each training step waits (a bounded while) for a rollout to be queued before it ends. Loops that
    run at once give it one at every step; loops in lock step cannot, and the step says so."""
    actors = make_actors(watchful=True)
    run = asyncio.run(plumbing.run_async(actors, steps=6, batch_groups=4, timeout=STARTUP_TIMEOUT * 3))
    assert [r["version"] for r in run["results"]] == list(range(1, 7)), (
        f"the six training steps answered versions {[r['version'] for r in run['results']]}, not 1 to 6: "
        "continuous_training runs exactly `steps` steps and returns every train result, in order")
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
    assert sorted(trained_in_steps) == sorted(ledger.trained) and len(trained_in_steps) == 10 * 4, (
        f"the steps trained {len(trained_in_steps)} groups and ledger.trained lists {len(ledger.trained)}; expected "
        "the same 40 ids in both: 10 steps of 4 groups each (a None sample is no step), and sample records in "
        "ledger.trained exactly the groups it hands out")
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
