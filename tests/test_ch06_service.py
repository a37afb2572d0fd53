"""Chapter 06: a service with retry and recovery. Run: pytest tests/test_ch06_service.py

Every test runs its scenario on one asyncio event loop (the `aio` fixture), as a
service's callers do: requests and background recoveries share that loop.
"""

import asyncio

import pytest
from monarch.actor import ActorError

from koans.testkit import processes
from koans.testkit.testing import NEVER, STARTUP_TIMEOUT, TIMEOUT, AwaitedStandIn, StandIn, StuckForever, run_on_virtual_clock


@pytest.fixture(scope="module")
def services_made(module_aio):
    """Every service a test made; closed together when the module is done (their processes stop at once)."""
    made = []
    yield made

    async def close_all():
        await asyncio.gather(*(service.close() for service in made))

    module_aio.run(close_all())


@pytest.fixture
def make_service(chapter, plumbing, test_tag, services_made):
    """Factory for Services of Echo replicas; every one is closed at the end of the module (no process left)."""
    mine = []

    def make(replicas=3, **options):
        options.setdefault("call_timeout", TIMEOUT)
        service = chapter.Service(plumbing.Echo, replicas=replicas, name=f"svc{len(mine)}_{test_tag}_", **options)
        mine.append(service)
        services_made.append(service)
        return service

    return make


async def gather(*awaitables):
    return await asyncio.gather(*awaitables)


async def pids_of(service):
    return [(await service.route("handle", i))["pid"] for i in range(len(service.replicas))]


@pytest.fixture(scope="module")
def idle_service(chapter, plumbing, module_aio):
    """One service of 4 Echo replicas that no test kills, shared by the bookkeeping tests.
    Each test gets it back all healthy, with fresh counters and the cursor at 0."""
    service = chapter.Service(plumbing.Echo, replicas=4, name="idle_svc_", auto_recover=False, call_timeout=TIMEOUT)
    yield service
    module_aio.run(service.close())


@pytest.fixture
def four(chapter, idle_service, monkeypatch):
    def no_recovery(replica):
        raise AssertionError(f"start_recovery(replica {replica.index}) on a service with auto_recover=False: "
                             "recover only if self.auto_recover")

    monkeypatch.setattr(idle_service, "start_recovery", no_recovery)
    for replica in idle_service.replicas:
        replica.healthy, replica.failures = True, 0
    idle_service.cursor, idle_service.stats, idle_service.sessions = 0, chapter.Stats(), {}
    return idle_service


def service_here(chapter, plumbing, actors, **options):
    """A Service whose replicas are stand-ins in this process (no Monarch process, nothing to close):
    for the bookkeeping of route and mark_unhealthy, on a virtual clock."""

    class Here(chapter.Service):
        def _install_fault_filter(self):
            pass

        def _start_replica(self, index, generation):
            return plumbing.Replica(index, None, actors[index], generation)

    options.setdefault("auto_recover", False)
    return Here(plumbing.Echo, replicas=len(actors), name="here", **options)


def echo_here():
    return StandIn(handle=lambda x: {"x": x, "y": x * x, "pid": 0})


# --- TODO 1: Service.next_replica ---
# Contract, clause by clause (the test that holds each):
#   1. the first healthy replica at or after the cursor, wrapping around   -> test_next_replica_goes_round_robin_over_the_healthy_ones,
#                                                                              test_the_search_starts_at_the_cursor_and_sees_each_replica_now_in_its_place
#   2. unhealthy replicas are skipped                                       -> test_next_replica_goes_round_robin_over_the_healthy_ones
#   3. replicas in `exclude` are skipped                                    -> test_next_replica_goes_round_robin_over_the_healthy_ones
#   4. None when no healthy replica is left outside `exclude`               -> test_next_replica_goes_round_robin_over_the_healthy_ones
#   5. the cursor moves just past the replica returned (not one step on from where it was)
#                                                                           -> test_next_replica_goes_round_robin_over_the_healthy_ones,
#                                                                              test_round_robin_resumes_after_a_skip
#   6. self.cursor and self.replicas are read at each call: a cursor set from outside, a replacement at an index
#                                                                           -> test_the_search_starts_at_the_cursor_and_sees_each_replica_now_in_its_place


@pytest.mark.todo("Service.next_replica")
def test_next_replica_goes_round_robin_over_the_healthy_ones(four):
    picks = [four.next_replica().index for _ in range(9)]
    assert picks == [0, 1, 2, 3, 0, 1, 2, 3, 0], (
        f"9 picks over 4 healthy replicas, cursor at 0, gave {picks}: start at self.cursor, and move it just past the "
        "replica returned")
    four.replicas[1].healthy = False
    picks = [four.next_replica().index for _ in range(4)]
    assert 1 not in picks, f"replica 1 is unhealthy, so it must be skipped; the picks were {picks}"
    assert picks == [2, 3, 0, 2], (
        f"with replica 1 out, the picks were {picks}, not [2, 3, 0, 2]. After a pick the cursor moves just past "
        "the replica picked, so the next call starts after it (not one step on from where the cursor was)")
    cursor = four.cursor
    assert four.next_replica(exclude={0, 2, 3}) is None, "nothing healthy outside the excluded ones"
    assert four.cursor == cursor, (
        f"the cursor went from {cursor} to {four.cursor} on a call that returned no replica: it moves only past a "
        "replica returned")
    assert four.next_replica(exclude={0, 3}).index == 2, (
        "with replica 1 unhealthy and replicas 0 and 3 excluded, next_replica did not return replica 2, the only one "
        "left: skip both the unhealthy replicas and those in `exclude`")
    assert four.next_replica().index == 3, "the cursor moved past the replica picked last (2)"
    for replica in four.replicas:
        replica.healthy = False
    assert four.next_replica() is None, "no healthy replica at all"


@pytest.mark.todo("Service.next_replica")
@pytest.mark.hint(3)
def test_round_robin_resumes_after_a_skip(four):
    assert four.next_replica(exclude={0, 1}).index == 2, (
        "with replicas 0 and 1 excluded and the cursor at 0, next_replica did not return replica 2: answer the first "
        "healthy replica at or after the cursor that is not in `exclude`")
    assert [four.next_replica().index for _ in range(5)] == [3, 0, 1, 2, 3], "the next pick starts after 2"


@pytest.mark.todo("Service.next_replica")
@pytest.mark.hint(2)
def test_the_search_starts_at_the_cursor_and_sees_each_replica_now_in_its_place(chapter, plumbing):
    """next_replica reads self.cursor and self.replicas afresh at every call: a cursor set by code outside
    next_replica is where it starts, and a replacement put at an index is what it finds there."""
    service = service_here(chapter, plumbing, [echo_here() for _ in range(3)])
    service.cursor = 2
    picked = service.next_replica().index
    assert picked == 2, f"with self.cursor set to 2, next_replica returned replica {picked}: start at self.cursor"
    old = service.replicas[1]
    old.healthy = False
    service.replicas[1] = plumbing.Replica(1, None, echo_here(), generation=2)  # recovery replaced it
    found = [service.next_replica() for _ in range(3)]
    assert [r.index for r in found] == [0, 1, 2] and found[1] is service.replicas[1], (
        f"replica 1 was replaced by a healthy one, and next_replica then returned {[r.index for r in found]}"
        f"{' (the old, dead replica 1)' if found[1] is old else ''}: look in self.replicas at each call (an "
        "iterator made once keeps the replicas of that time), so the replacement takes its turn")


# --- TODO 2: Service.mark_unhealthy ---
# Contract, clause by clause (the test that holds each):
#   1. the replica leaves rotation (healthy False)                          -> test_marking_takes_a_replica_out_once
#   2. only the first report of a death counts                              -> test_marking_takes_a_replica_out_once
#   3. a report about a replica no longer in self.replicas changes nothing  -> test_a_marked_replica_is_recovered_on_a_new_process_and_late_reports_change_nothing,
#                                                                              test_a_report_about_a_replica_no_longer_in_the_service_changes_nothing
#   4. replica.failures grows by one: it counts every death at that index, carried into each replacement
#                                                                           -> test_marking_adds_one_death_to_those_already_counted_at_that_index
#   5. stats.replica_failures grows by one per death                        -> test_marking_takes_a_replica_out_once
#   6. recovery starts only with auto_recover                               -> test_marking_takes_a_replica_out_once,
#                                                                              test_a_marked_replica_is_recovered_on_a_new_process_and_late_reports_change_nothing
#   7. with auto_recover too, the replica leaves rotation at once, while its replacement starts
#                                                                           -> test_a_replica_being_replaced_is_out_of_rotation_meanwhile


@pytest.mark.todo("Service.mark_unhealthy")
def test_marking_takes_a_replica_out_once(four):
    replica = four.replicas[1]
    four.mark_unhealthy(replica, "died")
    four.mark_unhealthy(replica, "died, seen by a second request")
    snapshot = four.snapshot()
    assert snapshot["healthy"] == [True, False, True, True], (
        f"healthy {snapshot['healthy']} after replica 1 was reported dead: expected only replica 1 out of rotation, "
        "[True, False, True, True]; the replica reported leaves rotation (its healthy goes False)")
    assert (replica.failures, snapshot["replica_failures"]) == (1, 1), (
        f"replica.failures {replica.failures}, stats.replica_failures {snapshot['replica_failures']} after two "
        "reports of one death: expected 1 and 1 (one more on each, at the first report only)")
    assert [four.next_replica().index for _ in range(4)] == [0, 2, 3, 0], (
        "with replica 1 marked unhealthy, four picks from the cursor at 0 were not [0, 2, 3, 0]: round robin skips a "
        "replica whose healthy is False (next_replica, TODO 1)")
    assert four.recovering == {}, "auto_recover=False: nothing is replaced"
    four.mark_unhealthy(four.replicas[3], "a second replica died")
    assert four.snapshot()["replica_failures"] == 2, (
        f"stats.replica_failures {four.snapshot()['replica_failures']} after the deaths of replicas 1 and 3: expected "
        "2. Each death adds one to the count so far; it is not set to 1")


@pytest.mark.todo("Service.mark_unhealthy")
@pytest.mark.hint(2)
def test_a_marked_replica_is_recovered_on_a_new_process_and_late_reports_change_nothing(make_service, aio):
    service = make_service()

    async def scenario():
        old = service.replicas[2]
        old_pid = await asyncio.wait_for(old.actor.whoami.call_one(), STARTUP_TIMEOUT)
        service.mark_unhealthy(old, "died")
        await service.wait_recovered(timeout=STARTUP_TIMEOUT)
        assert service.replicas[2] is not old, (
            f"replica 2 was marked unhealthy with auto_recover on, yet it was never replaced (recoveries "
            f"{service.snapshot()['recoveries']}): mark_unhealthy starts the replica's recovery when auto_recover is on")
        service.mark_unhealthy(old, "a late report about the old replica")
        after = service.snapshot()
        assert after["healthy"][2] and after["replica_failures"] == 1, (
            f"a late report about replica 2, already replaced, changed its replacement (healthy {after['healthy']}, "
            f"replica_failures {after['replica_failures']}): the replica reported is not self.replicas[2] any more, "
            "so the report changes nothing")
        new_pid = await asyncio.wait_for(service.replicas[2].actor.whoami.call_one(), STARTUP_TIMEOUT)
        return old_pid, new_pid

    old_pid, new_pid = aio.run(scenario())
    snapshot = service.snapshot()
    assert snapshot["healthy"] == [True, True, True], "the replacement is healthy, and a late report leaves it so"
    assert (snapshot["replica_failures"], snapshot["recoveries"], snapshot["generations"]) == (1, 1, [1, 1, 2]), (
        f"replica_failures {snapshot['replica_failures']}, recoveries {snapshot['recoveries']}, generations "
        f"{snapshot['generations']} after one death of replica 2 and a late report about it: expected 1, 1 and [1, 1, "
        "2]. The death is counted once and (auto_recover) starts one recovery; the late report about the replaced "
        "replica changes nothing")
    assert new_pid != old_pid, "the replacement runs in a new process"


@pytest.mark.todo("Service.mark_unhealthy")
def test_a_replica_being_replaced_is_out_of_rotation_meanwhile(chapter, plumbing):
    """auto_recover on: a replacement takes seconds to start, and until it is in, no request goes to the dead
    replica. No Monarch process: stand-ins, and a recovery that is started but never finishes."""
    service = service_here(chapter, plumbing, [echo_here(), echo_here(), echo_here()], auto_recover=True)
    started = []
    service.start_recovery = started.append  # the replacement is on its way (here it never arrives)
    dead = service.replicas[1]
    service.mark_unhealthy(dead, "died")
    assert started == [dead], f"auto_recover=True: one recovery starts for the dead replica, not {started}"
    healthy = service.snapshot()["healthy"]
    assert healthy == [True, False, True], (
        f"healthy {healthy} right after the report: the dead replica leaves rotation at once, with auto_recover "
        "too (its replacement takes seconds to start, and requests sent to it meanwhile would fail)")
    assert [service.next_replica().index for _ in range(4)] == [0, 2, 0, 2], (
        "with replica 1 out of rotation while its replacement starts, four picks from the cursor at 0 were not [0, 2, "
        "0, 2]: round robin skips a replica whose healthy is False (next_replica, TODO 1)")


@pytest.mark.todo("Service.mark_unhealthy")
@pytest.mark.hint(3)
def test_marking_adds_one_death_to_those_already_counted_at_that_index(four):
    replica = four.replicas[2]
    replica.failures = 2  # two deaths at index 2 before: a replacement carries its predecessors' count
    four.mark_unhealthy(replica, "died a third time")
    assert replica.failures == 3, (
        f"replica.failures is {replica.failures} after a third death at index 2: it counts every death seen at "
        "that index (the replacement carries it on), so a report adds one to it, it does not set it")
    assert four.snapshot()["replica_failures"] == 1, "and the service counts this death once"


@pytest.mark.todo("Service.mark_unhealthy")
@pytest.mark.hint(2)
def test_a_report_about_a_replica_no_longer_in_the_service_changes_nothing(chapter, plumbing):
    """Replica 1 was swapped for a new one while it still looked healthy (say, a planned restart), and then a
    request that had been waiting on the old one reports it dead. No Monarch process: stand-ins."""
    service = service_here(chapter, plumbing, [echo_here(), echo_here()])
    old = service.replicas[1]
    service.replicas[1] = plumbing.Replica(1, None, echo_here(), generation=2)
    service.mark_unhealthy(old, "a late report about the replica swapped out")
    snapshot = service.snapshot()
    assert (snapshot["replica_failures"], old.failures, snapshot["healthy"]) == (0, 0, [True, True]), (
        f"{snapshot['replica_failures']} failures counted, old replica's count {old.failures}: the replica "
        "reported is no longer in self.replicas (it was replaced), so the report changes nothing, whatever "
        "that replica's own health flag says")


# --- TODO 3: Service.route ---
# Contract, clause by clause (the test that holds each):
#   1. the reply of the first replica that answers comes back; requests spread round robin
#                                                                           -> test_requests_spread_evenly
#  12. any reply is a reply, one that is false too (None, 0, "", {})   -> test_a_reply_that_looks_false_is_still_a_reply
#   2. a death is retried on another replica, and costs no request          -> test_a_replica_killed_mid_stream_costs_no_request_and_comes_back,
#                                                                              test_many_requests_in_flight_survive_kills
#   3. an endpoint error goes back to the caller, unretried (the ActorError itself) -> test_an_endpoint_error_goes_back_to_the_caller_unretried
#   4. at most self.attempts tries, each on a replica not tried yet, even one healthy again by then
#                                                                           -> test_a_replica_that_does_not_answer_in_time_is_retried_elsewhere_and_never_again,
#                                                                              test_when_every_attempt_fails_the_error_lists_each_one
#   5. each call waits at most self.call_timeout (the service's, not a default)
#                                                                           -> test_each_try_waits_the_services_call_timeout,
#                                                                              test_a_replica_that_does_not_answer_in_time_is_retried_elsewhere_and_never_again
#   6. a death or timeout marks the replica it called unhealthy, and only that one (a replacement now at
#      its index stays in rotation)                                         -> test_a_late_failure_marks_the_replica_called_not_its_replacement
#   7. each failed try is recorded as Attempt(index, kind, summary); stats.retries counts tries after the first
#                                                                           -> test_when_every_attempt_fails_the_error_lists_each_one,
#                                                                              test_a_replica_that_does_not_answer_in_time_is_retried_elsewhere_and_never_again,
#                                                                              test_each_try_waits_the_services_call_timeout
#   8. nobody left to try: stats.failed, ServiceUnavailable with the healthy count (no try made: it says so); the
#      count is healthy_count() then, whatever this request tried
#                                                                           -> test_when_every_attempt_fails_the_error_lists_each_one
#  11. a cancelled caller marks no replica: the cancel goes on up  -> test_a_cancelled_caller_takes_no_replica_out
#  10. the caller's arguments reach the endpoint, keyword ones too
#                                                                           -> test_a_replica_that_does_not_answer_in_time_is_retried_elsewhere_and_never_again
#   9. sessions stick to their replica while it is healthy                 -> test_sessions_stick_and_move_only_when_their_replica_dies_and_fanout_skips_it


@pytest.mark.todo("Service.route")
@pytest.mark.hint(2)
def test_route_awaits_each_call(chapter, plumbing):
    """route is async code: a blocking .get() would stop the service's event loop, and every other request on it."""
    replicas = [AwaitedStandIn(handle=lambda x: {"x": x, "y": x * x, "pid": 0}) for _ in range(2)]
    service = service_here(chapter, plumbing, replicas, call_timeout=5.0)
    assert run_on_virtual_clock(service.route("handle", 3))["y"] == 9, (
        "route('handle', 3) on two healthy replicas did not return the reply {'y': 9, ...}: return the reply as it came")


@pytest.mark.todo("Service.route")
def test_requests_spread_evenly(four, module_aio):
    replies = module_aio.run(gather(*(four.route("handle", i) for i in range(31))))
    assert [r["y"] for r in replies] == [i * i for i in range(31)], (
        f"31 requests handle(i) came back with y = {[r['y'] for r in replies]}, not i * i for i in 0..30: route "
        "returns the reply of the replica that answered, as it came, for the caller's own arguments")
    counts = list(four.snapshot()["per_replica"].values())
    assert len(counts) == 4 and max(counts) - min(counts) <= 1, f"uneven spread: {counts}"
    assert four.snapshot()["requests"] == four.snapshot()["ok"] == 31, (
        f"requests {four.snapshot()['requests']}, ok {four.snapshot()['ok']} after 31 requests that were all "
        "answered: expected 31 and 31. On success route calls self._served(replica, session), which counts the "
        "request in ok: once per request")


@pytest.mark.todo("Service.route")
def test_a_replica_killed_mid_stream_costs_no_request_and_comes_back(chapter, plumbing, make_service, aio):
    service = make_service(replicas=2)

    async def scenario():
        before = set(await pids_of(service))
        answers = []
        for i in range(30):
            if i == 10:
                killed = await plumbing.kill_replica(service, 1)
            try:
                answers.append((await service.route("handle", i))["y"])
            except chapter.ServiceUnavailable as err:
                pytest.fail(f"request {i} met the dead replica, and route gave up after {len(err.attempts)} "
                            f"attempt(s), with self.attempts={service.attempts} and another replica healthy: a try "
                            "that died or timed out goes on to a replica not tried yet, up to self.attempts tries")
        await service.wait_recovered(timeout=STARTUP_TIMEOUT)
        return before, killed, answers, await service.fanout("whoami")

    faults_before = len(processes.recorded_faults)
    before, killed, answers, answering = aio.run(scenario())
    assert answers == [i * i for i in range(30)], "every request is answered, the kill notwithstanding"
    unexpected = [str(getattr(f, "mesh_name", f)) for f in processes.recorded_faults[faults_before:]]
    assert not unexpected, (
        f"the kill of our own replica reached the job's fault hook as {unexpected}: the given ReplicaPool expects "
        "its replicas' deaths and those of the meshes Monarch keeps on every process "
        "(koans.testkit.monarch_compat.MONARCH_PROCESS_MESHES); a new Monarch may have added one there")
    snapshot = service.snapshot()
    assert snapshot["failed"] == 0 and snapshot["replica_failures"] == 1, (
        f"failed {snapshot['failed']}, replica_failures {snapshot['replica_failures']}: no request failed, and the "
        "request that met the dead replica marked it (mark_unhealthy) once")
    assert snapshot["retries"] >= 1, "the request that hit the dead replica was retried elsewhere"
    assert sorted(answering) == [0, 1], (
        f"after recovery, replicas {sorted(answering)} answered, not both: the request that met dead replica 1 marks "
        "it (mark_unhealthy), which is what starts its recovery")
    assert killed not in answering.values() and len(set(answering.values()) - before) == 1, (
        f"processes answering after recovery {list(answering.values())!r}, before the kill {before!r}, killed "
        f"{killed!r}: expected the killed one gone and exactly one new one, its replacement. Either the dead replica "
        "was not replaced, or a healthy one was too: route marks only the replica whose call died")


@pytest.mark.todo("Service.route")
def test_many_requests_in_flight_survive_kills(plumbing, make_service, aio):
    """A small chaos run: four requests in flight at a time while two replica processes are killed."""
    service = make_service(attempts=3)
    sent = iter(range(60))

    async def stream(answers):
        for i in sent:
            if i in (20, 40):
                await service.wait_recovered(timeout=STARTUP_TIMEOUT)
                await plumbing.kill_replica(service, i // 20 - 1)
            answers[i] = (await service.route("handle", i))["y"]

    answers = {}
    aio.run(gather(*(stream(answers) for _ in range(4))))
    assert answers == {i: i * i for i in range(60)}, "each of the 60 requests answered, once, correctly"
    snapshot = service.snapshot()
    assert (snapshot["requests"], snapshot["ok"], snapshot["failed"]) == (60, 60, 0), (
        f"requests {snapshot['requests']}, ok {snapshot['ok']}, failed {snapshot['failed']} after 60 requests that "
        "were all answered: expected 60, 60 and 0. Each answered request is counted once in ok (self._served), and "
        "stats.failed only when route raises ServiceUnavailable")
    assert snapshot["replica_failures"] == 2, "each killed process is counted once, however many requests met it"


@pytest.mark.todo("Service.route")
def test_sessions_stick_and_move_only_when_their_replica_dies_and_fanout_skips_it(plumbing, make_service, aio):
    service = make_service(auto_recover=False)

    async def scenario():
        alice = {(await service.route("handle", i, session="alice"))["pid"] for i in range(4)}
        bob = {(await service.route("handle", i, session="bob"))["pid"] for i in range(4)}
        dead = service.sessions["alice"]
        await plumbing.kill_replica(service, dead)
        moved = [(await service.route("handle", i, session="alice"))["pid"] for i in range(4)]
        return alice, bob, moved, dead, await service.fanout("whoami")

    alice, bob, moved, dead, answering = aio.run(scenario())
    assert len(alice) == 1 and len(bob) == 1, "a session keeps going to one replica"
    assert len(set(moved)) == 1 and moved[0] not in alice, "alice moved once, then stuck to her new replica"
    assert service.snapshot()["healthy"] == [i != dead for i in range(3)], (
        f"healthy {service.snapshot()['healthy']} after replica {dead} was killed (auto_recover=False): expected only "
        f"replica {dead} out of rotation. The request that met the dead replica marks that replica unhealthy, and "
        "only it")
    assert sorted(answering) == sorted(set(range(3)) - {dead}), "fanout skips the dead replica"


@pytest.mark.todo("Service.route")
@pytest.mark.hint(3)
def test_an_endpoint_error_goes_back_to_the_caller_unretried(chapter, four, module_aio):
    try:
        with pytest.raises(ActorError, match="malformed"):
            module_aio.run(four.route("reject", "malformed prompt"))
    except chapter.ServiceUnavailable as err:
        pytest.fail(f"route raised ServiceUnavailable after {len(err.attempts)} attempt(s) for a request its "
                    "endpoint refused: an endpoint error is the request's fault, not the replica's, so route raises "
                    "that ActorError to the caller at the first try, unretried")
    snapshot = four.snapshot()
    assert (snapshot["retries"], snapshot["replica_failures"], snapshot["healthy"]) == (0, 0, [True] * 4), (
        f"one try that met an endpoint error: retries {snapshot['retries']}, replica_failures "
        f"{snapshot['replica_failures']}, healthy {snapshot['healthy']}; expected 0, 0 and all healthy: the error is "
        "the request's, not the replica's, so it goes back unretried, and retries count only tries after the first")
    assert (snapshot["requests"], snapshot["ok"], snapshot["failed"]) == (1, 0, 0), "not a ServiceUnavailable"


@pytest.mark.todo("Service.route")
@pytest.mark.hint(3)
def test_a_reply_that_looks_false_is_still_a_reply(chapter, plumbing):
    """None, 0, "" and {} are answers like any other: the first try returns them, and nothing is marked."""
    service = service_here(chapter, plumbing, [StandIn(handle=lambda x: x) for _ in range(2)], call_timeout=5.0)
    for value in (0, None, "", {}):
        try:
            reply = run_on_virtual_clock(service.route("handle", value))
        except chapter.ServiceUnavailable as err:
            pytest.fail(f"the replica answered {value!r} at the first try, and route raised ServiceUnavailable "
                        f"({err}): a reply is a reply, even a false one (None, 0, '', {{}}). Tell success from failure "
                        "by how the call ended (the outcome's kind), not by what the reply holds")
        assert reply == value and type(reply) is type(value), (
            f"the replica answered {value!r}, and route returned {reply!r}: return the reply as it came, even a false "
            "one")
    snapshot = service.snapshot()
    assert (snapshot["retries"], snapshot["replica_failures"], snapshot["healthy"]) == (0, 0, [True, True]), (
        f"four requests answered {0, None, '', {}} at their first try: retries {snapshot['retries']}, replica_failures "
        f"{snapshot['replica_failures']}, healthy {snapshot['healthy']}; a reply that is false is still a success: "
        "tell success from failure by how the call ended, not by what the reply holds (only a death or a timeout "
        "marks a replica)")


@pytest.mark.todo("Service.route")
@pytest.mark.hint(3)
def test_when_every_attempt_fails_the_error_lists_each_one(chapter, make_service, aio):
    # A death is reported in a second or two; the generous call timeout keeps a loaded machine from
    # turning a slow report into a "timeout".
    service = make_service(replicas=3, attempts=2, auto_recover=False, call_timeout=20.0)
    with pytest.raises(chapter.ServiceUnavailable) as caught:
        aio.run(service.route("crash"))  # every replica it reaches dies
    attempts = caught.value.attempts
    outcomes = [a.outcome for a in attempts]
    # A death is normally reported ("died"), but when two replicas die moments apart Monarch sometimes
    # reports the second only by silence, which route() sees as a timeout.
    tries = service.snapshot()["retries"] + 1
    assert len(outcomes) == 2 and outcomes[0] == "died" and set(outcomes) <= {"died", "timeout"}, (
        f"attempts=2, every replica reached dies: the attempts recorded were {outcomes}, after {tries} tries: "
        + ("each failed try must be recorded as an Attempt in the list ServiceUnavailable gets"
           if len(outcomes) < tries else "attempts=2 allows 2 tries in all"))
    assert len({a.replica for a in attempts}) == 2, "each attempt went to a different replica"
    assert service.snapshot()["retries"] == 1, "two attempts: the first try and one retry"
    message = str(caught.value)
    assert "after 2 attempt(s)" in message and "attempt 2: replica" in message and "died" in message, (
        f"the ServiceUnavailable message does not list the 2 failed attempts: {message}. Raise it with the endpoint "
        "name, the list of every Attempt recorded, and self.healthy_count()")
    assert "1 replica(s) healthy now" in message, (
        f"two of three replicas died and one is left: ServiceUnavailable gets self.healthy_count(). Got: {message}")
    survivor = ({0, 1, 2} - {a.replica for a in attempts}).pop()
    assert aio.run(service.route("handle", 3))["y"] == 9, f"replica {survivor} was never tried and still serves"
    with pytest.raises(chapter.ServiceUnavailable, match="after 1 attempt") as caught:
        aio.run(service.route("crash"))
    with pytest.raises(chapter.ServiceUnavailable, match="no replica is healthy") as none_tried:
        aio.run(service.route("handle", 1))
    for error, tries in ((caught.value, 1), (none_tried.value, 0)):
        assert "0 replica(s) healthy now" in str(error), (
            f"after {tries} tr{'y' if tries == 1 else 'ies'}, with every replica dead: {error}. The count is "
            "self.healthy_count() when it is raised, not the replicas less those this request tried: the others "
            "may have died before it")
    snapshot = service.snapshot()
    assert (snapshot["failed"], snapshot["ok"], snapshot["requests"]) == (3, 1, 4), (
        f"failed {snapshot['failed']}, ok {snapshot['ok']}, requests {snapshot['requests']}: 3 requests raised "
        "ServiceUnavailable and 1 was answered; stats.failed counts each request that raised it")


@pytest.mark.todo("Service.route")
def test_a_replica_that_does_not_answer_in_time_is_retried_elsewhere_and_never_again(chapter, make_service, aio):
    """Two replicas that hang, three attempts allowed. While the second attempt waits, the first replica is
    back in rotation (as its replacement would be): the request still goes to each replica once."""
    service = make_service(replicas=2, auto_recover=False)
    # One request first, its argument by keyword: replica 0 serves it, so this request starts at replica 1.
    # (With the default timeout: a fresh replica's first answer may be slow on a busy machine.)
    try:
        reply = aio.run(service.route("handle", x=3))
    except TypeError as err:
        pytest.fail(f"route('handle', x=3) raised {err!r}: route passes the caller's keyword arguments on to the "
                    "endpoint, as well as its positional ones")
    assert reply["y"] == 9, f"route('handle', x=3) returned {reply!r}: route passes the caller's keyword arguments on"
    retries_before = service.snapshot()["retries"]
    service.call_timeout = 0.5  # the hanging calls below take 2 s

    async def scenario():
        async def first_one_comes_back():
            while all(r.healthy for r in service.replicas):  # until the first attempt has marked its replica
                await asyncio.sleep(0.01)
            for replica in service.replicas:
                replica.healthy = True

        comeback = asyncio.create_task(first_one_comes_back())
        try:
            answer = await service.route("hang", 2.0)
        except BaseException:
            await asyncio.wait_for(comeback, TIMEOUT)
            raise
        comeback.cancel()
        pytest.fail(f"route answered {answer!r} from replicas that hang 2 s, with call_timeout 0.5 s: each call "
                    "waits at most self.call_timeout")

    with pytest.raises(chapter.ServiceUnavailable) as caught:
        aio.run(scenario())
    attempts = [(a.replica, a.outcome) for a in caught.value.attempts]
    assert sorted(attempts) == [(0, "timeout"), (1, "timeout")], (
        f"attempts {attempts}: each replica once. A replica this request already tried is not tried again, "
        "even when it is healthy again by then")
    assert attempts == [(1, "timeout"), (0, "timeout")], (
        f"attempts {attempts}: replica 1 was tried first, then replica 0. An Attempt records the index of the "
        "replica called, not the try's number")
    details = [a.detail for a in caught.value.attempts]
    assert details == ["no answer in time"] * 2, (
        f"each attempt's detail is its Outcome's summary (one line, said for every kind); got {details}")
    assert service.snapshot()["retries"] - retries_before == 1, (
        "one retry: the second attempt. When no replica is left to try, there is no third try to count")


@pytest.mark.todo("Service.route")
def test_a_cancelled_caller_takes_no_replica_out(chapter, make_service, aio):
    """The caller gives up (its task is cancelled) while its replica is still working: the replica is not at
    fault. It stays healthy, nothing is counted against it, and the cancel reaches the caller."""
    service = make_service(replicas=2, auto_recover=False)

    async def scenario():
        request = asyncio.create_task(service.route("hang", 1.0))
        while service.stats.requests == 0 and not request.done():  # until route has started
            await asyncio.sleep(0.01)
        for _ in range(5):
            await asyncio.sleep(0)  # route is now waiting for the replica's reply
        request.cancel()
        try:
            await asyncio.wait_for(request, TIMEOUT)
        except asyncio.CancelledError:
            return "cancelled"
        return "answered"

    assert aio.run(scenario()) == "cancelled", "the cancel goes on up to the caller"
    health = [replica.healthy for replica in service.replicas]
    assert health == [True, True] and service.stats.replica_failures == 0, (
        f"health {health}, {service.stats.replica_failures} failure(s) counted after a caller was cancelled: only a "
        "death or a timeout is the replica's fault; a cancel is the caller's own, and goes on up untouched")


@pytest.mark.todo("Service.route")
def test_a_late_failure_marks_the_replica_called_not_its_replacement(chapter, plumbing):
    """A request waits on replica 0, which hangs. Meanwhile another request's report got replica 0 replaced
    (recovery put a new one at index 0). When this request's call times out, it reports the replica it
    called, which is gone already: the replacement must stay in rotation. On a virtual clock."""
    service = service_here(chapter, plumbing, [StandIn(handle=NEVER), echo_here()], call_timeout=5.0)
    old = service.replicas[0]

    async def scenario():
        async def replaced_meanwhile():
            await asyncio.sleep(1)
            old.healthy = False  # another request saw it die...
            service.replicas[0] = plumbing.Replica(0, None, echo_here(), generation=2)  # ...and it was replaced

        replacing = asyncio.create_task(replaced_meanwhile())
        reply = await service.route("handle", 3)
        await replacing
        return reply

    try:
        reply = run_on_virtual_clock(scenario())
    except StuckForever:
        pytest.fail("route waited forever for a replica that never answers: wait at most self.call_timeout")
    assert reply["y"] == 9, "the retry on replica 1 answers"
    new = service.replicas[0]
    assert new.generation == 2 and new.healthy, (
        "the request's call to the old replica 0 failed after that replica had been replaced, and route took the "
        "replacement out of rotation: report the replica you called (mark_unhealthy ignores one already "
        "replaced), not whatever now holds its index")


@pytest.mark.todo("Service.route")
@pytest.mark.hint(2)
def test_each_try_waits_the_services_call_timeout(chapter, plumbing):
    """Three replicas that never answer, call_timeout 5 s, on a virtual clock: the request gives up after three
    tries of 5 s each, at t=15, with one timeout per replica."""
    service = service_here(chapter, plumbing, [StandIn(handle=NEVER) for _ in range(3)], call_timeout=5.0)

    async def scenario():
        try:
            await service.route("handle", 1)
        except chapter.ServiceUnavailable as err:
            return [(a.replica, a.outcome) for a in err.attempts], asyncio.get_running_loop().time()
        return None, None

    try:
        attempts, at = run_on_virtual_clock(scenario())
    except StuckForever:
        pytest.fail("route waited forever for a replica that never answers: each call waits at most self.call_timeout")
    assert attempts == [(0, "timeout"), (1, "timeout"), (2, "timeout")], (
        f"attempts {attempts}: one timeout on each replica")
    assert at == pytest.approx(15.0), (
        f"three tries on replicas that never answer gave up at t={at:g} s, not 15: each call waits the service's "
        "call_timeout (5 s here), not a default")
    assert service.stats.retries == 2, (
        f"stats.retries {service.stats.retries} after three tries: expected 2, one more for each try after the "
        "first (not set to 1)")


# --- The given fault filter: a pool's replicas may die; nobody else's failures are swallowed ---------------


def test_open_pools_filter_their_own_deaths_and_the_last_to_close_restores_the_hook(plumbing, monkeypatch):
    import monarch.actor

    seen = []
    monkeypatch.setattr(monarch.actor, "unhandled_fault_hook", seen.append)
    deaths = plumbing._ExpectedDeaths()
    deaths.expect("svc_a")
    deaths.expect("svc_b")

    class Failure:
        def __init__(self, mesh_name):
            self.mesh_name = mesh_name

    for mesh in ("svc_a0_g1", "svc_b1_g2", "logger-123", "someone_else"):
        monarch.actor.unhandled_fault_hook(Failure(mesh))
    assert [f.mesh_name for f in seen] == ["someone_else"], "only a failure no open pool expects is passed on"
    deaths.stop_expecting("svc_a")  # closed first, though opened first
    monarch.actor.unhandled_fault_hook(Failure("svc_a0_g1"))
    assert [f.mesh_name for f in seen] == ["someone_else", "svc_a0_g1"], "a closed pool's deaths are no longer its own"
    deaths.stop_expecting("svc_b")
    assert monarch.actor.unhandled_fault_hook == seen.append, "the last pool to close puts the hook back"
