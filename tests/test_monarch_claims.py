"""What the docs claim about Monarch 0.7, shown on the installed library. Each test is the
ten-line script behind a sentence of the docs, and prints nothing unless the claim fails.

  docs/02_actor_mesh.md   a failure is contained to its process: an endpoint error poisons nothing;
                          a dead process leaves the others' actors answering, a spawn on a slice
                          without it works, and a spawn that covers it does not complete
  docs/03_rdma_transfer.md  a handle pickles to a few hundred bytes whatever the memory's size;
                          read_into sees the owner's memory as it is at the time of the read;
                          Monarch itself checks shape and size but never dtype
  docs/02_actor_mesh.md   context().actor_instance.rank is the actor's own place; current_rank()
                          is the message's view, renumbered by a slice
  docs/02_actor_mesh.md   an endpoint that raises under broadcast() has no caller to hand the error to:
                          the actor dies and the failure reaches the fault hook; under call_one the
                          caller gets ActorError and the actor lives
  docs/05_supervision.md  a caller's timeout does not cancel the remote call: the endpoint runs on
                          and finishes; an out-of-memory exception raised in an endpoint is an
                          ActorError like any other, and the actor still answers
  docs/01_hello_actor.md  an actor handles one message at a time, an async endpoint's awaits
                          included; only a @concurrent_endpoint lets another message in at an await
  docs/appendix/cluster.md  an endpoint that waits for a completion sent to its own actor wedges, blocking
                          or awaiting in a plain endpoint alike; awaiting in a concurrent one does not. On
                          0.7.0's TCP fallback a read's own completion does not come through the actor
"""

import asyncio
import os
import pickle
import signal
import threading
import time

import pytest
import torch
from monarch.actor import Actor, ActorError, concurrent_endpoint, endpoint, this_proc
from monarch.rdma import RDMABuffer

from koans.testkit import processes
from koans.testkit.claim_actors import Broken, Holder, Notifier, Probe, Waiter
from koans.testkit.monarch_compat import SupervisionError

TIMEOUT = 30


def test_an_endpoint_error_poisons_nothing(fresh_procs, test_tag):
    procs = fresh_procs(procs=2)
    probe = procs.spawn(f"probe_{test_tag}", Probe)
    with pytest.raises(ActorError):
        probe.slice(procs=0).boom.call_one().get(timeout=TIMEOUT)
    assert probe.slice(procs=0).ping.call_one().get(timeout=TIMEOUT), "the actor that raised still answers"
    again = procs.spawn(f"again_{test_tag}", Probe)
    assert len(again.ping.call().get(timeout=TIMEOUT)) == 2, "and the mesh still takes new actors"


def test_a_death_spoils_only_its_own_process(fresh_procs, test_tag):
    procs = fresh_procs(procs=2)
    probe = procs.spawn(f"probe_{test_tag}", Probe)
    probe.ping.call().get(timeout=TIMEOUT)
    with pytest.raises(SupervisionError):
        probe.slice(procs=1).die.call_one().get(timeout=TIMEOUT)
    other_pid = probe.slice(procs=0).ping.call_one().get(timeout=TIMEOUT)
    assert other_pid, "the other process's actor still answers"
    survivor = procs.slice(procs=0).spawn(f"survivor_{test_tag}", Probe)
    assert survivor.ping.call_one().get(timeout=TIMEOUT), "a spawn on a slice without the dead process works"
    covering = procs.spawn(f"covering_{test_tag}", Probe)
    try:
        with pytest.raises(TimeoutError):  # no error comes back: the call just never completes
            covering.ping.call().get(timeout=5)
    finally:  # the pending spawn keeps this mesh from stopping cleanly: end its last process ourselves
        os.kill(other_pid, signal.SIGKILL)
        fresh_procs.forget(procs)


def test_a_failed_constructor_answers_nothing_and_its_process_takes_no_new_actor(fresh_procs, test_tag):
    procs = fresh_procs(procs=1)
    broken = procs.spawn(f"broken_{test_tag}", Broken)
    with pytest.raises(Exception):  # no reply: a timeout (or, at times, a supervision error)
        broken.ping.call_one().get(timeout=5)
    with pytest.raises(Exception, match="supervision events"):
        procs.spawn(f"after_{test_tag}", Probe).ping.call_one().get(timeout=TIMEOUT)


def test_a_handle_pickles_small_whatever_the_size():
    sizes = [len(pickle.dumps(RDMABuffer(torch.zeros(n, dtype=torch.uint8)))) for n in (1024, 64 * 2**20)]
    assert all(size < 1024 for size in sizes) and abs(sizes[0] - sizes[1]) < 64, sizes


def test_a_read_sees_the_memory_as_it_is_at_the_time_of_the_read(shared_procs, test_tag):
    holder = shared_procs(procs=1).spawn(f"holder_{test_tag}", Holder)
    handle = holder.buffer.call_one().get(timeout=TIMEOUT)
    landing = torch.full((16,), -1.0)

    def read() -> float:
        handle.read_into(landing, timeout=TIMEOUT).get(timeout=TIMEOUT)
        return float(landing.mean())

    holder.fill.call_one(1.0).get(timeout=TIMEOUT)
    assert read() == 1.0
    holder.fill.call_one(2.0).get(timeout=TIMEOUT)
    assert read() == 2.0, "the same handle, read again, shows the change: a pointer, not a copy"


def test_monarch_checks_shape_and_size_but_not_dtype():
    source = RDMABuffer(torch.arange(4, dtype=torch.float32))
    for bad in (torch.zeros(2, 2), torch.zeros(8)[::2], torch.zeros(0)):
        with pytest.raises(ValueError):
            RDMABuffer(bad)  # 2-D, strided, empty: refused
    with pytest.raises(ValueError, match="must be >="):
        source.read_into(torch.zeros(4, dtype=torch.float16), timeout=TIMEOUT).get(timeout=TIMEOUT)  # too few bytes
    bits = torch.zeros(4, dtype=torch.int32)
    source.read_into(bits, timeout=TIMEOUT).get(timeout=TIMEOUT)  # same bytes, another dtype: accepted, not converted
    assert bits.tolist() == torch.arange(4, dtype=torch.float32).view(torch.int32).tolist()


def test_the_actors_own_place_and_the_messages_view(shared_procs, test_tag):
    probes = shared_procs(procs=3).spawn(f"places_{test_tag}", Probe)
    through_slice = sorted(probes.slice(procs=slice(1, 3)).places.call().get(timeout=TIMEOUT).values(),
                           key=lambda pair: pair[1]["procs"])
    assert through_slice == [({"procs": 0}, {"procs": 1}), ({"procs": 1}, {"procs": 2})]
    assert probes.slice(procs=2).places.call_one().get(timeout=TIMEOUT) == ({}, {"procs": 2})
    here = this_proc().spawn(f"here_{test_tag}", Probe)
    assert here.ping.call_one().get(timeout=TIMEOUT) == os.getpid()


def test_an_error_under_broadcast_kills_the_actor_and_reaches_the_fault_hook(fresh_procs):
    procs = fresh_procs(procs=1)  # this mesh ends with a dead actor: not a shared one
    probe = procs.spawn("broadcast_boom", Probe)  # a short name: a failure names its mesh by a prefix of it
    with pytest.raises(ActorError):  # a call has a reply port: the error goes back to the caller
        probe.boom.call_one().get(timeout=TIMEOUT)
    assert probe.ping.call_one().get(timeout=TIMEOUT), "after an error under call_one the actor lives"
    faults_before = len(processes.recorded_faults)
    probe.boom.broadcast()  # no reply port: nobody to hand the error to
    with pytest.raises(SupervisionError):  # messages arrive in order: ping comes after the failed boom
        probe.ping.call_one().get(timeout=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while not any(f.mesh_name.startswith("broadcast_boom") for f in processes.recorded_faults[faults_before:]):
        assert time.monotonic() < deadline, "the broadcast's failure never reached the fault hook"
        time.sleep(0.1)


# Actors spawned in this process (this_proc()): their class may live in this test module (another
# process could not import it), and they share the test's Events. A caller's timeout is the caller's
# alone either way: no message goes to the actor when it expires.
STARTED, RELEASE, EVENTS = threading.Event(), threading.Event(), []


class Gated(Actor):
    def __init__(self):
        self.finished = 0

    @endpoint
    def work(self) -> str:
        EVENTS.append("endpoint started")
        STARTED.set()
        RELEASE.wait(timeout=TIMEOUT)  # runs until the test lets it go, after the caller gave up
        self.finished += 1
        EVENTS.append("endpoint finished")
        return "done"

    @endpoint
    def finished_calls(self) -> int:
        return self.finished

    @endpoint
    def out_of_memory(self, kind: str) -> None:
        if kind == "torch":  # what a CUDA allocation that does not fit raises
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        raise MemoryError()


@pytest.mark.parametrize("wait", ["get", "asyncio.wait_for"])
def test_a_timeout_does_not_cancel_the_remote_call(wait, test_tag):
    for fresh in (STARTED, RELEASE, EVENTS):
        fresh.clear()
    gated = this_proc().spawn(f"gated_{test_tag}", Gated)
    call = gated.work.call_one()
    assert STARTED.wait(timeout=TIMEOUT), "the endpoint never started"
    with pytest.raises(TimeoutError):
        if wait == "get":
            call.get(timeout=0.2)
        else:
            asyncio.run(asyncio.wait_for(call, 0.2))  # how chapters 05 and 06 wait
    EVENTS.append("caller timed out")
    RELEASE.set()
    # Messages from one caller arrive in order: this one is handled after `work` ends.
    assert gated.finished_calls.call_one().get(timeout=TIMEOUT) == 1, "the endpoint ran to its end"
    assert EVENTS == ["endpoint started", "caller timed out", "endpoint finished"]


@pytest.mark.parametrize("kind", ["torch", "python"])
def test_an_out_of_memory_error_in_an_endpoint_is_an_actor_error(kind, test_tag):
    actor = this_proc().spawn(f"oom_{test_tag}", Gated)
    with pytest.raises(ActorError) as raised:
        actor.out_of_memory.call_one(kind).get(timeout=TIMEOUT)
    assert isinstance(raised.value.exception, torch.OutOfMemoryError if kind == "torch" else MemoryError)
    assert actor.finished_calls.call_one().get(timeout=TIMEOUT) == 0, "the actor still answers"


class Turns(Actor):
    """Async endpoints: one waits for a gate that the other opens."""

    def __init__(self):
        self.events, self.gate = [], asyncio.Event()

    async def _wait(self, patience: float) -> None:
        self.events.append("waiting starts")
        try:
            await asyncio.wait_for(self.gate.wait(), patience)
            self.events.append("waiting woken")
        except TimeoutError:
            self.events.append("waiting gave up")

    @endpoint
    async def wait_for_gate(self, patience: float) -> None:
        await self._wait(patience)

    @concurrent_endpoint
    async def wait_for_gate_concurrently(self, patience: float) -> None:
        await self._wait(patience)

    @endpoint
    async def open_gate(self) -> None:
        self.events.append("gate opened")
        self.gate.set()

    @concurrent_endpoint
    async def open_gate_concurrently(self) -> None:
        self.events.append("gate opened")
        self.gate.set()

    @endpoint
    async def log(self) -> list[str]:
        return self.events


@pytest.mark.parametrize("concurrent", [False, True])
def test_an_actor_handles_one_message_at_a_time_awaits_included(concurrent, test_tag):
    turns = this_proc().spawn(f"turns_{test_tag}", Turns)
    waiter = turns.wait_for_gate_concurrently if concurrent else turns.wait_for_gate
    waiting, opening = waiter.call_one(1.0), turns.open_gate.call_one()
    waiting.get(timeout=TIMEOUT)
    opening.get(timeout=TIMEOUT)
    events = turns.log.call_one().get(timeout=TIMEOUT)
    if concurrent:  # the gate opens while the waiter awaits it
        assert events[-1] == "waiting woken" and "waiting gave up" not in events, events
    else:  # open_gate waits its turn: the waiter can only give up
        assert events == ["waiting starts", "waiting gave up", "gate opened"]


def test_a_plain_endpoint_holds_back_every_later_message_a_concurrent_one_too(test_tag):
    """TorchTitan's RL README: "`@endpoint` will block all the other endpoints, including `@concurrent_endpoint`".
    On 0.7.0 it holds for calls queued behind it (its dispatch loop awaits each plain handler before it takes the
    next message, _src/actor/actor_mesh.py _dispatch_loop): the concurrent opener cannot start while the plain
    waiter waits, so the waiter gives up. A concurrent task that had started before keeps running at the plain
    endpoint's awaits (the other half: a concurrent waiter is woken by a plain opener)."""
    turns = this_proc().spawn(f"turns_{test_tag}", Turns)
    waiting, opening = turns.wait_for_gate.call_one(1.0), turns.open_gate_concurrently.call_one()
    waiting.get(timeout=TIMEOUT)
    opening.get(timeout=TIMEOUT)
    events = turns.log.call_one().get(timeout=TIMEOUT)
    assert events == ["waiting starts", "waiting gave up", "gate opened"], (
        f"{events}: a concurrent endpoint queued behind a plain one started only when the plain one returned")


WEDGED = ["waiting starts", "waiting gave up", "completion arrived"]


@pytest.mark.parametrize("how, expected", [("start_and_block", WEDGED), ("start_and_await", WEDGED),
                                           ("start_and_await_concurrently",
                                            ["waiting starts", "completion arrived", "waiting woken"])])
def test_an_endpoint_waiting_for_a_completion_sent_to_its_own_actor(shared_procs, how, expected, test_tag):
    """WeightBridge's limitations: a completion that arrives as a message to the actor that waits for it is
    never seen while that actor's loop is held. The wait is bounded here (1 s), so a wedge shows as a give-up."""
    procs = shared_procs(procs=2)
    waiter = procs.slice(procs=0).spawn(f"waiter_{test_tag}", Waiter)
    notifier = procs.slice(procs=1).spawn(f"notifier_{test_tag}", Notifier)
    getattr(waiter, how).call_one(notifier, waiter, 1.0).get(timeout=TIMEOUT)
    for _ in range(100):  # the completion's message runs once the waiter lets go; wait for it to be logged
        events = waiter.log.call_one().get(timeout=TIMEOUT)
        if "completion arrived" in events:
            break
        time.sleep(0.05)
    assert events == expected, f"{how}: {events}"


class BlockingReader(Actor):
    @endpoint
    async def read_blocking(self, handle) -> list[float]:
        landing = torch.full((16,), -1.0)
        handle.read_into(landing, timeout=TIMEOUT).get(timeout=TIMEOUT)  # Monarch warns: a blocking get() in a loop
        return landing.tolist()


def test_on_the_tcp_fallback_a_reads_completion_does_not_come_through_the_actor(shared_procs, test_tag):
    """On 0.7.0 without ibverbs, a blocking .get() on a read inside an endpoint completes (Monarch warns that it
    "can freeze the loop and deadlock"): the fallback's completion is not a message to the reader's actor. The
    landing starts at -1, so a read that moved nothing fails. WeightBridge reports the opposite on ibverbs."""
    holder = shared_procs(procs=1).spawn(f"holder_{test_tag}", Holder)
    holder.fill.call_one(3.0).get(timeout=TIMEOUT)
    handle = holder.buffer.call_one().get(timeout=TIMEOUT)
    reader = this_proc().spawn(f"reader_{test_tag}", BlockingReader)
    assert reader.read_blocking.call_one(handle).get(timeout=TIMEOUT) == [3.0] * 16
