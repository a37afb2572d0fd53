"""Chapter 02: actor meshes and adverbs. Run: pytest tests/test_ch02_actor_mesh.py"""

import os
import time
import types

import pytest
from monarch.actor import ActorError

from koans.testkit import processes
from koans.testkit.monarch_compat import SupervisionError
from koans.testkit.testing import TIMEOUT

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


# --- TODO 1: Worker.whoami -------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - the reply holds spawn_coords, message_coords, message_size and pid, each coordinate a plain dict
#       -> test_each_actor_knows_its_own_coordinates
#   - pid is the actor's own process: one per actor of the mesh
#       -> test_call_reaches_every_actor_in_its_own_process
#   - spawn_coords is where the actor was spawned, whatever view the message comes through
#       -> test_a_slice_renumbers_the_message_not_the_actor, test_spawning_on_a_slice_of_the_proc_mesh_uses_only_those_processes
#   - message_coords and message_size are the message's view: a slice renumbers them (a dimension of size 1 stays;
#     one actor picked by index leaves none: {} and {})
#       -> test_a_slice_renumbers_the_message_not_the_actor, test_call_one_needs_exactly_one_actor
#   - on a mesh of two dimensions both name every dimension
#       -> test_coordinates_and_size_name_every_dimension_of_a_two_dimensional_mesh


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
        assert me["message_size"] == {"procs": 4}, (
            f"message_size {me['message_size']!r}: a plain dict naming every dimension of the message's mesh")


@pytest.mark.todo("Worker.whoami")
def test_a_slice_renumbers_the_message_not_the_actor(workers):
    view = workers.slice(procs=slice(2, 4))
    replies = sorted(view.whoami.call().get(timeout=TIMEOUT).values(), key=lambda me: me["spawn_coords"]["procs"])
    assert [me["spawn_coords"] for me in replies] == [{"procs": 2}, {"procs": 3}], (
        f"through the slice procs=2..3, spawn_coords were {[me['spawn_coords'] for me in replies]}: they stay "
        "{'procs': 2} and {'procs': 3}, where the actors were spawned (kept from __init__), whatever the message's view")
    assert [me["message_coords"] for me in replies] == [{"procs": 0}, {"procs": 1}], (
        "current_rank() is the message's view: through a 2-actor slice the ranks are 0 and 1"
    )
    assert all(me["message_size"] == {"procs": 2} for me in replies), (
        f"through the 2-actor slice procs=2..3, message_size was {[me['message_size'] for me in replies]!r}: it is the "
        "message's view, {'procs': 2} through this slice, not the size of the mesh the actors were spawned on")
    alone = workers.slice(procs=slice(3, 4)).whoami.call_one().get(timeout=TIMEOUT)
    assert (alone["message_coords"], alone["message_size"]) == ({"procs": 0}, {"procs": 1}), (
        f"through a one-actor slice the message sees {alone['message_coords']} of {alone['message_size']}: a "
        "dimension of size 1 is still a dimension, reported as it is")


@pytest.mark.todo("Worker.whoami")
def test_coordinates_and_size_name_every_dimension_of_a_two_dimensional_mesh(workers):
    grid = workers.split(procs=("rows", "cols"), cols=2)
    replies = grid.whoami.call().get(timeout=TIMEOUT)
    for point, me in replies.items():
        assert me["message_coords"] == dict(point), f"the actor at {dict(point)} saw the message at {me['message_coords']}"
        assert me["message_size"] == {"rows": 2, "cols": 2}, (
            f"on a 2x2 mesh the message's size is {{'rows': 2, 'cols': 2}}, got {me['message_size']}: report every "
            "dimension, not one of them")


@pytest.mark.todo("Worker.whoami")
def test_call_one_needs_exactly_one_actor(workers):
    me = workers.slice(procs=3).whoami.call_one().get(timeout=TIMEOUT)
    assert me["spawn_coords"] == {"procs": 3}, (
        f"through workers.slice(procs=3) the actor spawned at procs=3 reported spawn_coords {me['spawn_coords']!r}: "
        "spawn_coords is where the actor was spawned (kept from __init__), whatever view the message comes through")
    assert (me["message_coords"], me["message_size"]) == ({}, {}), (
        f"through workers.slice(procs=3), one actor picked by index, the message saw {me['message_coords']} of "
        f"{me['message_size']}: that view has no dimension left, so current_rank() and current_size() are empty "
        "({} and {}). Report them as they are, even when empty")
    with pytest.raises(ValueError, match="exactly 1 actor"):
        workers.whoami.call_one()


# --- TODO 2: Worker.add ----------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - adds `amount` (a negative one too) to this actor's tally and answers the new tally
#       -> test_state_belongs_to_one_actor
#   - the tally is the actor's own (broadcast, choose and call each reach the right ones)
#       -> test_broadcast_returns_nothing_yet_arrives_before_later_messages, test_choose_sends_each_message_to_exactly_one_actor
#   - a crashed process fails its caller; the others keep their state
#       -> test_a_crashed_process_fails_its_caller_and_spares_the_others


@pytest.mark.todo("Worker.add")
def test_state_belongs_to_one_actor(workers):
    first = workers.slice(procs=1).add.call_one(5).get(timeout=TIMEOUT)
    assert first == 5, (
        f"add(5) on a fresh actor answered {first!r}, expected 5: add the amount to self.tally, then answer the new "
        "tally" + (" (0 is the tally from before this add)" if first == 0 else ""))
    tallies = workers.add.call(0).get(timeout=TIMEOUT)
    got = [tallies.item(procs=r) for r in range(4)]
    assert got == [0, 5, 0, 0], (
        f"after add(5) at procs=1, add(0) on every actor answered {got}, not [0, 5, 0, 0]: only the actor at procs=1 "
        "got the 5, and it keeps it. add adds the amount to the tally the actor keeps (never replaces it), and "
        "answers that tally, not the amount")
    assert workers.slice(procs=2).add.call_one(-7).get(timeout=TIMEOUT) == -7, "an amount may be negative: 0 - 7"


@pytest.mark.todo("Worker.add")
def test_broadcast_returns_nothing_yet_arrives_before_later_messages(workers):
    assert workers.add.broadcast(3) is None, "broadcast() is fire-and-forget"
    # Messages from one sender to one actor arrive in the order they were sent,
    # so this call sees the broadcast's effect without any waiting.
    tallies = workers.add.call(0).get(timeout=TIMEOUT)
    assert list(tallies.values()) == [3, 3, 3, 3], (
        f"after broadcast add(3) to the 4 workers, add(0) on each answered {list(tallies.values())!r}, not "
        "[3, 3, 3, 3]: add adds the amount to the tally the actor keeps (never replaces it) and answers that tally")


@pytest.mark.todo("Worker.add")
def test_choose_sends_each_message_to_exactly_one_actor(workers):
    replies = [workers.add.choose(1).get(timeout=TIMEOUT) for _ in range(12)]
    tallies = list(workers.add.call(0).get(timeout=TIMEOUT).values())
    assert sum(tallies) == 12, f"12 messages of +1 should add 12 in total, not {sum(tallies)}: tallies {tallies}"
    assert all(1 <= reply <= 12 for reply in replies), (
        f"choose(1), sent 12 times, answered {replies!r}: each answer is the chosen actor's new tally after adding 1, "
        "so between 1 and 12")


@pytest.mark.todo("Worker.add", "Worker.whoami")
def test_a_crashed_process_fails_its_caller_and_spares_the_others(chapter, fresh_procs):
    pair = chapter.spawn_workers(fresh_procs(procs=2))
    assert len(pair.whoami.call().get(timeout=TIMEOUT)) == 2, (
        "whoami.call() on a fresh mesh of 2 workers did not answer once per actor: call() reaches every actor, and "
        "its ValueMesh holds one reply for each of the 2")
    faults_before = len(processes.recorded_faults)

    with pytest.raises(SupervisionError):
        pair.slice(procs=1).crash.call_one().get(timeout=TIMEOUT)

    survivor = pair.slice(procs=0)
    assert survivor.add.call_one(2).get(timeout=TIMEOUT) == 2, "the other process is untouched by the crash"
    assert survivor.whoami.call_one().get(timeout=TIMEOUT)["spawn_coords"] == {"procs": 0}, (
        "after its neighbour's process crashed, the actor at procs=0 did not report spawn_coords {'procs': 0}: "
        "spawn_coords is where the actor was spawned (kept from __init__), whatever view the message comes through")
    deadline = time.monotonic() + TIMEOUT
    while len(processes.recorded_faults) == faults_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(processes.recorded_faults) > faults_before, "the crash reached the fault hook, which recorded it"


# --- TODO 3: Worker.sum_my_share -------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - sums the squares of numbers[rank::size], rank and size as the message sees them
#       -> test_each_rank_does_its_own_share_of_the_work
#   - through a slice the shares split among the slice's own actors (one actor picked by index: size 1, the whole list)
#       -> test_a_slice_shares_the_work_among_its_own_actors
#   - size is the product of every dimension (not one of them, not their sum): on 2-D meshes and their slices the shares cover the list exactly once
#       -> test_shares_cover_the_list_exactly_once_on_a_mesh_of_two_dimensions


def _share_it_summed(part, rank, size):
    """Name the share a wrong sum matches, when one does: e.g. len(current_size()) cuts with a size of 1."""
    for k in range(1, 9):
        for r in range(k):
            if part == squares(NUMBERS[r::k]) and (r, k) != (rank, size):
                if k != size:
                    return (f" (its sum is that of numbers[{r}::{k}]: it took the size as {k}, "
                            f"where the mesh holds {size})")
                return f" (its sum is that of numbers[{r}::{k}], rank {r}'s share: it started at the wrong place)"
    return ""


@pytest.mark.todo("Worker.sum_my_share")
def test_each_rank_does_its_own_share_of_the_work(workers):
    parts = workers.sum_my_share.call(NUMBERS).get(timeout=TIMEOUT)
    for point, part in parts.items():
        assert part == squares(NUMBERS[point.rank :: 4]), (
            f"rank {point.rank} should sum squares of numbers[{point.rank}::4]"
            + _share_it_summed(part, point.rank, size=4))


@pytest.mark.todo("Worker.sum_my_share")
def test_a_slice_shares_the_work_among_its_own_actors(workers):
    view = workers.slice(procs=slice(1, 4))
    parts = sorted(view.sum_my_share.call(NUMBERS).get(timeout=TIMEOUT).items(), key=lambda kv: kv[0].rank)
    assert [part for _, part in parts] == [squares(NUMBERS[r::3]) for r in range(3)], (
        "through a 3-actor slice, shares are numbers[rank::3] with the message's rank"
    )
    try:
        whole = workers.slice(procs=2).sum_my_share.call_one(NUMBERS).get(timeout=TIMEOUT)
    except ActorError as error:
        pytest.fail(f"sum_my_share failed through workers.slice(procs=2): {str(error)[-300:]}\nOne actor picked by "
                    "index is a view with no dimension left: current_size() is {}, and the product of no sizes is 1")
    assert whole == squares(NUMBERS), (
        f"through workers.slice(procs=2), one actor picked by index, the share summed to {whole}: that view has no "
        "dimension left, so the size is 1 (the product of no sizes) and the rank 0: the share is the whole list")


def shares_on(view):
    """Each actor's share through `view`, by its flat message rank; an ActorError's cause in words."""
    try:
        parts = view.sum_my_share.call(NUMBERS).get(timeout=TIMEOUT)
    except ActorError as error:
        pytest.fail(f"sum_my_share failed on a mesh of dimensions {dict(view.sizes)}: {str(error)[-300:]}\n"
                    "A mesh can have any dimensions, not just 'procs': the message's size is the product of all "
                    "of them, and its rank the flat rank over all of them (current_rank().rank)")
    return {point.rank: part for point, part in parts.items()}


@pytest.mark.todo("Worker.sum_my_share")
@pytest.mark.parametrize("shape", [{"rows": 2, "cols": 2}, {"rows": 4, "cols": 1}], ids=["2x2", "4x1"])
def test_shares_cover_the_list_exactly_once_on_a_mesh_of_two_dimensions(workers, shape):
    grid = workers.split(procs=("rows", "cols"), cols=shape["cols"])
    assert dict(grid.sizes) == shape, (
        f"the test's set-up split the 4 workers into dimensions {dict(grid.sizes)!r}, not {shape!r}: that is "
        "Monarch's split, and runs none of your endpoints")
    size = shape["rows"] * shape["cols"]
    parts = shares_on(grid)
    assert parts == {rank: squares(NUMBERS[rank::size]) for rank in range(size)}, (
        f"on a {shape['rows']}x{shape['cols']} mesh each of the {size} actors sums numbers[rank::{size}]: the size "
        "is the product of the dimensions (not their sum, not one of them), so the shares cover the list once")
    rows = grid.slice(rows=slice(0, 2))  # a slice that keeps both dimensions
    parts = shares_on(rows)
    count = 2 * shape["cols"]
    assert sum(parts.values()) == squares(NUMBERS) and len(parts) == count, (
        f"through a {dict(rows.sizes)} slice the {count} actors' shares should add up to the whole list's sum")


# --- TODO 4: sum_of_squares ------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - calls every worker of the mesh or slice it is given (of any dimensions) and adds all their values, an exact int
#       -> test_sum_of_squares_combines_the_value_mesh
#   - an empty list sums to 0
#       -> test_sum_of_squares_combines_the_value_mesh
#   - waits at most the caller's `timeout`: a worker that never answers raises TimeoutError
#       -> test_sum_of_squares_waits_at_most_its_timeout


@pytest.mark.todo("sum_of_squares", "Worker.sum_my_share")
def test_sum_of_squares_combines_the_value_mesh(chapter, workers):
    grid = workers.split(procs=("rows", "cols"), cols=2)
    for mesh, size in (workers, 4), (workers.slice(procs=slice(0, 3)), 3), (grid, 4):
        try:
            total = chapter.sum_of_squares(mesh, NUMBERS, TIMEOUT)
        except (KeyError, TypeError, ValueError) as error:
            pytest.fail(f"sum_of_squares on a mesh of dimensions {dict(mesh.sizes)} raised {error!r}: a mesh may have "
                        "any dimensions; add up the ValueMesh's values, whatever their coordinates")
        one_share = " (that is one worker's share: call every worker, and add every value)" \
            if total in [squares(NUMBERS[rank::size]) for rank in range(size)] else ""
        assert total == squares(NUMBERS), (
            f"sum_of_squares over {size} workers ({dict(mesh.sizes)}) of 1..100 gave {total!r}, not "
            f"{squares(NUMBERS)}{one_share}")
    assert chapter.sum_of_squares(workers, [], TIMEOUT) == 0, (
        "sum_of_squares(workers, []) did not answer 0: an empty list sums to 0 (every worker's share is empty)")
    big = [2**31 + 1, 3, 2**30]
    total = chapter.sum_of_squares(workers, big, TIMEOUT)
    assert type(total) is int and total == squares(big), (
        f"sum_of_squares({big}) gave {total!r}: the answer is an int, exact (a float sum rounds beyond 2**53)")


@pytest.mark.todo("sum_of_squares")
def test_sum_of_squares_waits_at_most_its_timeout(chapter, plumbing, fresh_procs):
    class NeverAnswers:  # stands in for the call and its future: records each wait, then gives up
        waits: list = []

        def call(self, numbers):
            return self

        def get(self, timeout=None):
            self.waits.append(timeout)
            raise TimeoutError(f"no answer in {timeout} s")

    with pytest.raises(TimeoutError):
        chapter.sum_of_squares(types.SimpleNamespace(sum_my_share=NeverAnswers()), [1, 2, 3], timeout=0.5)
    assert NeverAnswers.waits == [0.5], (
        f"waits {NeverAnswers.waits}, the caller gave timeout=0.5: one wait, of the caller's timeout (pass it on), "
        "then the TimeoutError goes to the caller (a second try would hold the caller past its timeout)")
    stuck = fresh_procs(procs=1).spawn("stuck_workers", plumbing.SlowWorker, 1.5)
    with pytest.raises(TimeoutError):  # a worker that never answers in time must not hang the caller
        chapter.sum_of_squares(stuck, [1, 2, 3], timeout=0.5)


@pytest.mark.todo("Worker.whoami")
def test_spawning_on_a_slice_of_the_proc_mesh_uses_only_those_processes(chapter, procs, workers):
    everyone = workers.whoami.call().get(timeout=TIMEOUT)
    pair = chapter.spawn_workers(procs.slice(procs=slice(0, 2)))
    replies = pair.whoami.call().get(timeout=TIMEOUT)
    assert sorted(me["spawn_coords"]["procs"] for me in replies.values()) == [0, 1], (
        f"workers spawned on procs.slice(procs=slice(0, 2)) reported spawn_coords "
        f"{[me['spawn_coords'] for me in replies.values()]!r}: spawn_coords is each actor's place in the mesh it was "
        "spawned on, here procs 0 and 1")
    assert {me["pid"] for me in replies.values()} == {everyone.item(procs=r)["pid"] for r in (0, 1)}, (
        f"workers spawned on processes 0 and 1 reported pids {[me['pid'] for me in replies.values()]!r}, but "
        f"the workers already there reported {[everyone.item(procs=r)['pid'] for r in (0, 1)]!r}: pid is the "
        "actor's own process, so actors on the same processes report the same pids")
