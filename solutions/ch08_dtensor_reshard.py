"""Chapter 08: resharding by overlap, from one DTensor layout to another.

The trainer may hold a weight sharded by rows over 2 ranks (FSDP2-like
`Shard(0)`), while the generator splits it over 4 ranks for tensor
parallelism. An `nn.Linear` weight is [out, in]: a column-parallel layer
shards it `Shard(0)` (each rank computes a slice of the output), a
row-parallel layer `Shard(1)` (each rank holds a slice of the input features
and computes a partial sum). Below, the generator's layer is row-parallel.
The traditional move gathers the whole tensor and scatters it again. The
better one: every destination rank works out which source shards overlap its
own block, and pulls only those bytes.

    source: [Shard(0)] on 2 ranks          destination: [Shard(1)] on 4 ranks (row-parallel)
    +---------------+                      +---+---+---+---+
    |     s0        |                      |   |   |   |   |
    +---------------+          ->          |d0 |d1 |d2 |d3 |
    |     s1        |                      |   |   |   |   |
    +---------------+                      +---+---+---+---+
    d2's block overlaps s0 (top half) and s1 (bottom half): two pulls of 1/8 each.

DTensor is the common language for both layouts: a device mesh shape plus one
placement per mesh dimension, `Shard(d)` (split tensor dim d across this mesh
dimension, in chunks of ceil(n / parts), so the last shares may be short or
empty) or `Replicate()` (every rank holds all of it).

From a layout, each rank's *box* follows: per tensor dimension, an offset and
a length. Boxes intersect into the pieces to move.

Your TODOs:
  1. shard_box        the box a mesh coordinate owns, by DTensor's rule
  2. intersect        the overlap of two boxes, or None
  3. plan_transfer    per destination rank: (source rank, source slices, destination slices)
  4. ShardHolder.pull  the destination's side of a plan: read each piece by RDMA, copy it into place

Given, safe to skip: ch08_plumbing.py (the DTensor meshes, the source side, the demo).
Check: koans check 8    Demo: python -m exercises.ch08_dtensor_reshard    Read: docs/08_dtensor_reshard.md
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import dataclass

import torch
from koans.learn.demo import run_demo
from monarch.actor import endpoint
from torch.distributed.tensor import Shard

from .ch03_rdma_transfer import TensorHandle, pull_into
from .ch08_plumbing import ShardHolderBase

TIMEOUT = 60  # seconds, a whole number: RDMABuffer.read_into (behind pull_into) refuses a float
Box = tuple[tuple[int, int], ...]  # per tensor dimension: (offset, length)


@dataclass(frozen=True)
class Piece:
    """One pull: this region of source rank `src`'s local shard goes to this region of ours."""

    src: int
    src_slices: tuple[slice, ...]
    dst_slices: tuple[slice, ...]

    @property
    def numel(self) -> int:
        count = 1
        for s in self.dst_slices:
            count *= s.stop - s.start
        return count


def ranks(mesh_shape: tuple[int, ...]):
    """(flat rank, mesh coordinate) for every rank, in row-major order."""
    return enumerate(itertools.product(*(range(n) for n in mesh_shape)))


def shard_box(shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements, coord: tuple[int, ...]) -> Box:
    """The block of a tensor of `shape` that the rank at mesh coordinate `coord` holds.

    Go through the mesh dimensions in order. For Shard(d), split what is left of
    tensor dim d into mesh_shape[m] shares the way DTensor does: share size
    ceil(length / parts); share i starts at i * size, clamped to the end; the
    last shares may be short or empty. 5 over 4 gives lengths 2, 2, 1, 0, the
    empty one at offset 5. DTensor puts every empty share at the end of the
    tensor's dimension (its full size), even one split out of a smaller part.
    (torch.chunk uses the same size but returns only the non-empty chunks: 3
    of them for 5 over 4.) Replicate() leaves the box as it is.
    """
    if len(placements) != len(mesh_shape) or len(coord) != len(mesh_shape):
        raise ValueError(f"need one placement and one coordinate per mesh dimension: mesh {mesh_shape}, "
                         f"placements {placements}, coordinate {coord}")
    # >>> TODO(ch08): start from the whole tensor; narrow the sharded dims mesh dimension by mesh dimension
    # The answer has one (offset, length) per tensor dimension, in the tensor's coordinates. The split
    # follows DTensor's rule (see the docstring); an empty share has length 0 and, as DTensor places it,
    # the offset of the dimension's end: its full size.
    box = [(0, size) for size in shape]
    for m, placement in enumerate(placements):
        if isinstance(placement, Shard):
            offset, length = box[placement.dim]
            size = -(-length // mesh_shape[m])
            start = min(coord[m] * size, length)
            share = max(0, min(size, length - start))
            box[placement.dim] = (offset + start, share) if share else (shape[placement.dim], 0)
    return tuple(box)
    # <<< TODO


def intersect(a: Box, b: Box) -> Box | None:
    """The box both `a` and `b` cover, or None if they do not overlap (or the overlap is empty)."""
    # >>> TODO(ch08): per dimension, the overlap runs from the larger start to the smaller end
    # No overlap in any one dimension (an empty range, or boxes that only touch): None.
    overlap = []
    for (a_off, a_len), (b_off, b_len) in zip(a, b):
        start, end = max(a_off, b_off), min(a_off + a_len, b_off + b_len)
        if end <= start:
            return None
        overlap.append((start, end - start))
    return tuple(overlap)
    # <<< TODO


def local_slices(box: Box, within: Box) -> tuple[slice, ...]:
    """`box` as slices of the local tensor that holds `within` (box must lie inside within)."""
    return tuple(slice(off - w_off, off - w_off + length) for (off, length), (w_off, _) in zip(box, within))


def plan_transfer(shape, src_mesh, src_placements, dst_mesh, dst_placements) -> dict[int, list[Piece]]:
    """For every destination rank, the pieces to pull: each element of its box exactly once.

    When several source ranks hold the same data (Replicate), the piece comes
    from one of them, picked by destination rank so that the load spreads.
    """
    src_boxes = {rank: shard_box(shape, src_mesh, src_placements, c) for rank, c in ranks(src_mesh)}
    plan = {}
    # >>> TODO(ch08): for each destination rank and box, collect one Piece per distinct overlapping source box
    # Source ranks with the same box are replicas: take each overlap from just one of them, the one at
    # position dst_rank % len(replicas) among them (ranks ascending), so destinations spread over replicas;
    # dst_rank is the flat (row-major) destination rank, as ranks() numbers it, on a mesh of any shape.
    # A Piece's slices are local: into the source rank's shard, and into the destination rank's.
    holders: dict[Box, list[int]] = {}
    for rank, box in src_boxes.items():
        holders.setdefault(box, []).append(rank)
    for dst_rank, coord in ranks(dst_mesh):
        dst_box = shard_box(shape, dst_mesh, dst_placements, coord)
        pieces = []
        for src_box, group in holders.items():
            overlap = intersect(src_box, dst_box)
            if overlap is not None:
                src = group[dst_rank % len(group)]
                pieces.append(Piece(src, local_slices(overlap, src_box), local_slices(overlap, dst_box)))
        plan[dst_rank] = pieces
    return plan
    # <<< TODO


class ShardHolder(ShardHolderBase):
    """One rank of a mesh that runs torch.distributed and holds a DTensor's local shard in `self.local`.

    The given base (ch08_plumbing.py) sets up the mesh, makes the DTensor and, on
    the source side, stages requested regions as chapter 03 handles. Your part is
    the destination side.
    """

    @endpoint
    async def pull(self, pieces: list[Piece], handles: list[TensorHandle]) -> int:
        """Destination side: read every piece and copy it into its place. Answers the bytes read."""
        # >>> TODO(ch08): read every piece (all reads at once), then copy each into its place in self.local
        # handles[i] reads pieces[i]. A piece arrives flat: handle.numel elements of handle.dtype,
        # through chapter 03's pull_into.
        # Its place is self.local[piece.dst_slices], in that region's shape. Answer the bytes read (0 for
        # a rank with no pieces: an empty share). A read that fails fails the pull: its error reaches the caller.
        buffers = await asyncio.gather(*(pull_into(handle, torch.empty(handle.numel, dtype=handle.dtype))
                                         for handle in handles))
        for piece, buffer in zip(pieces, buffers):
            region = self.local[piece.dst_slices]
            region.copy_(buffer.view(region.shape))
        return sum(handle.nbytes for handle in handles)
        # <<< TODO


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from .ch08_plumbing import main  # the demo: given code, safe to skip

    run_demo(main)
