"""Chapter 03 plumbing: the demo. You may skip this file; nothing in it is a TODO.

    python -m exercises.ch03_rdma_transfer            the demo (the reference: python -m solutions.ch03_rdma_transfer)
    python -m exercises.ch03_rdma_transfer --bench    read throughput and Monarch's knobs (koans/bench/rdma.py)
"""

import sys
import time

from koans.learn.demo import demo_options
from monarch.actor import this_host
from monarch.rdma import get_rdma_backend

from .ch03_rdma_transfer import Reader, TensorOwner, fingerprint, message_bytes


def main() -> None:
    if "--bench" in sys.argv[1:]:  # the benchmark parses its own flags: --bench --help lists them
        rest = [arg for arg in sys.argv[1:] if arg != "--bench"]
        from koans.bench.rdma import main as bench_main

        bench_main(rest)
        return
    demo_options(f"{__package__}.ch03_rdma_transfer", "Chapter 03's demo: a handle against a copy.",
                 (("--bench", "measure RDMA read throughput instead (its own flags: --bench --help)"),))
    timeout = 60
    numel = 16 * 1024 * 1024  # 64 MiB of float32
    print(f"Chapter 03: RDMA transfer (backend: {get_rdma_backend()})\n")
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        owner = procs.slice(procs=0).spawn("owner", TensorOwner, numel)
        reader = procs.slice(procs=1).spawn("reader", Reader, numel)

        handle = owner.handle.call_one().get(timeout=timeout)
        print(f"Owner holds {handle.nbytes / 2**20:.0f} MiB; its handle is {message_bytes(handle)} bytes in a message.")

        start = time.perf_counter()
        got = reader.pull.call_one(handle).get(timeout=timeout)
        first_s = time.perf_counter() - start
        print(f"\nReader pulled it by handle: fingerprint {got} (owner: {owner.fingerprint.call_one().get(timeout=timeout)})")
        print(f"  first pull {first_s * 1e3:.0f} ms (includes one-time RDMA setup in both processes)")

        start = time.perf_counter()
        copy = owner.send_copy.call_one().get(timeout=timeout)
        message_s = time.perf_counter() - start
        print(f"The same tensor as a message reply: {message_bytes(copy) / 2**20:.1f} MiB pickled, {message_s * 1e3:.0f} ms")

        new = owner.add_.call_one(1.0).get(timeout=timeout)
        print("\nOwner adds 1.0 in place. Then:")
        print(f"  the copy we were sent is stale:    {fingerprint(copy)} != {new}")
        start = time.perf_counter()
        again = reader.pull.call_one(handle).get(timeout=timeout)
        print(f"  a re-read through the same handle: {again} == {new}  ({(time.perf_counter() - start) * 1e3:.0f} ms)")
        print("\nA handle is a pointer: small to send, and always reads what is there now.")
    finally:
        procs.stop().get(timeout=timeout)
