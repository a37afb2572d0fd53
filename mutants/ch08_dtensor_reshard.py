"""Chapter 08: plausible wrong answers (see mutants/README.md)."""

from koans.maintain.mutants import Mutant

SHARD_BOX = '''
    box = [(0, size) for size in shape]
    for m, placement in enumerate(placements):
        if isinstance(placement, Shard):
            offset, length = box[placement.dim]
            size = -(-length // mesh_shape[m])
            start = min(coord[m] * size, length)
            box[placement.dim] = (offset + start, max(0, min(size, length - start)))
    return tuple(box)
'''

INTERSECT = '''
    overlap = []
    for (a_off, a_len), (b_off, b_len) in zip(a, b):
        start, end = max(a_off, b_off), min(a_off + a_len, b_off + b_len)
        if end <= start:
            return None
        overlap.append((start, end - start))
    return tuple(overlap)
'''

PLAN = '''
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
'''

MUTANTS = [
    Mutant("shard_box", "floor division for the chunk size", SHARD_BOX.replace("size = -(-length // mesh_shape[m])",
                                                                             "size = length // mesh_shape[m]"), clause="torch.chunk's rule"),
    Mutant("shard_box", "forgets the offset of an earlier split of the same dim",
           SHARD_BOX.replace("box[placement.dim] = (offset + start,", "box[placement.dim] = (start,"), clause="starts from the earlier one's offset"),
    Mutant("shard_box", "splits an even share per rank and lets the last take the rest", '''
        box = [(0, size) for size in shape]
        for m, placement in enumerate(placements):
            if isinstance(placement, Shard):
                offset, length = box[placement.dim]
                size = length // mesh_shape[m]
                start = coord[m] * size
                last = coord[m] == mesh_shape[m] - 1
                box[placement.dim] = (offset + start, length - start if last else size)
        return tuple(box)
    ''', clause="torch.chunk's rule"),
    Mutant("intersect", "treats boxes that only touch as overlapping", INTERSECT.replace("if end <= start:", "if end < start:"), clause='touching is not overlapping'),
    Mutant("intersect", "inclusive box ends", INTERSECT.replace("overlap.append((start, end - start))",
                                                                "overlap.append((start, end - start + 1))"), clause='end offset + length excluded'),
    Mutant("plan_transfer", "always pulls from the first replica", PLAN.replace("group[dst_rank % len(group)]", "group[0]"), clause='spread over both replicas'),
    Mutant("plan_transfer", "pulls from every replica, not one", '''
        for dst_rank, coord in ranks(dst_mesh):
            dst_box = shard_box(shape, dst_mesh, dst_placements, coord)
            pieces = []
            for src_rank, src_box in src_boxes.items():
                overlap = intersect(src_box, dst_box)
                if overlap is not None:
                    pieces.append(Piece(src_rank, local_slices(overlap, src_box), local_slices(overlap, dst_box)))
            plan[dst_rank] = pieces
        return plan
    ''', clause='written more than once'),
    Mutant("plan_transfer", "slices the destination by the source's box", PLAN.replace(
        "local_slices(overlap, src_box), local_slices(overlap, dst_box)",
        "local_slices(overlap, src_box), local_slices(overlap, src_box)"), clause='local coordinates'),
    Mutant("ShardHolder.pull", "copies into a flattened region (a copy, when the region is not contiguous)", '''
        read = 0
        for piece, handle in zip(pieces, handles):
            buffer = await pull_into(handle, torch.empty(handle.numel, dtype=handle.dtype))
            self.local[piece.dst_slices].reshape(-1).copy_(buffer)
            read += handle.nbytes
        return read
    ''', clause='region itself'),
    Mutant("ShardHolder.pull", "reads every piece into one shared buffer, copied after the loop", '''
        read, landed = 0, []
        for piece, handle in zip(pieces, handles):
            buffer = await pull_into(handle, torch.empty(handle.numel, dtype=handle.dtype))
            landed.append((piece, buffer))
            read += handle.nbytes
        for piece, buffer in landed[:1]:
            region = self.local[piece.dst_slices]
            region.copy_(buffer.view(region.shape))
        return read
    ''', clause='its own landing buffer'),
    Mutant("shard_box", "leaves an empty share's start unclamped (a learner's)", '''
        box = [(0, size) for size in shape]
        for m, placement in enumerate(placements):
            if isinstance(placement, Shard):
                offset, length = box[placement.dim]
                size = -(-length // mesh_shape[m])
                start = coord[m] * size
                box[placement.dim] = (offset + start, max(0, min(size, length - start)))
        return tuple(box)
    ''', clause='at the end of the whole dimension'),
    Mutant("intersect", "answers an empty box instead of None", INTERSECT.replace(
        "        if end <= start:\n            return None\n", "").replace("(start, end - start)", "(start, max(0, end - start))"), clause='never a box of length 0'),
    Mutant("plan_transfer", "spreads replicas by the coordinate's first entry, not the flat rank (a learner's)", PLAN.replace(
        "group[dst_rank % len(group)]", "group[coord[0] % len(group)]"), clause='flat (row-major) destination rank'),
    Mutant("plan_transfer", "takes turns over each box's replicas with a counter, not dst_rank % len(replicas): "
           "they differ once a destination skips a box (a learner's)", PLAN.replace(
        "    for dst_rank, coord in ranks(dst_mesh):", "    turn = {box: 0 for box in holders}\n    for dst_rank, coord in ranks(dst_mesh):").replace(
        "src = group[dst_rank % len(group)]", "src = group[turn[src_box] % len(group)]\n                turn[src_box] += 1"), clause='nor a count of the pieces'),
    Mutant("shard_box", "splits by the first mesh dimension's size, whatever the mesh dimension", '''
        box = [(0, size) for size in shape]
        for m, placement in enumerate(placements):
            if isinstance(placement, Shard):
                offset, length = box[placement.dim]
                size = -(-length // mesh_shape[0])
                start = min(coord[m] * size, length)
                share = max(0, min(size, length - start))
                box[placement.dim] = (offset + start, share) if share else (shape[placement.dim], 0)
        return tuple(box)
    ''', clause='mesh_shape[m]'),
    Mutant("ShardHolder.pull", "reads one piece after another (a learner's)", '''
        read = 0
        for piece, handle in zip(pieces, handles):
            buffer = await pull_into(handle, torch.empty(handle.numel, dtype=handle.dtype))
            region = self.local[piece.dst_slices]
            region.copy_(buffer.view(region.shape))
            read += handle.nbytes
        return read
    ''', clause='in parallel'),
    Mutant("ShardHolder.pull", "lands each piece in a buffer of the default dtype", '''
        buffers = await asyncio.gather(*(pull_into(handle, torch.empty(handle.numel)) for handle in handles))
        for piece, buffer in zip(pieces, buffers):
            region = self.local[piece.dst_slices]
            region.copy_(buffer.view(region.shape))
        return sum(handle.nbytes for handle in handles)
    ''', clause='never converts'),
    # From a second independent set (each one caught by a clause test added for it):
    Mutant('ShardHolder.pull', 'answers the bytes of the local shard, not the bytes read', '''
        buffers = await asyncio.gather(*(pull_into(handle, torch.empty(handle.numel, dtype=handle.dtype))
                                         for handle in handles))
        for piece, buffer in zip(pieces, buffers):
            region = self.local[piece.dst_slices]
            region.copy_(buffer.view(region.shape))
        return self.local.numel() * self.local.element_size()
    ''', clause="in its handle's dtype"),
]


# Caught since the sixth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('intersect', "answers None when the overlap list is empty: two boxes of a 0-d tensor (one element each) are taken as disjoint (breaks 'the box both cover', for a scalar: ())", '''
    overlap = []
    for (a_off, a_len), (b_off, b_len) in zip(a, b):
        start, end = max(a_off, b_off), min(a_off + a_len, b_off + b_len)
        if end <= start:
            return None
        overlap.append((start, end - start))
    return tuple(overlap) if overlap else None
''', clause="0-d tensor's boxes"),
    Mutant('ShardHolder.pull', "counts the bytes with the local shard's element size, not the handles': wrong when the pieces arrive in another dtype than self.local's (breaks 'answer the bytes read')", '''
        buffers = await asyncio.gather(*(pull_into(handle, torch.empty(handle.numel, dtype=handle.dtype))
                                         for handle in handles))
        for piece, buffer in zip(pieces, buffers):
            region = self.local[piece.dst_slices]
            region.copy_(buffer.view(region.shape))
        return sum(piece.numel for piece in pieces) * self.local.element_size()
''', clause="in its handle's dtype"),
    Mutant('ShardHolder.pull', "allocates each landing buffer in self.local's dtype, not the handle's: pull_into refuses a piece that arrives in another dtype (breaks 'a piece arrives flat: handle.numel elements of handle.dtype')", '''
        buffers = await asyncio.gather(*(pull_into(handle, torch.empty(handle.numel, dtype=self.local.dtype))
                                         for handle in handles))
        for piece, buffer in zip(pieces, buffers):
            region = self.local[piece.dst_slices]
            region.copy_(buffer.view(region.shape))
        return sum(handle.nbytes for handle in handles)
''', clause='never converts'),
]

# The tenth independent set (input classes) found these; clause tests now hold them.
MUTANTS += [
    Mutant("ShardHolder.pull", "waits with asyncio.wait, which refuses the empty set of a rank with no pieces", '''
        tasks = [asyncio.ensure_future(pull_into(handle, torch.empty(handle.numel, dtype=handle.dtype)))
                 for handle in handles]
        await asyncio.wait(tasks)
        for piece, task in zip(pieces, tasks):
            region = self.local[piece.dst_slices]
            region.copy_(task.result().view(region.shape))
        return sum(handle.nbytes for handle in handles)
''', clause='answers 0 bytes'),
    Mutant("ShardHolder.pull", "gathers with return_exceptions=True and skips a failed read, answering fewer bytes", '''
        results = await asyncio.gather(*(pull_into(handle, torch.empty(handle.numel, dtype=handle.dtype))
                                         for handle in handles), return_exceptions=True)
        read = 0
        for piece, handle, buffer in zip(pieces, handles, results):
            if isinstance(buffer, BaseException):
                continue
            region = self.local[piece.dst_slices]
            region.copy_(buffer.view(region.shape))
            read += handle.nbytes
        return read
''', clause='fails the pull'),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
MUTANTS += [
    Mutant("shard_box", "an empty share placed at the end of what was split, not of the whole dimension", '''
        box = [(0, size) for size in shape]
        for m, placement in enumerate(placements):
            if isinstance(placement, Shard):
                offset, length = box[placement.dim]
                size = -(-length // mesh_shape[m])
                start = min(coord[m] * size, length)
                share = max(0, min(size, length - start))
                box[placement.dim] = (offset + start, share) if share else (offset + length, 0)
        return tuple(box)
    ''', clause="end of the whole dimension"),
]
