"""Chapter 03: RDMA transfer, the "magic pointer".

Messages are the control plane: small, ordered, pickled. Tensors are the data
plane. An RDMABuffer is a handle to a block of memory in the process that made
it: a few hundred bytes however big the memory, so it travels in any message.
Whoever holds it pulls the bytes into a tensor of their own with `read_into`,
while the owner goes on working. Reading again sees the memory as it is then:
a pointer, not a copy.

    owner process    --- handle (~0.5 KiB), in a message --->    reader process
    tensor (64 MiB)  ====== bytes, read_into, no mailbox =====>  destination

Monarch's rules: a buffer is one flat (1-D), contiguous, non-empty block; a read
needs a 1-D, contiguous destination big enough. RDMA copies raw bytes and never
checks dtypes, so this chapter adds a rule: exactly the handle's dtype and size.

Your TODOs:
  1. expose                    check the tensor, wrap it in an RDMABuffer
  2. pull_into                 check the destination, read the bytes into it
  3. TensorOwner.send_copy     the contrast: the tensor itself, in a message

Given, safe to skip: ch03_plumbing.py (the demo, the benchmark).
Check: koans check 3    Demo: python -m exercises.ch03_rdma_transfer    Read: docs/03_rdma_transfer.md
"""

from __future__ import annotations

import hashlib
import pickle
import warnings
from dataclasses import dataclass

import torch
from koans.learn.demo import run_demo
from monarch.actor import Actor, endpoint
from monarch.rdma import RDMABuffer, RDMATcpFallbackWarning

# Without an RDMA card Monarch falls back to TCP and warns in every process; once is enough.
warnings.simplefilter("ignore", RDMATcpFallbackWarning)


@dataclass(frozen=True)
class TensorHandle:
    """What travels in a message: a pointer to remote memory plus what it holds."""

    buffer: RDMABuffer
    dtype: torch.dtype
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def allocation(self) -> str:
        """How a reader allocates a destination for this handle."""
        return f"torch.empty({self.numel}, dtype={self.dtype})"


# --- What expose() and pull_into() say when they refuse (given) ---------------------------
# Each returns the exact message for one rule. The tests compare messages exactly, so they
# check which rule fired, in which order, not how you phrase it.


def not_a_tensor(value) -> str:
    return f"expose() takes a torch.Tensor, got {type(value).__name__}"


def not_flat(tensor: torch.Tensor) -> str:
    return (f"expose() needs a 1-D tensor, got shape {tuple(tensor.shape)}. Expose tensor.view(-1) instead: "
            "the same memory, flat, so the handle still sees updates.")


def not_contiguous(tensor: torch.Tensor) -> str:
    return (f"expose() needs contiguous memory, but this tensor steps through it with strides {tensor.stride()}. "
            "Expose tensor.contiguous(), a packed copy, and keep it alive: later changes to the original will not show.")


def empty_tensor(tensor: torch.Tensor) -> str:
    return "expose() got an empty tensor: there are no bytes to point at. Expose a tensor with at least one element."


def wrong_dtype(destination: torch.Tensor, handle: TensorHandle) -> str:
    return (f"destination dtype {destination.dtype} is not the remote {handle.dtype}: RDMA copies raw bytes and "
            f"never converts. Read into {handle.allocation}, then convert with .to().")


def wrong_layout(destination: torch.Tensor, handle: TensorHandle) -> str:
    return f"destination must be 1-D and contiguous, got shape {tuple(destination.shape)}. Allocate {handle.allocation}."


def wrong_count(destination: torch.Tensor, handle: TensorHandle) -> str:
    return (f"destination holds {destination.numel()} elements but the remote tensor has {handle.numel}. "
            f"Allocate {handle.allocation}.")


# --- Your part ---------------------------------------------------------------------------


def expose(tensor: torch.Tensor) -> TensorHandle:
    """A handle through which other processes can read `tensor`'s memory (not a copy of it).

    The memory must stay alive (keep a reference to `tensor`) while the handle is in use.
    """
    # >>> TODO(ch03): refuse what RDMA cannot point at, then wrap the tensor itself in an RDMABuffer
    # Refuse, in this order: not a torch.Tensor (TypeError), not 1-D, not contiguous (as torch judges
    # it), empty (ValueError), each with its message from above; nothing else. The handle must point
    # at this tensor's own memory, so that a reader sees the owner's later in-place updates.
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(not_a_tensor(tensor))
    if tensor.dim() != 1:
        raise ValueError(not_flat(tensor))
    if not tensor.is_contiguous():
        raise ValueError(not_contiguous(tensor))
    if tensor.numel() == 0:
        raise ValueError(empty_tensor(tensor))
    return TensorHandle(RDMABuffer(tensor), tensor.dtype, tensor.numel())
    # <<< TODO


async def pull_into(handle: TensorHandle, destination: torch.Tensor, timeout: int = 60) -> torch.Tensor:
    """Copy the remote tensor behind `handle` into `destination`, and return `destination`.

    The reader allocates `destination` once (`handle.allocation` says how) and reuses it
    for every pull. `timeout` is in whole seconds: RDMABuffer.read_into refuses a float.
    """
    # >>> TODO(ch03): check the destination against the handle, then await the RDMA read into it
    # Refuse (ValueError, messages from above), in this order: another dtype (even one of the same
    # item size); not 1-D or not contiguous (as torch judges it); another element count. Then read
    # the remote bytes into `destination` itself, with `timeout` as the read's own limit (its
    # TimeoutError reaches the caller), and return it.
    if destination.dtype != handle.dtype:
        raise ValueError(wrong_dtype(destination, handle))
    if destination.dim() != 1 or not destination.is_contiguous():
        raise ValueError(wrong_layout(destination, handle))
    if destination.numel() != handle.numel:
        raise ValueError(wrong_count(destination, handle))
    await handle.buffer.read_into(destination, timeout=timeout)
    return destination
    # <<< TODO


def fingerprint(tensor: torch.Tensor) -> str:
    """A short hash of the tensor's bytes: compare two tensors without moving them."""
    raw = tensor.detach().contiguous().view(-1).view(torch.uint8)
    return hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:16]


def message_bytes(value: object) -> int:
    """How many bytes `value` takes in a message (Monarch pickles what it sends)."""
    return len(pickle.dumps(value))


class TensorOwner(Actor):
    """Owns a tensor in its process and lends it out: by handle or by copy."""

    def __init__(self, numel: int, dtype: torch.dtype = torch.float32, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.tensor = torch.randn(numel, generator=generator).to(dtype)
        self.handle_to_tensor: TensorHandle | None = None

    @endpoint
    def handle(self) -> TensorHandle:
        """A handle to this actor's tensor (made once; every caller gets the same one)."""
        if self.handle_to_tensor is None:
            self.handle_to_tensor = expose(self.tensor)
        return self.handle_to_tensor

    @endpoint
    def send_copy(self) -> torch.Tensor:
        """The tensor itself, as a message reply: every byte goes through the mailbox."""
        # >>> TODO(ch03): return the tensor itself; Monarch pickles it into the reply
        return self.tensor
        # <<< TODO

    @endpoint
    def add_(self, amount: float) -> str:
        """Change the tensor in place (same memory, new values); return its new fingerprint."""
        self.tensor.add_(amount)
        return fingerprint(self.tensor)

    @endpoint
    def fingerprint(self) -> str:
        return fingerprint(self.tensor)


class Reader(Actor):
    """Lives in another process and pulls remote tensors into one preallocated buffer."""

    def __init__(self, numel: int, dtype: torch.dtype = torch.float32):
        # NaN (or 128 for integers, a value no test's sender holds): a read that moved nothing cannot pass for one
        self.destination = torch.full((numel,), float("nan") if dtype.is_floating_point else 128, dtype=dtype)
        self.pulls = 0

    @endpoint
    async def pull(self, handle: TensorHandle) -> str:
        """Read the remote tensor into this reader's buffer; return the fingerprint of what arrived."""
        await pull_into(handle, self.destination)
        self.pulls += 1
        return fingerprint(self.destination)


if __name__ == "__main__":
    from .ch03_plumbing import main  # the demo: given code, safe to skip

    run_demo(main)
