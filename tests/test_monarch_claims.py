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
"""

import os
import pickle
import signal

import pytest
import torch
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import ActorError, this_proc
from monarch.rdma import RDMABuffer

from koans.claim_actors import Broken, Holder, Probe

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
