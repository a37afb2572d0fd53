"""Chapter 01: hello, actor. Run: pytest tests/test_ch01_hello_actor.py

The tests follow the TODOs in order: greet, whereabouts, start_one_process,
spawn_greeter. Until you write spawn_greeter, they spawn with Monarch's own
`procs.spawn(name, ActorClass, *args)`.
"""

import asyncio
import math
import os

import pytest
import torch
from monarch.actor import this_proc

from koans.testkit.testing import STARTUP_TIMEOUT, TIMEOUT


@pytest.fixture
def remote_procs(shared_procs):
    """One process besides this one, shared with other tests."""
    return shared_procs(procs=1)


def greeter_here(chapter, name):
    return this_proc().spawn("greeter", chapter.Greeter, name)


# --- TODO 1: Greeter.greet -------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - returns exactly "Hello, <who>! I am <name> (greeting #<n>)."
#       -> test_greet_returns_the_greeting
#   - n counts this greeting too: the first is #1
#       -> test_greet_returns_the_greeting
#   - <who> is the caller's text as given: no tidying of spaces or case
#       -> test_the_visitor_is_greeted_as_given
#   - the count survives between calls
#       -> test_state_is_kept_across_calls
#   - the count is this actor's own, not shared with another greeter in the process
#       -> test_each_actor_has_its_own_state
#   - the same endpoint answers when awaited from async code
#       -> test_futures_can_be_awaited_in_async_code


def what_differs(reply, who: str, name: str, count: int) -> str:
    """The clause a greeting broke, read off the difference from the one expected (not the test's topic)."""
    import re

    expected = f"Hello, {who}! I am {name} (greeting #{count})."
    if not isinstance(reply, str):
        return f"greet answers the greeting as a str, not {type(reply).__name__}"
    numbers = re.findall(r"#(\d+)", reply)
    if numbers and int(numbers[-1]) != count:
        got = int(numbers[-1])
        return (f"the count says #{got} where it should say #{count}: "
                + ("count this greeting before building the text (the first greeting is #1)" if got == 0 else
                   "the count is this actor's own, kept on self (a counter shared by every Greeter, at class or "
                   "module level, counts the others' greetings too)" if got > count else
                   "each greeting counts one more than the last: keep the count on self, between calls"))
    if f"Hello, {name}" in reply and f"I am {who}" in reply:
        return "the visitor and the greeter are swapped: Hello, <who>! I am <name>"
    if who not in reply and who.strip() in reply:
        return "<who> is the caller's text exactly as given: leave its spaces and case alone"
    if re.sub(r"[^\w#]", "", reply) == re.sub(r"[^\w#]", "", expected):
        return f"the words are right; the punctuation or spacing differs from the contract's {expected!r}"
    return f"the contract's text is {expected!r}"


@pytest.mark.todo("Greeter.greet")
def test_greet_returns_the_greeting(chapter):
    ada = greeter_here(chapter, "Ada")
    reply = ada.greet.call_one("Grace").get(timeout=TIMEOUT)
    assert reply == "Hello, Grace! I am Ada (greeting #1).", (
        f"got {reply!r}: {what_differs(reply, 'Grace', 'Ada', 1)}")


@pytest.mark.todo("Greeter.greet")
def test_the_visitor_is_greeted_as_given(chapter):
    ada = greeter_here(chapter, "Ada")
    reply = ada.greet.call_one("  grace hopper ").get(timeout=TIMEOUT)
    assert reply == "Hello,   grace hopper ! I am Ada (greeting #1).", (
        f"got {reply!r}: {what_differs(reply, '  grace hopper ', 'Ada', 1)}")


@pytest.mark.todo("Greeter.greet")
def test_state_is_kept_across_calls(chapter):
    ada = greeter_here(chapter, "Ada")
    replies = [ada.greet.call_one(who).get(timeout=TIMEOUT) for who in ("A", "B", "C")]
    wrong = next(((n, who, reply) for n, (who, reply) in enumerate(zip("ABC", replies), start=1)
                  if reply != f"Hello, {who}! I am Ada (greeting #{n})."), None)
    assert wrong is None, (
        f"a new greeter greeted {replies}; greeting #{wrong[0] if wrong else 0}: "
        f"{what_differs(wrong[2], wrong[1], 'Ada', wrong[0]) if wrong else ''}")


@pytest.mark.todo("Greeter.greet")
def test_each_actor_has_its_own_state(chapter):
    ada, bob = greeter_here(chapter, "Ada"), greeter_here(chapter, "Bob")
    ada.greet.call_one("x").get(timeout=TIMEOUT)
    ada.greet.call_one("x").get(timeout=TIMEOUT)
    reply = bob.greet.call_one("x").get(timeout=TIMEOUT)
    assert reply == "Hello, x! I am Bob (greeting #1).", (
        f"Bob, after Ada greeted twice, said {reply!r}: {what_differs(reply, 'x', 'Bob', 1)}")


@pytest.mark.todo("Greeter.greet")
def test_futures_can_be_awaited_in_async_code(chapter, remote_procs):
    remote = remote_procs.spawn("greeter", chapter.Greeter, "Barbara")
    replies = asyncio.run(asyncio.wait_for(chapter.greet_twice(remote, "Edsger"), timeout=STARTUP_TIMEOUT))
    assert replies == ["Hello, Edsger! I am Barbara (greeting #1).", "Hello, Edsger! I am Barbara (greeting #2)."], (
        f"greeting a new greeter twice from async code (await instead of .get()) gave {replies!r}: greet answers "
        "the same text, #1 then #2, however its future is waited for")


# --- TODO 2: Greeter.whereabouts -------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - the keys are exactly pid, host and device
#       -> test_this_proc_runs_the_actor_in_our_own_process
#   - pid is the actor's own process (ours under this_proc(), another on a new mesh)
#       -> test_this_proc_runs_the_actor_in_our_own_process, test_a_proc_mesh_runs_the_actor_in_another_process
#   - host is the machine's host name
#       -> test_a_proc_mesh_runs_the_actor_in_another_process
#   - device is what the actor's process sees: "cpu" without a GPU
#       -> test_the_actor_reports_the_device_its_process_sees
#   - ... and "cuda" when its process sees one (asked of torch, not assumed)
#       -> test_the_device_is_asked_of_torch_not_assumed


@pytest.mark.todo("Greeter.whereabouts")
def test_this_proc_runs_the_actor_in_our_own_process(chapter):
    where = greeter_here(chapter, "Ada").whereabouts.call_one().get(timeout=TIMEOUT)
    assert set(where) == {"pid", "host", "device"}, (
        f"whereabouts answered {where!r}: its keys are exactly 'pid', 'host' and 'device', no more and no fewer")
    assert where["pid"] == os.getpid(), (
        f"the greeter runs in this process ({os.getpid()}: this_proc() is the calling process itself), yet "
        f"whereabouts reported pid {where['pid']}: report the pid of the process the endpoint runs in")


@pytest.mark.todo("Greeter.whereabouts")
def test_a_proc_mesh_runs_the_actor_in_another_process(chapter, remote_procs):
    remote = remote_procs.spawn("greeter", chapter.Greeter, "Barbara")
    where = remote.whereabouts.call_one().get(timeout=STARTUP_TIMEOUT)
    assert where["pid"] != os.getpid(), "an actor spawned on a new ProcMesh runs in that new process"
    assert where["host"] == os.uname().nodename, (
        f"host {where['host']!r} is not this machine's host name {os.uname().nodename!r}: ask the actor's own "
        "process for its host name")


@pytest.mark.todo("Greeter.whereabouts")
def test_the_actor_reports_the_device_its_process_sees(chapter, remote_procs, device):
    remote = remote_procs.spawn("greeter", chapter.Greeter, "Barbara")
    where = remote.whereabouts.call_one().get(timeout=STARTUP_TIMEOUT)
    assert where["device"] == device.type, f"this machine computes on {device.type!r}"


@pytest.mark.todo("Greeter.whereabouts")
def test_the_device_is_asked_of_torch_not_assumed(chapter, monkeypatch):
    """A stand-in GPU: this process is made to report one visible CUDA device, and the actor runs here."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    if hasattr(torch, "accelerator"):
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
        monkeypatch.setattr(torch.accelerator, "device_count", lambda: 1)
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args, **kwargs: torch.device("cuda"))
    where = greeter_here(chapter, "Ada").whereabouts.call_one().get(timeout=TIMEOUT)
    assert where["device"] == "cuda", (
        f"this process now sees a GPU, yet the actor reported {where['device']!r}: ask torch what the actor's "
        "process can see (\"cuda\" when it sees a GPU), do not assume \"cpu\"")


# --- TODO 3: start_one_process ---------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - a mesh of exactly one process, its dimension named "procs" as in every chapter
#       -> test_start_one_process_makes_a_mesh_of_one_new_process
#   - a new process, not the caller's own
#       -> test_start_one_process_makes_a_mesh_of_one_new_process
#   - a new one at every call (not one kept and handed out again)
#       -> test_each_call_starts_a_process_of_its_own


@pytest.mark.todo("start_one_process")
def test_start_one_process_makes_a_mesh_of_one_new_process(chapter):
    procs = chapter.start_one_process()
    sizes = dict(procs.sizes)
    assert sizes, (
        f"start_one_process returned a {type(procs).__name__} with no dimensions: that is the calling process "
        "(this_proc()) or the host itself (this_host()), not a mesh of one new process")
    ours = False
    try:
        assert math.prod(sizes.values()) == 1, (
            f"start_one_process should make a mesh of exactly one process; this one has dimensions {sizes}")
        assert sizes == {"procs": 1}, (
            f"dimensions {sizes}: the course names a mesh's processes 'procs' (callers slice it with procs=0)")
        where = procs.spawn("greeter", chapter.Greeter, "Remy").whereabouts.call_one().get(timeout=STARTUP_TIMEOUT)
        ours = where["pid"] == os.getpid()
        assert not ours, ("start_one_process should start a new process; the mesh it returned is this very "
                          "process (what this_proc() gives)")
    finally:
        if not ours:  # this process itself is not ours to stop
            procs.stop().get(timeout=STARTUP_TIMEOUT)


@pytest.mark.todo("start_one_process")
def test_each_call_starts_a_process_of_its_own(chapter):
    first = chapter.start_one_process()
    second = chapter.start_one_process()
    try:
        assert second is not first, (
            "start_one_process returned the same ProcMesh twice: each call starts one new process, so that "
            "stopping one caller's mesh never stops another's")
    finally:
        first.stop().get(timeout=STARTUP_TIMEOUT)
        if second is not first:
            second.stop().get(timeout=STARTUP_TIMEOUT)


# --- TODO 4: spawn_greeter -------------------------------------------------------------------------
# Contract, clause by clause (the test that holds each):
#   - the greeter lives on the mesh it is given (this_proc() or a new one)
#       -> test_spawn_greeter_works_on_any_proc_mesh
#   - `name` reaches the greeter's __init__
#       -> test_spawn_greeter_works_on_any_proc_mesh, test_each_greeter_is_spawned_under_its_own_name
#   - the actor is spawned under `name`, so logs and failure reports tell greeters apart
#       -> test_each_greeter_is_spawned_under_its_own_name


@pytest.mark.todo("spawn_greeter")
def test_spawn_greeter_works_on_any_proc_mesh(chapter, remote_procs):
    here = chapter.spawn_greeter(this_proc(), "Ada")
    there = chapter.spawn_greeter(remote_procs, "Barbara")
    replies = [here.greet.call_one("you").get(timeout=TIMEOUT), there.greet.call_one("you").get(timeout=STARTUP_TIMEOUT)]
    assert replies == ["Hello, you! I am Ada (greeting #1).", "Hello, you! I am Barbara (greeting #1)."], (
        f"the greeters spawned as 'Ada' and 'Barbara' answered {replies}: `name` must reach Greeter.__init__ (the "
        "arguments after the class)")
    pids = [g.whereabouts.call_one().get(timeout=TIMEOUT)["pid"] for g in (here, there)]
    assert pids == [os.getpid(), pids[1]] and pids[1] != os.getpid(), (
        f"spawn_greeter(this_proc(), ...) should put its greeter in this process ({os.getpid()}) and "
        f"spawn_greeter(remote_procs, ...) in the other one; they answered from pids {pids}: use the ProcMesh "
        "you are given")


class RecordingProcs:
    """Stands in for a ProcMesh: spawns in this process, and records the name each actor was spawned under."""

    def __init__(self):
        self.names = []

    def spawn(self, name, actor_class, *args, **kwargs):
        self.names.append(name)
        return this_proc().spawn(name, actor_class, *args, **kwargs)


@pytest.mark.todo("spawn_greeter")
def test_each_greeter_is_spawned_under_its_own_name(chapter):
    procs = RecordingProcs()
    for name in ("Ada", "Grace"):
        greeter = chapter.spawn_greeter(procs, name)
        assert greeter.greet.call_one("you").get(timeout=TIMEOUT) == f"Hello, you! I am {name} (greeting #1).", (
            f"the greeter from spawn_greeter(procs, {name!r}) did not answer 'Hello, you! I am {name} (greeting #1).' "
            "to its first greeting: either `name` did not reach Greeter.__init__ (the arguments after the class), or "
            "greet itself (TODO 1) does not answer as its contract says")
    assert procs.names == ["Ada", "Grace"], (
        f"the greeters were spawned under the actor names {procs.names}: spawn each under its own `name`, so that "
        "Monarch's logs and failure reports tell them apart")
