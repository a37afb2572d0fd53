"""Chapter 03: plausible wrong answers (see mutants/README.md).

Deleted as harmless: `send_copy` returning `self.tensor.clone()`; the reply
is pickled either way, so the caller gets the same bytes.
"""

from koans.maintain.mutants import Mutant

MUTANTS = [
    Mutant("expose", "checks contiguity before the 1-D rule", '''
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(not_a_tensor(tensor))
        if not tensor.is_contiguous():
            raise ValueError(not_contiguous(tensor))
        if tensor.dim() != 1:
            raise ValueError(not_flat(tensor))
        if tensor.numel() == 0:
            raise ValueError(empty_tensor(tensor))
        return TensorHandle(RDMABuffer(tensor), tensor.dtype, tensor.numel())
    ''', clause="in the TODO's order"),
    Mutant("expose", "exposes a packed copy, so later updates never show", '''
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(not_a_tensor(tensor))
        if tensor.dim() != 1:
            raise ValueError(not_flat(tensor))
        if not tensor.is_contiguous():
            raise ValueError(not_contiguous(tensor))
        if tensor.numel() == 0:
            raise ValueError(empty_tensor(tensor))
        packed = tensor.clone()
        return TensorHandle(RDMABuffer(packed), packed.dtype, packed.numel())
    ''', clause='not a copy'),
    Mutant("expose", "refuses a non-tensor with ValueError", '''
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(not_a_tensor(tensor))
        if tensor.dim() != 1:
            raise ValueError(not_flat(tensor))
        if not tensor.is_contiguous():
            raise ValueError(not_contiguous(tensor))
        if tensor.numel() == 0:
            raise ValueError(empty_tensor(tensor))
        return TensorHandle(RDMABuffer(tensor), tensor.dtype, tensor.numel())
    ''', clause='raises TypeError'),
    Mutant("pull_into", "checks the element count before the layout", '''
        if destination.dtype != handle.dtype:
            raise ValueError(wrong_dtype(destination, handle))
        if destination.numel() != handle.numel:
            raise ValueError(wrong_count(destination, handle))
        if destination.dim() != 1 or not destination.is_contiguous():
            raise ValueError(wrong_layout(destination, handle))
        await handle.buffer.read_into(destination, timeout=timeout)
        return destination
    ''', clause="in the TODO's order"),
    Mutant("pull_into", "accepts a destination that is too big", '''
        if destination.dtype != handle.dtype:
            raise ValueError(wrong_dtype(destination, handle))
        if destination.dim() != 1 or not destination.is_contiguous():
            raise ValueError(wrong_layout(destination, handle))
        if destination.numel() < handle.numel:
            raise ValueError(wrong_count(destination, handle))
        await handle.buffer.read_into(destination, timeout=timeout)
        return destination
    ''', clause='wrong_count'),
    Mutant("pull_into", "starts the read and does not wait for it", '''
        if destination.dtype != handle.dtype:
            raise ValueError(wrong_dtype(destination, handle))
        if destination.dim() != 1 or not destination.is_contiguous():
            raise ValueError(wrong_layout(destination, handle))
        if destination.numel() != handle.numel:
            raise ValueError(wrong_count(destination, handle))
        handle.buffer.read_into(destination, timeout=timeout)
        return destination
    ''', clause='awaited'),
    Mutant("TensorOwner.send_copy", "sends the handle instead of the tensor", '''
        return expose(self.tensor)
    ''', clause='torch.Tensor itself'),
    Mutant("TensorOwner.send_copy", "sends the tensor's fingerprint", '''
        return fingerprint(self.tensor)
    ''', clause='torch.Tensor itself'),
    Mutant("expose", "tests `dim() > 1`, so a 0-D tensor gets past the 1-D rule (a learner's)", '''
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(not_a_tensor(tensor))
        if tensor.dim() > 1:
            raise ValueError(not_flat(tensor))
        if not tensor.is_contiguous():
            raise ValueError(not_contiguous(tensor))
        if tensor.numel() == 0:
            raise ValueError(empty_tensor(tensor))
        return TensorHandle(RDMABuffer(tensor), tensor.dtype, tensor.numel())
    ''', clause='not_flat'),
    Mutant("pull_into", "reads without the caller's timeout, so Monarch's default applies (a learner's)", '''
        if destination.dtype != handle.dtype:
            raise ValueError(wrong_dtype(destination, handle))
        if destination.dim() != 1 or not destination.is_contiguous():
            raise ValueError(wrong_layout(destination, handle))
        if destination.numel() != handle.numel:
            raise ValueError(wrong_count(destination, handle))
        await handle.buffer.read_into(destination)
        return destination
    ''', clause="caller's timeout"),
    Mutant("pull_into", "checks the layout before the dtype (a learner's)", '''
        if destination.dim() != 1 or not destination.is_contiguous():
            raise ValueError(wrong_layout(destination, handle))
        if destination.dtype != handle.dtype:
            raise ValueError(wrong_dtype(destination, handle))
        if destination.numel() != handle.numel:
            raise ValueError(wrong_count(destination, handle))
        await handle.buffer.read_into(destination, timeout=timeout)
        return destination
    ''', clause="in the TODO's order"),
    Mutant("TensorOwner.send_copy", "sends the numbers as a Python list", '''
        return self.tensor.tolist()
    ''', clause='torch.Tensor itself'),
    Mutant("pull_into", "checks the dtype by its item size, so int32 passes for float32 (a learner's)", '''
        if destination.dtype.itemsize != handle.dtype.itemsize:
            raise ValueError(wrong_dtype(destination, handle))
        if destination.dim() != 1 or not destination.is_contiguous():
            raise ValueError(wrong_layout(destination, handle))
        if destination.numel() != handle.numel:
            raise ValueError(wrong_count(destination, handle))
        await handle.buffer.read_into(destination, timeout=timeout)
        return destination
    ''', clause='wrong_dtype'),
    Mutant("pull_into", "bounds the read with asyncio.wait_for, leaving read_into its default (a learner's)", '''
        import asyncio

        if destination.dtype != handle.dtype:
            raise ValueError(wrong_dtype(destination, handle))
        if destination.dim() != 1 or not destination.is_contiguous():
            raise ValueError(wrong_layout(destination, handle))
        if destination.numel() != handle.numel:
            raise ValueError(wrong_count(destination, handle))
        await asyncio.wait_for(handle.buffer.read_into(destination), timeout)
        return destination
    ''', clause='not a wait_for'),
    Mutant("pull_into", "treats a timed-out read as done and returns the destination", '''
        if destination.dtype != handle.dtype:
            raise ValueError(wrong_dtype(destination, handle))
        if destination.dim() != 1 or not destination.is_contiguous():
            raise ValueError(wrong_layout(destination, handle))
        if destination.numel() != handle.numel:
            raise ValueError(wrong_count(destination, handle))
        try:
            await handle.buffer.read_into(destination, timeout=timeout)
        except TimeoutError:
            pass
        return destination
    ''', clause='TimeoutError reach the caller'),
    Mutant("TensorOwner.send_copy", "sends it as float32, whatever the owner's dtype", '''
        return self.tensor.to(torch.float32)
    ''', clause='no conversion'),
    # From a second independent set (each one caught by a clause test added for it):
    Mutant('pull_into', 'writes the destination into the remote memory (write_from) instead of reading it', '''
        if destination.dtype != handle.dtype:
            raise ValueError(wrong_dtype(destination, handle))
        if destination.dim() != 1 or not destination.is_contiguous():
            raise ValueError(wrong_layout(destination, handle))
        if destination.numel() != handle.numel:
            raise ValueError(wrong_count(destination, handle))
        await handle.buffer.write_from(destination, timeout=timeout)
        return destination
    ''', clause='never writes'),
]


# Caught since the fifth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('expose', 'tests contiguity as stride == (1,): a one-element tensor with another stride is refused (breaks: refuse only what is not contiguous)', '''
if not isinstance(tensor, torch.Tensor):
    raise TypeError(not_a_tensor(tensor))
if tensor.dim() != 1:
    raise ValueError(not_flat(tensor))
if tensor.stride() != (1,):
    raise ValueError(not_contiguous(tensor))
if tensor.numel() == 0:
    raise ValueError(empty_tensor(tensor))
return TensorHandle(RDMABuffer(tensor), tensor.dtype, tensor.numel())
''', clause='is_contiguous()'),
]


# Caught since the sixth independent set (written without reading the tests) found them alive.
MUTANTS += [
    Mutant('expose', "exact type check rejects Tensor subclasses such as nn.Parameter: breaks 'not a torch.Tensor (TypeError) ... nothing else'", '''
if type(tensor) is not torch.Tensor:
    raise TypeError(not_a_tensor(tensor))
if tensor.dim() != 1:
    raise ValueError(not_flat(tensor))
if not tensor.is_contiguous():
    raise ValueError(not_contiguous(tensor))
if tensor.numel() == 0:
    raise ValueError(empty_tensor(tensor))
return TensorHandle(RDMABuffer(tensor), tensor.dtype, tensor.numel())
''', clause='subclass'),
    Mutant('TensorOwner.send_copy', "caches the first copy and sends it again: a later in-place update does not show; breaks 'return the tensor itself'", '''
if getattr(self, "sent_copy", None) is None:
    self.sent_copy = self.tensor.clone()
return self.sent_copy
''', clause='never a copy kept'),
]

# The tenth independent set (input classes) found these; clause tests now hold them.
MUTANTS += [
    Mutant("pull_into", "tests `dim() > 1` for the layout, so a 0-D destination gets past the 1-D rule", '''
    if destination.dtype != handle.dtype:
        raise ValueError(wrong_dtype(destination, handle))
    if destination.dim() > 1 or not destination.is_contiguous():
        raise ValueError(wrong_layout(destination, handle))
    if destination.numel() != handle.numel:
        raise ValueError(wrong_count(destination, handle))
    await handle.buffer.read_into(destination, timeout=timeout)
    return destination
    ''', clause='wrong_layout'),
    Mutant("pull_into", "judges contiguity by stride(0) == 1, refusing a one-element view torch calls contiguous", '''
    if destination.dtype != handle.dtype:
        raise ValueError(wrong_dtype(destination, handle))
    if destination.dim() != 1 or destination.stride(0) != 1:
        raise ValueError(wrong_layout(destination, handle))
    if destination.numel() != handle.numel:
        raise ValueError(wrong_count(destination, handle))
    await handle.buffer.read_into(destination, timeout=timeout)
    return destination
    ''', clause='is_contiguous'),
    # From a mechanical set (one operator at one site of the solution; caught by a case added for it):
    Mutant("expose", "checks emptiness before contiguity (only an empty sparse tensor tells them apart)", '''
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(not_a_tensor(tensor))
        if tensor.dim() != 1:
            raise ValueError(not_flat(tensor))
        if tensor.numel() == 0:
            raise ValueError(empty_tensor(tensor))
        if not tensor.is_contiguous():
            raise ValueError(not_contiguous(tensor))
        return TensorHandle(RDMABuffer(tensor), tensor.dtype, tensor.numel())
    ''', clause="in the TODO's order"),
]


# From a study of new users on the student edition (issue 51's list): mistakes whose message once named
# another clause, or none. Each now gets a sentence that names its own.
MUTANTS += [
    Mutant("expose", "numel in bytes", '''
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(not_a_tensor(tensor))
        if tensor.dim() != 1:
            raise ValueError(not_flat(tensor))
        if not tensor.is_contiguous():
            raise ValueError(not_contiguous(tensor))
        if tensor.numel() == 0:
            raise ValueError(empty_tensor(tensor))
        return TensorHandle(RDMABuffer(tensor), tensor.dtype, tensor.numel() * tensor.element_size())
    ''', clause="elements | element count | numel"),
]
