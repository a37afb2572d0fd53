"""Chapter 01: hello, actor. Run: pytest tests/test_ch01_hello_actor.py"""

import asyncio
import os

import pytest
from monarch.actor import this_proc

from koans.testing import STARTUP_TIMEOUT, TIMEOUT


@pytest.fixture
def remote_procs(shared_procs):
    """One process besides this one, shared by the tests below."""
    return shared_procs(procs=1)


@pytest.mark.todo("Greeter.greet", "spawn_greeter")
def test_greet_returns_the_greeting(chapter):
    ada = chapter.spawn_greeter(this_proc(), "Ada")
    reply = ada.greet.call_one("Grace").get(timeout=TIMEOUT)
    assert reply == "Hello, Grace! I am Ada (greeting #1)."


@pytest.mark.todo("Greeter.greet", "spawn_greeter")
def test_state_is_kept_across_calls(chapter):
    ada = chapter.spawn_greeter(this_proc(), "Ada")
    replies = [ada.greet.call_one(who).get(timeout=TIMEOUT) for who in ("A", "B", "C")]
    assert [r.rsplit("#", 1)[1] for r in replies] == ["1).", "2).", "3)."], (
        f"each greeting should count one more than the last; got {replies}"
    )


@pytest.mark.todo("Greeter.greet", "spawn_greeter")
def test_each_actor_has_its_own_state(chapter):
    ada = chapter.spawn_greeter(this_proc(), "Ada")
    bob = chapter.spawn_greeter(this_proc(), "Bob")
    ada.greet.call_one("x").get(timeout=TIMEOUT)
    ada.greet.call_one("x").get(timeout=TIMEOUT)
    assert bob.greet.call_one("x").get(timeout=TIMEOUT) == "Hello, x! I am Bob (greeting #1).", (
        "Bob's count must not see Ada's greetings: state belongs to one actor"
    )


@pytest.mark.todo("Greeter.whereabouts", "spawn_greeter")
def test_this_proc_runs_the_actor_in_our_own_process(chapter):
    local = chapter.spawn_greeter(this_proc(), "Ada")
    where = local.whereabouts.call_one().get(timeout=TIMEOUT)
    assert where["pid"] == os.getpid()


@pytest.mark.todo("Greeter.whereabouts", "spawn_greeter")
def test_a_proc_mesh_runs_the_actor_in_another_process(chapter, remote_procs):
    remote = chapter.spawn_greeter(remote_procs, "Barbara")
    where = remote.whereabouts.call_one().get(timeout=STARTUP_TIMEOUT)
    assert where["pid"] != os.getpid(), "an actor spawned on a new ProcMesh must run in that new process"
    assert remote.greet.call_one("Grace").get(timeout=TIMEOUT) == "Hello, Grace! I am Barbara (greeting #1)."


@pytest.mark.todo("Greeter.whereabouts", "spawn_greeter")
def test_the_actor_reports_the_device_its_process_sees(chapter, remote_procs, device):
    remote = chapter.spawn_greeter(remote_procs, "Barbara")
    where = remote.whereabouts.call_one().get(timeout=STARTUP_TIMEOUT)
    assert set(where) == {"pid", "host", "device"}
    assert where["device"] == device.type
    assert where["host"] == os.uname().nodename


@pytest.mark.todo("Greeter.greet", "spawn_greeter")
def test_futures_can_be_awaited_in_async_code(chapter, remote_procs):
    remote = chapter.spawn_greeter(remote_procs, "Barbara")
    replies = asyncio.run(asyncio.wait_for(chapter.greet_twice(remote, "Edsger"), timeout=STARTUP_TIMEOUT))
    assert replies == ["Hello, Edsger! I am Barbara (greeting #1).", "Hello, Edsger! I am Barbara (greeting #2)."]


@pytest.mark.todo("start_one_process", "spawn_greeter", "Greeter.whereabouts")
def test_start_one_process_makes_a_new_process(chapter):
    procs = chapter.start_one_process()
    try:
        sizes = dict(procs.sizes)
        assert sizes == {"procs": 1}, f"expected a mesh of exactly one process, got dimensions {sizes}"
        where = chapter.spawn_greeter(procs, "Remy").whereabouts.call_one().get(timeout=STARTUP_TIMEOUT)
        assert where["pid"] != os.getpid()
    finally:
        procs.stop().get(timeout=STARTUP_TIMEOUT)
