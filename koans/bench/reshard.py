"""The chapter 08 benchmark: resharding by overlap against torch's redistribute, in seconds.

    python -m solutions.ch08_dtensor_reshard --bench [--sizes 17,70,140] [--rounds 5] [--json PATH]

A float32 weight of 896 columns (Qwen2.5-0.5B's hidden size) and 4864 x k rows
(its MLP width times k), moved from Shard(0) on 2 processes to Shard(1) on 4
others, the chapter's example layout. Side by side, in one run, on the same
processes, taken round-robin so that a machine that slows down mid-run slows
every row alike:

  reshard        the chapter's `reshard`: each destination pulls its overlaps
                 (T bytes on the wire for a tensor of T bytes)
  redistribute   torch's own `DTensor.redistribute`, Shard(0) -> Shard(1), in 4
                 plain processes (torch.multiprocessing, gloo, no Monarch), as a
                 torchrun job runs it. torch cannot move a DTensor between two
                 meshes, so its source is Shard(0) on the same 4; on CPU it
                 all-gathers and keeps a slice (4 T received)
  gather+scatter everything read by RDMA to destination 0, which cuts the column
                 blocks and the other destinations read theirs (1.75 T)
  raw read       one RDMABuffer read_into of T bytes between two processes: what
                 the same bytes cost with no plan, no staging and no copies (its source
                 and landing buffers made once per size, like the reshard's staging)

Every timing is from the controller: one call, until every process has answered. The median is
of the moves after the first: a weight is moved again after every training step, and the reshard
keeps its staging buffers and their registrations for that (each method's first move is printed
beside it).
It runs on the chapter module it is started from (solutions or exercises).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import statistics
import time
import warnings

import torch
from monarch.actor import Actor, endpoint, this_host

TIMEOUT = 600
COLS, ROWS = 896, 4864  # Qwen2.5-0.5B: hidden size, MLP width
SOURCES, DESTINATIONS = 2, 4
SRC_LAYOUT, DST_LAYOUT = [("shard", 0)], [("shard", 1)]


def shape_for(mb: float) -> tuple[int, int]:
    """A float32 [rows, 896] weight of about `mb` MB: from 9 MB up, a whole number of 4864-row blocks,
    so that 17 is the doc's example (4864 x 896), 70 four of them and 140 eight."""
    rows = max(DESTINATIONS, round(mb * 1e6 / (4 * COLS)))
    return (max(1, round(rows / ROWS)) * ROWS if rows >= ROWS // 2 else rows), COLS


def full_tensor(shape, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _column_block(shape, rank: int) -> slice:
    size = -(-shape[1] // DESTINATIONS)
    start = min(rank * size, shape[1])
    return slice(start, min(start + size, shape[1]))


class Probe(Actor):
    """The baselines, on the same processes as the chapter's ShardHolders (one Probe per process)."""

    def __init__(self):
        from monarch.actor import current_rank

        warnings.simplefilter("ignore")
        self.rank = current_rank().rank
        self.kept: list = []

    # --- the raw read ---
    @endpoint
    async def expose_raw(self, nbytes: int):
        """The raw read's source, made and registered once per size, as the reshard keeps its staging."""
        from monarch.rdma import RDMABuffer

        self.raws = getattr(self, "raws", {})
        if nbytes not in self.raws:
            memory = torch.ones(nbytes, dtype=torch.uint8)
            self.raws[nbytes] = (memory, RDMABuffer(memory))
        return self.raws[nbytes][1]

    @endpoint
    async def read_raw(self, buffer, nbytes: int) -> int:
        """Into a landing buffer kept per size (the sizes take turns), so that no timed read allocates."""
        self.landings = getattr(self, "landings", {})
        if nbytes not in self.landings:
            self.landings[nbytes] = torch.zeros(nbytes, dtype=torch.uint8)
        await buffer.read_into(self.landings[nbytes], timeout=TIMEOUT)
        return nbytes

    # --- gather, then scatter: sources expose their whole (contiguous) row shards ---
    @endpoint
    async def hold_rows(self, shape, seed: int):
        from monarch.rdma import RDMABuffer

        rows = -(-shape[0] // SOURCES)
        self.rows = full_tensor(shape, seed)[self.rank * rows: (self.rank + 1) * rows].contiguous()
        return RDMABuffer(self.rows.view(-1)), tuple(self.rows.shape)

    @endpoint
    async def gather_and_cut(self, shape, row_buffers) -> list:
        """On the hub (destination 0): read every row shard into the whole tensor, then cut the
        other destinations' column blocks and expose each (a staging copy, as in the chapter)."""
        from monarch.rdma import RDMABuffer

        whole = torch.empty(shape)
        offsets, start = [], 0
        for _, rows_shape in row_buffers:
            offsets.append(slice(start, start + rows_shape[0]))
            start += rows_shape[0]
        await asyncio.gather(*(buffer.read_into(whole[rows].view(-1), timeout=TIMEOUT)
                               for (buffer, _), rows in zip(row_buffers, offsets)))
        self.local = whole[:, _column_block(shape, 0)].contiguous()
        self.kept = [whole[:, _column_block(shape, r)].contiguous().view(-1) for r in range(1, DESTINATIONS)]
        return [RDMABuffer(block) for block in self.kept]

    @endpoint
    async def take_block(self, shape, buffer) -> None:
        block = _column_block(shape, self.rank)
        self.local = torch.empty(shape[0], block.stop - block.start)
        await buffer.read_into(self.local.view(-1), timeout=TIMEOUT)

    @endpoint
    async def check_block(self, shape, seed: int) -> bool:
        return torch.equal(self.local, full_tensor(shape, seed)[:, _column_block(shape, self.rank)])

    @endpoint
    async def release(self) -> None:
        self.kept = []


def _torch_rank(rank: int, world: int, port: int, pipe) -> None:
    """One rank of torch's own group: plain processes, gloo, no Monarch. Serves commands from the pipe."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")  # "CPU process group does not support alltoall yet, falling back with allgather"
    import logging

    logging.getLogger("torch").setLevel(logging.ERROR)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (world,))
    while True:
        command, *args = pipe.recv()
        if command == "load":
            shape, seed = args
            dtensor = distribute_tensor(full_tensor(shape, seed), mesh, [Shard(0)])
            pipe.send(True)
        elif command == "run":
            local = dtensor.redistribute(mesh, [Shard(1)]).to_local()
            pipe.send(not args[0] or torch.equal(local, full_tensor(shape, seed)[:, _column_block(shape, rank)]))
        else:
            dist.destroy_process_group()
            pipe.send(True)
            return


class TorchGroup:
    """torch's redistribute as a torchrun job would run it: `world` plain processes on a gloo group."""

    def __init__(self, world: int):
        import socket

        import torch.multiprocessing as mp

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        context = mp.get_context("spawn")
        self.pipes, self.procs = [], []
        for rank in range(world):
            mine, theirs = context.Pipe()
            proc = context.Process(target=_torch_rank, args=(rank, world, port, theirs), daemon=True)
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)

    def ask(self, *command) -> list:
        for pipe in self.pipes:
            pipe.send(command)
        return [pipe.recv() for pipe in self.pipes]

    def close(self) -> None:
        try:
            self.ask("stop")
        finally:
            for proc in self.procs:
                proc.join(timeout=30)


class Bench:
    """Two meshes (2 sources, 4 destinations), each with the chapter's ShardHolder and a Probe."""

    def __init__(self, chapter):
        from monarch.spmd import setup_torch_elastic_env

        self.chapter = chapter
        self.plumbing = importlib.import_module(chapter.__name__.rsplit(".", 1)[0] + ".ch08_plumbing")
        self.src_procs = this_host().spawn_procs(per_host={"procs": SOURCES})
        self.dst_procs = this_host().spawn_procs(per_host={"procs": DESTINATIONS})
        setup_torch_elastic_env(self.src_procs)
        setup_torch_elastic_env(self.dst_procs)
        self.src = self.src_procs.spawn("bench_src", chapter.ShardHolder)
        self.dst = self.dst_procs.spawn("bench_dst", chapter.ShardHolder)
        self.src_probe = self.src_procs.spawn("bench_src_probe", Probe)
        self.dst_probe = self.dst_procs.spawn("bench_dst_probe", Probe)
        for reply in [self.src.setup.call((SOURCES,)), self.dst.setup.call((DESTINATIONS,))]:
            reply.get(timeout=TIMEOUT)
        self.torch = TorchGroup(DESTINATIONS)

    def load(self, shape, seed: int) -> None:
        """Every method's input, made once per size and outside the timings."""
        self.shape, self.seed = shape, seed
        nbytes = 4 * shape[0] * shape[1]
        self.src.distribute.call(shape, seed, SRC_LAYOUT).get(timeout=TIMEOUT)
        self.torch.ask("load", shape, seed)
        self.row_buffers = [self.src_probe.slice(procs=r).hold_rows.call_one(shape, seed).get(timeout=TIMEOUT)
                            for r in range(SOURCES)]
        self.raw = self.src_probe.slice(procs=0).expose_raw.call_one(nbytes).get(timeout=TIMEOUT)
        self.nbytes = nbytes

    # each method answers its seconds; `check` also verifies what arrived, outside the timing
    def reshard(self, check: bool = False) -> float:
        started = time.perf_counter()
        result = self.plumbing.reshard(self.shape, self.seed, self.src, (SOURCES,), SRC_LAYOUT,
                                       self.dst, (DESTINATIONS,), DST_LAYOUT)
        took = time.perf_counter() - started
        if result["bytes_read"] != self.nbytes:
            raise RuntimeError(f"reshard read {result['bytes_read']} bytes, not {self.nbytes}")
        if check:
            shards = self.dst.local_shard.call().get(timeout=TIMEOUT)
            full = full_tensor(self.shape, self.seed)
            for r in range(DESTINATIONS):
                if not torch.equal(shards.item(procs=r), full[:, _column_block(self.shape, r)]):
                    raise RuntimeError(f"reshard: destination {r} holds the wrong values")
        return took

    def redistribute(self, check: bool = False) -> float:
        started = time.perf_counter()
        same = self.torch.ask("run", check)
        took = time.perf_counter() - started
        if not all(same):
            raise RuntimeError("redistribute: a destination holds the wrong values")
        return took

    def gather_scatter(self, check: bool = False) -> float:
        hub = self.dst_probe.slice(procs=0)
        started = time.perf_counter()
        blocks = hub.gather_and_cut.call_one(self.shape, self.row_buffers).get(timeout=TIMEOUT)
        taking = [self.dst_probe.slice(procs=r).take_block.call_one(self.shape, blocks[r - 1])
                  for r in range(1, DESTINATIONS)]
        for reply in taking:
            reply.get(timeout=TIMEOUT)
        took = time.perf_counter() - started
        hub.release.call_one().get(timeout=TIMEOUT)
        if check and not all(self.dst_probe.check_block.call(self.shape, self.seed).get(timeout=TIMEOUT).values()):
            raise RuntimeError("gather+scatter: a destination holds the wrong values")
        return took

    def raw_read(self, check: bool = False) -> float:
        started = time.perf_counter()
        self.dst_probe.slice(procs=0).read_raw.call_one(self.raw, self.nbytes).get(timeout=TIMEOUT)
        return time.perf_counter() - started

    def close(self) -> None:
        self.torch.close()
        for reply in [self.src.teardown.call(), self.dst.teardown.call()]:
            try:
                reply.get(timeout=60)
            except Exception:
                pass
        for reply in [self.src_procs.stop(), self.dst_procs.stop()]:
            reply.get(timeout=60)


METHODS = ("reshard", "redistribute", "gather_scatter", "raw_read")
LABELS = {"reshard": "reshard (overlap pulls)", "redistribute": "torch redistribute (gloo)",
          "gather_scatter": "gather, then scatter", "raw_read": "raw read, same bytes"}


def measure(chapter, sizes_mb: list[float], rounds: int, seed: int = 0, log=print) -> list[dict]:
    """Per size: every method's seconds per round (rounds taken round-robin over sizes and methods)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    bench = Bench(chapter)
    try:
        shapes = [shape_for(mb) for mb in sizes_mb]
        seconds = {shape: {m: [] for m in METHODS} for shape in shapes}
        first = {shape: {} for shape in shapes}  # the first move of each size: allocation, registration, connections
        for shape in shapes:  # warm up every path once per size, and check it
            bench.load(shape, seed)
            for method in METHODS:
                first[shape][method] = getattr(bench, method)(check=True)
        for round_ in range(rounds):
            for shape in shapes:
                bench.load(shape, seed)
                order = METHODS if round_ % 2 == 0 else METHODS[::-1]
                for method in order:
                    seconds[shape][method].append(getattr(bench, method)())
            log(f"  round {round_ + 1}/{rounds} done", flush=True)
        return [{"shape": list(shape), "nbytes": 4 * shape[0] * shape[1], "mb": round(4 * shape[0] * shape[1] / 1e6),
                 "seconds": seconds[shape], "median_s": {m: statistics.median(s) for m, s in seconds[shape].items()},
                 "first_s": first[shape]}
                for shape in shapes]
    finally:
        bench.close()


def data_plane_figures(quick: bool = False) -> list[dict]:
    """Per size, the reshard's median seconds against redistribute's and against a raw read's.

    quick=True: tiny sizes and one round, a smoke test."""
    chapter = importlib.import_module(os.environ.get("KOANS_IMPL", "solutions") + ".ch08_dtensor_reshard")
    sizes, rounds = ([1, 2], 1) if quick else ([17, 70, 140], 5)
    figures = []
    for size in measure(chapter, sizes, rounds, log=lambda *a, **k: None):
        config = {"shape": size["shape"], "dtype": "float32", "nbytes": size["nbytes"], "sources": SOURCES,
                  "destinations": DESTINATIONS, "layout": "Shard(0) -> Shard(1)", "rounds": rounds,
                  "statistic": "median of the moves after the first (the same weight moved again)",
                  "first_move_s": size["first_s"]}
        med = size["median_s"]
        for baseline, name in (("redistribute", "reshard_vs_redistribute"), ("raw_read", "reshard_vs_raw_read")):
            figures.append({"name": f"{name}_{size['mb']}", "value": med["reshard"], "limit": med[baseline],
                            "ratio": med["reshard"] / med[baseline], "unit": "s",
                            "config": {**config, "limit_is": baseline}})
    return figures


def main(module: str = "solutions.ch08_dtensor_reshard", argv: list[str] | None = None) -> dict:
    from koans.bench.weight_sync import _hardware

    parser = argparse.ArgumentParser(prog=f"python -m {module} --bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="17,70,140", help="MB of float32 per tensor, comma-separated")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per method (the median is reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    chapter = importlib.import_module(module)
    hardware = _hardware()
    print(f"Resharding benchmark on {hardware['cpu']} ({hardware['cores']} cores, torch {hardware['torch']}); "
          f"{SOURCES} x Shard(0) -> {DESTINATIONS} x Shard(1), float32; median of {args.rounds} rounds\n", flush=True)
    sizes = measure(chapter, [float(s) for s in args.sizes.split(",")], args.rounds, args.seed)
    print()
    for size in sizes:
        med = size["median_s"]
        raw_gbps = size["nbytes"] / med["raw_read"] / 1e9
        print(f"{size['mb']} MB {tuple(size['shape'])}:")
        for method in METHODS:
            rounds = ", ".join(f"{1e3 * s:.0f}" for s in size["seconds"][method])
            print(f"  {LABELS[method]:<27}{1e3 * med[method]:8.1f} ms  {med[method] / med['redistribute']:5.2f}x "
                  f"redistribute  {med['raw_read'] / med[method]:5.2f}x raw read's speed   (rounds: {rounds} ms; "
                  f"first move {1e3 * size['first_s'][method]:.0f} ms)")
        print(f"  (raw read: {raw_gbps:.2f} GB/s)")
    report = {"hardware": hardware, "module": module, "sources": SOURCES, "destinations": DESTINATIONS,
              "rounds": args.rounds, "sizes": sizes}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
    return report


if __name__ == "__main__":
    main()
