"""The chapter 03 benchmark: how fast an RDMABuffer read is, and which knobs make it faster.

    python -m solutions.ch03_rdma_transfer --bench [--sizes 0.27,1] [--repeats 5] [--json PATH]
    python -m koans.bench.rdma --pull-vs-raw [--in-flight 1,2,8] [--json PATH]
        chapter 07's pull against one raw read_into of the same bytes (data_plane_figures)

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
import importlib
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
    from koans.bench.weight_sync import best_copy_gbps

    a, b = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)
    return best_copy_gbps(nbytes, lambda: b.copy_(a))


# --- Chapter 07's pull against one raw read (data_plane_figures) ----------------------------------


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole host so far, from /proc/stat (Linux)."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4], sum(fields)  # idle and iowait are not busy


def cores_busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    """How many of the host's cores were busy, on average, between two cpu_jiffies()."""
    total = after[1] - before[1]
    return (after[0] - before[0]) / total * (os.cpu_count() or 1) if total else 0.0


class SlotOwner(Actor):
    """A trainer's staging slot, as chapter 07 builds it: `nbytes` offered as RDMA chunks of `chunk_bytes`,
    and the same bytes as one RDMABuffer (the raw read's source)."""

    def __init__(self, chapter: str, nbytes: int, chunk_bytes: int):
        from monarch.rdma import RDMABuffer

        warnings.simplefilter("ignore")
        transports = importlib.import_module(chapter + ".ch07_transports")
        self.slot = transports.StagingSlot(nbytes, "cpu", False, chunk_bytes)
        self.slot.flat.fill_(1)
        self.whole = RDMABuffer(self.slot.flat)

    @endpoint
    def handles(self):
        return self.whole, self.slot.offers["rdma"]

    @endpoint
    def close(self) -> None:
        self.slot.close()


class SlotReader(Actor):
    """A generator's side: chapter 07's RDMA source (the chunks each half of the weights needs, read
    `in_flight` at a time, as load_snapshot fetches them) against one raw read_into of the same bytes."""

    def __init__(self, chapter: str, nbytes: int):
        warnings.simplefilter("ignore")
        self.transports = importlib.import_module(chapter + ".ch07_transports")
        self.cache = self.transports.SourceCache(TIMEOUT)
        self.nbytes = nbytes
        self.landing = torch.zeros(nbytes, dtype=torch.uint8)

    async def _pull(self, offer, in_flight: int) -> None:
        Entry = self.transports.Entry
        self.cache.reads_in_flight = in_flight
        source = self.cache.open(offer, self.nbytes)
        half = self.nbytes // 2  # load_snapshot fetches the first half's chunks, copies, then the second half's
        await source.fetch([Entry("first", torch.uint8, (half,), 0)])
        await source.fetch([Entry("second", torch.uint8, (self.nbytes - half,), half)])

    @endpoint
    async def rounds(self, whole, offer, in_flights: list[int], rounds: int) -> tuple[dict, dict]:
        """GB/s per round of the raw read and of the pull at each in-flight count, and the host's cores busy
        meanwhile (both processes, and anything else running); one warm-up of each first. Each round runs
        every row once, in an order that turns round by round."""
        rows = ["raw"] + [f"pull@{k}" for k in in_flights]
        measured: dict[str, list[float]] = {row: [] for row in rows}
        busy: dict[str, list[float]] = {row: [] for row in rows}
        for number in range(rounds + 1):
            shift = number % len(rows)
            for row in rows[shift:] + rows[:shift]:
                if row == "raw":
                    self.landing.zero_()
                    before = cpu_jiffies()
                    started = time.perf_counter()
                    await whole.read_into(self.landing, timeout=TIMEOUT)
                    took, landing = time.perf_counter() - started, self.landing
                else:
                    if self.cache.landing is not None:
                        self.cache.landing.zero_()
                    before = cpu_jiffies()
                    started = time.perf_counter()
                    await self._pull(offer, int(row.partition("@")[2]))
                    took, landing = time.perf_counter() - started, self.cache.landing
                cores = cores_busy(before, cpu_jiffies())
                if int(landing.min()) != 1:
                    raise RuntimeError(f"{row}: the read did not fill the landing buffer")
                if number > 0:  # round 0 warms up: connections, registration, first touch
                    measured[row].append(self.nbytes / took / 1e9)
                    busy[row].append(cores)
        return measured, busy


def data_plane_figures(quick: bool = False, *, chapter: str = "solutions", in_flights: list[int] | None = None,
                       rounds: int = 3, sizes_gb: tuple[float, ...] | None = None) -> list[dict]:
    """Chapter 07's RDMA pull of a snapshot against ONE raw read_into of the same bytes, measured side by side.

    For each size (0.27 and 0.94 GB; quick: 16 and 48 MiB) one fresh pair of processes, with the RDMA
    settings the chapter runs under (solutions/__init__.py), holds a staging slot offered as the chapter's
    16 MiB chunks; `rounds` interleaved rounds of the raw read and the pull, after a warm-up, and the
    medians. Answers one figure per size: {"name": "rdma_pull_vs_raw_read_0.27GB", "value": pull GB/s,
    "limit": raw read GB/s, "ratio": value / limit, "unit": "GB/s", "config": {...}}. The config also holds
    loopback TCP between two processes (the fallback's ceiling), measured in the same run, and, when
    `in_flights` names several counts, the pull at each.
    """
    import monarch

    importlib.import_module(chapter)  # its __init__ sets the RDMA settings the chapter's processes run with
    transports = importlib.import_module(chapter + ".ch07_transports")
    plumbing_chunk = 16 * 2**20  # WeightPublisher's rdma_chunk_bytes default
    chosen = transports.READS_IN_FLIGHT
    in_flights = sorted(set(in_flights or []) | {chosen})
    env = {knob: os.environ[knob] for knob in KNOBS if knob in os.environ}
    sizes = sizes_gb or ((0.016, 0.048) if quick else (0.27, 0.94))
    figures = []
    for size in sizes:
        nbytes = max(plumbing_chunk, int(size * 1e9) // plumbing_chunk * plumbing_chunk)
        loopback = loopback_tcp_gbps(nbytes)
        procs = this_host().spawn_procs(per_host={"procs": 2}, bootstrap_command=default_bootstrap_cmd().with_env(env))
        try:
            owner = procs.slice(procs=0).spawn("slot_owner", SlotOwner, chapter, nbytes, plumbing_chunk)
            reader = procs.slice(procs=1).spawn("slot_reader", SlotReader, chapter, nbytes)
            whole, offer = owner.handles.call_one().get(timeout=TIMEOUT)
            measured, busy = reader.rounds.call_one(whole, offer, in_flights, rounds).get(timeout=TIMEOUT)
            owner.close.call_one().get(timeout=TIMEOUT)
        finally:
            procs.stop().get(timeout=60)
        raw = statistics.median(measured["raw"])
        pull = statistics.median(measured[f"pull@{chosen}"])
        label = f"{size:g}GB" if not quick else f"{nbytes / 2**20:.0f}MiB"
        figures.append({
            "name": f"rdma_pull_vs_raw_read_{label}", "value": pull, "limit": raw, "ratio": pull / raw, "unit": "GB/s",
            "config": {"bytes": nbytes, "reads_in_flight": chosen, "chunk_bytes": plumbing_chunk,
                       "rdma_settings": env or "Monarch's defaults", "backend": "tcp fallback" if not _has_rdma_card() else "ibverbs",
                       "rounds": rounds, "rounds_gbps": measured,
                       "cores_busy": {row: statistics.median(values) for row, values in busy.items()},
                       "pull_gbps_by_in_flight": {k: statistics.median(measured[f"pull@{k}"]) for k in in_flights},
                       "loopback_tcp_gbps": loopback, "torch": torch.__version__,
                       "monarch": getattr(monarch, "__version__", None) or _version("torchmonarch")}})
    return figures


def _has_rdma_card() -> bool:
    return os.path.isdir("/sys/class/infiniband") and bool(os.listdir("/sys/class/infiniband"))


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def print_data_plane_figures(figures: list[dict]) -> None:
    for figure in figures:
        config = figure["config"]
        print(f"{figure['name']}: pull {figure['value']:.2f} GB/s ({config['reads_in_flight']} reads in flight) / "
              f"one raw read_into {figure['limit']:.2f} GB/s = {figure['ratio']:.2f}x; "
              f"loopback TCP {config['loopback_tcp_gbps']:.2f} GB/s", flush=True)
        if len(config["pull_gbps_by_in_flight"]) > 1:
            print("  pull by reads in flight: " + ", ".join(
                f"{k}: {v:.2f} ({v / figure['limit']:.2f}x)" for k, v in config["pull_gbps_by_in_flight"].items()))
        print(f"  cores busy (of {os.cpu_count()}): " + ", ".join(f"{row} {cores:.2f}" for row, cores in config["cores_busy"].items()))
        print("  rounds: " + "; ".join(f"{row} " + ", ".join(f"{g:.2f}" for g in values)
                                      for row, values in config["rounds_gbps"].items()), flush=True)


def main(argv: list[str] | None = None) -> dict:
    from koans.bench.weight_sync import _hardware

    parser = argparse.ArgumentParser(prog="python -m solutions.ch03_rdma_transfer --bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0.27,1", help="GB per read, comma-separated")
    parser.add_argument("--repeats", type=int, default=5, help="reads per process pair")
    parser.add_argument("--rounds", type=int, default=3,
                        help="fresh process pairs per row, taken round-robin over the rows (the median is reported)")
    parser.add_argument("--configs", default="", help="only these configurations (numbers from 1, comma-separated)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--pull-vs-raw", action="store_true",
                        help="instead: chapter 07's pull against one raw read_into of the same bytes (data_plane_figures)")
    parser.add_argument("--in-flight", default="", help="with --pull-vs-raw: also these reads-in-flight counts (comma-separated)")
    args = parser.parse_args(argv)
    if args.pull_vs_raw:
        sizes = tuple(float(s) for s in args.sizes.split(",")) if args.sizes != "0.27,1" else None
        figures = data_plane_figures(in_flights=[int(k) for k in args.in_flight.split(",") if k],
                                     rounds=max(args.rounds, 3), sizes_gb=sizes)
        print_data_plane_figures(figures)
        if args.json:
            with open(args.json, "w") as out:
                json.dump(figures, out, indent=2)
        return {"figures": figures}
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
