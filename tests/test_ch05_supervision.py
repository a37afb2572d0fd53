"""Chapter 05: supervision. Run: pytest tests/test_ch05_supervision.py"""

import asyncio

import pytest

from koans.testing import STARTUP_TIMEOUT, TIMEOUT


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


@pytest.mark.todo("classify")
def test_a_reply_is_ok(chapter, child):
    outcome = asyncio.run(chapter.classify(child.ping.call_one(7), STARTUP_TIMEOUT, where="child"))
    assert (outcome.kind, outcome.ok, outcome.where) == ("ok", True, "child")
    assert outcome.value == {"x": 7, "pid": outcome.value["pid"]}, "the value of an ok Outcome is the reply itself"


@pytest.mark.todo("classify")
def test_an_exception_in_an_endpoint_is_not_a_death(chapter, child):
    outcome = asyncio.run(chapter.classify(child.fail.call_one("bad request"), TIMEOUT, where="child"))
    assert outcome.kind == "endpoint_error", f"an endpoint that raises is an endpoint_error, got {outcome.kind}"
    assert "bad request" in str(outcome.value) and outcome.where == "child"
    assert asyncio.run(chapter.classify(child.ping.call_one(1), TIMEOUT)).ok, "after raising, the actor still answers"


@pytest.mark.todo("classify")
def test_no_answer_in_time_is_a_timeout(chapter, child):
    outcome = asyncio.run(chapter.classify(child.stall.call_one(0.6), timeout=0.2, where="child"))
    assert outcome.kind == "timeout" and isinstance(outcome.value, TimeoutError) and outcome.where == "child"
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
    assert outcome.kind == "ok"
    assert ran_meanwhile > 0, ("nothing else ran while classify waited: it blocked the event loop. In async "
                               "code, wait with `await` (asyncio.wait_for), never with `.get()`")


@pytest.mark.todo("classify")
def test_a_dead_process_is_told_apart(chapter, fresh_procs):
    doomed = fresh_procs(procs=1).spawn("doomed_child", chapter.Child)
    assert asyncio.run(chapter.classify(doomed.ping.call_one(0), STARTUP_TIMEOUT)).ok
    outcome = asyncio.run(chapter.classify(doomed.crash.call_one(), TIMEOUT, where="doomed"))
    assert (outcome.kind, outcome.where) == ("died", "doomed"), f"a process that exits is 'died', got {outcome.kind}"


@pytest.mark.todo("classify")
def test_other_errors_are_not_swallowed(chapter):
    async def broken():
        raise KeyError("not a call's failure")

    with pytest.raises(KeyError):
        asyncio.run(chapter.classify(broken(), TIMEOUT))


@pytest.mark.todo("classify")
def test_the_supervisor_tells_the_two_failures_apart(supervised):
    supervisor = supervised()
    first_pid = ask(supervisor.ask, 1, timeout=STARTUP_TIMEOUT)["pid"]
    assert ask(supervisor.provoke, "raise") == "endpoint_error"
    assert ask(supervisor.ask, 2)["pid"] == first_pid, "an endpoint error kills nobody"
    status = ask(supervisor.status)
    assert (status["generation"], status["failures"]) == (1, [])


# --- TODO 2: Supervisor.__supervise__ --------------------------------------------------------


@pytest.mark.todo("Supervisor.__supervise__")
def test_each_killed_child_is_detected_recorded_and_replaced_once(plumbing, supervised, aio):
    supervisor = supervised()
    pids = [ask(supervisor.ask, 1, timeout=STARTUP_TIMEOUT)["pid"]]
    for generation in (2, 3):
        assert ask(supervisor.provoke, "crash") == "died"
        status = aio.run(plumbing.wait_for_generation(supervisor, generation, timeout=TIMEOUT))
        assert len(status["failures"]) == generation - 1, f"one death, one record: {status['failures']}"
        record = status["failures"][-1]
        assert record["generation"] == generation - 1, (
            f"the record's generation is the dead child's ({generation - 1}), not {record['generation']}: "
            "record it before you respawn")
        assert record["mesh"].startswith(f"child_g{generation - 1}"), f"the record names the mesh that died, not {record['mesh']!r}"
        assert "exited" in record["report"]
        replacement = ask(supervisor.ask, generation, timeout=STARTUP_TIMEOUT)
        assert replacement["x"] == generation and replacement["pid"] not in pids, "the replacement runs in a new process"
        pids.append(replacement["pid"])
    assert ask(supervisor.status)["generation"] == 3, "one new generation per death, never two"


@pytest.mark.todo("Supervisor.__supervise__")
def test_only_its_own_meshes_are_handled(chapter):
    class Failure:  # what Monarch hands __supervise__, reduced to what it reads
        def __init__(self, mesh_name):
            self.mesh_name = mesh_name

        def report(self):
            return "process exited"

    supervisor = chapter.Supervisor.__new__(chapter.Supervisor)  # the method alone, without spawning a child
    supervisor.generation, supervisor.failures = 1, []
    supervisor.spawn_child = lambda: setattr(supervisor, "generation", supervisor.generation + 1)
    assert supervisor.__supervise__(Failure("logger-abc")) is True, "Monarch's own log forwarder: handled, nothing to do"
    assert (supervisor.generation, supervisor.failures) == (1, [])
    assert supervisor.__supervise__(Failure("somebody_else")) is False, "not ours: pass it up the tree"
    assert (supervisor.generation, supervisor.failures) == (1, [])
    assert supervisor.__supervise__(Failure("child_g1-xyz")) is True
    assert supervisor.generation == 2 and supervisor.failures == [
        {"generation": 1, "mesh": "child_g1-xyz", "report": "process exited"}]


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
