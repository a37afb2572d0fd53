"""Chapter 03: RDMA transfer, the "magic pointer".

Messages are the control plane: small, ordered, pickled. Tensors are the data
plane: big. Sending a 1 GB tensor in a message pickles every byte, pushes it
through the actor's mailbox and unpickles it on the far side, and what arrives
is a snapshot that is stale as soon as the owner changes its tensor.

An RDMABuffer is a handle to a block of memory in the process that made it.
The handle pickles to a few hundred bytes, whatever the size of the memory, so
it can travel in any message. Whoever holds it can pull the bytes straight
into a tensor of their own with `read_into`, while the owner goes on working:
no endpoint of the owner runs for the read. Reading again later sees the
owner's memory as it is then: a pointer, not a copy.

    owner process                              reader process
    +------------------+   handle (~0.5 KiB)   +------------------+
    | tensor (64 MiB)  | --------------------> | destination      |
    |  RDMABuffer      |   control plane       |  (preallocated)  |
    +------------------+                       +------------------+
             |              bytes (64 MiB), read_into    ^
             +-------------------------------------------+
                            data plane

Without an RDMA network card Monarch falls back to TCP (a warning says so).
The API and the lesson are the same; only the speed differs.

Your TODOs:
  1. expose                    check the tensor, wrap it in an RDMABuffer
  2. pull_into                 check the destination, read the bytes into it
  3. TensorOwner.send_copy     the contrast: the tensor itself, in a message

Check:     pytest tests/test_ch03_rdma_transfer.py     (or: koans check 3)
Run demo:  python -m solutions.ch03_rdma_transfer
Read:      docs/03_rdma_transfer.md
"""

from __future__ import annotations

import hashlib
import pickle
import time
import warnings
from dataclasses import dataclass

import torch
from koans.demo import run_demo
from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer, RDMATcpFallbackWarning, get_rdma_backend

# Our machines have no RDMA card; saying so once per process is enough.
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


def expose(tensor: torch.Tensor) -> TensorHandle:
    """A handle through which other processes can read `tensor`'s memory.

    The memory must be one flat, contiguous, non-empty block, and it must stay
    alive (keep a reference to `tensor`) for as long as the handle is in use.
    Bad tensors raise ValueError (TypeError for non-tensors) with a fix.
    """
    # >>> TODO(ch03): reject what RDMA cannot point at, then wrap the tensor in an RDMABuffer
    # Check, in this order, each with a message that says what to do instead:
    #   not a torch.Tensor (TypeError), not 1-D, not contiguous, empty (ValueError).
    # Then return TensorHandle(RDMABuffer(tensor), tensor.dtype, tensor.numel()).
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expose() takes a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != 1:
        raise ValueError(
            f"expose() needs a 1-D tensor, got shape {tuple(tensor.shape)}. "
            "Expose tensor.view(-1) instead: it is the same memory, flat, so the handle still sees updates."
        )
    if not tensor.is_contiguous():
        raise ValueError(
            f"expose() needs contiguous memory, but this tensor skips through it with stride {tensor.stride()}. "
            "Expose tensor.contiguous(), a packed copy, and keep that copy alive: "
            "later changes to the original will not show through the handle."
        )
    if tensor.numel() == 0:
        raise ValueError("expose() got an empty tensor: there are no bytes to point at. Expose a tensor with at least one element.")
    return TensorHandle(RDMABuffer(tensor), tensor.dtype, tensor.numel())
    # <<< TODO


async def pull_into(handle: TensorHandle, destination: torch.Tensor, timeout: int = 60) -> torch.Tensor:
    """Copy the remote tensor behind `handle` into `destination`, and return it.

    `destination` is allocated once by the reader and reused for every pull:
    a 1-D contiguous tensor with the handle's dtype and number of elements.
    A wrong one raises ValueError that says what to allocate.
    """
    # >>> TODO(ch03): check the destination against the handle, then await the RDMA read into it
    # Wanted: torch.empty(handle.numel, dtype=handle.dtype). Check dtype, then 1-D and contiguous,
    # then the element count. handle.buffer.read_into(dst, timeout=timeout) returns a Future: await it.
    wanted = f"torch.empty({handle.numel}, dtype={handle.dtype})"
    if destination.dtype != handle.dtype:
        raise ValueError(
            f"destination dtype {destination.dtype} does not match the remote {handle.dtype}: RDMA copies raw bytes "
            f"and never converts. Read into {wanted}, then convert with .to()."
        )
    if destination.dim() != 1 or not destination.is_contiguous():
        raise ValueError(f"destination must be 1-D and contiguous, got shape {tuple(destination.shape)}. Allocate {wanted}.")
    if destination.numel() != handle.numel:
        raise ValueError(
            f"destination holds {destination.numel()} elements but the remote tensor has {handle.numel}. Allocate {wanted}."
        )
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
        self.destination = torch.empty(numel, dtype=dtype)
        self.pulls = 0

    @endpoint
    async def pull(self, handle: TensorHandle) -> str:
        """Read the remote tensor into this reader's buffer; return the fingerprint of what arrived."""
        await pull_into(handle, self.destination)
        self.pulls += 1
        return fingerprint(self.destination)


def main() -> None:
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


if __name__ == "__main__":
    run_demo(main)
