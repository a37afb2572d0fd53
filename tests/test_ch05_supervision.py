"""Chapter 05: supervision. Run: pytest tests/test_ch05_supervision.py"""

import pytest

from koans.testing import STARTUP_TIMEOUT, TIMEOUT


@pytest.fixture
def supervised(chapter, request):
    """Factory: a Supervisor on a process of its own (stopped at teardown, with its children)."""
    started = []

    def start(poll="1s"):
        procs, supervisor = chapter.spawn_supervisor(poll=poll, name=f"supervisor_{len(started)}")
        started.append((procs, supervisor))
        return supervisor

    yield start
    for procs, supervisor in started:
        try:
            chapter.stop_supervisor(procs, supervisor, timeout=STARTUP_TIMEOUT)
        except Exception:  # a broken supervisor (e.g. a stub that raised): stop its process anyway
            procs.stop().get(timeout=STARTUP_TIMEOUT)


@pytest.fixture
def child(chapter, shared_procs):
    return shared_procs(procs=1).spawn("plain_child", chapter.Child)


# --- TODO 1: classify ---------------------------------------------------------------------


@pytest.mark.todo("classify")
def test_a_reply_is_ok(chapter, child):
    outcome = chapter.classify(child.ping.call_one(7), TIMEOUT, where="child")
    assert (outcome.kind, outcome.ok, outcome.where) == ("ok", True, "child")
    assert outcome.value["x"] == 7


@pytest.mark.todo("classify")
def test_an_exception_in_an_endpoint_is_not_a_death(chapter, child):
    outcome = chapter.classify(child.fail.call_one("bad request"), TIMEOUT)
    assert outcome.kind == "endpoint_error", f"an endpoint that raises is an endpoint_error, got {outcome.kind}"
    assert "bad request" in str(outcome.value)
    assert chapter.classify(child.ping.call_one(1), TIMEOUT).ok, "after raising, the actor still answers"


@pytest.mark.todo("classify")
def test_no_answer_in_time_is_a_timeout(chapter, child):
    outcome = chapter.classify(child.stall.call_one(1.0), timeout=0.2)
    assert outcome.kind == "timeout" and isinstance(outcome.value, TimeoutError)


@pytest.mark.todo("classify")
def test_a_dead_process_is_told_apart(chapter, fresh_procs):
    doomed = fresh_procs(procs=1).spawn("doomed_child", chapter.Child)
    assert chapter.classify(doomed.ping.call_one(0), STARTUP_TIMEOUT).ok
    outcome = chapter.classify(doomed.crash.call_one(), TIMEOUT)
    assert outcome.kind == "died", f"a process that exits is 'died', got {outcome.kind}"


@pytest.mark.todo("classify")
def test_the_supervisor_tells_the_two_failures_apart(supervised):
    supervisor = supervised()
    first_pid = supervisor.ask.call_one(1).get(timeout=STARTUP_TIMEOUT)["pid"]
    assert supervisor.provoke.call_one("raise").get(timeout=TIMEOUT) == "endpoint_error"
    assert supervisor.ask.call_one(2).get(timeout=TIMEOUT)["pid"] == first_pid, "an endpoint error kills nobody"
    status = supervisor.status.call_one().get(timeout=TIMEOUT)
    assert (status["generation"], status["failures"]) == (1, [])


# --- TODO 2: Supervisor.__supervise__ --------------------------------------------------------


@pytest.mark.todo("Supervisor.__supervise__")
def test_a_killed_child_is_detected_recorded_and_replaced(chapter, supervised):
    supervisor = supervised()
    first_pid = supervisor.ask.call_one(1).get(timeout=STARTUP_TIMEOUT)["pid"]
    assert supervisor.provoke.call_one("crash").get(timeout=TIMEOUT) == "died"
    status = chapter.wait_for_generation(supervisor, 2, timeout=TIMEOUT)
    assert status["generation"] == 2
    assert len(status["failures"]) == 1, f"one death, one record: {status['failures']}"
    assert status["failures"][0]["mesh"].startswith("child_g1"), "the record names the mesh that died"
    assert "exited" in status["failures"][0]["report"]
    replacement = supervisor.ask.call_one(2).get(timeout=STARTUP_TIMEOUT)
    assert replacement["x"] == 2 and replacement["pid"] != first_pid, "the replacement runs in a new process"


@pytest.mark.todo("Supervisor.__supervise__")
def test_every_death_gets_its_own_replacement(chapter, supervised):
    supervisor = supervised()
    pids = [supervisor.ask.call_one(0).get(timeout=STARTUP_TIMEOUT)["pid"]]
    for generation in (2, 3):
        assert supervisor.provoke.call_one("crash").get(timeout=TIMEOUT) == "died"
        chapter.wait_for_generation(supervisor, generation, timeout=TIMEOUT)
        pids.append(supervisor.ask.call_one(generation).get(timeout=STARTUP_TIMEOUT)["pid"])
    status = supervisor.status.call_one().get(timeout=TIMEOUT)
    assert [f["generation"] for f in status["failures"]] == [1, 2]
    assert len(set(pids)) == 3


@pytest.mark.todo("Supervisor.__supervise__")
@pytest.mark.parametrize("poll", ["500ms", "2s"])
def test_the_detection_poll_is_configurable(chapter, supervised, poll):
    supervisor = supervised(poll=poll)
    assert supervisor.status.call_one().get(timeout=STARTUP_TIMEOUT)["poll"] == poll, (
        "spawn_supervisor must start the supervisor's process with the poll setting in its environment"
    )
    assert supervisor.provoke.call_one("crash").get(timeout=TIMEOUT) == "died"
    assert chapter.wait_for_generation(supervisor, 2, timeout=TIMEOUT)["generation"] == 2
