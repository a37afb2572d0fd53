"""Chapter 02: actor meshes and adverbs. Run: pytest tests/test_ch02_actor_mesh.py"""

import os
import time

import pytest
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError  # not re-exported in 0.7

from koans import harness
from koans.testing import TIMEOUT

NUMBERS = list(range(1, 101))


def squares(numbers):
    return sum(x * x for x in numbers)


@pytest.fixture
def procs(shared_procs):
    return shared_procs(procs=4)


@pytest.fixture
def workers(chapter, procs):
    """A fresh mesh of 4 Workers (one per process) for each test."""
    return chapter.spawn_workers(procs)


@pytest.mark.todo("Worker.whoami")
def test_call_reaches_every_actor_in_its_own_process(workers):
    replies = workers.whoami.call().get(timeout=TIMEOUT)
    assert len(replies) == 4, "call() answers with one value per actor"
    pids = {me["pid"] for me in replies.values()}
    assert len(pids) == 4 and os.getpid() not in pids, f"expected 4 distinct worker processes, got pids {pids}"


@pytest.mark.todo("Worker.whoami")
def test_each_actor_knows_its_own_coordinates(workers):
    for point, me in workers.whoami.call().get(timeout=TIMEOUT).items():
        assert me["spawn_coords"] == dict(point), f"the actor at {dict(point)} reported {me['spawn_coords']}"
        assert me["message_coords"] == dict(point), "a message to the whole mesh sees the actor where it was spawned"
        assert me["message_size"] == {"procs": 4}


@pytest.mark.todo("Worker.whoami")
def test_a_slice_renumbers_the_message_not_the_actor(workers):
    view = workers.slice(procs=slice(2, 4))
    replies = sorted(view.whoami.call().get(timeout=TIMEOUT).values(), key=lambda me: me["spawn_coords"]["procs"])
    assert [me["spawn_coords"] for me in replies] == [{"procs": 2}, {"procs": 3}]
    assert [me["message_coords"] for me in replies] == [{"procs": 0}, {"procs": 1}], (
        "current_rank() is the message's view: through a 2-actor slice the ranks are 0 and 1"
    )
    assert all(me["message_size"] == {"procs": 2} for me in replies)


@pytest.mark.todo("Worker.whoami")
def test_call_one_needs_exactly_one_actor(workers):
    me = workers.slice(procs=3).whoami.call_one().get(timeout=TIMEOUT)
    assert me["spawn_coords"] == {"procs": 3}
    with pytest.raises(ValueError, match="exactly 1 actor"):
        workers.whoami.call_one()


@pytest.mark.todo("Worker.add")
def test_state_belongs_to_one_actor(workers):
    assert workers.slice(procs=1).add.call_one(5).get(timeout=TIMEOUT) == 5
    tallies = workers.add.call(0).get(timeout=TIMEOUT)
    assert [tallies.item(procs=r) for r in range(4)] == [0, 5, 0, 0], "only the actor at procs=1 got the 5"


@pytest.mark.todo("Worker.add")
def test_broadcast_returns_nothing_yet_arrives_before_later_messages(workers):
    assert workers.add.broadcast(3) is None, "broadcast() is fire-and-forget"
    # Messages from one sender to one actor arrive in the order they were sent,
    # so this call sees the broadcast's effect without any waiting.
    tallies = workers.add.call(0).get(timeout=TIMEOUT)
    assert list(tallies.values()) == [3, 3, 3, 3]


@pytest.mark.todo("Worker.add")
def test_choose_sends_each_message_to_exactly_one_actor(workers):
    replies = [workers.add.choose(1).get(timeout=TIMEOUT) for _ in range(12)]
    tallies = list(workers.add.call(0).get(timeout=TIMEOUT).values())
    assert sum(tallies) == 12, f"12 messages of +1 should add 12 in total, not {sum(tallies)}: tallies {tallies}"
    assert all(1 <= reply <= 12 for reply in replies)


@pytest.mark.todo("Worker.add", "Worker.whoami")
def test_a_crashed_process_fails_its_caller_and_spares_the_others(chapter, fresh_procs):
    pair = chapter.spawn_workers(fresh_procs(procs=2))
    assert len(pair.whoami.call().get(timeout=TIMEOUT)) == 2
    faults_before = len(harness.recorded_faults)

    with pytest.raises(SupervisionError):
        pair.slice(procs=1).crash.call_one().get(timeout=TIMEOUT)

    survivor = pair.slice(procs=0)
    assert survivor.add.call_one(2).get(timeout=TIMEOUT) == 2, "the other process is untouched by the crash"
    assert survivor.whoami.call_one().get(timeout=TIMEOUT)["spawn_coords"] == {"procs": 0}
    deadline = time.monotonic() + TIMEOUT
    while len(harness.recorded_faults) == faults_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(harness.recorded_faults) > faults_before, "the crash reached the fault hook, which recorded it"


@pytest.mark.todo("Worker.sum_my_share")
def test_each_rank_does_its_own_share_of_the_work(workers):
    parts = workers.sum_my_share.call(NUMBERS).get(timeout=TIMEOUT)
    for point, part in parts.items():
        assert part == squares(NUMBERS[point.rank :: 4]), f"rank {point.rank} should sum squares of numbers[{point.rank}::4]"


@pytest.mark.todo("Worker.sum_my_share")
def test_a_slice_shares_the_work_among_its_own_actors(workers):
    view = workers.slice(procs=slice(1, 4))
    parts = sorted(view.sum_my_share.call(NUMBERS).get(timeout=TIMEOUT).items(), key=lambda kv: kv[0].rank)
    assert [part for _, part in parts] == [squares(NUMBERS[r::3]) for r in range(3)], (
        "through a 3-actor slice, shares are numbers[rank::3] with the message's rank"
    )


@pytest.mark.todo("sum_of_squares", "Worker.sum_my_share")
def test_sum_of_squares_combines_the_value_mesh(chapter, workers):
    assert chapter.sum_of_squares(workers, NUMBERS, TIMEOUT) == squares(NUMBERS)
    assert chapter.sum_of_squares(workers.slice(procs=slice(0, 3)), NUMBERS, TIMEOUT) == squares(NUMBERS)
    assert chapter.sum_of_squares(workers, [], TIMEOUT) == 0


@pytest.mark.todo("sum_of_squares")
def test_sum_of_squares_waits_at_most_its_timeout(chapter, plumbing, fresh_procs):
    stuck = fresh_procs(procs=1).spawn("stuck_workers", plumbing.SlowWorker, 1.5)
    with pytest.raises(TimeoutError):  # a worker that never answers in time must not hang the caller
        chapter.sum_of_squares(stuck, [1, 2, 3], timeout=0.5)


@pytest.mark.todo("Worker.whoami")
def test_spawning_on_a_slice_of_the_proc_mesh_uses_only_those_processes(chapter, procs, workers):
    everyone = workers.whoami.call().get(timeout=TIMEOUT)
    pair = chapter.spawn_workers(procs.slice(procs=slice(0, 2)))
    replies = pair.whoami.call().get(timeout=TIMEOUT)
    assert sorted(me["spawn_coords"]["procs"] for me in replies.values()) == [0, 1]
    assert {me["pid"] for me in replies.values()} == {everyone.item(procs=r)["pid"] for r in (0, 1)}
