"""Chapter 07: weight sync without process groups.

The trainer *publishes*: it claims a free staging slot, copies its weights into
it in the background, and the WeightStore records "v6 is in slot A". A
generator *pulls* when it is ready: a lease on the latest version, a copy into
its own weights, the lease back. Nobody joins a collective: the trainer never
waits for a generator, and a generator waits only for its own pull.

    trainer: weights --stage--> slot A (v6) <-- pull -- generator (lease on A)
                                slot B      <-- the next version goes here
    WeightStore (control plane): latest v6 in A; A has 1 lease; B free

The double-buffer rule: the trainer writes only a slot that holds neither the
latest version, nor one being written, nor one under a lease; with none free
it skips that version ("latest wins"). A lease expires after lease_timeout_s
(its reader may be dead: one killed in the middle of a pull never gives its
lease back, so its slot stays blocked until then); a reader whose lease
expired learns it from `release` and must not keep what it loaded.

Your TODOs:
  1. WeightStore.claim             the double-buffer rule: a slot the trainer may write, or None
  2. WeightPublisher.publish       claim a slot, stage in the background, or skip; never wait for readers
  3. SnapshotReader.pull_and_load  load the newest version under a lease; never keep a torn load

Given, safe to skip: ch07_transports.py (layout, staging, shm / CUDA IPC / RDMA), ch07_plumbing.py.
Check: koans check 7    Demo: python -m exercises.ch07_weight_sync (--bench)    Read: docs/07_weight_sync.md
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Mapping

import torch
from koans.learn.demo import run_demo
from monarch.actor import Actor, endpoint

from .ch07_transports import READS_IN_FLIGHT, Layout, SourceCache, StagingArea, check_compatible, load_snapshot, pick_transport

TIMEOUT = 60.0


@dataclass(frozen=True)
class Snapshot:
    """What `acquire` hands a reader: the layout and the ways to reach the slot, never the weights.

    Small next to the weights, but it grows with them: one RDMA handle per 16 MiB chunk makes it
    about 46 KB for Qwen2.5-0.5B's shapes in bfloat16, and about 0.4 MB for a 7B model.
    """

    version: int
    slot: int
    lease: int
    layout: Layout
    offers: dict
    published_at: float  # time.time() of the commit, for freshness figures


class WeightStore(Actor):
    """Bookkeeping for the slots: which version is latest, who writes, who reads. Never touches the weights."""

    def __init__(self, lease_timeout_s: float = 120.0):
        self.lease_timeout_s = lease_timeout_s
        self.layout: Layout | None = None
        self.offers: list[dict] = []  # one per slot: the ways to reach it
        self.latest: tuple[int, int, float] | None = None  # (version, slot, published_at)
        self.writing: set[int] = set()  # slots the trainer is staging into
        self.leases: dict[int, tuple[int, float]] = {}  # lease id -> (slot, time.monotonic() when acquired)
        self.next_lease = 1
        self.counts = {"commits": 0, "skipped_claims": 0, "acquires": 0, "releases": 0, "expired_leases": 0}

    @endpoint
    def register(self, layout: Layout, offers: list[dict]) -> None:
        self.layout, self.offers = layout, offers

    @endpoint
    def claim(self) -> int | None:
        """A slot the trainer may stage the next version into, now marked as being written; None if none."""
        # Slots are numbered 0 .. len(self.offers) - 1. A slot is needed while it holds the latest
        # version, while it is being written, and while a lease is on it. A lease older than
        # self.lease_timeout_s is lost (its reader may be dead): at every claim, drop each such lease from
        # self.leases and count it in counts["expired_leases"], so it blocks nothing. Add the slot you
        # answer to self.writing; count counts["skipped_claims"] when you answer None.
        raise NotImplementedError("TODO(ch07): the double-buffer rule: answer a slot nobody needs, or None (the trainer then skips)")

    @endpoint
    def commit(self, slot: int, version: int, published_at: float) -> None:
        """The trainer finished staging `version` into `slot`: it is the latest now."""
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
        """A lease on the latest version, if it is newer than `newer_than`; else None."""
        if self.latest is None or self.latest[0] <= newer_than:
            return None
        version, slot, published_at = self.latest
        lease, self.next_lease = self.next_lease, self.next_lease + 1
        self.leases[lease] = (slot, time.monotonic())
        self.counts["acquires"] += 1
        return Snapshot(version, slot, lease, self.layout, self.offers[slot], published_at)

    @endpoint
    def release(self, lease: int) -> bool:
        """Give a lease back. True: it was held all along. False: it had expired, and the slot
        may have been rewritten while the reader read it."""
        held = self.leases.pop(lease, None) is not None
        self.counts["releases"] += held
        return held

    @endpoint
    def stats(self) -> dict:
        return {**self.counts, "latest_version": self.latest[0] if self.latest else 0,
                "readers": len(self.leases), "writing": len(self.writing)}


class WeightPublisher:
    """Lives in the trainer's process, next to the weights, and publishes versions of them.

        await publisher.wait_staged()   # before anything changes the weights (optimizer.step)
        optimizer.step()
        await publisher.publish(model.state_dict(), version=step)

    Staging runs in the background while the next forward and backward only
    *read* the weights; `wait_staged` is where the trainer would wait if it
    were still running. `staging`: "cpu" (shared host memory, pinned when the
    weights are on a GPU), "cuda" (GPU memory, for readers on the same GPU) or
    "auto" (ch07_transports.choose_staging says exactly what it picks).
    """

    def __init__(self, state_dict: Mapping[str, torch.Tensor], store: WeightStore, *, num_slots: int = 2,
                 staging: str = "auto", rdma_chunk_bytes: int = 16 * 2**20, timeout: float = TIMEOUT):
        if num_slots < 2:
            raise ValueError(f"num_slots={num_slots}: double buffering needs at least 2 slots")
        self.store, self.timeout = store, timeout
        self.staging = StagingArea(state_dict, store, num_slots, staging, rdma_chunk_bytes, timeout)
        self.layout = self.staging.layout
        self.version = 0  # the last version published
        self.skipped = 0  # publish() calls that found no free slot
        self._registered = False
        self._retry: asyncio.Task | None = None  # retry_until_free's background task
        self._keep_retrying = False

    async def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> int | None:
        """Start publishing `state_dict` as `version`; answers the version, or None if it was skipped."""
        if version <= self.version:
            raise ValueError(f"publish(version={version}) after version {self.version}: versions only increase")
        self.staging.check_matches(state_dict)
        await self._before_next()  # the store knows our slots; the previous version is committed
        # Ask the store: await the answer, at most self.timeout (a blocking wait would freeze the trainer's
        # event loop); no answer in time is an error (TimeoutError). No slot: count it in self.skipped and
        # answer None at once; waiting for a reader here is exactly what this design avoids. A slot:
        # self.staging.start(state_dict, slot, version) is a plain call (not awaited): it returns at once
        # and commits the version when the copy is done; record it as self.version and answer it.
        raise NotImplementedError("TODO(ch07): claim a slot from the store; stage into it in the background, or skip this version")

    async def _before_next(self) -> None:
        if not self._registered:
            await asyncio.wait_for(self.store.register.call_one(self.layout, self.staging.offers), self.timeout)
            self._registered = True
        await self.staging.finish()

    async def wait_staged(self) -> None:
        """Return when the weights may change: the last snapshot no longer reads them, and no
        retry (retry_until_free) will read them again."""
        await self._stop_retrying()
        await self.staging.wait_copied()

    def retry_until_free(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """After publish() skipped `version`: offer it again in the background until a slot frees.

        A trainer needs this to stay live. A reader that dies holding a lease keeps its slot
        until the lease expires, and only claim() notices the expiry. Without a retry, the
        trainer skips, trains on, and soon runs more than max_lag versions ahead of every
        generator; then every new group is too stale to train on, so the trainer never
        publishes (never claims) again. With it, training waits at most one lease timeout.
        The next wait_staged() stops the retry: the weights are about to change, and the
        next publish() carries them.
        """
        self._keep_retrying = True
        self._retry = asyncio.get_running_loop().create_task(
            self._publish_when_free(state_dict, version, keep_going=lambda: self._keep_retrying))

    async def _stop_retrying(self) -> None:
        self._keep_retrying = False
        if self._retry is not None:
            retry, self._retry = self._retry, None
            await asyncio.wait_for(retry, self.timeout)  # it ends after at most one publish(); its error surfaces here

    async def _publish_when_free(self, state_dict: Mapping[str, torch.Tensor], version: int,
                                 keep_going: Callable[[], bool]) -> bool:
        """publish(`version`) again, after a pause that grows from 10 ms to 0.5 s, until it is out or
        keep_going() says stop. Never cancelled in the middle: a claim in flight would leak its slot."""
        pause = 0.01
        while self.version < version:
            await asyncio.sleep(pause)
            pause = min(2 * pause, 0.5)
            if self.version >= version or not keep_going():
                break
            await self.publish(state_dict, version)
        return self.version >= version

    async def publish_until_out(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Publish `version` (already skipped once, perhaps) as soon as a slot is free, then wait for its
        commit. For the end of a run: the last version must reach the generators."""
        await self._stop_retrying()
        if self.version < version:
            deadline = time.monotonic() + self.timeout
            await self.publish(state_dict, version)
            if not await self._publish_when_free(state_dict, version, keep_going=lambda: time.monotonic() < deadline):
                raise TimeoutError(f"version {version}: no staging slot came free in {self.timeout} s")
        await self.staging.finish()

    async def close(self) -> None:
        """Stop retrying, finish the last staging, then free the slots (and their shared-memory files)."""
        try:
            await self._stop_retrying()
            await self.staging.finish()
        finally:
            self.staging.close()


class SnapshotReader:
    """Lives in a generator's process and pulls new versions into its weights on request.

    `targets` are the tensors to fill, e.g. `model.state_dict()` (whose tensors
    share memory with the model), in any dtype and on any device. `reads_in_flight`: how many
    chunks an RDMA pull reads at once.
    """

    def __init__(self, store: WeightStore, targets: Mapping[str, torch.Tensor], *, transport: str = "auto",
                 timeout: float = TIMEOUT, attempts: int = 3, reads_in_flight: int = READS_IN_FLIGHT):
        if not targets:
            raise ValueError("SnapshotReader got no tensors to load into; pass model.state_dict()")
        self.store, self.targets, self.transport, self.timeout = store, dict(targets), transport, timeout
        self.attempts = attempts  # loads to try when leases keep expiring under us
        self.device = next(iter(self.targets.values())).device
        self.version = 0  # the version our weights hold
        self.lost_leases = 0  # loads thrown away because the lease expired during them
        self.last_transport: str | None = None
        self._checked_layout: Layout | None = None
        self._sources = SourceCache(timeout, reads_in_flight)  # RDMA: chunks read at once (ch07_transports)

    async def pull_and_load(self, halfway: Callable[[], Awaitable[None]] | None = None) -> int | None:
        """Load the latest version if it is newer than ours; answer it, or None if there is none."""
        # store.acquire(newer_than) answers a Snapshot with a lease, or None (nothing newer: answer None).
        # self.load(snapshot, halfway) copies it into our weights; pass `halfway` to every load, a reload
        # too (a test's gate: it may hold any load halfway). Every call to the store (acquire, release) is
        # awaited, at most self.timeout. release() answers False when the lease had expired: the slot may
        # have changed while we read, so the load may be torn; count self.lost_leases and load again (at most
        # self.attempts loads in all, then raise RuntimeError). A good load: record self.version, answer it.
        raise NotImplementedError("TODO(ch07): under a lease on the newest version, load it; give the lease back whatever happens")

    async def load(self, snapshot: Snapshot, halfway: Callable[[], Awaitable[None]] | None = None) -> None:
        """Copy `snapshot`'s bytes into our weights by the best transport; every copy is done on return."""
        if snapshot.layout != self._checked_layout:
            check_compatible(self.targets, snapshot.layout)
            self._checked_layout = snapshot.layout
        self.last_transport = pick_transport(snapshot.offers, self.transport, self.device)
        source = self._sources.open(snapshot.offers[self.last_transport], snapshot.layout.total_bytes)
        await load_snapshot(self.targets, snapshot.layout, source, halfway)


if __name__ == "__main__":
    from .ch07_plumbing import main  # the demo and the benchmark: given code, safe to skip

    run_demo(main)
