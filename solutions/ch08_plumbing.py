"""Chapter 08 plumbing: DTensor meshes and the source side of a transfer, byte counts, a picture
of a plan, and the demo. You may skip this file; nothing in it is a TODO.

    python -m exercises.ch08_dtensor_reshard           the demo (the reference: python -m solutions.ch08_dtensor_reshard)
    python -m exercises.ch08_dtensor_reshard --bench   seconds against torch's redistribute (koans/bench/reshard.py)
"""

from __future__ import annotations

import sys
import itertools
from typing import TYPE_CHECKING

from koans.learn.demo import demo_options
import torch
from monarch.actor import Actor, current_rank, endpoint, this_host
from torch.distributed.tensor import Replicate, Shard

from .ch03_rdma_transfer import TensorHandle, expose

if TYPE_CHECKING:
    from .ch08_dtensor_reshard import Piece

TIMEOUT = 60.0


def _chapter():
    from . import ch08_dtensor_reshard  # imported late: the chapter file imports this one

    return ch08_dtensor_reshard


def bytes_moved(plan: dict[int, list[Piece]], element_size: int) -> int:
    return element_size * sum(piece.numel for pieces in plan.values() for piece in pieces)


def naive_bytes(shape, dst_mesh, element_size: int) -> dict[str, int]:
    """What the traditional moves cost: every destination gathers all; or gather to one, then scatter."""
    total = element_size
    for size in shape:
        total *= size
    dst_ranks = 1
    for size in dst_mesh:
        dst_ranks *= size
    return {"all_gather": total * dst_ranks, "gather_then_scatter": 2 * total}


def draw_plan(plan, shape, dst_mesh, dst_placements, width: int = 32, height: int = 8) -> str:
    """ASCII picture of a 2-D plan: each cell lettered by the source rank it is pulled from
    (A = source 0, B = source 1, ...), in capitals for even destination ranks and small letters
    for odd ones, so that the destination blocks stand apart."""
    rows, cols = shape
    picture = [[" "] * width for _ in range(height)]
    for dst_rank, coord in _chapter().ranks(dst_mesh):
        (r0, _), (c0, _) = _chapter().shard_box(shape, dst_mesh, dst_placements, coord)
        for piece in plan[dst_rank]:
            rs, cs = piece.dst_slices
            for y in range(height):
                for x in range(width):
                    r, c = y * rows // height, x * cols // width
                    if r0 + rs.start <= r < r0 + rs.stop and c0 + cs.start <= c < c0 + cs.stop:
                        letter = "ABCDEFGH"[piece.src % 8]
                        picture[y][x] = letter if dst_rank % 2 == 0 else letter.lower()
    return "\n".join("    |" + "".join(line) + "|" for line in picture)


def _layout(spec: list[tuple[str, int]]):
    return [Shard(dim) if kind == "shard" else Replicate() for kind, dim in spec]


class ShardHolderBase(Actor):
    """One rank of a mesh that runs torch.distributed (gloo) and holds a DTensor shard (`self.local`).

    The chapter's ShardHolder adds the destination side, `pull`."""

    def __init__(self):
        self.rank = current_rank().rank
        self.staged = {}  # what was asked -> (its staging buffer, the handles): kept alive while handles are out
        self.shards = {}  # a destination's shard per shape, refilled when a weight of that shape comes again

    @endpoint
    async def setup(self, mesh_shape: tuple[int, ...]) -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        self.mesh = init_device_mesh("cpu", mesh_shape)

    @endpoint
    async def distribute(self, shape, seed: int, layout: list[tuple[str, int]]) -> tuple[int, ...]:
        """Hold a real DTensor: the seeded global tensor, distributed with `layout`. Answers the local shape."""
        from torch.distributed.tensor import distribute_tensor

        full = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        self.local = distribute_tensor(full, self.mesh, _layout(layout)).to_local().contiguous()
        return tuple(self.local.shape)

    @endpoint
    async def reference(self, shape, seed: int, from_layout, to_layout) -> torch.Tensor:
        """torch's own answer for this rank: redistribute from one layout to the other."""
        from torch.distributed.tensor import distribute_tensor

        full = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
        return distribute_tensor(full, self.mesh, _layout(from_layout)).redistribute(self.mesh, _layout(to_layout)).to_local()

    @endpoint
    async def stage(self, pieces: list[Piece]) -> list[TensorHandle]:
        """Source side: pack every requested region into one flat staging buffer, region after region,
        and expose each region of it. A staging copy, because RDMA reads one contiguous block and a
        region of a shard usually is not one; one buffer, because one allocation and one pass over the
        shard cost less than one per piece.

        The buffer and its handles stay for the next request of the same regions (a weight moved again
        after the next training step), one per set of regions, as a model has many weights: that request
        only copies the new values in, with no allocation and no registration. `release` gives the memory
        back."""
        layout = (self.local.dtype, tuple((piece.numel, tuple((s.start, s.stop) for s in piece.src_slices))
                                          for piece in pieces))
        if layout not in self.staged:
            staging = torch.empty(sum(piece.numel for piece in pieces), dtype=self.local.dtype)
            starts = [0, *itertools.accumulate(piece.numel for piece in pieces)]
            self.staged[layout] = (staging, [expose(staging[start: start + piece.numel])
                                             for start, piece in zip(starts, pieces)])
        staging, handles = self.staged[layout]
        start = 0
        for piece in pieces:
            region = self.local[piece.src_slices]
            staging[start: start + piece.numel].view(region.shape).copy_(region)
            start += piece.numel
        return handles

    @endpoint
    async def release(self) -> None:
        self.staged, self.shards = {}, {}

    @endpoint
    async def allocate(self, local_shape: tuple[int, ...]) -> None:
        """A destination shard of this shape, all NaN (a move that missed an element cannot pass for one);
        one of the same shape already made is refilled, not allocated again."""
        if tuple(local_shape) not in self.shards:
            self.shards[tuple(local_shape)] = torch.empty(local_shape)
        self.local = self.shards[tuple(local_shape)].fill_(float("nan"))

    @endpoint
    async def local_shard(self) -> torch.Tensor:
        return self.local

    @endpoint
    async def teardown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


_rank_slices: dict[int, tuple] = {}  # id(mesh) -> (the mesh, one slice per rank): slicing costs ~2 ms a move


def _one_per_rank(holders, count: int) -> list:
    if id(holders) not in _rank_slices:
        if len(_rank_slices) >= 8:
            _rank_slices.clear()
        _rank_slices[id(holders)] = (holders, [holders.slice(procs=r) for r in range(count)])
    return _rank_slices[id(holders)][1]


def reshard(shape, seed, src_holders, src_mesh, src_layout, dst_holders, dst_mesh, dst_layout) -> dict:
    """Move a DTensor from the source mesh's layout to the destination mesh's, by the overlap plan.

    Each rank gets one message per step and every rank of a step works at once, so a move's fixed cost
    is two rounds of messages, however many pieces the plan has: the sources stage while the destinations
    allocate, then the destinations pull (their sources done, so they do not compete with them for CPU)."""
    plan = _chapter().plan_transfer(shape, src_mesh, _layout(src_layout), dst_mesh, _layout(dst_layout))
    src_list = _one_per_rank(src_holders, len(list(_chapter().ranks(src_mesh))))
    dst_list = _one_per_rank(dst_holders, len(list(_chapter().ranks(dst_mesh))))
    wanted: dict[int, list[tuple[int, int]]] = {}  # source rank -> (destination rank, piece index), every piece it gives
    for dst_rank, pieces in plan.items():
        for i, piece in enumerate(pieces):
            wanted.setdefault(piece.src, []).append((dst_rank, i))
    staging = {src: src_list[src].stage.call_one([plan[dst_rank][i] for dst_rank, i in where])  # one per source
               for src, where in wanted.items()}
    allocating = []  # while the sources stage: the destinations need no handle to make room
    for dst_rank, coord in _chapter().ranks(dst_mesh):
        box = _chapter().shard_box(shape, dst_mesh, _layout(dst_layout), coord)
        allocating.append(dst_list[dst_rank].allocate.call_one(tuple(length for _, length in box)))
    handles = {dst_rank: [None] * len(pieces) for dst_rank, pieces in plan.items()}
    for src, reply in staging.items():
        for (dst_rank, i), handle in zip(wanted[src], reply.get(timeout=TIMEOUT)):
            handles[dst_rank][i] = handle
    # an actor handles one sender's messages in order: each destination allocates before it pulls
    pulls = [dst_list[dst_rank].pull.call_one(plan[dst_rank], handles[dst_rank]) for dst_rank, _ in _chapter().ranks(dst_mesh)]
    read = sum(reply.get(timeout=TIMEOUT) for reply in pulls)  # every destination pulls at once
    for reply in allocating:
        reply.get(timeout=TIMEOUT)
    return {"plan": plan, "bytes_read": read}


def main() -> None:
    if "--bench" in sys.argv[1:]:  # the benchmark parses its own flags: --bench --help lists them
        from koans.bench.reshard import main as bench_main

        bench_main(f"{__package__}.ch08_dtensor_reshard", [arg for arg in sys.argv[1:] if arg != "--bench"])
        return
    demo_options(f"{__package__}.ch08_dtensor_reshard", "Chapter 08's demo: overlap plans, and a real DTensor moved.",
                 (("--bench", "time the reshard against torch's redistribute instead (its own flags: --bench --help)"),))
    print("Chapter 08: resharding by overlap\n")
    shape, src_mesh, dst_mesh = (8, 16), (2,), (4,)
    plan = _chapter().plan_transfer(shape, src_mesh, [Shard(0)], dst_mesh, [Shard(1)])
    print(f"A {shape[0]}x{shape[1]} weight, 2 x Shard(0) -> 4 x Shard(1). Who pulls what (A = from source 0, B = from 1):")
    print("      " + "".join(f"d{r}".ljust(8) for r in range(4)))
    print(draw_plan(plan, shape, dst_mesh, [Shard(1)]))
    for dst, pieces in plan.items():
        print(f"  d{dst}: " + "; ".join(f"from s{p.src} rows {p.src_slices[0].start}:{p.src_slices[0].stop} "
                                       f"cols {p.src_slices[1].start}:{p.src_slices[1].stop}" for p in pieces))

    qwen = (4864, 896)  # Qwen2.5-0.5B's MLP up-projection
    naive = naive_bytes(qwen, (4,), 2)
    print(f"\nA Qwen-sized {qwen[0]}x{qwen[1]} bf16 weight ({naive['gather_then_scatter'] // 2 / 2**20:.1f} MiB) into 4 ranks:")
    print(f"  {'from':<16}{'to':<14}{'pieces':>7}{'moved MiB':>11}{'vs all-gather':>15}{'vs gather+scatter':>19}")
    for src_name, src_layout, dst_name, dst_layout in [("2 x Shard(0)", [Shard(0)], "4 x Shard(1)", [Shard(1)]),
                                                       ("2 x Shard(0)", [Shard(0)], "4 x Shard(0)", [Shard(0)]),
                                                       ("2 x Replicate", [Replicate()], "4 x Shard(1)", [Shard(1)]),
                                                       ("2 x Shard(1)", [Shard(1)], "4 x Replicate", [Replicate()])]:
        qwen_plan = _chapter().plan_transfer(qwen, (2,), src_layout, (4,), dst_layout)
        moved = bytes_moved(qwen_plan, 2)
        pieces = sum(len(p) for p in qwen_plan.values())
        print(f"  {src_name:<16}{dst_name:<14}{pieces:>7}{moved / 2**20:>11.1f}{100 * moved / naive['all_gather']:>14.0f}%"
              f"{100 * moved / naive['gather_then_scatter']:>18.0f}%")
    print("  Overlap pulls move exactly what the destinations hold, each byte once; the layouts only decide\n"
          "  how many pieces that takes. (Replicated destinations need the whole tensor each: no saving there.)")

    print("\nThe real thing: a DTensor on 2 processes (gloo) pulled into 4 processes, checked against redistribute")
    run_real(verbose=True)


def run_real(shape=(6, 10), seed=7, verbose=False, sources: int = 2, destinations: int = 4) -> bool:
    """A real DTensor, Shard(0) over `sources` processes (gloo), pulled by the overlap plan into Shard(1) over
    `destinations` other processes; True if every destination shard equals torch's own redistribute."""
    from monarch.spmd import setup_torch_elastic_env

    src_procs = this_host().spawn_procs(per_host={"procs": sources})
    dst_procs = this_host().spawn_procs(per_host={"procs": destinations})
    try:
        setup_torch_elastic_env(src_procs)
        setup_torch_elastic_env(dst_procs)
        src, dst = src_procs.spawn("src_holder", _chapter().ShardHolder), dst_procs.spawn("dst_holder", _chapter().ShardHolder)
        ready = [src.setup.call((sources,)), dst.setup.call((destinations,))]  # both meshes start up at once
        for reply in ready:
            reply.get(timeout=TIMEOUT)
        distributed = src.distribute.call(shape, seed, [("shard", 0)])
        # torch's own answer, worked out on the destination mesh while the source distributes (it needs
        # nothing of the move); the destination's later calls queue behind it.
        torch_says = dst.reference.call(shape, seed, [("shard", 0)], [("shard", 1)])
        distributed.get(timeout=TIMEOUT)
        result = reshard(shape, seed, src, (sources,), [("shard", 0)], dst, (destinations,), [("shard", 1)])
        ours = dst.local_shard.call().get(timeout=TIMEOUT)
        torch_says = torch_says.get(timeout=TIMEOUT)
        same = all(torch.equal(ours.item(procs=r), torch_says.item(procs=r)) for r in range(destinations))
        if verbose:
            print(f"  {shape} float32, {result['bytes_read']} bytes pulled; equal to redistribute, bit for bit: {same}")
        for reply in [src.teardown.call(), dst.teardown.call()]:
            reply.get(timeout=TIMEOUT)
        return same
    finally:
        stopping = [src_procs.stop(), dst_procs.stop()]  # at once
        for reply in stopping:
            reply.get(timeout=TIMEOUT)
