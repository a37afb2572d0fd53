"""Chapter 07: weight sync without process groups.

In RL the trainer changes the policy every step, and the generators must get
the new weights. The textbook way is a collective: trainer and generators join
one process group and `broadcast`. Then every generator stops generating,
the trainer stops training, and everyone waits for the slowest; the two sides
must also agree on one world size. This chapter does it the other way round:

    trainer process                                     generator processes
    +-------------------------------+                   +--------------------+
    | weights --stage--> slot A (v6)| <--- pull bytes -- | weights (v6)       |
    |          (background) slot B  |                   +--------------------+
    +-------------------------------+                   +--------------------+
              | claim / commit                          | weights (v4)       |
              v                                         +--------------------+
    +-------------------------------+   acquire/release        |
    | WeightStore (control plane)   | <------------------------+
    |  latest = v6 in slot A        |
    |  leases: A: 1 reader          |
    +-------------------------------+

  - The trainer *publishes*: it copies ("stages") its weights into a staging
    slot in CPU memory, in the background, and commits "version v is in slot
    A" to the store. Its only wait is for a free slot (one short message).
  - A generator *pulls* when it is ready: it acquires a lease on the latest
    version, copies the bytes into its own weights, and releases the lease.
  - Two slots (double buffering): the trainer stages into the slot nobody is
    reading, so a reader never sees a half-written version and the trainer
    never writes into memory a reader holds. If both slots are busy, the
    trainer skips publishing that step instead of waiting: "latest wins".
  - The bytes move by the fastest transport the two processes share: the same
    shared memory when they sit on one host, CUDA IPC when they share a GPU,
    and chapter 03's RDMABuffer otherwise.

Your TODOs:
  1. stage                        copy every weight into its place in a slot
  2. WeightPublisher.publish      claim a slot, stage in the background, count the version
  3. SnapshotReader.pull_and_load acquire a lease, load, always release

Given code to read next: ch07_transports.py, beside this file (byte layout; shm, CUDA IPC, RDMA).

Check:     pytest tests/test_ch07_weight_sync.py     (or: koans check 7)
Run demo:  python -m solutions.ch07_weight_sync      (benchmark: add --bench)
Read:      docs/07_weight_sync.md
"""

from __future__ import annotations

import hashlib
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Mapping

import torch
from koans.demo import run_demo
from monarch.actor import Actor, endpoint, this_host

from .ch07_transports import (
    Layout,
    SourceCache,
    StagingSlot,
    entry_view,
    pick_transport,
    plan_layout,
    remove_orphaned_shm_files,
)

TIMEOUT = 60.0


def stage(state_dict: Mapping[str, torch.Tensor], layout: Layout, slot: torch.Tensor) -> None:
    """Copy every distinct tensor of `state_dict` to its place in the flat `slot`.

    On CUDA, run this on a side stream: with non_blocking=True, copies into
    pinned memory return at once and the GPU does them in the background.
    """
    # entry_view(slot, entry) is where entry's bytes go; copy_(..., non_blocking=True) fills it.
    # Aliases (tied weights) have no entry of their own: they are sent once, under the entry's name.
    raise NotImplementedError("TODO(ch07): copy each layout entry's tensor from the state dict into its view of the slot")


def state_fingerprint(state_dict: Mapping[str, torch.Tensor]) -> str:
    """One short hash over every name and every byte: equal fingerprints, bit-equal weights."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().to("cpu").contiguous().view(-1)
        digest.update(f"{name}:{tensor.dtype}:{tuple(state_dict[name].shape)}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


# --- The control plane: versions, slots and leases -------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """What `acquire` hands a reader: small, whatever the size of the weights."""

    version: int
    slot: int
    lease: int
    layout: Layout
    offers: dict
    published_at: float  # time.time() of the commit, for freshness figures


class WeightStore(Actor):
    """Bookkeeping for the slots: which version is latest, who is writing, who is reading.

    It never touches the weights. Every endpoint is a few dict operations, so
    nobody waits on it for long. Rules:
      - claim:   a slot that is not the latest, not being written, and has no
                 reader; None if there is none (the trainer then skips a version)
      - commit:  that slot now holds `version`, which must be newer than the latest
      - acquire: a lease on the latest version, if it is newer than the caller's
      - release: give the lease back. Leases older than `lease_timeout_s` are
                 treated as lost (their reader died) and stop blocking the slot.
    """

    def __init__(self, lease_timeout_s: float = 120.0):
        self.lease_timeout_s = lease_timeout_s
        self.layout: Layout | None = None
        self.offers: list[dict] = []
        self.latest: tuple[int, int, float] | None = None  # (version, slot, published_at)
        self.writing: set[int] = set()
        self.leases: dict[int, tuple[int, float]] = {}  # lease -> (slot, acquired at)
        self.next_lease = 1
        self.counts = {"commits": 0, "skipped_claims": 0, "acquires": 0, "releases": 0, "expired_leases": 0}

    @endpoint
    def register(self, layout: Layout, offers: list[dict]) -> None:
        self.layout, self.offers = layout, offers

    @endpoint
    def claim(self) -> int | None:
        now = time.monotonic()
        for lease, (_, since) in list(self.leases.items()):
            if now - since > self.lease_timeout_s:
                del self.leases[lease]
                self.counts["expired_leases"] += 1
        busy = set(self.writing) | {slot for slot, _ in self.leases.values()}
        if self.latest is not None:
            busy.add(self.latest[1])
        for slot in range(len(self.offers)):
            if slot not in busy:
                self.writing.add(slot)
                return slot
        self.counts["skipped_claims"] += 1
        return None

    @endpoint
    def commit(self, slot: int, version: int, published_at: float) -> None:
        self.writing.discard(slot)
        if self.latest is not None and version <= self.latest[0]:
            raise ValueError(f"version {version} is not newer than the published {self.latest[0]}: versions only increase")
        self.latest = (version, slot, published_at)
        self.counts["commits"] += 1

    @endpoint
    def abort(self, slot: int) -> None:
        self.writing.discard(slot)

    @endpoint
    def acquire(self, newer_than: int = 0) -> Snapshot | None:
        if self.latest is None or self.latest[0] <= newer_than:
            return None
        version, slot, published_at = self.latest
        lease, self.next_lease = self.next_lease, self.next_lease + 1
        self.leases[lease] = (slot, time.monotonic())
        self.counts["acquires"] += 1
        return Snapshot(version, slot, lease, self.layout, self.offers[slot], published_at)

    @endpoint
    def release(self, lease: int) -> None:
        if self.leases.pop(lease, None) is not None:
            self.counts["releases"] += 1

    @endpoint
    def stats(self) -> dict:
        return {
            **self.counts,
            "latest_version": self.latest[0] if self.latest else 0,
            "readers": len(self.leases),
            "writing": len(self.writing),
        }


# --- Trainer side -------------------------------------------------------------------------


class WeightPublisher:
    """Lives in the trainer's process, next to the weights, and publishes versions of them.

    Use it like this in the training loop:

        publisher.wait_staged()     # before anything changes the weights (optimizer.step)
        optimizer.step()
        publisher.publish(model.state_dict(), version=step)

    `publish` returns once a slot is claimed and staging has started. Staging
    runs in the background (a thread on CPU; a side CUDA stream on GPU) while
    the next forward and backward only *read* the weights. `wait_staged` is
    where the trainer would block if staging were still running.
    """

    def __init__(
        self,
        state_dict: Mapping[str, torch.Tensor],
        store: WeightStore,
        *,
        num_slots: int = 2,
        staging: str = "auto",
        rdma_chunk_bytes: int = 64 * 2**20,
        timeout: float = TIMEOUT,
    ):
        if staging not in ("auto", "cpu", "cuda"):
            raise ValueError(f"staging must be 'auto', 'cpu' or 'cuda', not {staging!r}")
        if num_slots < 2:
            raise ValueError(f"num_slots={num_slots}: double buffering needs at least 2 slots")
        self.layout = plan_layout(state_dict)
        self.store, self.timeout = store, timeout
        on_cuda = any(t.is_cuda for t in state_dict.values())
        where = "cuda" if staging == "cuda" else "cpu"
        if where == "cuda" and not on_cuda:
            raise ValueError("staging='cuda' stages GPU weights into GPU memory, but these weights are on the CPU")
        remove_orphaned_shm_files()
        self.slots = [StagingSlot(self.layout.total_bytes, where, on_cuda, rdma_chunk_bytes) for _ in range(num_slots)]
        self.copy_stream = torch.cuda.Stream() if on_cuda else None
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight-staging")
        self._in_flight: Future | None = None
        self._staged_event = None
        self.version = 0
        self.skipped = 0
        self.blocked_s = 0.0  # time the trainer spent inside publish() and wait_staged()
        self.staging_s: list[float] = []  # per published version, in the background
        store.register.call_one(self.layout, [slot.offers for slot in self.slots]).get(timeout=timeout)

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> int | None:
        """Start publishing `state_dict` as `version`; None if no slot was free (skipped)."""
        if version <= self.version:
            raise ValueError(f"publish(version={version}) after version {self.version}: versions only increase")
        self._check_matches_layout(state_dict)
        started = time.perf_counter()
        self._finish_previous()
        # self.store.claim.call_one().get(timeout=self.timeout) answers a slot index or None.
        # self._start_staging(state_dict, slot, version) returns at once; then remember the version.
        # Set `published` to the version, or to None when skipped: the lines after this region return it.
        # Never wait for readers here.
        raise NotImplementedError("TODO(ch07): claim a slot; if none is free count a skip, else stage into it in the background")
        self.blocked_s += time.perf_counter() - started
        return published

    def _check_matches_layout(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """A state dict unlike the first one would be staged wrong: say so now, not in a background thread."""
        same = set(state_dict) == set(self.layout.names) and all(
            tuple(state_dict[e.name].shape) == e.shape and state_dict[e.name].dtype == e.dtype for e in self.layout.entries
        )
        if not same:
            raise ValueError("publish() got a state dict whose names, shapes or dtypes differ from the one this "
                             "WeightPublisher was made for; make a new WeightPublisher for a new model")

    def wait_staged(self) -> None:
        """Return when the weights may change: the last snapshot is no longer reading them."""
        started = time.perf_counter()
        if self.copy_stream is not None and self._staged_event is not None:
            # The GPU waits, not the CPU: later kernels on the trainer's stream
            # start after the staging copies.
            torch.cuda.current_stream().wait_event(self._staged_event)
        else:
            self._finish_previous()
        self.blocked_s += time.perf_counter() - started

    def _start_staging(self, state_dict: Mapping[str, torch.Tensor], slot: int, version: int) -> None:
        if self.copy_stream is not None:
            self.copy_stream.wait_stream(torch.cuda.current_stream())  # after the step that made these weights
            began = time.perf_counter()
            with torch.cuda.stream(self.copy_stream):
                stage(state_dict, self.layout, self.slots[slot].flat)
                self._staged_event = torch.cuda.Event()
                self._staged_event.record()
            self._in_flight = self._worker.submit(self._commit_when_copied, slot, version, began, self._staged_event)
        else:
            self._in_flight = self._worker.submit(self._stage_then_commit, dict(state_dict), slot, version)

    def _stage_then_commit(self, state_dict, slot: int, version: int) -> None:
        began = time.perf_counter()
        try:
            stage(state_dict, self.layout, self.slots[slot].flat)
        except BaseException:
            self.store.abort.call_one(slot).get(timeout=self.timeout)
            raise
        self.staging_s.append(time.perf_counter() - began)
        self.store.commit.call_one(slot, version, time.time()).get(timeout=self.timeout)

    def _commit_when_copied(self, slot: int, version: int, began: float, copied) -> None:
        copied.synchronize()
        self.staging_s.append(time.perf_counter() - began)
        self.store.commit.call_one(slot, version, time.time()).get(timeout=self.timeout)

    def _finish_previous(self) -> None:
        """Wait for the previous version's staging and commit (normally long done); re-raise its error."""
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            in_flight.result(timeout=self.timeout)

    def flush(self) -> None:
        """Wait until the last published version is staged and committed."""
        self._finish_previous()

    def close(self) -> None:
        """Finish the last staging, then free the slots (and their shared-memory files)."""
        try:
            self._finish_previous()
        finally:
            self._worker.shutdown(wait=True)
            for slot in self.slots:
                slot.close()


# --- Generator side -------------------------------------------------------------------------


def load_snapshot(
    targets: Mapping[str, torch.Tensor], layout: Layout, source, halfway: Callable[[], None] | None = None
) -> None:
    """Copy every target tensor from the snapshot, converting dtype and device on the way.

    A tensor tied to another (same memory) is written once. `halfway`, if
    given, is called after about half of the tensors are loaded (tests use it
    to hold a reader in the middle of a read).
    """
    written: set[tuple] = set()
    names = list(targets)
    for index, name in enumerate(names):
        target = targets[name]
        key = (target.untyped_storage().data_ptr(), target.storage_offset(), tuple(target.shape))
        if key not in written:
            written.add(key)
            with torch.no_grad():
                target.copy_(source.view(layout.entry(name)))
        if halfway is not None and index == (len(names) - 1) // 2:
            halfway()


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


class SnapshotReader:
    """Lives in a generator's process and pulls new versions into its weights on request.

    `targets` are the tensors to fill, e.g. `model.state_dict()` (whose tensors
    share memory with the model), in any dtype and on any device.
    """

    def __init__(self, store: WeightStore, targets: Mapping[str, torch.Tensor], *, transport: str = "auto", timeout: float = TIMEOUT):
        self.store, self.targets, self.transport, self.timeout = store, dict(targets), transport, timeout
        if not self.targets:
            raise ValueError("SnapshotReader got no tensors to load into; pass model.state_dict()")
        self.device = next(iter(self.targets.values())).device
        self.version = 0
        self.last_transport: str | None = None
        self._checked_layout: Layout | None = None
        self._sources = SourceCache(timeout)

    def pull_and_load(self, halfway: Callable[[], None] | None = None) -> int | None:
        """Load the latest version if it is newer than ours; return it, or None if there is none."""
        # self.store.acquire.call_one(self.version).get(timeout=self.timeout) gives a Snapshot or None.
        # self._open(snapshot) gives a source; load_snapshot(self.targets, snapshot.layout, source, halfway).
        # Release with self.store.release.call_one(snapshot.lease).get(timeout=self.timeout), in a finally.
        # Then record and return snapshot.version.
        raise NotImplementedError("TODO(ch07): acquire a lease newer than self.version; load it; release the lease even on error")

    def _open(self, snapshot: Snapshot):
        if snapshot.layout != self._checked_layout:
            check_compatible(self.targets, snapshot.layout)
            self._checked_layout = snapshot.layout
        self.last_transport = pick_transport(snapshot.offers, self.transport, self.device)
        return self._sources.open(snapshot.offers[self.last_transport], snapshot.layout.total_bytes)


def wait_for_version(store: WeightStore, version: int, timeout: float = TIMEOUT) -> None:
    """Return once the store's latest version is at least `version`.

    Staging runs in the background, so a version becomes visible a little
    after `publish` returns. Only demos and tests need to wait like this;
    real generators just pull whatever is newest when they are ready.
    """
    deadline = time.monotonic() + timeout
    while store.stats.call_one().get(timeout=timeout)["latest_version"] < version:
        if time.monotonic() > deadline:
            raise TimeoutError(f"version {version} was not committed within {timeout} s: "
                               "is WeightPublisher.publish staging and committing it?")
        time.sleep(0.005)


# --- A trainer and a generator to try it on -------------------------------------------------


def make_policy(recipe: str, seed: int) -> torch.nn.Module:
    """Small models with the features that matter here. `recipe`:
    "mlp": a 3-layer MLP whose output layer is tied to its input embedding;
    "qwen2": a tiny Hugging Face Qwen2 causal LM (tied embeddings, bf16-friendly).
    """
    torch.manual_seed(seed)
    if recipe == "mlp":
        embed = torch.nn.Embedding(16, 24)
        head = torch.nn.Linear(24, 16, bias=False)
        head.weight = embed.weight  # tied: one tensor, two names
        return torch.nn.Sequential(embed, torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 24), head)
    if recipe == "qwen2":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        config = Qwen2Config(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             tie_word_embeddings=True)
        return Qwen2ForCausalLM(config)
    raise ValueError(f"unknown recipe {recipe!r}: use 'mlp' or 'qwen2'")


class Gate(Actor):
    """A test gate: readers wait at it until someone opens it."""

    def __init__(self):
        self.arrived, self.opened = 0, False

    @endpoint
    def arrive(self) -> None:
        self.arrived += 1

    @endpoint
    def is_open(self) -> bool:
        return self.opened

    @endpoint
    def open(self) -> None:
        self.opened = True

    @endpoint
    def count(self) -> int:
        return self.arrived


class PolicyTrainer(Actor):
    """Stands in for a trainer: each step changes every weight a little, then publishes."""

    def __init__(self, store: WeightStore, recipe: str = "mlp", dtype: torch.dtype = torch.float32,
                 staging: str = "auto", rdma_chunk_bytes: int = 64 * 2**20, device: str = "cpu"):
        self.model = make_policy(recipe, seed=0).to(device=device, dtype=dtype)
        self.steps = 0
        self.published: dict[int, str] = {}  # version -> state fingerprint
        self.events: list[tuple[str, int]] = []
        self.publisher = WeightPublisher(self.model.state_dict(), store, staging=staging, rdma_chunk_bytes=rdma_chunk_bytes)

    @endpoint
    def step(self) -> int | None:
        """One 'training step'; returns the version published, or None if skipped."""
        self.steps += 1
        self.publisher.wait_staged()
        with torch.no_grad():
            for param in self.model.parameters():
                param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(self.steps)).to(param))
        state = self.model.state_dict()
        version = self.publisher.publish(state, version=self.steps)
        if version is not None:
            self.published[version] = state_fingerprint(state)
        self.events.append(("published" if version else "skipped", self.steps))
        return version

    @endpoint
    def fingerprints(self) -> dict[int, str]:
        return self.published

    @endpoint
    def state(self) -> dict:
        return {name: t.detach().cpu().clone() for name, t in self.model.state_dict().items()}

    @endpoint
    def publisher_stats(self) -> dict:
        self.publisher.flush()
        return {"version": self.publisher.version, "skipped": self.publisher.skipped,
                "pinned": [slot.pinned for slot in self.publisher.slots],
                "shm_paths": [slot.path for slot in self.publisher.slots]}

    @endpoint
    def close(self) -> None:
        self.publisher.close()


class PolicyGenerator(Actor):
    """Stands in for a generator: holds its own copy of the policy and syncs it on request."""

    def __init__(self, store: WeightStore, recipe: str = "mlp", dtype: torch.dtype = torch.float32,
                 transport: str = "auto", device: str = "cpu"):
        self.model = make_policy(recipe, seed=1).to(device=device, dtype=dtype)  # not the trainer's weights
        self.reader = SnapshotReader(store, self.model.state_dict(), transport=transport)

    @endpoint
    def sync(self, gate: Gate | None = None) -> dict:
        """Pull the newest version (if any). With a gate, wait at it halfway through the load."""

        def wait_at_gate() -> None:
            gate.arrive.call_one().get(timeout=TIMEOUT)
            deadline = time.monotonic() + TIMEOUT
            while not gate.is_open.call_one().get(timeout=TIMEOUT):
                if time.monotonic() > deadline:
                    raise TimeoutError("the gate was never opened")
                time.sleep(0.01)

        version = self.reader.pull_and_load(halfway=wait_at_gate if gate is not None else None)
        return {"version": version, "loaded": self.reader.version, "transport": self.reader.last_transport,
                "fingerprint": state_fingerprint(self.model.state_dict())}

    @endpoint
    def state(self) -> dict:
        return {name: t.detach().cpu().clone() for name, t in self.model.state_dict().items()}

    @endpoint
    def tied_names_share_memory(self) -> bool:
        """After loading, are tied weights (e.g. embedding and lm_head) still one tensor?"""
        state = self.model.state_dict()
        aliases = plan_layout(state).aliases
        return bool(aliases) and all(state[a].data_ptr() == state[b].data_ptr() for a, b in aliases)


def main() -> None:
    import sys

    if "--bench" in sys.argv:
        from koans.bench_weight_sync import main as bench_main

        bench_main(__spec__.name, [arg for arg in sys.argv[1:] if arg != "--bench"])  # e.g. "solutions.ch07_weight_sync"
        return
    print("Chapter 07: weight sync without process groups\n")
    procs = this_host().spawn_procs(per_host={"procs": 3})
    try:
        trainer_procs = procs.slice(procs=0)
        store = trainer_procs.spawn("store", WeightStore)
        trainer = trainer_procs.spawn("trainer", PolicyTrainer, store)
        fast = procs.slice(procs=1).spawn("fast_gen", PolicyGenerator, store, "mlp", torch.float32, "shm")
        far = procs.slice(procs=2).spawn("rdma_gen", PolicyGenerator, store, "mlp", torch.bfloat16, "rdma")
        gate = procs.slice(procs=0).spawn("gate", Gate)
        print("step  published  store: latest readers   generators (version via transport)")
        for step in range(1, 6):
            version = trainer.step.call_one().get(timeout=TIMEOUT)
            wait_for_version(store, version)
            synced = [g.sync.call_one().get(timeout=TIMEOUT) for g in (fast, far)]
            stats = store.stats.call_one().get(timeout=TIMEOUT)
            print(f"{step:>4}  {str(version):>9}  {stats['latest_version']:>13} {stats['readers']:>7}   "
                  + ", ".join(f"v{s['loaded']} via {s['transport']}" if s["version"] else f"v{s['loaded']} (nothing newer yet)"
                              for s in synced))

        print("\nA slow reader takes a lease on version 6 and stops halfway; the trainer keeps stepping:")
        wait_for_version(store, trainer.step.call_one().get(timeout=TIMEOUT))
        slow = fast.sync.call_one(gate)
        deadline = time.monotonic() + TIMEOUT
        while gate.count.call_one().get(timeout=TIMEOUT) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(3):
            version = trainer.step.call_one().get(timeout=TIMEOUT)
            stats = store.stats.call_one().get(timeout=TIMEOUT)
            print(f"  trainer step -> published {version}  (readers {stats['readers']}, skipped claims {stats['skipped_claims']})")
        gate.open.call_one().get(timeout=TIMEOUT)
        slow_result = slow.get(timeout=TIMEOUT)
        fingerprints = trainer.fingerprints.call_one().get(timeout=TIMEOUT)
        print(f"  the slow reader finished v{slow_result['loaded']}; bit-equal to the trainer's v6 "
              f"(no torn read): {slow_result['fingerprint'] == fingerprints[6]}")

        final = trainer.step.call_one().get(timeout=TIMEOUT)
        wait_for_version(store, final)
        fast_result, far_result = (g.sync.call_one().get(timeout=TIMEOUT) for g in (fast, far))
        fingerprints = trainer.fingerprints.call_one().get(timeout=TIMEOUT)
        trainer_state = trainer.state.call_one().get(timeout=TIMEOUT)
        far_state = far.state.call_one().get(timeout=TIMEOUT)
        far_equal = all(torch.equal(far_state[n], t.to(torch.bfloat16)) for n, t in trainer_state.items())
        print(f"\nAfter step {final} (the lease is released, so it publishes again):")
        print(f"  float32 generator via shm at v{fast_result['loaded']}: bit-equal to the trainer: "
              f"{fast_result['fingerprint'] == fingerprints[final]}")
        print(f"  bfloat16 generator via rdma at v{far_result['loaded']}: equal to the trainer's weights cast to bf16: {far_equal}")
        trainer.close.call_one().get(timeout=TIMEOUT)
    finally:
        procs.stop().get(timeout=TIMEOUT)


if __name__ == "__main__":
    run_demo(main)
