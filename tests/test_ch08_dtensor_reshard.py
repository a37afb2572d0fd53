"""Chapter 08: resharding by overlap. Run: pytest tests/test_ch08_dtensor_reshard.py"""

import asyncio
import random

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset as torch_local_box

from koans.testkit.testing import starts_apart

CASES = 240  # generated layouts per property, from a fixed seed


def random_case(rng):
    ndim = rng.randint(1, 3)
    shape = tuple(rng.randint(1, 11) for _ in range(ndim))

    def layout():
        mesh = tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 2)))
        return mesh, [Shard(rng.randrange(ndim)) if rng.random() < 0.75 else Replicate() for _ in mesh]

    return shape, *layout(), *layout()


def cases(seed):
    rng = random.Random(seed)
    return [random_case(rng) for _ in range(CASES)]


def chunk_reference(full, mesh, placements, coord):
    """torch.chunk applied mesh dimension by mesh dimension: the block a rank holds."""
    block = full
    for m, placement in enumerate(placements):
        if isinstance(placement, Shard):
            pieces = torch.chunk(block, mesh[m], dim=placement.dim)
            block = pieces[coord[m]] if coord[m] < len(pieces) else block.narrow(placement.dim, block.shape[placement.dim], 0)
    return block


def region(full, box):
    return full[tuple(slice(offset, offset + length) for offset, length in box)]


def volume(box):
    count = 1
    for _, length in box:
        count *= length
    return count


# --- TODO 1: shard_box ---
# Contract, clause by clause (the test that holds each):
#   1. DTensor's split: share size ceil(length / parts), the last shares short or empty
#                                                          -> test_boxes_follow_torchs_uneven_chunking, test_boxes_match_torch_on_generated_layouts
#   2. an empty share has length 0 at the end of the dimension (its full size)  -> test_boxes_match_torch_on_generated_layouts
#   3. mesh dimensions in order; a second split of one tensor dim splits the first's share, offsets added
#                                                          -> test_boxes_follow_torchs_uneven_chunking, test_boxes_match_torch_on_generated_layouts
#   4. each mesh dimension splits by its own size (2-D meshes, 1 x n and n x 1 too) -> test_boxes_match_torch_on_generated_layouts
#   5. Replicate() leaves the box as it is                  -> test_boxes_follow_torchs_uneven_chunking
#   6. the boxes cover the tensor once per replica          -> test_destination_boxes_cover_the_tensor_exactly_once_per_replica
#   7. one placement and one coordinate per mesh dimension, else ValueError (given)  -> test_boxes_follow_torchs_uneven_chunking


@pytest.mark.todo("shard_box")
def test_boxes_follow_torchs_uneven_chunking(chapter):
    boxes = [chapter.shard_box((10,), (4,), [Shard(0)], (r,)) for r in range(4)]
    assert boxes == [((0, 3),), ((3, 3),), ((6, 3),), ((9, 1),)], (
        f"10 elements over 4 ranks gave {boxes}: boxes are (offset, length); torch.chunk's rule gives each share "
        "ceil(10 / 4) = 3, so 3, 3, 3 and what is left, 1")
    assert [chapter.shard_box((5,), (4,), [Shard(0)], (r,))[0][1] for r in range(4)] == [2, 2, 1, 0], "the last may be empty"
    assert chapter.shard_box((6, 8), (2, 2), [Shard(1), Replicate()], (1, 0)) == ((0, 6), (4, 4)), (
        "(6, 8) on mesh (2, 2), [Shard(1), Replicate()] at (1, 0) gave "
        f"{chapter.shard_box((6, 8), (2, 2), [Shard(1), Replicate()], (1, 0))}, not ((0, 6), (4, 4)): Shard(1) on "
        "mesh dimension 0 splits tensor dim 1 (8) into two shares of 4, coordinate 1 takes the second; Replicate() "
        "leaves the box as it is")
    nested = chapter.shard_box((8,), (2, 2), [Shard(0), Shard(0)], (1, 1))
    assert nested == ((6, 2),), (
        f"(8,) on mesh (2, 2), [Shard(0), Shard(0)] at (1, 1) gave {nested}: the first split leaves (4, 4), the "
        "second splits that box in two, giving (4 + 2, 2) = (6, 2): a later split starts from the earlier one's offset")
    with pytest.raises(ValueError, match="one placement"):
        chapter.shard_box((4,), (2, 2), [Shard(0)], (0, 0))


@pytest.mark.todo("shard_box")
def test_boxes_match_torch_on_generated_layouts(chapter):
    checked = 0
    for shape, mesh, placements, _, _ in cases(seed=8):
        full = torch.arange(volume(tuple((0, s) for s in shape))).reshape(shape)
        for _, coord in chapter.ranks(mesh):
            box = chapter.shard_box(shape, mesh, placements, coord)
            lengths, offsets = torch_local_box(shape, mesh, list(coord), placements)
            assert box == tuple(zip(offsets, lengths)), (
                f"{shape} on mesh {mesh} {placements} at {coord}: {box}, but DTensor's own is "
                f"{tuple(zip(offsets, lengths))}" + (" (an empty share has length 0, at the end of the whole "
                                                     "dimension: offset = its full size)" if 0 in lengths else
                                                     " (the Shard at mesh dimension m splits into mesh_shape[m] "
                                                     "shares, each ceil(length / mesh_shape[m]))"))
            expected = chunk_reference(full, mesh, placements, coord)
            assert tuple(length for _, length in box) == tuple(expected.shape), (shape, mesh, placements, coord, box)
            if expected.numel():
                assert torch.equal(region(full, box), expected), (shape, mesh, placements, coord, box)
            checked += 1
    assert checked >= CASES, (
        f"only {checked} ranks were checked over {CASES} generated layouts: each layout has at least one rank, and "
        "chapter.ranks(mesh) (given) names them all")


@pytest.mark.todo("shard_box")
def test_destination_boxes_cover_the_tensor_exactly_once_per_replica(chapter):
    for shape, _, _, mesh, placements in cases(seed=9):
        replicas = 1
        for size, placement in zip(mesh, placements):
            replicas *= size if isinstance(placement, Replicate) else 1
        coverage = torch.zeros(shape, dtype=torch.int64)
        for _, coord in chapter.ranks(mesh):
            region(coverage, chapter.shard_box(shape, mesh, placements, coord)).add_(1)
        assert bool((coverage == replicas).all()), f"{shape} on {mesh} {placements}: covered {coverage.unique().tolist()} times"


# --- TODO 2: intersect ---
# Contract, clause by clause (the test that holds each):
#   1. per dimension, from the larger start to the smaller end  -> test_intersect_known_boxes, test_intersect_agrees_with_masks_on_generated_boxes
#   2. boxes that only touch do not overlap: None              -> test_intersect_known_boxes
#   3. an empty overlap, or an empty box, is None (never a box of length 0) -> test_intersect_known_boxes,
#                                                                             test_intersect_agrees_with_masks_on_generated_boxes
#   4. the boxes of a 0-d tensor, (), overlap in ()          -> test_intersect_known_boxes


@pytest.mark.todo("intersect")
def test_intersect_known_boxes(chapter):
    overlap = chapter.intersect(((0, 4), (0, 8)), ((2, 4), (4, 8)))
    assert overlap == ((2, 2), (4, 4)), (
        f"rows 0..4 x cols 0..8 and rows 2..6 x cols 4..12 overlap in rows 2..4, cols 4..8: ((2, 2), (4, 4)), not "
        f"{overlap}: a box is (offset, length) per dim, its end offset + length excluded")
    assert chapter.intersect(((0, 4),), ((4, 4),)) is None, (
        "touching is not overlapping: answer None, never a box of length 0")
    assert chapter.intersect(((0, 4),), ((6, 2),)) is None, (
        f"(0..4) and (6..8) do not overlap, yet intersect answered {chapter.intersect(((0, 4),), ((6, 2),))!r}: an "
        "empty range in any dimension (its end at or before its start) means no overlap: None, never a box")
    assert chapter.intersect(((1, 8), (1, 8)), ((2, 2), (3, 1))) == ((2, 2), (3, 1)), "a box inside another"
    assert chapter.intersect(((0, 4),), ((2, 0),)) is None, "an empty box overlaps nothing"
    assert chapter.intersect((), ()) == (), (
        "a 0-d tensor's boxes are () and hold its one element: they overlap in the box (), not None (a scalar "
        "would never be moved)")


@pytest.mark.todo("intersect")
def test_intersect_agrees_with_masks_on_generated_boxes(chapter):
    rng = random.Random(10)
    for _ in range(CASES):
        ndim = rng.randint(1, 3)
        size = [rng.randint(1, 9) for _ in range(ndim)]

        def box():
            starts = [rng.randint(0, s) for s in size]
            return tuple((start, rng.randint(0, s - start)) for start, s in zip(starts, size))

        a, b = box(), box()
        mask_a, mask_b = torch.zeros(size, dtype=torch.bool), torch.zeros(size, dtype=torch.bool)
        region(mask_a, a).fill_(True)
        region(mask_b, b).fill_(True)
        both = mask_a & mask_b
        got = chapter.intersect(a, b)
        if not both.any():
            assert got is None, (a, b, got)
        else:
            expected = torch.zeros(size, dtype=torch.bool)
            region(expected, got).fill_(True)
            assert torch.equal(expected, both), (a, b, got)


# --- TODO 3: plan_transfer ---
# Contract, clause by clause (the test that holds each):
#   1. one entry per destination rank, flat row-major ranks     -> test_plans_deliver_every_element_once_on_generated_layouts
#   2. every element of a destination's box delivered exactly once, the right bytes (local slices on both sides)
#                                                              -> test_plans_deliver_every_element_once_on_generated_layouts,
#                                                                 test_two_row_shards_to_four_column_shards
#   3. only overlaps move: the bytes moved are the destination boxes -> test_bytes_moved_are_the_overlaps_and_less_than_a_full_gather
#   4. replicas: each overlap from one replica, the one at position dst_rank % len(replicas), dst_rank being
#      the flat destination rank (not a coordinate, nor a count of pieces so far), on 1-D and 2-D meshes
#                                                              -> test_replicated_sources_share_the_load,
#                                                                 test_replicas_are_picked_by_the_flat_destination_rank


def execute_in_memory(chapter, shape, src_mesh, src_placements, dst_mesh, dst_placements, plan):
    """Run a plan with plain tensors; answer per destination (result, expected, times each element was written)."""
    full = torch.arange(volume(tuple((0, s) for s in shape)), dtype=torch.float64).reshape(shape)
    src_local = {r: region(full, chapter.shard_box(shape, src_mesh, src_placements, c)) for r, c in chapter.ranks(src_mesh)}
    out = {}
    for r, c in chapter.ranks(dst_mesh):
        box = chapter.shard_box(shape, dst_mesh, dst_placements, c)
        local = torch.full(tuple(length for _, length in box), float("nan"), dtype=torch.float64)
        writes = torch.zeros(local.shape, dtype=torch.int64)
        for piece in plan[r]:
            into, taken = local[piece.dst_slices], src_local[piece.src][piece.src_slices]
            assert into.shape == taken.shape, (
                f"destination rank {r}: a piece's dst_slices select a {tuple(into.shape)} region of its shard, its "
                f"src_slices a {tuple(taken.shape)} region of source rank {piece.src}'s: both are the same overlap, "
                "each in its own side's local coordinates (the overlap's slices within dst_box, within src_box)")
            local[piece.dst_slices] = taken
            writes[piece.dst_slices] += 1
        out[r] = (local, region(full, box), writes)
    return out


@pytest.mark.todo("plan_transfer")
def test_plans_deliver_every_element_once_on_generated_layouts(chapter):
    for shape, src_mesh, src_placements, dst_mesh, dst_placements in cases(seed=11):
        plan = chapter.plan_transfer(shape, src_mesh, src_placements, dst_mesh, dst_placements)
        assert sorted(plan) == [r for r, _ in chapter.ranks(dst_mesh)], "one entry per destination rank"
        for rank, (local, expected, writes) in execute_in_memory(chapter, shape, src_mesh, src_placements,
                                                                 dst_mesh, dst_placements, plan).items():
            times = writes.unique().tolist()
            why = ("; some elements are written more than once: take each overlap from one of the source ranks "
                   "holding the same box (replicas), not from all of them" if max(times, default=1) > 1 else
                   "; some elements are never written: every source rank whose box overlaps this destination's "
                   "gives a piece" if min(times, default=1) == 0 else "")
            assert bool((writes == 1).all()), (
                f"{shape} {src_placements}->{dst_placements}: rank {rank} written {times} times{why}")
            assert torch.equal(local, expected), f"{shape} {src_placements}->{dst_placements}: rank {rank} got the wrong bytes"


@pytest.mark.todo("plan_transfer")
def test_bytes_moved_are_the_overlaps_and_less_than_a_full_gather(chapter, plumbing):
    for shape, src_mesh, src_placements, dst_mesh, dst_placements in cases(seed=12):
        plan = chapter.plan_transfer(shape, src_mesh, src_placements, dst_mesh, dst_placements)
        boxes = [chapter.shard_box(shape, dst_mesh, dst_placements, c) for _, c in chapter.ranks(dst_mesh)]
        moved = plumbing.bytes_moved(plan, 4)
        assert moved == 4 * sum(volume(b) for b in boxes), "each destination pulls exactly its own box"
        naive = plumbing.naive_bytes(shape, dst_mesh, 4)
        if any(volume(b) < volume(tuple((0, s) for s in shape)) for b in boxes):
            assert moved < naive["all_gather"], "when a destination holds less than all, overlap pulls beat gathering"


@pytest.mark.todo("plan_transfer")
def test_two_row_shards_to_four_column_shards(chapter, plumbing):
    plan = chapter.plan_transfer((8, 16), (2,), [Shard(0)], (4,), [Shard(1)])
    for dst, pieces in plan.items():
        assert sorted(p.src for p in pieces) == [0, 1], "each column block overlaps both row shards"
        assert all(p.numel == 16 for p in pieces), (
            f"destination {dst}: pieces of {[p.numel for p in pieces]} elements, not 16 each: its 8 x 4 column block "
            "overlaps each 4 x 16 row shard in 4 x 4, and a piece's dst_slices cover just that overlap")
        assert [p.dst_slices for p in sorted(pieces, key=lambda p: p.src)] == [(slice(0, 4), slice(0, 4)), (slice(4, 8), slice(0, 4))], (
            f"destination {dst}: dst_slices {[p.dst_slices for p in pieces]} (in plan order), not rows 0:4 (from "
            "source 0) and 4:8 (from source 1), columns 0:4: a piece's slices are local to the destination's own 8 x "
            "4 shard, not the whole tensor's coordinates")
    assert plumbing.bytes_moved(plan, 2) * 4 == plumbing.naive_bytes((8, 16), (4,), 2)["all_gather"], (
        f"the plan moves {plumbing.bytes_moved(plan, 2)} bytes of 2-byte elements; expected a quarter of an "
        f"all-gather's {plumbing.naive_bytes((8, 16), (4,), 2)['all_gather']}: each of the 4 destinations pulls its "
        "own 8 x 4 block, no more")


@pytest.mark.todo("plan_transfer")
def test_replicated_sources_share_the_load(chapter):
    plan = chapter.plan_transfer((8, 8), (2,), [Replicate()], (4,), [Shard(0)])
    assert all(len(pieces) == 1 for pieces in plan.values()), "any one replica has it all"
    assert {pieces[0].src for pieces in plan.values()} == {0, 1}, "the destinations spread over both replicas"


# Expected by the contract (the replica at position dst_rank % len(replicas), ranks ascending), written out.
SPREAD_CASES = [  # (src mesh, src placements, dst mesh, dst placements, per destination rank: the sources pulled)
    ((2,), [Replicate()], (1, 4), [Replicate(), Shard(1)], [[0], [1], [0], [1]]),
    ((2,), [Replicate()], (4, 1), [Shard(0), Replicate()], [[0], [1], [0], [1]]),
    ((2, 2), [Replicate(), Replicate()], (2, 2), [Shard(0), Shard(1)], [[0], [1], [2], [3]]),
    ((3,), [Replicate()], (2, 3), [Shard(0), Shard(1)], [[0], [1], [2], [0], [1], [2]]),
    ((2, 2), [Shard(0), Replicate()], (1, 4), [Replicate(), Shard(1)], [[0, 2], [1, 3], [0, 2], [1, 3]]),
    # rows [0, 3), [3, 6), [6, 8) against replicated halves: destination 1 overlaps both, 0 and 2 one each
    ((2, 2), [Shard(0), Replicate()], (3,), [Shard(0)], [[0], [1, 3], [2]]),
]


@pytest.mark.todo("plan_transfer")
@pytest.mark.parametrize("src_mesh, src_placements, dst_mesh, dst_placements, expected", SPREAD_CASES,
                         ids=[f"{'x'.join(map(str, c[0]))}-to-{'x'.join(map(str, c[2]))}" for c in SPREAD_CASES])
def test_replicas_are_picked_by_the_flat_destination_rank(chapter, src_mesh, src_placements, dst_mesh,
                                                          dst_placements, expected):
    plan = chapter.plan_transfer((8, 12), src_mesh, src_placements, dst_mesh, dst_placements)
    got = [sorted(p.src for p in plan[rank]) for rank in sorted(plan)]
    assert got == expected, (
        f"{src_placements} on {src_mesh} -> {dst_placements} on {dst_mesh}: destinations pulled from {got}, not "
        f"{expected}. Pick the replica at position dst_rank % len(replicas), where dst_rank is the flat "
        "(row-major) destination rank: not a mesh coordinate (coord[0] is 0 for every rank of a 1 x n mesh), nor a "
        "count of the pieces handed out so far")


# --- TODO 4: ShardHolder.pull ---
# Contract, clause by clause (the test that holds each):
#   1. every piece lands in its own region, in that region's shape (strided regions too)
#                                                              -> test_pull_puts_each_piece_in_its_place_even_a_strided_one
#   2. every read starts before any is waited for              -> test_pull_starts_every_read_before_waiting_for_any
#   3. answers the bytes read                                  -> test_pull_puts_each_piece_in_its_place_even_a_strided_one
#   4. a real DTensor arrives bit for bit as redistribute gives it -> test_a_real_dtensor_moves_between_meshes_bit_for_bit_as_redistribute
#   5. each piece is read in its handle's dtype (not the default float32, nor the shard's), its bytes counted in it
#                                                              -> test_pull_reads_each_piece_in_its_own_dtype
#   6. a rank with no pieces (an empty share) answers 0      -> test_a_rank_with_nothing_to_pull_answers_zero
#   7. a read that fails fails the pull: its error reaches the caller, no bytes answered
#                                                              -> test_a_read_that_fails_fails_the_pull


@pytest.mark.todo("ShardHolder.pull")
def test_pull_puts_each_piece_in_its_place_even_a_strided_one(chapter, plumbing):
    """One destination rank (in this process) whose two pieces are column blocks: not contiguous."""
    from monarch.actor import this_proc

    source = torch.arange(30, dtype=torch.float32).reshape(3, 10)
    left, right = source[:, :4].contiguous().view(-1), source[:, 4:].contiguous().view(-1)
    handles = [plumbing.expose(left), plumbing.expose(right)]
    pieces = [chapter.Piece(0, (slice(0, 3), slice(0, 4)), (slice(0, 3), slice(0, 4))),
              chapter.Piece(1, (slice(0, 3), slice(0, 6)), (slice(0, 3), slice(4, 10)))]
    holder = this_proc().spawn("strided_pull_holder", chapter.ShardHolder)
    holder.allocate.call_one((3, 10)).get(timeout=60)
    read = holder.pull.call_one(pieces, handles).get(timeout=60)
    assert read == 30 * 4, "pull answers the bytes it read"
    shard = holder.local_shard.call_one().get(timeout=60)
    wrong = [where for where, cols in (("0:4", slice(0, 4)), ("4:10", slice(4, 10)))
             if not torch.equal(shard[:, cols], source[:, cols])]
    if len(wrong) == 2:
        why = ("neither piece landed in the shard: copy each into the region itself (reshape(-1) or flatten() of a "
               "strided region is a copy, and writing into a copy changes nothing)")
    else:
        right = "4:10" if wrong == ["0:4"] else "0:4"
        why = (f"columns {right} hold their piece but columns {wrong[0] if wrong else '?'} do not: every piece is "
               "copied into its own region, each from its own landing buffer (one buffer shared by all the reads, "
               "or one copy after the loop, keeps a single piece)")
    assert torch.equal(shard, source), why


class CountingBuffer:
    """Stands in for an RDMABuffer, in this process: counts the reads in flight at once."""

    in_flight = most_at_once = 0

    def __init__(self, data: torch.Tensor):
        self.data = data

    def read_into(self, destination, *, timeout=60):
        async def read():
            CountingBuffer.in_flight += 1
            CountingBuffer.most_at_once = max(CountingBuffer.most_at_once, CountingBuffer.in_flight)
            await asyncio.sleep(0.01)  # a read takes a while: others may start meanwhile
            destination.copy_(self.data)
            CountingBuffer.in_flight -= 1

        return read()


@pytest.mark.todo("ShardHolder.pull")
def test_pull_starts_every_read_before_waiting_for_any(chapter):
    source = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    pieces = [chapter.Piece(0, (slice(r, r + 1), slice(0, 4)), (slice(r, r + 1), slice(0, 4))) for r in range(3)]
    handles = [chapter.TensorHandle(CountingBuffer(source[r].clone()), torch.float32, 4) for r in range(3)]
    holder = chapter.ShardHolder.__new__(chapter.ShardHolder)  # the endpoint's code alone, in this process
    holder.local = torch.full((3, 4), float("nan"))
    CountingBuffer.in_flight = CountingBuffer.most_at_once = 0
    read = asyncio.run(chapter.ShardHolder.__dict__["pull"]._method(holder, pieces, handles))
    assert torch.equal(holder.local, source) and read == 12 * 4, (
        f"after pull: shard equal to the three rows read: {torch.equal(holder.local, source)}, bytes answered "
        f"{read!r} (expected 48): either a piece did not land in its own region of self.local, or pull did not answer "
        "the bytes it read (12 float32 elements)")
    assert CountingBuffer.most_at_once == 3, (
        f"at most {CountingBuffer.most_at_once} of the 3 reads were in flight at once: start every read, then "
        "wait for them all (asyncio.gather), so the pieces arrive in parallel, not one after another")


def pull_here(chapter, holder, pieces, handles):
    """The endpoint's code alone, in this process, bounded: a pull that hangs fails instead."""
    return asyncio.run(asyncio.wait_for(chapter.ShardHolder.__dict__["pull"]._method(holder, pieces, handles), 30))


@pytest.mark.todo("ShardHolder.pull")
def test_a_rank_with_nothing_to_pull_answers_zero(chapter):
    holder = chapter.ShardHolder.__new__(chapter.ShardHolder)
    holder.local = torch.empty((0, 4))  # torch's chunking leaves a share empty when ranks outnumber rows
    try:
        read = pull_here(chapter, holder, [], [])
    except Exception as failure:
        raise AssertionError(
            f"pull with no pieces raised {type(failure).__name__} ({failure}): a rank whose share is empty gets no "
            "pieces from plan_transfer, and pulls nothing: it answers 0 bytes (asyncio.wait refuses an empty set; "
            "asyncio.gather of nothing is [])") from failure
    assert read == 0, f"pull with no pieces answered {read}: nothing was read, so 0 bytes"


class FailingBuffer:
    """Stands in for an RDMABuffer whose read fails, as a read from a dead process does."""

    def read_into(self, destination, *, timeout=60):
        async def read():
            await asyncio.sleep(0)
            raise TimeoutError("the read of this piece gave up")

        return read()


@pytest.mark.todo("ShardHolder.pull")
def test_a_read_that_fails_fails_the_pull(chapter):
    source = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    pieces = [chapter.Piece(0, (slice(r, r + 1), slice(0, 4)), (slice(r, r + 1), slice(0, 4))) for r in range(2)]
    handles = [chapter.TensorHandle(CountingBuffer(source[0].clone()), torch.float32, 4),
               chapter.TensorHandle(FailingBuffer(), torch.float32, 4)]
    holder = chapter.ShardHolder.__new__(chapter.ShardHolder)
    holder.local = torch.full((2, 4), float("nan"))
    try:
        read = pull_here(chapter, holder, pieces, handles)
    except (TimeoutError, ExceptionGroup) as failure:
        assert "gave up" in repr(failure), f"the read's own error should reach the caller, not {failure!r}"
    else:
        raise AssertionError(
            f"one piece's read failed, yet pull answered {read} bytes: a read that fails fails the pull (let its "
            "error reach the caller), or the caller takes a shard whose region never arrived for a whole one")


@pytest.mark.todo("ShardHolder.pull")
@pytest.mark.parametrize("local_dtype", [torch.bfloat16, torch.float32], ids=str)
def test_pull_reads_each_piece_in_its_own_dtype(chapter, local_dtype):
    """bfloat16 pieces, into a bfloat16 shard, and into a float32 one (a holder that keeps a wider copy)."""
    source = torch.arange(8, dtype=torch.float32).reshape(2, 4).to(torch.bfloat16)
    pieces = [chapter.Piece(0, (slice(r, r + 1), slice(0, 4)), (slice(r, r + 1), slice(0, 4))) for r in range(2)]
    handles = [chapter.TensorHandle(CountingBuffer(source[r].clone()), torch.bfloat16, 4) for r in range(2)]
    holder = chapter.ShardHolder.__new__(chapter.ShardHolder)  # the endpoint's code alone, in this process
    holder.local = torch.full((3, 4), float("nan"), dtype=local_dtype)  # NaN: a piece never read fails; row 3: no piece
    assert starts_apart(holder.local[:2], source.to(local_dtype)), "the test's own premise: the shard starts unlike its source"
    read = asyncio.run(chapter.ShardHolder.__dict__["pull"]._method(holder, pieces, handles))
    assert torch.equal(holder.local[:2], source.to(local_dtype)), (
        "each bfloat16 piece lands in its place: read in the handle's dtype, then copied into the shard")
    assert read == 8 * 2, (
        f"pull answers the bytes read: 8 bfloat16 elements are 16 bytes, not {read}: count each piece in its "
        f"handle's dtype (the shard, {local_dtype}, holds {holder.local.nbytes} bytes; only the pieces are read)")


@pytest.mark.todo("ShardHolder.pull")
@pytest.mark.time_limit(240)
def test_a_real_dtensor_moves_between_meshes_bit_for_bit_as_redistribute(plumbing):
    """Uneven rows over 2 processes (3 + 2 of 5 x 9), gathered by RDMA pulls on a third process, of another
    mesh: two pieces, one from each source process, land at their rows. The demo runs 2 -> 4 processes, into column shards; one
    destination keeps this test quick (each process imports torch), and the in-process tests above check
    column shards and strided pieces."""
    assert plumbing.run_real(shape=(5, 9), seed=3, sources=2, destinations=1), (
        "the destination shards differ from torch's redistribute")
