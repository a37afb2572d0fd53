"""Chapter 07 plumbing: small models to sync, a trainer and a generator that stand in for the real
ones, a gate that holds a reader halfway, and the demo. You may skip this file; nothing in it is
a TODO.

    python -m exercises.ch07_weight_sync           the demo, on your code (the reference: solutions.ch07_weight_sync)
    python -m exercises.ch07_weight_sync --bench   the benchmark (koans/bench/weight_sync.py)
"""

from __future__ import annotations

import asyncio
import sys
import time

from koans.learn.demo import demo_options
import torch
from monarch.actor import Actor, endpoint, this_host

from .ch07_transports import plan_layout, state_fingerprint
from .ch07_weight_sync import TIMEOUT, SnapshotReader, WeightPublisher, WeightStore


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


async def ask(endpoint, *args, timeout: float = TIMEOUT):
    """One call to a single actor, awaited at most `timeout` seconds."""
    return await asyncio.wait_for(endpoint.call_one(*args), timeout)


async def wait_for_version(store: WeightStore, version: int, timeout: float = TIMEOUT) -> None:
    """Return once the store's latest version is at least `version`.

    Staging runs in the background, so a version becomes visible a little
    after `publish` returns. Only demos and tests need to wait like this;
    real generators just pull whatever is newest when they are ready.
    """
    deadline = time.monotonic() + timeout
    while (await asyncio.wait_for(store.stats.call_one(), timeout))["latest_version"] < version:
        if time.monotonic() > deadline:
            raise TimeoutError(f"version {version} was not committed within {timeout} s: "
                               "is WeightPublisher.publish staging and committing it?")
        await asyncio.sleep(0.005)


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
                 staging: str = "auto", rdma_chunk_bytes: int = 16 * 2**20, device: str = "cpu"):
        self.model = make_policy(recipe, seed=0).to(device=device, dtype=dtype)
        self.steps = 0
        self.published: dict[int, str] = {}  # version -> state fingerprint
        self.publisher = WeightPublisher(self.model.state_dict(), store, staging=staging,
                                         rdma_chunk_bytes=rdma_chunk_bytes)

    @endpoint
    async def step(self) -> int | None:
        """One 'training step'; answers the version published, or None if skipped."""
        self.steps += 1
        await self.publisher.wait_staged()
        with torch.no_grad():
            for param in self.model.parameters():
                param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(self.steps)).to(param))
        state = self.model.state_dict()
        version = await self.publisher.publish(state, version=self.steps)
        if version is not None:
            self.published[version] = state_fingerprint(state)
        return version

    @endpoint
    async def publish_until_out(self) -> int:
        """Publish the current weights as the current step, waiting for a free slot if need be."""
        state = self.model.state_dict()
        await self.publisher.publish_until_out(state, self.steps)
        self.published[self.steps] = state_fingerprint(state)
        return self.steps

    @endpoint
    async def fingerprints(self) -> dict[int, str]:
        return self.published

    @endpoint
    async def state(self) -> dict:
        return {name: t.detach().cpu().clone() for name, t in self.model.state_dict().items()}

    @endpoint
    async def publisher_stats(self) -> dict:
        await self.publisher.staging.finish()
        return {"version": self.publisher.version, "skipped": self.publisher.skipped,
                "where": self.publisher.staging.where,
                "pinned": [slot.pinned for slot in self.publisher.staging.slots],
                "shm_paths": [slot.path for slot in self.publisher.staging.slots]}

    @endpoint
    async def close(self) -> None:
        await self.publisher.close()


class PolicyGenerator(Actor):
    """Stands in for a generator: holds its own copy of the policy and syncs it on request."""

    def __init__(self, store: WeightStore, recipe: str = "mlp", dtype: torch.dtype = torch.float32,
                 transport: str = "auto", device: str = "cpu"):
        self.model = make_policy(recipe, seed=1).to(device=device, dtype=dtype)  # not the trainer's weights
        self.reader = SnapshotReader(store, self.model.state_dict(), transport=transport)

    @endpoint
    async def sync(self, gate: Gate | None = None) -> dict:
        """Pull the newest version (if any). With a gate, wait at it halfway through each load."""

        async def wait_at_gate() -> None:
            await asyncio.wait_for(gate.arrive.call_one(), TIMEOUT)
            deadline = time.monotonic() + TIMEOUT
            while not await asyncio.wait_for(gate.is_open.call_one(), TIMEOUT):
                if time.monotonic() > deadline:
                    raise TimeoutError("the gate was never opened")
                await asyncio.sleep(0.01)

        version = await self.reader.pull_and_load(halfway=wait_at_gate if gate is not None else None)
        return {"version": version, "loaded": self.reader.version, "transport": self.reader.last_transport,
                "lost_leases": self.reader.lost_leases, "fingerprint": state_fingerprint(self.model.state_dict())}

    @endpoint
    async def state(self) -> dict:
        return {name: t.detach().cpu().clone() for name, t in self.model.state_dict().items()}

    @endpoint
    async def tied_names_share_memory(self) -> bool:
        """After loading, are tied weights (e.g. embedding and lm_head) still one tensor?"""
        state = self.model.state_dict()
        aliases = plan_layout(state).aliases
        return bool(aliases) and all(state[a].data_ptr() == state[b].data_ptr() for a, b in aliases)


async def demo() -> None:
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
            version = await ask(trainer.step)
            await wait_for_version(store, version)
            synced = [await ask(g.sync) for g in (fast, far)]
            stats = await ask(store.stats)
            print(f"{step:>4}  {str(version):>9}  {stats['latest_version']:>13} {stats['readers']:>7}   "
                  + ", ".join(f"v{s['loaded']} via {s['transport']}" if s["version"] else f"v{s['loaded']} (nothing newer yet)"
                              for s in synced))

        print("\nA slow reader takes a lease on version 6 and stops halfway; the trainer keeps stepping:")
        await wait_for_version(store, await ask(trainer.step))
        slow = asyncio.ensure_future(ask(fast.sync, gate))
        deadline = time.monotonic() + TIMEOUT
        while await ask(gate.count) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for _ in range(3):
            version = await ask(trainer.step)
            stats = await ask(store.stats)
            print(f"  trainer step -> published {version}  (readers {stats['readers']}, skipped claims {stats['skipped_claims']})")
        await ask(gate.open)
        slow_result = await slow
        fingerprints = await ask(trainer.fingerprints)
        print(f"  the slow reader finished v{slow_result['loaded']}; bit-equal to the trainer's v6 "
              f"(no torn read): {slow_result['fingerprint'] == fingerprints[6]}")

        final = await ask(trainer.step)
        await wait_for_version(store, final)
        fast_result, far_result = [await ask(g.sync) for g in (fast, far)]
        fingerprints = await ask(trainer.fingerprints)
        trainer_state, far_state = await ask(trainer.state), await ask(far.state)
        far_equal = all(torch.equal(far_state[n], t.to(torch.bfloat16)) for n, t in trainer_state.items())
        print(f"\nAfter step {final} (the lease is released, so it publishes again):")
        print(f"  float32 generator via shm at v{fast_result['loaded']}: bit-equal to the trainer: "
              f"{fast_result['fingerprint'] == fingerprints[final]}")
        print(f"  bfloat16 generator via rdma at v{far_result['loaded']}: equal to the trainer's weights cast to bf16: {far_equal}")
        await ask(trainer.close)
    finally:
        await asyncio.wait_for(procs.stop(), TIMEOUT)


def main() -> None:
    if "--bench" in sys.argv[1:]:  # the benchmark parses its own flags: --bench --help lists them
        rest = [arg for arg in sys.argv[1:] if arg != "--bench"]
        from koans.bench.weight_sync import main as bench_main

        bench_main(f"{__package__}.ch07_weight_sync", rest)
        return
    demo_options(f"{__package__}.ch07_weight_sync", "Chapter 07's demo: publish, pull, a slow reader.",
                 (("--bench", "staged against blocking weight sync instead (its own flags: --bench --help)"),))
    asyncio.run(demo())
