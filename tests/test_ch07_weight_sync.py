"""Chapter 07: weight sync without process groups. Run: pytest tests/test_ch07_weight_sync.py"""

import asyncio
import os
import time
import types
import warnings

import pytest
import torch
from monarch.actor import this_proc

from koans.testkit.testing import (NEVER, STARTUP_TIMEOUT, TIMEOUT, AwaitedStandIn, StandIn, StuckForever,
                           run_on_virtual_clock, starts_apart)

TRANSPORTS = ["shm", "rdma"]


def ask(endpoint, *args, timeout=TIMEOUT):
    return endpoint.call_one(*args).get(timeout=timeout)


@pytest.fixture
def procs(shared_procs):
    """Shared across tests; replaced by a fresh mesh if an earlier test broke it. The trainer's
    side (store, trainer) goes on procs=0, the generators on procs=1."""
    return shared_procs(procs=2)


@pytest.fixture
def store_here(chapter, test_tag):
    """Factory: a WeightStore in this process, registered with `slots` slots (no trainer needed)."""

    def make(slots=2, lease_timeout_s=120.0):
        store = this_proc().spawn(f"store_{test_tag}_{slots}_{lease_timeout_s}", chapter.WeightStore, lease_timeout_s)
        ask(store.register, None, [{} for _ in range(slots)])
        return store

    return make


@pytest.fixture
def weight_sync(chapter, plumbing, procs, test_tag):
    """Factory: a store and a trainer on procs=0, generators on procs=1.

    Every trainer made here is closed at teardown, which removes its
    shared-memory slot files; the test checks that they are gone.
    """
    made, tag = [], test_tag

    def make(recipe="mlp", trainer_dtype=torch.float32, generators=(("shm", torch.float32),), rdma_chunk_bytes=256,
             lease_timeout_s=120.0):
        index = len(made)
        on_trainer = procs.slice(procs=0)
        store = on_trainer.spawn(f"store_{tag}_{index}", chapter.WeightStore, lease_timeout_s)
        trainer = on_trainer.spawn(f"trainer_{tag}_{index}", plumbing.PolicyTrainer, store, recipe, trainer_dtype,
                                   "auto", rdma_chunk_bytes)
        gens = [
            procs.slice(procs=1).spawn(f"gen{n}_{tag}_{index}", plumbing.PolicyGenerator, store, recipe, dtype, transport)
            for n, (transport, dtype) in enumerate(generators)
        ]
        made.append(trainer)
        return store, trainer, gens

    yield make
    for trainer in made:
        try:
            paths = ask(trainer.publisher_stats, timeout=STARTUP_TIMEOUT)["shm_paths"]
            ask(trainer.close)
        except Exception:
            continue  # this trainer never started (the test has already failed and said why)
        assert not any(os.path.exists(p) for p in paths if p), "close() must remove the shared-memory slot files"


def step_and_commit(plumbing, aio, store, trainer):
    """One trainer step; wait until its version (if published) is committed."""
    version = ask(trainer.step, timeout=STARTUP_TIMEOUT)
    if version is not None:
        aio.run(plumbing.wait_for_version(store, version, timeout=TIMEOUT))
    return version


def hold_reader_halfway(gen, gate):
    """Start a sync that stops halfway through its load; return its future once it is there."""
    sync = gen.sync.call_one(gate)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while ask(gate.count) == 0:
        assert time.monotonic() < deadline, "the reader never reached the halfway point"
        time.sleep(0.01)
    return sync


# --- TODO 1: WeightStore.claim ---
# Contract, clause by clause (the test that holds each):
#   1. each free slot is handed out once, marked as being written; none free: None, counted in
#      counts["skipped_claims"]                                   -> test_claim_hands_out_each_free_slot_once_then_skips
#   2. never the latest version's slot                            -> test_claim_never_answers_the_slot_of_the_latest_version
#   3. never a slot under a live lease                            -> test_claim_never_answers_a_slot_a_reader_holds
#   4. a lease older than lease_timeout_s is dropped and counted (expired_leases) before the busy slots
#      are worked out, so it blocks nothing; its reader learns it from release
#                                                                 -> test_a_lease_older_than_the_timeout_is_dropped_at_the_next_claim
#   5. every claim drops the leases that expired by then, a free slot or not, and the count runs on
#                                                                 -> test_every_claim_drops_the_leases_expired_by_then
#   6. an expired lease is dropped alone: another reader's live lease on the same slot still holds it
#                                                                 -> test_an_expired_lease_takes_no_live_lease_with_it
#   7. "older than": a lease exactly lease_timeout_s old still holds
#                                                                 -> test_a_lease_exactly_the_timeout_old_still_holds


@pytest.mark.todo("WeightStore.claim")
def test_claim_hands_out_each_free_slot_once_then_skips(store_here):
    store = store_here(slots=2)
    first, second, third = ask(store.claim), ask(store.claim), ask(store.claim)
    assert {first, second} == {0, 1}, (
        f"three claims on two free slots answered {[first, second, third]}: each free slot goes out once; a slot "
        "handed out is being written, so it is not free for the next claim")
    assert third is None, "both slots are being written: nothing is free, the trainer skips"
    assert ask(store.claim) is None, "a fourth claim: still nothing free"
    stats = ask(store.stats)
    assert (stats["writing"], stats["skipped_claims"]) == (2, 2), (
        f"after four claims on two slots: writing {stats['writing']}, skipped_claims {stats['skipped_claims']}; "
        "expected 2 and 2: each slot handed out is marked as being written, and each None adds one skipped claim")


@pytest.mark.todo("WeightStore.claim")
@pytest.mark.hint(3)
def test_claim_never_answers_the_slot_of_the_latest_version(store_here):
    store = store_here(slots=2)
    slot = ask(store.claim)
    ask(store.commit, slot, 1, time.time())
    assert [ask(store.claim) for _ in range(2)] == [1 - slot, None], "the latest version's slot stays untouched"


@pytest.mark.todo("WeightStore.claim")
@pytest.mark.hint(3)
def test_claim_never_answers_a_slot_a_reader_holds(store_here):
    store = store_here(slots=3)
    for version in (1, 2):  # v1 lands in one slot, v2 in another
        ask(store.commit, ask(store.claim), version, time.time())
    lease = ask(store.acquire, 0)  # a reader on v2
    ask(store.commit, ask(store.claim), 3, time.time())  # v3 into the third slot: now v2's slot is leased, not latest
    claimed = ask(store.claim)
    expired = ask(store.stats).get("expired_leases", 0)
    assert claimed != lease.slot, (
        f"claim answered slot {claimed}, where v2's reader holds a lease taken a moment ago: "
        + (f"that lease was dropped as expired (expired_leases {expired}), though it is far younger than "
           "lease_timeout_s: a lease's age is now minus when it was taken, on the clock acquire stamps it with "
           "(time.monotonic(), not time.time())" if expired else
           "a slot under a lease is needed by its reader; answer another slot"))
    assert ask(store.stats)["skipped_claims"] == 0, (
        "the store counted a skipped claim, though every claim in this test had a free slot (one neither the latest "
        "version's, nor being written, nor under a lease) among its 3 slots: look at every slot, "
        "0 to len(self.offers) - 1, answer such a slot, and count skipped_claims only when answering None")
    ask(store.release, lease.lease)


@pytest.mark.todo("WeightStore.claim")
@pytest.mark.hint(2)
def test_a_lease_older_than_the_timeout_is_dropped_at_the_next_claim(store_here):
    store = store_here(slots=2, lease_timeout_s=0.0)  # every lease is already too old at the next claim
    ask(store.commit, ask(store.claim), 1, time.time())
    slot = ask(store.claim)  # the trainer starts writing v2 into the other slot...
    held = ask(store.acquire, 0)  # ...while two readers take a lease on v1
    other = ask(store.acquire, 0)
    assert slot == 1 - held.slot, (
        f"with v1 in slot {held.slot}, the claim for v2 answered {slot!r}, not the other slot: the latest version's "
        "slot is never answered, and the other slot was free")
    ask(store.commit, slot, 2, time.time())
    claimed = ask(store.claim)
    if claimed != held.slot and ask(store.stats)["expired_leases"] == 2:
        pytest.fail(f"this claim dropped both expired leases, yet answered {claimed!r}: drop them first, then work "
                    "out which slots are busy")
    assert claimed == held.slot, (
        "v2 is latest, and v1's slot has only expired leases: this very claim drops them, and then the slot is free")
    stats = ask(store.stats)
    assert (stats["expired_leases"], stats["readers"]) == (2, 0), (
        f"{stats['expired_leases']} expired lease(s) counted, {stats['readers']} reader(s) left: both leases had "
        "expired, and each one dropped counts once")
    assert ask(store.release, held.lease) is False, "the reader learns, when it gives the lease back, that it had lost it"
    assert ask(store.release, other.lease) is False, (
        "the second reader's lease had expired too: the claim drops it, so its release answers False")


@pytest.mark.todo("WeightStore.claim")
@pytest.mark.hint(2)
def test_every_claim_drops_the_leases_expired_by_then(store_here):
    store = store_here(slots=3, lease_timeout_s=0.0)  # every lease is already too old at the next claim
    ask(store.commit, ask(store.claim), 1, time.time())
    counted, answers = [], []
    for _ in range(2):  # slots are free each time: the expired lease blocks nothing, yet it is dropped
        lease = ask(store.acquire, 0)
        assert ask(store.claim) is not None, (
            "claim answered None though a slot was free (neither the latest version's, nor being written): an expired "
            "lease blocks nothing, so the claim answers a free slot")
        counted.append(ask(store.stats)["expired_leases"])
        answers.append(ask(store.release, lease.lease))
    assert counted == [1, 2], (
        f"expired_leases read {counted} after two claims, each of which found one expired lease: every claim "
        "drops the leases that expired by then, even when a free slot needs none of that, and the count runs on "
        "(+1 each, never reset)")
    assert answers == [False, False], "each reader learns, when it gives its lease back, that it had lost it"


@pytest.mark.todo("WeightStore.claim")
@pytest.mark.hint(2)
def test_an_expired_lease_takes_no_live_lease_with_it(chapter):
    store = chapter.WeightStore.__new__(chapter.WeightStore)  # the endpoint's code alone, in this process
    chapter.WeightStore.__init__(store, 60.0)
    store.offers = [{}, {}, {}]
    now = time.monotonic()
    store.latest = (2, 0, time.time())  # v2 is latest, in slot 0
    store.leases = {1: (1, now - 120.0), 2: (1, now)}  # two readers on v1 in slot 1: one lost 2 minutes ago, one live
    claimed = chapter.WeightStore.__dict__["claim"]._method(store)
    assert claimed == 2, (
        f"claim answered {claimed!r}: slot 0 holds the latest version and slot 1 still has a live reader, so only "
        "slot 2 is free. An expired lease is dropped on its own; a live lease on the same slot keeps that slot")
    assert list(store.leases) == [2] and store.counts["expired_leases"] == 1, (
        f"leases left {sorted(store.leases)}, expired_leases {store.counts['expired_leases']}: only lease 1 had "
        "expired; drop it (and count it) alone")


@pytest.mark.todo("WeightStore.claim")
@pytest.mark.hint(2)
def test_a_lease_exactly_the_timeout_old_still_holds(chapter, monkeypatch):
    store = chapter.WeightStore.__new__(chapter.WeightStore)  # the endpoint's code alone, in this process
    chapter.WeightStore.__init__(store, 60.0)
    store.offers = [{}, {}, {}]
    store.latest = (2, 0, time.time())  # v2 is latest, in slot 0; a reader took v1 in slot 1 at t = 1000 s
    store.leases = {1: (1, 1000.0)}
    with monkeypatch.context() as frozen:
        frozen.setattr(time, "monotonic", lambda: 1060.0)  # the clock stands exactly 60 s after the lease
        claimed = chapter.WeightStore.__dict__["claim"]._method(store)
    assert (claimed, list(store.leases), store.counts["expired_leases"]) == (2, [1], 0), (
        f"claim answered {claimed!r}, leases left {sorted(store.leases)}, expired_leases "
        f"{store.counts['expired_leases']}: a lease exactly lease_timeout_s (60 s) old is not older than it, so it "
        "still holds slot 1 (lost only when older: >, not >=)")


# --- TODO 2: WeightPublisher.publish ---
# Contract, clause by clause (the test that holds each):
#   1. a claimed slot: staged and committed in order, version recorded and answered
#                                                                 -> test_published_versions_reach_the_store_in_order
#   2. no slot: count self.skipped, answer None at once, never wait for a reader, start nothing
#                                                                 -> test_publish_skips_instead_of_waiting_when_every_slot_is_busy,
#                                                                    test_publish_awaits_the_store_and_never_blocks_the_trainers_loop
#   3. the claim waits at most self.timeout; no answer by then raises TimeoutError (not a skip)
#                                                                 -> test_publish_waits_for_the_store_at_most_its_timeout
#   4. the claim is awaited, never waited on with a blocking .get() (the trainer's event loop runs on)
#                                                                 -> test_publish_awaits_the_store_and_never_blocks_the_trainers_loop
#   5. publish answers while the copy still runs; the commit comes when the copy is done
#                                                                 -> test_publish_returns_while_the_copy_still_runs
#   8. publish calls staging.start itself, on the caller's thread, before it answers
#                                                                 -> test_publish_starts_the_copy_itself_before_it_answers
#   6. a refused publish (version not newer, other shapes) changes nothing -> test_versions_only_increase
#   7. a skipped last version still goes out once a slot frees    -> test_a_last_version_skipped_for_busy_slots_still_goes_out


@pytest.mark.todo("WeightPublisher.publish")
def test_published_versions_reach_the_store_in_order(plumbing, weight_sync, aio):
    store, trainer, _ = weight_sync()
    versions = [step_and_commit(plumbing, aio, store, trainer) for _ in range(3)]
    assert versions == [1, 2, 3], "with no readers, every step publishes its own version"
    stats = ask(store.stats)
    assert (stats["latest_version"], stats["commits"], stats["writing"]) == (3, 3, 0), (
        f"after three published versions: latest_version {stats['latest_version']}, commits {stats['commits']}, "
        f"writing {stats['writing']}; expected 3, 3 and 0: each publish claims one slot, stages into it, and its "
        "commit frees it")


@pytest.mark.todo("WeightPublisher.publish")
@pytest.mark.hint(3)
def test_publish_skips_instead_of_waiting_when_every_slot_is_busy(chapter, plumbing, procs, aio):
    store = procs.slice(procs=0).spawn("store_skips", chapter.WeightStore)
    weights = {"w": torch.zeros(32)}
    publisher = chapter.WeightPublisher(weights, store, rdma_chunk_bytes=64)

    async def scenario():
        assert await publisher.publish(weights, version=1) == 1, (
            "the first publish, into a store with both slots free, did not answer version 1: a publish that gets a "
            "slot starts staging into it and answers the version")
        await plumbing.wait_for_version(store, 1, timeout=TIMEOUT)
        reader_of_v1 = await asyncio.wait_for(store.acquire.call_one(0), TIMEOUT)  # a reader holds v1's slot
        weights["w"].fill_(2.0)
        assert await publisher.publish(weights, version=2) == 2, "the other slot was free"
        await plumbing.wait_for_version(store, 2, timeout=TIMEOUT)
        weights["w"].fill_(3.0)
        before = asyncio.all_tasks()
        try:
            third = await asyncio.wait_for(publisher.publish(weights, version=3), TIMEOUT)
        except TimeoutError:
            pytest.fail("publish is still waiting for a free slot: when every slot is busy it must skip at once")
        assert third is None, (
            f"publish answered {third!r}: v1's slot has a reader and v2's is the latest, so publish must skip: answer "
            "None, not wait and not overwrite"
        )
        left_running = [t for t in asyncio.all_tasks() - before if not t.done()]
        assert not left_running, (
            f"a skipped publish left {len(left_running)} task(s) running: it answers None and starts nothing (a "
            "retry in the background is the trainer's choice, retry_until_free, not publish's)")
        assert publisher.skipped == 1 and publisher.version == 2, (
            f"publisher.skipped {publisher.skipped}, publisher.version {publisher.version}: expected 1 and 2; count "
            "each skip, and record each version published (not a skipped one) in self.version")
        await asyncio.wait_for(store.release.call_one(reader_of_v1.lease), TIMEOUT)
        assert await publisher.publish(weights, version=4) == 4, "once the lease is released the slot is free again"
        await plumbing.wait_for_version(store, 4, timeout=TIMEOUT)
        assert (await asyncio.wait_for(store.stats.call_one(), TIMEOUT))["skipped_claims"] == 1, (
            "the store should have counted exactly one skipped claim, v3's: either publish asked the store again "
            "after a None (a skip answers None at once), or claim did not count its None in skipped_claims")

    try:
        aio.run(scenario())
    finally:
        aio.run(publisher.close())


def gives_up_in_time(coroutine, limit_s=10.0) -> str:
    """Run `coroutine`: "gave up" if it raised TimeoutError itself, "answered" if it returned, and
    "still waiting" if it was still waiting after `limit_s`."""

    async def attempt() -> str:
        try:
            await coroutine
        except TimeoutError:
            return "gave up"
        return "answered"

    async def bounded() -> str:
        try:
            return await asyncio.wait_for(attempt(), limit_s)
        except TimeoutError:
            return "still waiting"

    return asyncio.run(bounded())


@pytest.mark.todo("WeightPublisher.publish")
@pytest.mark.hint(2)
def test_publish_waits_for_the_store_at_most_its_timeout(chapter):
    store = StandIn(register=lambda layout, offers: None, claim=NEVER)  # a store that never answers a claim
    publisher = chapter.WeightPublisher({"w": torch.zeros(8)}, store, timeout=0.2)
    try:
        outcome = gives_up_in_time(publisher.publish({"w": torch.zeros(8)}, version=1))
    finally:
        publisher.staging.close()
    assert outcome != "still waiting", (
        "publish on a store that never answers was still waiting: wait at most self.timeout")
    assert outcome == "gave up", ("publish on a store that never answers returned (a skip?): no answer in time is an "
                                  "error, so let the TimeoutError out; a skip is the store's answer None")


@pytest.mark.todo("WeightPublisher.publish")
@pytest.mark.hint(2)
def test_publish_awaits_the_store_and_never_blocks_the_trainers_loop(chapter):
    """A store whose calls can only be awaited. A blocking .get() on the claim would work on a real store (Monarch
    only warns), but it stops the trainer's whole event loop until the store answers."""
    store = AwaitedStandIn(register=lambda layout, offers: None, claim=lambda: None)  # every slot busy: a skip
    publisher = chapter.WeightPublisher({"w": torch.zeros(8)}, store, timeout=5.0)
    try:
        answer = run_on_virtual_clock(publisher.publish({"w": torch.zeros(8)}, version=1))
        again = run_on_virtual_clock(publisher.publish({"w": torch.zeros(8)}, version=2))
    finally:
        publisher.staging.close()
    assert (answer, again, publisher.skipped, len(store.claim.calls)) == (None, None, 2, 2), (
        f"two publishes on a store with no free slot: publish answered {answer!r} and {again!r}, with self.skipped "
        f"{publisher.skipped} after {len(store.claim.calls)} claim(s); expected None, None, 2 and 2 (one claim per "
        "publish; each skip answers None and adds one to self.skipped)")


@pytest.mark.todo("WeightPublisher.publish")
@pytest.mark.hint(3)
def test_publish_starts_the_copy_itself_before_it_answers(chapter):
    """staging.start is called by publish itself, on the trainer's thread, before publish answers: the trainer
    may change its weights right after wait_staged(), which only waits for a copy already started. A start
    handed to another thread could begin later, and copy weights that have moved on."""
    import threading

    store = AwaitedStandIn(register=lambda layout, offers: None, claim=lambda: 0)  # slot 0 is free
    publisher = chapter.WeightPublisher({"w": torch.zeros(8)}, store, timeout=5.0)
    publisher.staging.close()
    starts = []

    class Staging:  # stands in for the background copy: records where and when start was called
        offers = []

        def check_matches(self, state_dict):
            pass

        async def finish(self):
            pass

        def start(self, state_dict, slot, version):
            starts.append((threading.get_ident(), slot, version))

    publisher.staging = Staging()

    async def publish_then_look():
        answer = await publisher.publish({"w": torch.zeros(8)}, version=1)
        return answer, list(starts)

    answer, started_by_then = run_on_virtual_clock(publish_then_look())
    assert answer == 1, f"slot 0 was free, and publish answered {answer!r}: it answers the version it publishes"
    assert started_by_then == [(threading.get_ident(), 0, 1)], (
        f"when publish answered, the staging.start calls (thread, slot, version) were {started_by_then}; expected "
        f"one, from this thread ({threading.get_ident()}), for slot 0, version 1: call it in publish itself, a "
        "plain call on this thread, before answering. It returns at once "
        "(the copy runs in the background); handed to an executor it may start after wait_staged(), and copy "
        "weights the trainer has changed since")


@pytest.mark.todo("WeightPublisher.publish")
def test_publish_returns_while_the_copy_still_runs(chapter, plumbing, procs, monkeypatch, aio):
    """The copy into the slot is held at a gate: publish must answer anyway (the copy goes on in the
    background), and the version is committed only when the copy is done."""
    import importlib
    import threading

    transports = importlib.import_module(f"{chapter.__package__}.ch07_transports")
    gate, real_stage = threading.Event(), transports.stage

    def gated_stage(*args, **kwargs):
        gate.wait(STARTUP_TIMEOUT)
        return real_stage(*args, **kwargs)

    monkeypatch.setattr(transports, "stage", gated_stage)
    store = procs.slice(procs=0).spawn("store_gated", chapter.WeightStore)
    weights = {"w": torch.ones(8)}
    publisher = chapter.WeightPublisher(weights, store)

    async def scenario():
        try:
            answered = await asyncio.wait_for(publisher.publish(weights, version=1), 10)
        except TimeoutError:
            gate.set()
            pytest.fail("publish did not answer while the copy was held at a gate: staging.start is a plain call "
                        "that returns at once; do not wait for the copy to be done")
        committed_meanwhile = (await asyncio.wait_for(store.stats.call_one(), TIMEOUT))["latest_version"]
        gate.set()
        await plumbing.wait_for_version(store, 1, timeout=TIMEOUT)
        return answered, committed_meanwhile

    try:
        answered, committed_meanwhile = aio.run(scenario())
    finally:
        gate.set()
        aio.run(publisher.close())
    assert answered == 1, "publish answered the version at once, while the copy was still held"
    assert committed_meanwhile == 0, "the store learns of v1 only when its copy is done (staging commits it)"


@pytest.mark.todo("WeightPublisher.publish")
def test_versions_only_increase(chapter, procs, aio):
    store = procs.slice(procs=0).spawn("store_order", chapter.WeightStore)
    weights = {"w": torch.zeros(8)}
    publisher = chapter.WeightPublisher(weights, store)

    async def scenario():
        assert await publisher.publish(weights, version=5) == 5, (
            "the first publish (version 5, every slot free) did not answer 5: a publish that gets a slot answers the "
            "version it publishes")
        with pytest.raises(ValueError, match="only increase"):
            await publisher.publish(weights, version=5)
        with pytest.raises(ValueError, match="only increase"):
            await publisher.publish(weights, version=3)
        with pytest.raises(ValueError, match="new WeightPublisher"):
            await publisher.publish({"w": torch.zeros(9)}, version=6)
        assert await publisher.publish(weights, version=6) == 6, "a refused publish changes nothing"

    try:
        aio.run(scenario())
    finally:
        aio.run(publisher.close())


@pytest.mark.todo("WeightPublisher.publish", "WeightStore.claim")
def test_a_last_version_skipped_for_busy_slots_still_goes_out(plumbing, weight_sync, procs, aio):
    """Both slots held by readers: the trainer skips; then publish_until_out publishes once one frees."""
    store, trainer, _ = weight_sync()
    leases = []
    for _ in range(2):  # a reader on each of the two slots
        step_and_commit(plumbing, aio, store, trainer)
        leases.append(ask(store.acquire, 0))
    assert ask(trainer.step) is None, "no slot was free, so step 3 was skipped"
    waiting = trainer.publish_until_out.call_one()  # waits for a slot
    ask(store.release, leases[0].lease)  # the first reader finishes
    assert waiting.get(timeout=TIMEOUT) == 3, (
        "publish_until_out did not answer 3, the version skipped while both slots were busy: once a reader releases "
        "its slot, a claim answers that slot and the skipped version goes out")
    assert ask(store.stats)["latest_version"] == 3, "the skipped version went out once a slot was free"
    ask(store.release, leases[1].lease)


# --- TODO 3: SnapshotReader.pull_and_load ---
# Contract, clause by clause (the test that holds each):
#   1. asks for a version newer than ours; nothing newer: None, nothing loaded
#                                                                 -> test_after_a_sync_the_generator_is_bit_equal_to_the_published_version
#   2. a good load: weights bit-equal to the version, self.version recorded and answered (any transport, dtype)
#                                                                 -> test_after_a_sync_the_generator_is_bit_equal_to_the_published_version,
#                                                                    test_the_generator_may_hold_another_dtype, test_a_hugging_face_qwen2_in_bf16_with_tied_embeddings
#   3. the load runs under the lease, and the lease goes back whatever happens (an error too, a cancellation too)
#                                                                 -> test_the_trainer_keeps_stepping_while_a_slow_reader_holds_a_lease,
#                                                                    test_a_mismatched_generator_gets_a_clear_error_and_releases_its_lease,
#                                                                    test_a_pull_cancelled_in_the_middle_of_a_load_gives_its_lease_back
#   4. release answered False: count self.lost_leases and load again, never keep the torn load
#                                                                 -> test_a_reader_whose_lease_expired_never_keeps_a_torn_load
#   5. at most self.attempts loads per call, then RuntimeError; each lease given back
#                                                                 -> test_a_reader_that_keeps_losing_its_lease_gives_up_after_its_attempts,
#                                                                    test_each_call_gets_its_own_attempts
#   6. `halfway` goes to every load, a reload too                 -> test_every_load_gets_halfway_a_reload_too
#   7. acquire waits at most self.timeout                          -> test_pull_waits_for_the_store_at_most_its_timeout
#   8. release waits at most self.timeout too                      -> test_pull_waits_for_a_release_at_most_its_timeout
#   9. every call to the store is awaited, never a blocking .get() -> test_every_load_gets_halfway_a_reload_too
#  10. versions only go up while training races the syncs          -> test_syncs_racing_training_are_never_torn_and_versions_only_increase
#  11. a wrong layout or transport is a clear error, lease released -> test_a_mismatched_generator_gets_a_clear_error_and_releases_its_lease,
#                                                                    test_forcing_a_transport_that_is_not_offered_is_a_clear_error
#  12. a reload asks again for anything newer than the version held (the torn load was never ours), so a
#      lost lease on the newest version loads that version again  -> test_a_lost_lease_on_the_newest_version_loads_that_version_again


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_after_a_sync_the_generator_is_bit_equal_to_the_published_version(plumbing, weight_sync, aio, transport):
    store, trainer, (gen,) = weight_sync(generators=[(transport, torch.float32)])
    before = ask(gen.sync, timeout=STARTUP_TIMEOUT)
    assert before["version"] is None, "nothing is published yet: a pull finds nothing and loads nothing"
    for _ in range(2):
        step_and_commit(plumbing, aio, store, trainer)
        synced = ask(gen.sync)
        published = ask(trainer.fingerprints)
        assert synced["transport"] == transport, (
            f"the sync went via {synced['transport']!r}, not the {transport!r} the generator asked for (None: nothing "
            "loaded yet): load each snapshot with self.load(snapshot, halfway), which picks the reader's transport")
        assert synced["fingerprint"] == published[synced["loaded"]], f"v{synced['loaded']} arrived different via {transport}"
    assert synced["loaded"] == 2, (
        f"after two versions were published and synced, the generator holds v{synced['loaded']!r}, not v2: each sync "
        "loads the newest version and records it as self.version")
    again = ask(gen.sync)
    assert again["version"] is None, (
        f"the reader holds v2, the latest, yet the next sync loaded v{again['version']} again: acquire asks for "
        "anything newer than self.version, the version last loaded, and gets None")
    assert ask(store.stats)["readers"] == 0, "every lease was released"


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_trainer_keeps_stepping_while_a_slow_reader_holds_a_lease(plumbing, weight_sync, procs, aio, test_tag,
                                                                       transport):
    store, trainer, (gen,) = weight_sync(generators=[(transport, torch.float32)])
    gate = procs.slice(procs=0).spawn(f"gate_{test_tag}", plumbing.Gate)
    step_and_commit(plumbing, aio, store, trainer)

    events = []
    slow_sync = hold_reader_halfway(gen, gate)  # a lease on v1, stopped halfway through loading it
    events.append("reader holds v1, halfway")
    for _ in range(3):
        version = ask(trainer.step)
        events.append(f"trainer step -> {version} (readers {ask(store.stats)['readers']})")
    ask(gate.open)
    result = slow_sync.get(timeout=TIMEOUT)
    events.append(f"reader done with v{result['loaded']}")

    assert events == [
        "reader holds v1, halfway",
        "trainer step -> 2 (readers 1)",  # the free slot takes v2
        "trainer step -> None (readers 1)",  # v1's slot is leased, v2's is latest: skip, don't wait
        "trainer step -> None (readers 1)",
        "reader done with v1",
    ], ("the reader holds no lease while halfway through v1 (readers 0): give the lease back only after the load "
        "(in a finally)" if "readers 0" in events[1] else
        "the trainer must go on stepping (and skip publishing) while the reader holds its lease") + f": {events}"
    assert result["fingerprint"] == ask(trainer.fingerprints)[1], "torn read: the slot changed under the reader"
    assert ask(store.stats)["readers"] == 0, (
        "the reader's sync is done, yet the store still counts a reader: give the lease back after the load, whatever "
        "happens")


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_reader_whose_lease_expired_never_keeps_a_torn_load(plumbing, weight_sync, procs, aio, test_tag, transport):
    """The lease runs out while the reader is halfway; the trainer publishes twice, the second time into the
    reader's slot. The reader finds out when it gives the lease back, and loads again."""
    store, trainer, (gen,) = weight_sync(generators=[(transport, torch.float32)], lease_timeout_s=0.0)
    gate = procs.slice(procs=0).spawn(f"gate_{test_tag}", plumbing.Gate)
    step_and_commit(plumbing, aio, store, trainer)
    slow_sync = hold_reader_halfway(gen, gate)  # holds v1's slot; its lease is already too old
    assert step_and_commit(plumbing, aio, store, trainer) == 2, "v2 goes into the other slot"
    assert step_and_commit(plumbing, aio, store, trainer) == 3, "v1's lease expired: v3 overwrites its slot"
    ask(gate.open)
    result = slow_sync.get(timeout=TIMEOUT)
    published = ask(trainer.fingerprints)
    assert result["fingerprint"] in published.values(), (
        f"the reader kept a mixture of two versions (lost_leases {result['lost_leases']}): its lease expired "
        "halfway, so release() answered False; await release's answer, and when it is False load again")
    assert result["lost_leases"] == 1, "release() answered False once; the reader must count it"
    assert (result["loaded"], result["fingerprint"]) == (3, published[3]), "it loaded again: the newest version, whole"
    assert ask(store.stats)["expired_leases"] >= 1, (
        "the store counted no expired lease, though the reader's lease (lease_timeout_s=0) was too old at v3's claim: "
        "claim drops each expired lease and counts it in expired_leases")


@pytest.mark.todo("SnapshotReader.pull_and_load")
def test_syncs_racing_training_are_never_torn_and_versions_only_increase(weight_sync):
    store, trainer, gens = weight_sync(generators=[("shm", torch.float32), ("rdma", torch.float32)])
    seen = {0: [], 1: []}
    for _ in range(8):
        step = trainer.step.call()  # not awaited: the syncs below race it
        for index, gen in enumerate(gens):
            result = ask(gen.sync, timeout=STARTUP_TIMEOUT)
            if result["version"] is not None:
                seen[index].append((result["loaded"], result["fingerprint"]))
        step.get(timeout=TIMEOUT)
    published = ask(trainer.fingerprints)
    for index, loads in seen.items():
        versions = [version for version, _ in loads]
        assert versions == sorted(set(versions)), f"generator {index} saw versions go back or repeat: {versions}"
        for version, fingerprint in loads:
            assert fingerprint == published[version], f"generator {index} loaded a torn v{version}"
    assert sum(len(loads) for loads in seen.values()) >= 2, "the generators should have loaded something"


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.hint(2)
def test_pull_waits_for_the_store_at_most_its_timeout(chapter):
    reader = chapter.SnapshotReader(StandIn(acquire=NEVER), {"w": torch.zeros(8)}, timeout=0.2)
    outcome = gives_up_in_time(reader.pull_and_load())
    assert outcome == "gave up", f"pull_and_load on a store that never answers: {outcome}. Wait at most self.timeout"


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.parametrize("attempts", [2, 4])
@pytest.mark.hint(3)
def test_a_reader_that_keeps_losing_its_lease_gives_up_after_its_attempts(chapter, attempts):
    snapshot = types.SimpleNamespace(version=3, lease=7)
    store = StandIn(acquire=lambda newer_than: snapshot, release=lambda lease: False)  # every lease was lost
    reader = chapter.SnapshotReader(store, {"w": torch.zeros(8)}, attempts=attempts)
    loads = []

    async def load(snap, halfway=None):  # the copy itself is not what this test is about
        loads.append(snap.version)
        assert len(loads) <= attempts, "pull_and_load loaded again after its last attempt: stop after self.attempts"
        await asyncio.sleep(0)

    reader.load = load
    with pytest.raises(RuntimeError):
        asyncio.run(asyncio.wait_for(reader.pull_and_load(), 10))
    assert (loads, reader.lost_leases, reader.version) == ([3] * attempts, attempts, 0), (
        f"{len(loads)} loads with attempts={attempts}, each lost its lease: load self.attempts times, count each "
        "lost lease, keep none of them (our version stays 0), then raise")
    assert len(store.release.calls) == attempts, "every lease is given back"


@pytest.mark.todo("SnapshotReader.pull_and_load")
def test_a_lost_lease_on_the_newest_version_loads_that_version_again(chapter):
    """Nothing newer than v3 was published: after the lease on v3 is lost, the reload is v3 again. The torn
    load never became our version, so the reader still asks for anything newer than the version it holds."""
    leases = iter([7, 8])
    store = StandIn(acquire=lambda newer_than: (types.SimpleNamespace(version=3, lease=next(leases))
                                                if newer_than < 3 else None),  # as WeightStore.acquire answers
                    release=lambda lease: lease == 8)  # the first lease was lost
    reader = chapter.SnapshotReader(store, {"w": torch.zeros(8)})
    loads = []

    async def load(snap, halfway=None):
        loads.append(snap.lease)
        await asyncio.sleep(0)

    reader.load = load
    answer = asyncio.run(asyncio.wait_for(reader.pull_and_load(), 10))
    assert (answer, loads, reader.lost_leases) == (3, [7, 8], 1), (
        f"answered {answer} after loads under leases {loads}: the torn load of v3 is not ours, so ask again for "
        f"anything newer than self.version ({store.acquire.calls}), and v3 comes back")


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.hint(3)
def test_each_call_gets_its_own_attempts(chapter):
    """self.attempts bounds the loads of one call: leases lost in an earlier call do not count against a later one."""
    versions = iter([3, 3, 3, 4, 4])  # call 1: v3 lost twice, then kept; call 2: v4 lost once, then kept
    held = iter([False, False, True, False, True])
    store = StandIn(acquire=lambda newer_than: types.SimpleNamespace(version=next(versions), lease=1),
                    release=lambda lease: next(held))
    reader = chapter.SnapshotReader(store, {"w": torch.zeros(8)}, attempts=3)

    async def load(snap, halfway=None):
        await asyncio.sleep(0)

    reader.load = load
    assert asyncio.run(asyncio.wait_for(reader.pull_and_load(), 10)) == 3, (
        "the first call (lease lost twice, then kept, attempts=3) did not answer 3: after a lost lease, load again, "
        "up to self.attempts loads, and answer the version of the load whose lease held")
    try:
        second = asyncio.run(asyncio.wait_for(reader.pull_and_load(), 10))
    except RuntimeError as error:
        pytest.fail(f"the second call gave up after one lost lease ({error}): each call may load self.attempts "
                    "times; reader.lost_leases is a lifetime count, not the bound")
    assert (second, reader.lost_leases) == (4, 3), (
        f"the second call answered {second!r} with lost_leases {reader.lost_leases!r}; expected 4 and 3 (two leases "
        "lost in the first call, one in this one): answer the version of the load whose lease held, and add every "
        "lost lease to self.lost_leases")


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.hint(3)
def test_pull_waits_for_a_release_at_most_its_timeout(chapter):
    """The store stops answering after handing out the lease (its process hung). On a virtual clock."""
    snapshot = types.SimpleNamespace(version=3, lease=7)
    store = StandIn(acquire=lambda newer_than: snapshot, release=NEVER)
    reader = chapter.SnapshotReader(store, {"w": torch.zeros(8)}, timeout=5.0)

    async def load(snap, halfway=None):  # the copy itself is not what this test is about
        await asyncio.sleep(0)

    reader.load = load

    async def scenario():
        try:
            await reader.pull_and_load()
        except TimeoutError:
            return "gave up"
        return "answered"

    try:
        outcome = run_on_virtual_clock(scenario())
    except StuckForever:
        pytest.fail("pull_and_load waited for release() with no timeout, on a store that never answers: it would "
                    "hang the generator forever. Every call to the store waits at most self.timeout")
    assert outcome == "gave up", f"release never answered, yet pull_and_load {outcome}: it must raise TimeoutError"
    assert reader.version == 0, "a load whose lease was never confirmed is not kept"


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.hint(3)
def test_a_pull_cancelled_in_the_middle_of_a_load_gives_its_lease_back(chapter):
    """The generator is shut down (its task cancelled) while it copies: the lease must still go back, or the
    slot stays blocked until the lease times out. On a virtual clock."""
    snapshot = types.SimpleNamespace(version=3, lease=7)
    store = AwaitedStandIn(acquire=lambda newer_than: snapshot, release=lambda lease: True)
    reader = chapter.SnapshotReader(store, {"w": torch.zeros(8)}, timeout=5.0)
    loading = asyncio.Event()

    async def load(snap, halfway=None):  # a long copy, cancelled halfway
        loading.set()
        await asyncio.sleep(3600)

    reader.load = load

    async def scenario():
        pulling = asyncio.create_task(reader.pull_and_load())
        await asyncio.wait([pulling, asyncio.ensure_future(loading.wait())], return_when=asyncio.FIRST_COMPLETED)
        if pulling.done():  # it ended before its load began: its own error (or answer) is the story
            return pulling.result() and "answered before loading"
        pulling.cancel()
        try:
            await pulling
        except asyncio.CancelledError:
            return "cancelled"
        return "answered"

    outcome = run_on_virtual_clock(scenario())
    assert store.release.calls == [(7,)], (
        f"the pull was cancelled in the middle of its load, and release was called {store.release.calls}: give the "
        "lease back whatever happens, a cancellation too (a finally; `except Exception` misses a cancellation)")
    assert outcome == "cancelled" and reader.version == 0, "the cancellation goes on to the caller; nothing is kept"


@pytest.mark.todo("SnapshotReader.pull_and_load")
def test_every_load_gets_halfway_a_reload_too(chapter):
    """The first lease is lost (release answers False), so the reader loads again. A test's gate (halfway) must
    be able to hold that reload too. The store here refuses a blocking .get(): calls are awaited."""
    snapshots = iter([types.SimpleNamespace(version=3, lease=7), types.SimpleNamespace(version=4, lease=8)])
    held = iter([False, True])
    store = AwaitedStandIn(acquire=lambda newer_than: next(snapshots), release=lambda lease: next(held))
    reader = chapter.SnapshotReader(store, {"w": torch.zeros(8)})
    given = []

    async def load(snap, halfway=None):
        given.append((snap.version, halfway))
        await asyncio.sleep(0)

    async def gate():
        pass

    reader.load = load
    answer = run_on_virtual_clock(reader.pull_and_load(halfway=gate))
    assert (answer, reader.lost_leases) == (4, 1), "the first lease was lost: load again, the newest version"
    assert given == [(3, gate), (4, gate)], (
        f"the loads got halfway={[h.__name__ if h else h for _, h in given]}: pass `halfway` to every load, "
        "the reload after a lost lease too (a test may hold any load halfway)")


@pytest.mark.todo("SnapshotReader.pull_and_load")
def test_the_generator_may_hold_another_dtype(plumbing, weight_sync, aio):
    store, trainer, (gen,) = weight_sync(generators=[("rdma", torch.bfloat16)])
    step_and_commit(plumbing, aio, store, trainer)
    assert ask(gen.sync, timeout=STARTUP_TIMEOUT)["loaded"] == 1, (
        "after v1 was published, a sync left the bfloat16 generator without v1 ('loaded' is the reader's "
        "self.version): whatever the generator's dtype, load the newest version and record it")
    theirs, ours = ask(trainer.state), ask(gen.state)
    for name, tensor in theirs.items():
        assert ours[name].dtype == torch.bfloat16, (
            f"{name} is {ours[name].dtype} in the generator after the sync, not bfloat16: load with self.load, which "
            "copies into the generator's own weights, in their own dtype")
        assert torch.equal(ours[name], tensor.to(torch.bfloat16)), f"{name} differs from the trainer's, cast to bf16"


@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_hugging_face_qwen2_in_bf16_with_tied_embeddings(plumbing, weight_sync, aio, transport):
    store, trainer, (gen,) = weight_sync("qwen2", torch.bfloat16, [(transport, torch.bfloat16)], rdma_chunk_bytes=4096)
    step_and_commit(plumbing, aio, store, trainer)
    synced = ask(gen.sync, timeout=STARTUP_TIMEOUT)
    assert synced["fingerprint"] == ask(trainer.fingerprints)[1], (
        f"after a sync the qwen2 generator (v{synced['loaded']!r} via {transport}) differs from the trainer's v1: a "
        "sync after v1 was published loads it bit for bit, through self.load under a lease")
    assert ask(gen.tied_names_share_memory), "embedding and lm_head must stay one tensor"


@pytest.mark.todo("SnapshotReader.pull_and_load")
def test_a_mismatched_generator_gets_a_clear_error_and_releases_its_lease(plumbing, weight_sync, procs, aio, test_tag):
    store, trainer, _ = weight_sync()
    step_and_commit(plumbing, aio, store, trainer)
    wrong = procs.slice(procs=1).spawn(f"gen_qwen_vs_mlp_{test_tag}", plumbing.PolicyGenerator, store, "qwen2")
    with pytest.raises(Exception, match="do not match the published ones") as caught:
        ask(wrong.sync, timeout=STARTUP_TIMEOUT)
    assert "same model config" in str(caught.value), (
        f"the error a mismatched generator got does not say to use the same model config: {caught.value}. Let the "
        "load's own error reach the caller unchanged (after giving the lease back)")
    assert ask(store.stats)["readers"] == 0, "the lease must be released even when loading fails"


@pytest.mark.todo("SnapshotReader.pull_and_load")
def test_forcing_a_transport_that_is_not_offered_is_a_clear_error(plumbing, weight_sync, aio):
    store, trainer, (gen,) = weight_sync(generators=[("cuda_ipc", torch.float32)])
    step_and_commit(plumbing, aio, store, trainer)
    with pytest.raises(Exception, match="'cuda_ipc' is not offered"):
        ask(gen.sync, timeout=STARTUP_TIMEOUT)
    assert ask(store.stats)["readers"] == 0, (
        "the sync failed ('cuda_ipc' is not offered), and the store still counts a reader: give the lease back "
        "whatever happens, an error in the load too")


# --- Where to stage: staging="auto" (given code) ----------------------------------------------------


@pytest.mark.parametrize("on_cuda, gpus, expected", [(False, 0, "cpu"), (True, 1, "cuda"), (True, 2, "cpu")],
                         ids=["cpu-weights", "one-shared-gpu", "several-gpus"])
def test_auto_staging_picks_by_layout(chapter, plumbing, on_cuda, gpus, expected):
    transports = __import__(chapter.__name__.rsplit(".", 1)[0] + ".ch07_transports", fromlist=["x"])
    assert transports.choose_staging("auto", on_cuda, visible_gpus=gpus) == expected, (
        f"given code: choose_staging('auto', on_cuda={on_cuda}, visible_gpus={gpus}) answered "
        f"{transports.choose_staging('auto', on_cuda, visible_gpus=gpus)!r}, not {expected!r}; ch07_transports.py is "
        "given, and should be as it came")
    with pytest.raises(ValueError, match="weights are on the CPU"):
        transports.choose_staging("cuda", False)


# --- GPU only: pinned staging, CUDA IPC, and no torn read on either ------------------------------------


@pytest.mark.gpu
@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.parametrize("staging, asked, expected", [("cpu", "auto", "shm"), ("cpu", "rdma", "rdma"),
                                                      ("cuda", "auto", "cuda_ipc"), ("auto", "auto", "cuda_ipc")])
def test_gpu_trainer_to_gpu_generator(plumbing, procs, aio, chapter, staging, asked, expected):
    """Both sides on the one GPU: pinned CPU staging (shm, rdma) or a GPU slot (CUDA IPC); auto picks the GPU slot."""
    on_trainer = procs.slice(procs=0)
    name = f"{staging}_{asked}"
    store = on_trainer.spawn(f"store_gpu_{name}", chapter.WeightStore)
    trainer = on_trainer.spawn(f"trainer_gpu_{name}", plumbing.PolicyTrainer, store, "qwen2", torch.bfloat16,
                               staging, 64 * 2**20, "cuda")
    gen = procs.slice(procs=1).spawn(f"gen_gpu_{name}", plumbing.PolicyGenerator, store, "qwen2", torch.bfloat16,
                                     asked, "cuda")
    try:
        step_and_commit(plumbing, aio, store, trainer)
        synced = ask(gen.sync, timeout=STARTUP_TIMEOUT)
        assert synced["transport"] == expected, "auto picks the fastest path that works from here"
        assert synced["fingerprint"] == ask(trainer.fingerprints)[1], (
            f"the GPU generator (v{synced['loaded']!r} via {synced['transport']!r}) differs from the trainer's v1: a "
            "sync after v1 was published loads it bit for bit")
        if expected != "cuda_ipc":
            assert all(ask(trainer.publisher_stats)["pinned"]), "CPU slots must be pinned"
    finally:
        ask(trainer.close)


@pytest.mark.gpu
@pytest.mark.todo("SnapshotReader.pull_and_load")
@pytest.mark.time_limit(600)
def test_gpu_syncs_by_cuda_ipc_are_never_torn(plumbing, procs, chapter):
    """staging="cuda", a reader in another process on the same GPU, 200 syncs racing the trainer's steps:
    every loaded state is bit-equal to one published version (the reader's device copies finish before
    it gives its lease back)."""
    on_trainer = procs.slice(procs=0)
    store = on_trainer.spawn("store_gpu_race", chapter.WeightStore)
    trainer = on_trainer.spawn("trainer_gpu_race", plumbing.PolicyTrainer, store, "qwen2", torch.bfloat16,
                               "cuda", 64 * 2**20, "cuda")
    gen = procs.slice(procs=1).spawn("gen_gpu_race", plumbing.PolicyGenerator, store, "qwen2", torch.bfloat16,
                                     "cuda_ipc", "cuda")
    loads = []
    try:
        while len(loads) < 200:
            step = trainer.step.call_one()  # racing the sync below
            result = ask(gen.sync, timeout=STARTUP_TIMEOUT)
            if result["version"] is not None:
                loads.append((result["loaded"], result["fingerprint"]))
            step.get(timeout=TIMEOUT)
        published = ask(trainer.fingerprints)
        torn = [version for version, fingerprint in loads if fingerprint != published[version]]
        assert not torn, f"{len(torn)} of {len(loads)} loads were torn, e.g. v{torn[:5]}"
        assert all(t == "cuda_ipc" for t in [ask(gen.sync)["transport"]] if t), (
            "the last sync went by another transport than the cuda_ipc the generator asked for")
    finally:
        ask(trainer.close)


# --- The given packing: stage into one flat slot, load back out (no actors) -------------------------


def test_staging_packs_every_kind_of_tensor_and_loading_unpacks_it_bit_for_bit(chapter):
    """Given code the trainer depends on: a transposed weight, a 0-D scalar, three dtypes, two names
    for one tensor (tied), packed into one aligned byte buffer and read back into fresh tensors."""
    import importlib

    transports = importlib.import_module(f"{chapter.__package__}.ch07_transports")
    generator = torch.Generator().manual_seed(0)
    embedding = torch.randn(6, 4, generator=generator)
    weights = {"embed": embedding, "head": embedding, "proj": torch.randn(4, 3, generator=generator).t(),
               "scale": torch.tensor(1.5), "steps": torch.arange(5), "norm": torch.randn(7).to(torch.bfloat16)}
    layout = transports.plan_layout(weights)
    assert layout.aliases == (("head", "embed"),), "tied names are packed once"
    assert all(e.offset % transports.ALIGN == 0 for e in layout.entries), "every entry starts aligned"
    spans = sorted((e.offset, e.offset + e.nbytes) for e in layout.entries)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), "entries never overlap"
    flat = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    transports.stage(weights, layout, transports.slot_views(layout, flat))
    targets = {name: torch.full_like(t.contiguous(), 99) for name, t in weights.items()}  # no value the sender holds
    targets["head"] = targets["embed"]  # tied on the reader's side too
    assert all(starts_apart(targets[name], tensor) for name, tensor in weights.items()), (
        "the test's own premise: every target starts unlike what is sent, so an unpacking that moved nothing fails")
    asyncio.run(transports.load_snapshot(targets, layout, transports._MappedSource(flat)))
    for name, tensor in weights.items():
        assert targets[name].dtype == tensor.dtype and torch.equal(targets[name], tensor), name


@pytest.mark.gpu
@pytest.mark.parametrize("on_disk", [False, True], ids=["dev-shm", "a-file-on-disk"])
def test_gpu_loads_from_shared_memory_pin_the_mapping_once(chapter, tmp_path, on_disk):
    """Given code: a generator on a GPU that reads a shared-memory slot page-locks its mapping on the first
    load (pageable memory copies to the GPU several times slower) and keeps it for later loads; its
    asynchronous copies have all landed when the load returns. A mapping that cannot be pinned (a file
    on disk) still loads right, with one warning, and leaves no CUDA error for torch's next call."""
    import importlib

    transports = importlib.import_module(f"{chapter.__package__}.ch07_transports")
    generator = torch.Generator().manual_seed(1)
    weights = {f"layer{i}": torch.randn(256, 64, generator=generator).to(torch.bfloat16) for i in range(8)}
    layout = transports.plan_layout(weights)
    folder = str(tmp_path) if on_disk else transports._shm_dir()
    path = os.path.join(folder, f"koans-test-slot-{os.getpid()}")
    flat = torch.from_file(path, shared=True, size=layout.total_bytes, dtype=torch.uint8)
    cache = transports.SourceCache(timeout=TIMEOUT)
    offer = transports.ShmOffer(transports.host_identity(), path, layout.total_bytes)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for scale in (1.0, -3.0):  # two versions through the same mapping
                transports.stage({n: t * scale for n, t in weights.items()}, layout, transports.slot_views(layout, flat))
                targets = {n: torch.zeros(t.shape, dtype=torch.float32, device="cuda") for n, t in weights.items()}
                source = cache.open(offer, layout.total_bytes)
                asyncio.run(transports.load_snapshot(targets, layout, source))
                for name, tensor in weights.items():
                    assert torch.equal(targets[name].cpu(), (tensor * scale).float()), (scale, name, cache.pinned)
    finally:
        os.unlink(path)
    assert list(cache.pinned.values()) == [not on_disk], "pinned in /dev/shm, once; a file on disk cannot be"
    pin_warnings = [str(w.message) for w in caught if "could not pin" in str(w.message)]
    assert len(pin_warnings) == on_disk, pin_warnings
    assert torch.ones(4, device="cuda").add(1).sum().item() == 8.0, "no CUDA error is left behind"
