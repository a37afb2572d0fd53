"""Chapter 07, given code: how a snapshot's bytes are laid out and how they travel.

Read this after the chapter file. Nothing here is a TODO.

Layout. A state dict is packed into one flat byte buffer (a "slot"); each
distinct tensor gets an aligned byte range. Tied weights share one range.

    slot: |embed.weight ........|pad|layers.0.q.weight ...|q.bias|pad| ... |
          ^ offset 0                ^ offset 64*k

Transports. Each slot is offered to readers in the ways that can reach it:
  shm       the slot *is* a file in /dev/shm; a reader on the same host maps
            the same pages and copies straight into its weights (one memcpy)
  cuda_ipc  the slot is GPU memory; a reader on the same GPU opens it through
            a CUDA IPC handle and copies device to device
  rdma      chapter 03's handles, one per chunk; works from any host, and
            without an RDMA card it falls back to TCP
`pick_transport` takes the fastest one that works from the reader's place.
"""

from __future__ import annotations

import os
import socket
import tempfile
import uuid
import warnings
from dataclasses import dataclass
from typing import Mapping

import torch

from .ch03_rdma_transfer import TensorHandle, expose

ALIGN = 64  # bytes; every tensor starts on a 64-byte boundary inside a slot
TRANSPORTS = ("cuda_ipc", "shm", "rdma")


# --- Layout: where each tensor lives inside one flat staging buffer -------------------


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the slot

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * _numel(self.shape)


@dataclass(frozen=True)
class Layout:
    """The byte map of a state dict packed into one flat buffer.

    Tied weights (two names, one tensor, like Qwen's embedding and lm_head)
    get one entry; `aliases` maps the other names to it, so they are sent once.
    """

    entries: tuple[Entry, ...]
    aliases: tuple[tuple[str, str], ...]  # (tied name, name of the entry holding its bytes)
    total_bytes: int

    def entry(self, name: str) -> Entry:
        name = dict(self.aliases).get(name, name)
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries] + [alias for alias, _ in self.aliases]


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def plan_layout(state_dict: Mapping[str, torch.Tensor]) -> Layout:
    """Give every distinct tensor of `state_dict` an aligned place in one flat buffer."""
    if not state_dict:
        raise ValueError("plan_layout() got an empty state dict: there is nothing to publish.")
    entries, aliases, owner_of, offset = [], [], {}, 0
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"state dict entry {name!r} is a {type(tensor).__name__}, not a tensor")
        same_memory = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(), tensor.dtype)
        if tensor.numel() > 0 and same_memory in owner_of:
            aliases.append((name, owner_of[same_memory]))
            continue
        owner_of[same_memory] = name
        entry = Entry(name, tensor.dtype, tuple(tensor.shape), offset)
        entries.append(entry)
        offset = -(-(offset + entry.nbytes) // ALIGN) * ALIGN
    return Layout(tuple(entries), tuple(aliases), max(offset, ALIGN))


def entry_view(flat: torch.Tensor, entry: Entry) -> torch.Tensor:
    """The tensor `entry` describes, as a view into the flat byte buffer (no copy)."""
    return flat[entry.offset : entry.offset + entry.nbytes].view(entry.dtype).view(entry.shape)


# --- Transports: the ways a reader can reach a slot's bytes ---------------------------


@dataclass(frozen=True)
class ShmOffer:
    """A slot in a shared-memory file: readers on the same host map the same pages."""

    host: str
    path: str
    nbytes: int


@dataclass(frozen=True)
class CudaIpcOffer:
    """A slot in GPU memory: readers on the same GPU open it through a CUDA IPC handle."""

    host: str
    device_uuid: str
    ipc: tuple  # torch.multiprocessing.reductions.reduce_tensor(slot)


@dataclass(frozen=True)
class RdmaOffer:
    """A slot as chapter 03 handles, one per chunk: works from any host."""

    chunks: tuple[tuple[int, TensorHandle], ...]  # (byte offset in the slot, handle)


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def remove_orphaned_shm_files() -> None:
    """Delete slot files whose creating process is gone (it was killed before cleaning up)."""
    prefix = os.path.join(_shm_dir(), "koans-weights-")
    for name in os.listdir(_shm_dir()):
        path = os.path.join(_shm_dir(), name)
        if path.startswith(prefix):
            pid = int(name.split("-")[2])
            if not os.path.exists(f"/proc/{pid}"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass


def _device_uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


class StagingSlot:
    """One buffer the trainer stages a version into, plus the offers that reach it."""

    def __init__(self, nbytes: int, where: str, pin: bool, rdma_chunk_bytes: int):
        self.path: str | None = None
        self.pinned = False
        offers: dict[str, object] = {}
        if where == "cuda":
            self.flat = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            from torch.multiprocessing.reductions import reduce_tensor

            _, ipc_args = reduce_tensor(self.flat)
            offers["cuda_ipc"] = CudaIpcOffer(socket.gethostname(), _device_uuid(self.flat.device), ipc_args)
        else:
            self.path = os.path.join(_shm_dir(), f"koans-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            self.flat = torch.from_file(self.path, shared=True, size=nbytes, dtype=torch.uint8)
            # Touch every page now: the OS then allocates the shared memory here, once, instead of
            # during the first publish, and a /dev/shm too small for it fails now, not mid-training.
            self.flat.zero_()
            if pin:
                self.pinned = _pin_in_place(self.flat)
            offers["shm"] = ShmOffer(socket.gethostname(), self.path, nbytes)
        chunks = range(0, nbytes, rdma_chunk_bytes)
        offers["rdma"] = RdmaOffer(tuple((start, expose(self.flat[start : start + rdma_chunk_bytes])) for start in chunks))
        self.offers = offers

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.flat.data_ptr())
            self.pinned = False
        if self.path is not None and os.path.exists(self.path):
            os.unlink(self.path)


def _pin_in_place(flat: torch.Tensor) -> bool:
    """Page-lock shared memory so the GPU can copy into it at full speed (cudaHostRegister)."""
    try:
        error = int(torch.cuda.cudart().cudaHostRegister(flat.data_ptr(), flat.numel(), 0))
    except Exception as err:  # no CUDA runtime binding in this torch build
        error = str(err)
    if error != 0:
        warnings.warn(f"could not pin the staging slot (cudaHostRegister: {error}); GPU-to-CPU staging will be slower",
                      stacklevel=2)
        return False
    return True


def pick_transport(offers: dict, wanted: str, device: torch.device) -> str:
    """The fastest transport offered that works from here; `wanted` forces one."""
    if wanted != "auto":
        if wanted not in TRANSPORTS:
            raise ValueError(f"transport must be 'auto' or one of {TRANSPORTS}, not {wanted!r}")
        if wanted not in offers:
            raise ValueError(f"transport {wanted!r} is not offered for this snapshot (offered: {sorted(offers)}); "
                             "cuda_ipc needs staging='cuda', shm needs staging on the CPU")
        return wanted
    here = socket.gethostname()
    ipc = offers.get("cuda_ipc")
    if ipc and ipc.host == here and device.type == "cuda" and _device_uuid(device) == ipc.device_uuid:
        return "cuda_ipc"
    shm = offers.get("shm")
    if shm and shm.host == here and os.path.exists(shm.path):
        return "shm"
    return "rdma"


class _MappedSource:
    """Bytes the reader can see in place: a shared-memory file, or a GPU slot via CUDA IPC."""

    def __init__(self, flat: torch.Tensor):
        self.flat = flat

    def view(self, entry: Entry) -> torch.Tensor:
        return entry_view(self.flat, entry)


class _RdmaSource:
    """Bytes pulled chunk by chunk into local memory, each chunk just before it is needed."""

    def __init__(self, offer: RdmaOffer, landing: torch.Tensor, timeout: float):
        self.offer, self.flat, self.timeout = offer, landing, timeout
        self.fetched: set[int] = set()

    def view(self, entry: Entry) -> torch.Tensor:
        for index, (start, handle) in enumerate(self.offer.chunks):
            overlaps = start < entry.offset + entry.nbytes and entry.offset < start + handle.nbytes
            if overlaps and index not in self.fetched:
                handle.buffer.read_into(self.flat[start : start + handle.nbytes], timeout=int(self.timeout)).get(timeout=self.timeout)
                self.fetched.add(index)
        return entry_view(self.flat, entry)


class SourceCache:
    """Opens offers for one reader, and keeps what is expensive to open (mappings, landing memory)."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.mapped: dict[str, torch.Tensor] = {}  # shm path or IPC handle -> the slot, mapped here
        self.landing: torch.Tensor | None = None  # local memory that RDMA reads land in

    def open(self, offer, total_bytes: int):
        if isinstance(offer, RdmaOffer):
            if self.landing is None or self.landing.numel() != total_bytes:
                self.landing = torch.zeros(total_bytes, dtype=torch.uint8)  # zeros: pages touched once, here
            return _RdmaSource(offer, self.landing, self.timeout)
        if isinstance(offer, ShmOffer):
            key = offer.path
            if key not in self.mapped:
                self.mapped[key] = torch.from_file(offer.path, shared=True, size=offer.nbytes, dtype=torch.uint8)
        else:
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            key = repr((offer.device_uuid, offer.ipc[7], offer.ipc[9]))  # IPC handle and offset name the slot
            if key not in self.mapped:
                self.mapped[key] = rebuild_cuda_tensor(*offer.ipc)
        return _MappedSource(self.mapped[key])
