"""Chapter 07 plumbing: how a snapshot's bytes are laid out, staged and moved.
You may skip this file; nothing in it is a TODO. docs/07_weight_sync.md tells the story.

Layout. A state dict is packed into one flat byte buffer (a "slot"); each
distinct tensor gets an aligned byte range. Tied weights share one range.

    slot: |embed.weight ........|pad|layers.0.q.weight ...|q.bias|pad| ... |
          ^ offset 0                ^ offset 64*k

Staging. `StagingArea` owns the slots and copies a state dict into one in
the background (a thread on CPU, a side CUDA stream on GPU), then commits
the version to the store.

Transports. Each slot is offered to readers in the ways that can reach it:
  shm       the slot *is* a file in /dev/shm; a reader on the same host maps
            the same pages and copies straight into its weights (one memcpy)
  cuda_ipc  the slot is GPU memory; a reader on the same GPU opens it through
            a CUDA IPC handle and copies device to device
  rdma      chapter 03's handles, one per chunk; works from any host, and
            without an RDMA card it falls back to TCP
`pick_transport` takes the fastest one that works from the reader's place.
"Same host" means the same `host_identity()`: the machine's name, or, for a
process a job placed on one of its hosts, that host's name too (ch10_multihost).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import tempfile
import time
import uuid
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping

import torch

from .ch03_rdma_transfer import TensorHandle, expose

ALIGN = 64  # bytes; every tensor starts on a 64-byte boundary inside a slot
TRANSPORTS = ("cuda_ipc", "shm", "rdma")
#: RDMA reads a reader keeps in flight at once, one chunk (the publisher's rdma_chunk_bytes) each.
#: Several hide each read's fixed costs behind the others' bytes; a bound keeps a reader of a big
#: model from opening every chunk's read at once (docs/07_weight_sync.md, "Pulling in parallel").
READS_IN_FLIGHT = 4
STAGINGS = ("auto", "cpu", "cuda")


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


def slot_views(layout: Layout, slot: torch.Tensor) -> list[torch.Tensor]:
    """Every entry's view into the flat `slot`, in layout order: made once per slot, not per publish."""
    return [entry_view(slot, entry) for entry in layout.entries]


def stage(state_dict: Mapping[str, torch.Tensor], layout: Layout, targets: list[torch.Tensor]) -> None:
    """Copy every distinct tensor of `state_dict` to its place in a flat slot (`targets`: its `slot_views`).

    On CUDA this runs on a side stream: with non_blocking=True, copies into
    pinned memory return at once and the GPU does them in the background. One
    `_foreach_copy_` (the batched copy FSDP2 uses) launches a few kernels
    instead of one per tensor: on one H100, 290 separate copies of a 1 GB
    model blocked the trainer for 8.8 ms a sync, the batched copy for 2.9.
    """
    torch._foreach_copy_(targets, [state_dict[entry.name].detach() for entry in layout.entries], non_blocking=True)


def state_fingerprint(state_dict: Mapping[str, torch.Tensor]) -> str:
    """One short hash over every name and every byte: equal fingerprints, bit-equal weights."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().to("cpu").contiguous().view(-1)
        digest.update(f"{name}:{tensor.dtype}:{tuple(state_dict[name].shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


# --- Where to stage ----------------------------------------------------------------------


def choose_staging(staging: str, weights_on_cuda: bool, visible_gpus: int | None = None) -> str:
    """"cpu" or "cuda": where the staging slots live.

    "auto" answers "cuda" when the weights are on a GPU and this process sees
    exactly one GPU; otherwise "cpu". A GPU slot is offered by CUDA IPC (to
    readers on that same GPU) and by RDMA; a host slot by shared memory (to
    readers on this host) and by RDMA. So with the recipe "one GPU per process"
    (each process's CUDA_VISIBLE_DEVICES names its own GPU) every process sees
    exactly one GPU: "auto" stages on the trainer's GPU, and a generator on
    another GPU of the same host reads by RDMA (TCP without an RDMA card), not
    by shared memory. For that layout pass staging="cpu": shared memory then
    reaches every process of the host. "auto" is right when trainer and
    generators share one GPU, or when every process sees every GPU (then it
    picks "cpu").
    """
    if staging not in STAGINGS:
        raise ValueError(f"staging must be one of {STAGINGS}, not {staging!r}")
    if staging == "cuda" and not weights_on_cuda:
        raise ValueError("staging='cuda' stages GPU weights into GPU memory, but these weights are on the CPU")
    if staging != "auto":
        return staging
    if visible_gpus is None:
        visible_gpus = torch.cuda.device_count() if weights_on_cuda else 0
    return "cuda" if weights_on_cuda and visible_gpus == 1 else "cpu"


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


# --- Which host a process is on -------------------------------------------------------------

HOST_ENV = "KOANS_HOST"  # set by ch10_multihost on the processes it places on a job's hosts


def host_identity() -> str:
    """The host this process runs on, as the transports compare it.

    The machine's name, as on one host. A process that ch10_multihost placed on
    one of a job's hosts also carries that host's name in $KOANS_HOST:
    monarch.job.ProcessJob simulates every host on this one machine, so the
    machine's name alone would call them all one host, and a reader on another
    simulated host would pick shared memory. Two processes are on one host only
    when both names agree, so a mix of placed and unplaced processes never
    shares memory by mistake.
    """
    machine = socket.gethostname()
    job_host = os.environ.get(HOST_ENV)
    return f"{machine}/{job_host}" if job_host else machine


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
            offers["cuda_ipc"] = CudaIpcOffer(host_identity(), _device_uuid(self.flat.device), ipc_args)
        else:
            self.path = os.path.join(_shm_dir(), f"koans-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            self.flat = torch.from_file(self.path, shared=True, size=nbytes, dtype=torch.uint8)
            # Touch every page now: the OS then allocates the shared memory here, once, instead of
            # during the first publish, and a /dev/shm too small for it fails now, not mid-training.
            self.flat.zero_()
            if pin:
                self.pinned = _pin_in_place(self.flat)
            offers["shm"] = ShmOffer(host_identity(), self.path, nbytes)
        chunks = range(0, nbytes, rdma_chunk_bytes)
        offers["rdma"] = RdmaOffer(tuple((start, expose(self.flat[start : start + rdma_chunk_bytes])) for start in chunks))
        self.offers = offers

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.flat.data_ptr())
            self.pinned = False
        if self.path is not None and os.path.exists(self.path):
            os.unlink(self.path)


def _pin_in_place(flat: torch.Tensor, what: str = "the staging slot") -> bool:
    """Page-lock shared memory so the GPU copies to and from it at full speed (cudaHostRegister)."""
    try:
        error = int(torch.cuda.cudart().cudaHostRegister(flat.data_ptr(), flat.numel(), 0))
    except Exception as err:  # no CUDA runtime binding in this torch build
        error = str(err)
    if error != 0:
        _clear_cuda_error()
        warnings.warn(f"could not pin {what} (cudaHostRegister: {error}); copies between it and the GPU will be slower",
                      stacklevel=2)
        return False
    return True


def _clear_cuda_error() -> None:
    """A failed CUDA call leaves CUDA's last error set; torch's next check would report it as its own failure."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            libraries = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:  # not Linux: nothing found to clear
        return
    for library in libraries:  # the runtime torch loaded: cudaGetLastError reads and resets the error
        ctypes.CDLL(library).cudaGetLastError()


class StagingArea:
    """The trainer's slots, and the background copy of a state dict into one of them.

    `start(state_dict, slot, version)` returns at once. The copy runs in the
    background (a thread on CPU; a side CUDA stream on GPU); when it is done,
    the version is committed to the store. `wait_copied()` returns when the
    weights may change again (the copy no longer reads them).
    """

    def __init__(self, state_dict: Mapping[str, torch.Tensor], store, num_slots: int, staging: str,
                 rdma_chunk_bytes: int, timeout: float):
        self.layout = plan_layout(state_dict)
        self.store, self.timeout = store, timeout
        on_cuda = any(t.is_cuda for t in state_dict.values())
        self.where = choose_staging(staging, on_cuda)
        remove_orphaned_shm_files()
        self.slots = [StagingSlot(self.layout.total_bytes, self.where, on_cuda, rdma_chunk_bytes) for _ in range(num_slots)]
        self.targets = [slot_views(self.layout, slot.flat) for slot in self.slots]
        self.copy_stream = torch.cuda.Stream() if on_cuda else None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-staging")
        self._in_flight: Future | None = None
        self._copied_event = None
        self.staging_s: list[float] = []  # per staged version, in the background

    @property
    def offers(self) -> list[dict]:
        return [slot.offers for slot in self.slots]

    def check_matches(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """A state dict unlike the first one would be staged wrong: say so now, not in a background thread."""
        same = set(state_dict) == set(self.layout.names) and all(
            tuple(state_dict[e.name].shape) == e.shape and state_dict[e.name].dtype == e.dtype for e in self.layout.entries
        )
        if not same:
            raise ValueError("publish() got a state dict whose names, shapes or dtypes differ from the one this "
                             "WeightPublisher was made for; make a new WeightPublisher for a new model")

    def start(self, state_dict: Mapping[str, torch.Tensor], slot: int, version: int) -> None:
        """Copy `state_dict` into `slot` in the background; commit `version` when the copy is done."""
        if self.copy_stream is not None:
            self.copy_stream.wait_stream(torch.cuda.current_stream())  # after the step that made these weights
            began = time.perf_counter()
            with torch.cuda.stream(self.copy_stream):
                stage(state_dict, self.layout, self.targets[slot])
                self._copied_event = torch.cuda.Event()
                self._copied_event.record()
            self._in_flight = self._worker.submit(self._commit_when_copied, slot, version, began, self._copied_event)
        else:
            self._in_flight = self._worker.submit(self._stage_then_commit, dict(state_dict), slot, version)

    def _stage_then_commit(self, state_dict, slot: int, version: int) -> None:
        began = time.perf_counter()
        try:
            stage(state_dict, self.layout, self.targets[slot])
        except BaseException:
            self.store.abort.call_one(slot).get(timeout=self.timeout)
            raise
        self.staging_s.append(time.perf_counter() - began)
        self.store.commit.call_one(slot, version, time.time()).get(timeout=self.timeout)

    def _commit_when_copied(self, slot: int, version: int, began: float, copied) -> None:
        copied.synchronize()
        self.staging_s.append(time.perf_counter() - began)
        self.store.commit.call_one(slot, version, time.time()).get(timeout=self.timeout)

    async def finish(self) -> None:
        """Wait for the last staging and its commit (normally long done); re-raise its error."""
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            await asyncio.wait_for(asyncio.wrap_future(in_flight), self.timeout)

    async def wait_copied(self) -> None:
        """Return when the weights may change: the last copy no longer reads them."""
        if self.copy_stream is not None and self._copied_event is not None:
            # The GPU waits, not the CPU: later kernels on the trainer's stream start after the copies.
            torch.cuda.current_stream().wait_event(self._copied_event)
        else:
            await self.finish()

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        for slot in self.slots:
            slot.close()


def pick_transport(offers: dict, wanted: str, device: torch.device) -> str:
    """The fastest transport offered that works from here; `wanted` forces one."""
    if wanted != "auto":
        if wanted not in TRANSPORTS:
            raise ValueError(f"transport must be 'auto' or one of {TRANSPORTS}, not {wanted!r}")
        if wanted not in offers:
            raise ValueError(f"transport {wanted!r} is not offered for this snapshot (offered: {sorted(offers)}); "
                             "cuda_ipc needs staging on the GPU, shm needs staging on the CPU")
        return wanted
    here = host_identity()  # a reader on another host never tries shared memory or CUDA IPC
    ipc = offers.get("cuda_ipc")
    if ipc and ipc.host == here and device.type == "cuda" and _device_uuid(device) == ipc.device_uuid:
        return "cuda_ipc"
    shm = offers.get("shm")
    if shm and shm.host == here and os.path.exists(shm.path):
        return "shm"
    return "rdma"


# --- Reading a snapshot ---------------------------------------------------------------------


class _MappedSource:
    """Bytes the reader sees in place: a shared-memory file, or a GPU slot through CUDA IPC."""

    def __init__(self, flat: torch.Tensor, pinned: dict[int, bool] | None = None):
        self.flat = flat
        self._pinned = {} if pinned is None else pinned  # shared by a reader's sources: pin each mapping once

    def prepare_copy_to_gpu(self) -> bool:
        """Page-lock a shared-memory mapping, once (the GPU copies from pageable memory several times slower).

        Answers whether the copies may run asynchronously: only from page-locked memory, or on the GPU."""
        key = self.flat.data_ptr()
        if not self.flat.is_cuda and key not in self._pinned:
            self._pinned[key] = _pin_in_place(self.flat, "the generator's view of the shared-memory slot")
        return self.flat.is_cuda or self._pinned[key]

    async def fetch(self, entries: list[Entry]) -> None:
        pass  # nothing to move: the bytes are already visible here

    def view(self, entry: Entry) -> torch.Tensor:
        return entry_view(self.flat, entry)


class _RdmaSource:
    """Bytes pulled into local memory by RDMA, the chunks each group of tensors needs, just before it."""

    def __init__(self, offer: RdmaOffer, landing: torch.Tensor, timeout: float, in_flight: int = READS_IN_FLIGHT):
        self.offer, self.flat, self.timeout, self.in_flight = offer, landing, timeout, in_flight
        self.fetched: set[int] = set()

    async def fetch(self, entries: list[Entry]) -> None:
        wanted = []
        for index, (start, handle) in enumerate(self.offer.chunks):
            if index not in self.fetched and any(start < e.offset + e.nbytes and e.offset < start + handle.nbytes
                                                 for e in entries):
                wanted.append((self.flat[start : start + handle.nbytes], handle))
                self.fetched.add(index)
        await read_chunks(wanted, self.timeout, self.in_flight)

    def view(self, entry: Entry) -> torch.Tensor:
        return entry_view(self.flat, entry)

    def prepare_copy_to_gpu(self) -> bool:
        return False  # the landing memory is replaced when the layout changes; it stays pageable


async def read_chunks(pairs: list[tuple[torch.Tensor, TensorHandle]], timeout: float,
                      in_flight: int = READS_IN_FLIGHT) -> None:
    """Read each handle into its destination, `in_flight` reads at a time: when one ends, the next starts."""
    if in_flight < 1:
        raise ValueError(f"in_flight={in_flight}: at least one read must be in flight")
    free = asyncio.Semaphore(in_flight)

    async def read(destination: torch.Tensor, handle: TensorHandle) -> None:
        async with free:
            await handle.buffer.read_into(destination, timeout=int(timeout))

    await asyncio.gather(*(read(destination, handle) for destination, handle in pairs))


class SourceCache:
    """Opens offers for one reader, and keeps what is expensive to open (mappings, landing memory)."""

    def __init__(self, timeout: float, reads_in_flight: int = READS_IN_FLIGHT):
        self.timeout, self.reads_in_flight = timeout, reads_in_flight
        self.mapped: dict[str, torch.Tensor] = {}  # shm path or IPC handle -> the slot, mapped here
        self.landing: torch.Tensor | None = None  # local memory that RDMA reads land in
        self.pinned: dict[int, bool] = {}  # mapping's address -> page-locked for copies to the GPU (tried once)

    def open(self, offer, total_bytes: int):
        if isinstance(offer, RdmaOffer):
            if self.landing is None or self.landing.numel() != total_bytes:
                self.landing = torch.zeros(total_bytes, dtype=torch.uint8)  # zeros: pages touched once, here
            return _RdmaSource(offer, self.landing, self.timeout, self.reads_in_flight)
        if isinstance(offer, ShmOffer):
            key = offer.path
            if key not in self.mapped:
                self.mapped[key] = torch.from_file(offer.path, shared=True, size=offer.nbytes, dtype=torch.uint8)
        else:
            from torch.multiprocessing.reductions import rebuild_cuda_tensor

            key = repr((offer.device_uuid, offer.ipc[7], offer.ipc[9]))  # IPC handle and offset name the slot
            if key not in self.mapped:
                self.mapped[key] = rebuild_cuda_tensor(*offer.ipc)
        return _MappedSource(self.mapped[key], self.pinned)


async def load_snapshot(targets: Mapping[str, torch.Tensor], layout: Layout, source,
                        halfway: Callable[[], Awaitable[None]] | None = None) -> None:
    """Copy every target tensor from the snapshot, converting dtype and device on the way.

    A tensor tied to another (same memory) is written once. `halfway`, if
    given, is awaited after about half of the tensors are loaded (tests use it
    to hold a reader in the middle of a read). When this returns, every copy
    has finished, GPU copies included: the slot may be handed back.
    """
    entries = {name: layout.entry(name) for name in targets}
    to_gpu = any(t.is_cuda for t in targets.values())
    asynchronous = to_gpu and source.prepare_copy_to_gpu()
    names = list(entries)
    halves = [names[: (len(names) + 1) // 2], names[(len(names) + 1) // 2 :]]
    written: set[tuple] = set()
    for number, part in enumerate(halves):
        await source.fetch([entries[name] for name in part])
        destinations, sources = [], []
        for name in part:
            target = targets[name]
            key = (target.untyped_storage().data_ptr(), target.storage_offset(), tuple(target.shape))
            if key not in written:
                written.add(key)
                destinations.append(target)
                sources.append(source.view(entries[name]))
        if destinations:  # one call for the whole half: launching copies one by one costs more than the bytes
            with torch.no_grad():
                torch._foreach_copy_(destinations, sources, non_blocking=asynchronous)
        if number == 0 and halfway is not None:
            await halfway()
    if to_gpu or source.flat.is_cuda:
        torch.cuda.synchronize()  # device copies are asynchronous: finish them before the lease goes back


def check_compatible(targets: Mapping[str, torch.Tensor], layout: Layout) -> None:
    """Raise ValueError naming every mismatch between the generator's weights and the trainer's."""
    published = set(layout.names)
    missing = [n for n in targets if n not in published]
    unfilled = [n for n in layout.names if n not in targets]
    wrong_shape = [
        f"{n}: here {tuple(t.shape)}, published {layout.entry(n).shape}"
        for n, t in targets.items()
        if n in published and tuple(t.shape) != layout.entry(n).shape
    ]
    problems = []
    if missing:
        problems.append(f"the trainer publishes no {missing[:5]}")
    if unfilled:
        problems.append(f"the generator has nothing to load {unfilled[:5]} into")
    if wrong_shape:
        problems.append("shapes differ: " + "; ".join(wrong_shape[:5]))
    if problems:
        raise ValueError("the generator's weights do not match the published ones: " + ", and ".join(problems)
                         + ". Build both sides from the same model config.")
