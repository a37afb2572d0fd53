"""The chapter 03 benchmark: how fast an RDMABuffer read is, and which knobs make it faster.

    python -m solutions.ch03_rdma_transfer --bench [--sizes 0.27,1] [--repeats 5] [--json PATH]

Two processes on this host: an owner exposes N bytes, a reader pulls them.
Each configuration runs on fresh processes (Monarch reads its RDMA settings
when a process starts) and reports the median GB/s of `repeats` reads after
one warm-up read. Side by side, in one run:

  whole            one read_into of one buffer over all N bytes
  chunks, serial   64 MiB buffers, read one after another
  chunks, gather   64 MiB buffers, all reads started at once (asyncio.gather)
  chunks, action   64 MiB buffers, all reads in one RDMAAction submit

under Monarch's settings for the TCP fallback (the transport when there is
no RDMA card): MONARCH_RDMA_MAX_CHUNK_SIZE_MB (the size of the pieces a read
is cut into) and MONARCH_RDMA_TCP_FALLBACK_PARALLELISM (how many pieces are
in flight at once; default 1). And the limits, measured in the same run:
loopback TCP between two processes (what the fallback can reach at best) and
memcpy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import time
import warnings

import torch
from monarch.actor import Actor, default_bootstrap_cmd, endpoint, this_host

CHUNK = 64 * 2**20
TIMEOUT = 600

#: (label, read pattern, environment) in the order they are reported. A pattern "gather@16" reads
#: buffers of 16 MiB instead of 64 MiB. The first four rows are what the course did before it adopted
#: the knobs and what it does now (solutions/__init__.py sets the piece size when there is no RDMA card).
CONFIGS = [
    ("ch03 read, Monarch's defaults (before)", "whole", {}),
    ("ch07 rdma: 64 MiB one by one (before)", "serial", {}),
    ("ch03 read, pieces of 4 MB (now)", "whole", {"MONARCH_RDMA_MAX_CHUNK_SIZE_MB": "4"}),
    ("ch07 rdma: 16 MiB at once, pieces 4 MB (now)", "gather@16", {"MONARCH_RDMA_MAX_CHUNK_SIZE_MB": "4"}),
    ("64 MiB at once", "gather", {}),
    ("64 MiB in one RDMAAction", "action", {}),
    ("64 MiB in one RDMAAction, pieces 4 MB", "action", {"MONARCH_RDMA_MAX_CHUNK_SIZE_MB": "4"}),
    ("64 MiB at once, pieces 4 MB", "gather", {"MONARCH_RDMA_MAX_CHUNK_SIZE_MB": "4"}),
    ("16 MiB at once", "gather@16", {}),
    ("8 MiB at once", "gather@8", {}),
    ("whole, parallelism 2", "whole", {"MONARCH_RDMA_TCP_FALLBACK_PARALLELISM": "2"}),
    ("whole, parallelism 8", "whole", {"MONARCH_RDMA_TCP_FALLBACK_PARALLELISM": "8"}),
    ("RDMAAction, pieces 4 MB, parallelism 4", "action",
     {"MONARCH_RDMA_MAX_CHUNK_SIZE_MB": "4", "MONARCH_RDMA_TCP_FALLBACK_PARALLELISM": "4"}),
    ("whole, pieces 4 MB, parallelism 8", "whole",
     {"MONARCH_RDMA_MAX_CHUNK_SIZE_MB": "4", "MONARCH_RDMA_TCP_FALLBACK_PARALLELISM": "8"}),
    ("16 MiB at once, parallelism 8", "gather@16", {"MONARCH_RDMA_TCP_FALLBACK_PARALLELISM": "8"}),
]
KNOBS = ("MONARCH_RDMA_MAX_CHUNK_SIZE_MB", "MONARCH_RDMA_TCP_FALLBACK_PARALLELISM")


class Owner(Actor):
    def __init__(self, nbytes: int, chunk: int = CHUNK):
        from monarch.rdma import RDMABuffer

        warnings.simplefilter("ignore")
        self.memory = torch.ones(nbytes, dtype=torch.uint8)
        self.whole = RDMABuffer(self.memory)
        self.chunks = [RDMABuffer(self.memory[start: start + chunk]) for start in range(0, nbytes, chunk)]

    @endpoint
    def handles(self):
        return self.whole, self.chunks


class Reader(Actor):
    def __init__(self, nbytes: int):
        warnings.simplefilter("ignore")
        self.landing = torch.zeros(nbytes, dtype=torch.uint8)

    @endpoint
    async def read(self, pattern: str, whole, chunks, repeats: int) -> list[float]:
        from monarch.rdma import RDMAAction

        size = -(-self.landing.numel() // len(chunks))
        parts = [self.landing[i * size: (i + 1) * size] for i in range(len(chunks))]
        seconds = []
        for _ in range(repeats + 1):  # the first read warms up (connections, registration)
            self.landing.zero_()
            started = time.perf_counter()
            if pattern == "whole":
                await whole.read_into(self.landing, timeout=TIMEOUT)
            elif pattern == "serial":
                for part, chunk in zip(parts, chunks):
                    await chunk.read_into(part, timeout=TIMEOUT)
            elif pattern == "gather":
                await asyncio.gather(*(chunk.read_into(part, timeout=TIMEOUT) for part, chunk in zip(parts, chunks)))
            else:
                action = RDMAAction()
                for part, chunk in zip(parts, chunks):
                    action.read_remote(part, chunk)
                await action.submit(timeout=TIMEOUT)
            seconds.append(time.perf_counter() - started)
            if int(self.landing.min()) != 1:
                raise RuntimeError(f"{pattern}: the read did not fill the landing buffer")
        return seconds[1:]


def measure(nbytes: int, pattern: str, env: dict, repeats: int) -> float:
    """Median GB/s of `repeats` reads, on two fresh processes with `env`. A pattern "gather@16"
    reads buffers of 16 MiB (default 64 MiB)."""
    pattern, _, mib = pattern.partition("@")
    chunk = int(mib) * 2**20 if mib else CHUNK
    procs = this_host().spawn_procs(per_host={"procs": 2}, bootstrap_command=default_bootstrap_cmd().with_env(env))
    try:
        owner = procs.slice(procs=0).spawn("owner", Owner, nbytes, chunk)
        reader = procs.slice(procs=1).spawn("reader", Reader, nbytes)
        whole, chunks = owner.handles.call_one().get(timeout=TIMEOUT)
        seconds = reader.read.call_one(pattern, whole, chunks, repeats).get(timeout=TIMEOUT)
        return nbytes / statistics.median(seconds) / 1e9
    finally:
        procs.stop().get(timeout=60)


def loopback_tcp_gbps(nbytes: int) -> float:
    """One TCP stream between two processes of this host, 8 MiB at a time: the fallback's ceiling."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    block = 8 * 2**20
    pid = os.fork()
    if pid == 0:  # the sender
        try:
            out = socket.create_connection(server.getsockname())
            payload, sent = memoryview(bytearray(block)), 0
            while sent < nbytes:
                out.sendall(payload)
                sent += block
            out.shutdown(socket.SHUT_WR)
            out.recv(1)  # wait for the receiver to finish
        finally:
            os._exit(0)
    conn, _ = server.accept()
    into, got = memoryview(bytearray(block)), 0
    started = time.perf_counter()
    while got < nbytes:
        count = conn.recv_into(into)
        if not count:
            break
        got += count
    took = time.perf_counter() - started
    conn.sendall(b"x")
    conn.close()
    server.close()
    os.waitpid(pid, 0)
    return got / took / 1e9


def memcpy_gbps(nbytes: int) -> float:
    from koans.bench_weight_sync import best_copy_gbps

    a, b = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    return best_copy_gbps(nbytes, lambda: b.copy_(a))


def main(argv: list[str] | None = None) -> dict:
    from koans.bench_weight_sync import _hardware

    parser = argparse.ArgumentParser(prog="python -m solutions.ch03_rdma_transfer --bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0.27,1", help="GB per read, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="reads per process pair")
    parser.add_argument("--rounds", type=int, default=1,
                        help="fresh process pairs per row, taken round-robin over the rows (the median is reported)")
    parser.add_argument("--configs", default="", help="only these configurations (numbers from 1, comma-separated)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    chosen = [CONFIGS[int(n) - 1] for n in args.configs.split(",")] if args.configs else CONFIGS
    for knob in KNOBS:  # each row sets exactly the knobs it names; spawned processes inherit nothing else
        os.environ.pop(knob, None)
    hardware = _hardware()
    print(f"RDMA read benchmark on {hardware['cpu']} ({hardware['cores']} cores); the median of {args.repeats} reads "
          f"per process pair, {args.rounds} pair(s) per row\n", flush=True)
    report = {"hardware": hardware, "repeats": args.repeats, "sizes": []}
    for size in (float(s) for s in args.sizes.split(",")):
        nbytes = int(size * 1e9) // CHUNK * CHUNK or CHUNK
        limits = {"loopback_tcp_gbps": loopback_tcp_gbps(nbytes), "memcpy_gbps": memcpy_gbps(nbytes)}
        print(f"{nbytes / 1e9:.2f} GB: limits: loopback TCP {limits['loopback_tcp_gbps']:.2f} GB/s, "
              f"memcpy {limits['memcpy_gbps']:.1f} GB/s", flush=True)
        measured = {label: [] for label, _, _ in chosen}
        for _ in range(args.rounds):  # round-robin, so a machine that slows down mid-run slows every row alike
            for label, pattern, env in chosen:
                measured[label].append(measure(nbytes, pattern, env, args.repeats))
        rows = [{"config": label, "pattern": pattern, "env": env, "gbps": statistics.median(measured[label]),
                 "rounds": measured[label]} for label, pattern, env in chosen]
        base = rows[0]["gbps"]
        for row in rows:
            print(f"  {row['config']:<46} {row['gbps']:6.2f} GB/s  {row['gbps'] / base:5.2f}x row 1  "
                  f"{100 * row['gbps'] / limits['loopback_tcp_gbps']:4.0f}% of loopback TCP"
                  + (f"   (rounds: {', '.join(f'{g:.2f}' for g in row['rounds'])})" if args.rounds > 1 else ""), flush=True)
        report["sizes"].append({"nbytes": nbytes, "limits": limits, "rows": rows})
        print()
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    return report


if __name__ == "__main__":
    main()
