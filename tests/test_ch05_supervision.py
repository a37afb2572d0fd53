"""Chapter 05: supervision. Run: pytest tests/test_ch05_supervision.py"""

import asyncio

import pytest
from monarch.actor import ActorError

from koans.testkit.monarch_compat import SupervisionError
from koans.testkit.testing import STARTUP_TIMEOUT, TIMEOUT, run_on_virtual_clock


@pytest.fixture
def supervised(chapter, plumbing, aio):
    """Factory: a Supervisor on a process of its own (stopped at teardown, with its children)."""
    started = []

    def start(poll="500ms"):
        procs, supervisor = chapter.spawn_supervisor(poll=poll, name=f"supervisor_{len(started)}")
        started.append((procs, supervisor))
        return supervisor

    yield start

    async def stop(procs, supervisor):
        try:
            await plumbing.stop_supervisor(procs, supervisor, timeout=STARTUP_TIMEOUT)
        except Exception:  # a broken supervisor (e.g. a stub that raised): stop its process anyway
            await asyncio.wait_for(procs.stop(), STARTUP_TIMEOUT)

    async def stop_all():  # at once: each stop waits on its own processes
        await asyncio.gather(*(stop(procs, supervisor) for procs, supervisor in started))

    aio.run(stop_all())


@pytest.fixture
def child(chapter, shared_procs):
    return shared_procs(procs=1).spawn("plain_child", chapter.Child)


def ask(endpoint, *args, timeout=TIMEOUT):
    return endpoint.call_one(*args).get(timeout=timeout)


# --- TODO 1: classify ---------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   1. a reply is "ok", its value the reply itself           -> test_a_reply_is_ok
#   2. an endpoint that raised is "endpoint_error", no death -> test_an_exception_in_an_endpoint_is_not_a_death,
#                                                               test_the_supervisor_tells_the_two_failures_apart
#   3. an endpoint error's value is the exception itself     -> test_an_exception_in_an_endpoint_is_not_a_death
#   4. a process that died is "died"                         -> test_a_dead_process_is_told_apart
#   5. a death's value is the exception itself               -> test_a_dead_process_is_told_apart
#   6. no reply within the given `timeout` is "timeout",
#      its value a TimeoutError                              -> test_no_answer_in_time_is_a_timeout
#   7. it waits with `await`: other tasks run meanwhile      -> test_waiting_lets_other_tasks_run
#   8. every Outcome carries `where`                         -> test_a_reply_is_ok (and each test above)
#   9. any other exception propagates                        -> test_other_errors_are_not_swallowed
#  10. a cancel is not a timeout: CancelledError propagates  -> test_a_cancelled_caller_is_not_a_timeout
#  11. `timeout` is seconds as given, fractions too (not rounded to whole seconds), and 0 is no wait at all
#                                                            -> test_a_fractional_timeout_is_kept_as_given


@pytest.mark.todo("classify")
def test_a_reply_is_ok(chapter, child):
    outcome = asyncio.run(chapter.classify(child.ping.call_one(7), STARTUP_TIMEOUT, where="child"))
    assert (outcome.kind, outcome.ok, outcome.where) == ("ok", True, "child"), (
        f"a reply in time: kind {outcome.kind!r}, ok {outcome.ok}, where {outcome.where!r}; expected 'ok', True and "
        "'child': every Outcome carries the `where` it was given")
    assert outcome.value == {"x": 7, "pid": outcome.value["pid"]}, "the value of an ok Outcome is the reply itself"


@pytest.mark.todo("classify")
def test_an_exception_in_an_endpoint_is_not_a_death(chapter, child):
    outcome = asyncio.run(chapter.classify(child.fail.call_one("bad request"), TIMEOUT, where="child"))
    assert outcome.kind == "endpoint_error", f"an endpoint that raises is an endpoint_error, got {outcome.kind}"
    assert isinstance(outcome.value, ActorError), (
        "an endpoint error's value is the exception itself (the ActorError caught), which a caller such as "
        f"chapter 06's service raises again; got {type(outcome.value).__name__}: {outcome.value!r:.100}")
    assert "bad request" in str(outcome.value) and outcome.where == "child", (
        f"an endpoint that raised 'bad request' gave value {outcome.value!r:.100}, where {outcome.where!r}; expected "
        "the exception itself (its text names 'bad request') and where 'child': every Outcome carries `where`")
    assert asyncio.run(chapter.classify(child.ping.call_one(1), TIMEOUT)).ok, "after raising, the actor still answers"


@pytest.mark.todo("classify")
def test_a_fractional_timeout_is_kept_as_given(chapter):
    class prompt_reply:  # stands in for a call that answers at once, after two turns of the event loop
        def __await__(self):
            yield from asyncio.sleep(0).__await__()
            yield from asyncio.sleep(0).__await__()
            return "pong"

        def get(self, timeout=None):
            raise AssertionError("a blocking .get() inside classify, async code: it stops the event loop until the "
                                 "reply comes; await the future (with the timeout) instead")

    outcome = asyncio.run(chapter.classify(prompt_reply(), timeout=0.9, where="stand-in"))
    assert (outcome.kind, outcome.value) == ("ok", "pong"), (
        f"a reply that came at once, within timeout=0.9, was classified {outcome.kind!r}: the timeout is "
        "seconds as given, fractions too; int(0.9) is 0, which gives up at once")
    outcome = run_on_virtual_clock(chapter.classify(prompt_reply(), timeout=0, where="stand-in"))
    why = ("A timeout of 0 waits not at all; it is not 'no timeout given' (bound the wait by `timeout` as given: "
           "never ignore it, never replace it by a default)" if outcome.kind == "ok" else
           "the wait's TimeoutError is a 'timeout'; only the three failure classes are anything else")
    assert outcome.kind == "timeout", (
        f"timeout=0 and a reply that needs two turns of the event loop: classified {outcome.kind!r}, not "
        f"'timeout'. {why}")


@pytest.mark.todo("classify")
def test_no_answer_in_time_is_a_timeout(chapter, child):
    outcome = asyncio.run(chapter.classify(child.stall.call_one(0.6), timeout=0.2, where="child"))
    assert outcome.kind == "timeout" and isinstance(outcome.value, TimeoutError) and outcome.where == "child", (
        f"a reply that takes 0.6 s, with timeout=0.2: kind {outcome.kind!r}, value a {type(outcome.value).__name__}, "
        f"where {outcome.where!r}; expected 'timeout', a TimeoutError and 'child': no reply within the given "
        "`timeout` is a 'timeout', its value a TimeoutError, and every Outcome carries `where`")
    assert ask(child.ping, 3)["x"] == 3, "a slow actor is not a dead one"


@pytest.mark.todo("classify")
def test_waiting_lets_other_tasks_run(chapter, child):
    """classify is async: while it waits for a reply, the event loop runs other tasks (a `.get()` would
    block the whole loop: nothing else could run until the reply came)."""
    ticks = []

    async def scenario():
        async def ticker():
            while True:
                ticks.append(len(ticks))
                await asyncio.sleep(0.01)

        ticking = asyncio.create_task(ticker())
        outcome = await chapter.classify(child.stall.call_one(0.3), timeout=STARTUP_TIMEOUT, where="child")
        ran_meanwhile = len(ticks)  # read before this task yields again
        ticking.cancel()
        return outcome, ran_meanwhile

    outcome, ran_meanwhile = asyncio.run(scenario())
    assert outcome.kind == "ok", (
        f"a reply that came after 0.3 s, well within the timeout, was classified {outcome.kind!r}: a reply within "
        "the given `timeout` is 'ok'")
    assert ran_meanwhile > 0, ("nothing else ran while classify waited: it blocked the event loop. In async "
                               "code, wait with `await` (asyncio.wait_for), never with `.get()`")


@pytest.mark.todo("classify")
def test_a_dead_process_is_told_apart(chapter, fresh_procs):
    doomed = fresh_procs(procs=1).spawn("doomed_child", chapter.Child)
    assert asyncio.run(chapter.classify(doomed.ping.call_one(0), STARTUP_TIMEOUT)).ok, (
        "a ping to a live child, before any crash, was not classified 'ok': a reply within the timeout is 'ok'")
    outcome = asyncio.run(chapter.classify(doomed.crash.call_one(), TIMEOUT, where="doomed"))
    assert (outcome.kind, outcome.where) == ("died", "doomed"), f"a process that exits is 'died', got {outcome.kind}"
    assert isinstance(outcome.value, SupervisionError), (
        "a death's value is the exception itself (the SupervisionError caught), which a caller can raise or "
        f"log; got {type(outcome.value).__name__}: {outcome.value!r:.100}")


@pytest.mark.todo("classify")
@pytest.mark.parametrize("error", [KeyError("not a call's failure"), RuntimeError("a bug, not a death")],
                         ids=["KeyError", "RuntimeError"])
def test_other_errors_are_not_swallowed(chapter, error):
    async def broken():
        raise error

    try:
        outcome = asyncio.run(chapter.classify(broken(), TIMEOUT))
    except Exception as raised:
        assert raised is error, f"classify raised {raised!r}: the error that is not a call's failure goes on up as it is"
        return
    raise AssertionError(f"a {type(error).__name__} became Outcome {outcome.kind!r}: only Monarch's ActorError, "
                         "SupervisionError and the timeout are outcomes; catch those classes, not a base class "
                         "such as RuntimeError, so that any other error goes on up")


@pytest.mark.todo("classify")
def test_a_cancelled_caller_is_not_a_timeout(chapter):
    """Cancelling the task that waits in classify (its caller gave up, or the program shuts down) must end that
    task: CancelledError goes on up. Turned into an Outcome, the cancel is lost and the task runs on."""

    async def scenario():
        waiting = asyncio.Event()

        async def never_answers():
            waiting.set()
            await asyncio.Event().wait()

        task = asyncio.create_task(chapter.classify(never_answers(), TIMEOUT, where="child"))
        started = asyncio.create_task(waiting.wait())
        await asyncio.wait([task, started], timeout=TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if not task.done():  # classify is waiting: cancel its caller's task now
            task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            return "cancelled"

    result = asyncio.run(scenario())
    assert result == "cancelled", (
        f"classify was cancelled while it waited, and returned {result!r}: a cancellation is not a timeout. "
        "Let CancelledError propagate: catch only the three failures a call can have")


@pytest.mark.todo("classify")
def test_the_supervisor_tells_the_two_failures_apart(supervised):
    supervisor = supervised()
    first_pid = ask(supervisor.ask, 1, timeout=STARTUP_TIMEOUT)["pid"]
    assert ask(supervisor.provoke, "raise") == "endpoint_error", (
        "the supervisor's child raised inside an endpoint, and classify did not call it 'endpoint_error': an "
        "endpoint that raised is an endpoint_error, not a death")
    assert ask(supervisor.ask, 2)["pid"] == first_pid, "an endpoint error kills nobody"
    status = ask(supervisor.status)
    assert (status["generation"], status["failures"]) == (1, []), (
        f"after an endpoint error the supervisor is at generation {status['generation']!r} with failures "
        f"{status['failures']!r}; expected generation 1 and none: an endpoint error kills nobody, so nothing is "
        "recorded or replaced")


# --- TODO 2: Supervisor.__supervise__ --------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   1. it knows its child by what it spawned it as
#      (self.child_name), never by Monarch's names           -> test_the_child_is_known_by_what_it_was_spawned_as
#   2. the current child's failure is recorded before the
#      respawn: {"generation": the dead child's, "mesh": the
#      failed mesh's name, "report": failure.report()}       -> test_the_child_is_known_by_what_it_was_spawned_as,
#                                                               test_each_killed_child_is_detected_recorded_and_replaced_once
#   3. and replaced: the next generation, on a new process   -> test_each_killed_child_is_detected_recorded_and_replaced_once
#   4. each death is recorded and replaced once, however
#      many failures report it                               -> test_a_death_reported_twice_is_replaced_once
#   5. any other mesh (Monarch's own, whatever its name):
#      nothing recorded or replaced                          -> test_monarchs_own_meshes_are_left_alone_whatever_their_names
#   6. handled either way (True; False fails the supervisor) -> test_monarchs_own_meshes_are_left_alone_whatever_their_names,
#                                                               test_a_death_is_handled_whatever_the_poll_interval
#   7. it works whatever the supervision poll interval       -> test_a_death_is_handled_whatever_the_poll_interval
#   8. every death of the current child, however many came
#      before: no restart budget                             -> test_every_death_is_replaced_however_many_came_before

REPORT = "the process this actor was running on exited with non-zero code 1"


class Failure:
    """What Monarch hands __supervise__, reduced to what it reads."""

    def __init__(self, mesh_name):
        self.mesh_name = mesh_name

    def report(self):
        return REPORT


def bare_supervisor(chapter, child_name=lambda generation: f"child_g{generation}"):
    """A Supervisor for its __supervise__ alone, at generation 1: no process is spawned; its spawn_child
    only starts the next generation and names its child (`child_name(generation)`)."""
    supervisor = chapter.Supervisor.__new__(chapter.Supervisor)
    supervisor.generation, supervisor.failures, supervisor.child_name = 1, [], child_name(1)

    def spawn_child():
        supervisor.generation += 1
        supervisor.child_name = child_name(supervisor.generation)

    supervisor.spawn_child = spawn_child
    return supervisor


@pytest.mark.todo("Supervisor.__supervise__")
def test_the_child_is_known_by_what_it_was_spawned_as(chapter):
    supervisor = bare_supervisor(chapter, child_name=lambda generation: f"replica_{'abc'[generation - 1]}")
    handled = supervisor.__supervise__(Failure("replica_a-Xy12"))
    assert supervisor.failures == [{"generation": 1, "mesh": "replica_a-Xy12", "report": REPORT}], (
        "the current child's failure is recorded as {generation: the dead child's, mesh: the failed mesh's name, "
        "report: failure.report()}. Know the child by what it was spawned as (self.child_name, here "
        f"'replica_a'), not by a name you expect: got {supervisor.failures}")
    assert (handled, supervisor.generation) == (True, 2), (
        "the current child's failure is handled (True) by starting the next generation (spawn_child): "
        f"got {handled!r}, generation {supervisor.generation}")


@pytest.mark.todo("Supervisor.__supervise__")
def test_monarchs_own_meshes_are_left_alone_whatever_their_names(chapter):
    """Monarch runs meshes of its own on every process it starts (0.7: logger-..., 0.8: log_level-...); they
    die with the child's process, and their failures come to the owner of that process too."""
    supervisor = bare_supervisor(chapter)
    for name in ("logger-atYxTPXoBfV", "log_level-7aqj9AHFNqQ", "a_helper_of_a_later_monarch-q1",
                 "child_g1_logger-w8", "logs_of_child_g1-q3"):  # a later Monarch may name its meshes after yours
        child = supervisor.child_name
        handled = supervisor.__supervise__(Failure(name))
        assert (supervisor.generation, supervisor.failures) == (1, []), (
            f"{name!r} is not the child (that is {child!r}, spawned as such): nothing to record or replace. "
            f"Got generation {supervisor.generation}, failures {supervisor.failures}")
        assert handled is True, (
            f"{name!r}, a mesh Monarch runs on the child's process, returned {handled!r}: handle it (True), "
            "whatever its name. False fails the supervisor itself, and passes the failure up")


@pytest.mark.todo("Supervisor.__supervise__")
def test_a_death_reported_twice_is_replaced_once(chapter):
    supervisor = bare_supervisor(chapter)
    for mesh in ("child_g1-xyz", "child_g1-xyz", "child_g2-abc"):  # the first death reported twice, then one more
        assert supervisor.__supervise__(Failure(mesh)) is True, (
            f"__supervise__ did not return True for the failure of {mesh!r}: every failure is handled (True), a "
            "second report of a death already replaced too; False fails the supervisor itself")
    assert [(f["generation"], f["mesh"]) for f in supervisor.failures] == [(1, "child_g1-xyz"), (2, "child_g2-abc")], (
        "each death is recorded once, however many failures report it: a second report of child_g1 comes after "
        f"it was replaced (it is no longer self.child_name). Got {supervisor.failures}")
    assert supervisor.generation == 3, f"each death is replaced once: two deaths, generation 3, not {supervisor.generation}"


@pytest.mark.todo("Supervisor.__supervise__")
def test_every_death_is_replaced_however_many_came_before(chapter):
    supervisor = bare_supervisor(chapter)
    for generation in range(1, 13):
        assert supervisor.__supervise__(Failure(f"child_g{generation}-x{generation}")) is True, (
            f"__supervise__ did not return True for the death of generation {generation}'s child: each death of "
            "the current child is handled (True), however many came before it")
    assert (supervisor.generation, len(supervisor.failures)) == (13, 12), (
        f"12 deaths of the current child: generation {supervisor.generation} and {len(supervisor.failures)} "
        "records, not 13 and 12. Each death of the current child is recorded and replaced, however many came "
        "before it")


@pytest.mark.todo("Supervisor.__supervise__")
def test_each_killed_child_is_detected_recorded_and_replaced_once(plumbing, supervised, aio):
    """After the quick tests above, which name the clause: this one kills real processes, and shows the symptom."""
    supervisor = supervised()
    pids = [ask(supervisor.ask, 1, timeout=STARTUP_TIMEOUT)["pid"]]
    for generation in (2, 3):
        try:
            provoked = ask(supervisor.provoke, "crash")
            status = aio.run(plumbing.wait_for_generation(supervisor, generation, timeout=TIMEOUT))
        except (ActorError, SupervisionError) as err:
            pytest.fail(f"the supervisor itself failed when its child's process died ({str(err)[:300]}): "
                        "__supervise__ answers True for every failure it is called for, the child's and the meshes "
                        "Monarch runs on that process alike (False or an exception passes it all up)")
        assert provoked == "died", (
            f"the child's process was crashed, and classify called it {provoked!r}, not 'died': a process that died "
            "is 'died'")
        strangers = [f["mesh"] for f in status["failures"] if not f["mesh"].startswith("child_g")]
        assert len(status["failures"]) == generation - 1, (
            f"one death, one record: {status['failures']}" + (
                f"; {strangers} are meshes Monarch runs for itself, not the child: record nothing for a mesh "
                "not spawned as self.child_name" if strangers else ""))
        record = status["failures"][-1]
        assert record["generation"] == generation - 1, (
            f"the record's generation is the dead child's ({generation - 1}), not {record['generation']}: "
            "record it before you respawn")
        assert record["mesh"].startswith(f"child_g{generation - 1}"), f"the record names the mesh that died, not {record['mesh']!r}"
        assert "exited" in record["report"], (
            f"the record's report is {record['report']!r}: record failure.report(), Monarch's own account of the "
            "death (it says the process exited)")
        replacement = ask(supervisor.ask, generation, timeout=STARTUP_TIMEOUT)
        assert replacement["x"] == generation and replacement["pid"] not in pids, "the replacement runs in a new process"
        pids.append(replacement["pid"])
    assert ask(supervisor.status)["generation"] == 3, "one new generation per death, never two"


@pytest.mark.todo("Supervisor.__supervise__")
def test_a_death_is_handled_whatever_the_poll_interval(plumbing, supervised, aio):
    supervisors = {poll: supervised(poll=poll) for poll in ("500ms", "2s")}
    for poll, supervisor in supervisors.items():
        assert ask(supervisor.status, timeout=STARTUP_TIMEOUT)["poll"] == poll, "the setting reached the supervisor's process"
    provoked = {poll: supervisor.provoke.call_one("crash") for poll, supervisor in supervisors.items()}  # both at once
    for poll, reply in provoked.items():
        assert reply.get(timeout=TIMEOUT) == "died", poll

    async def replaced():
        return await asyncio.gather(*(plumbing.wait_for_generation(s, 2, timeout=TIMEOUT) for s in supervisors.values()))

    for poll, status in zip(supervisors, aio.run(replaced())):
        assert [(f["generation"], f["mesh"][:8]) for f in status["failures"]] == [(1, "child_g1")], (
            f"poll {poll}: one death of generation 1, recorded once, whatever the poll interval")
    for poll, supervisor in supervisors.items():
        assert ask(supervisor.ask, 5, timeout=STARTUP_TIMEOUT)["x"] == 5, f"poll {poll}: and the replacement serves"
