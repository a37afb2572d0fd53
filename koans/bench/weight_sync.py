"""The chapter 07 benchmark: staged weight sync against a blocking broadcast.

    python -m solutions.ch07_weight_sync --bench [--size 0.5b|small|tiny|GB] [--json PATH]
    python -m solutions.ch07_weight_sync --bench --sizes 0.07,0.27,0.99    how the figures scale with the bytes
    koans bench --gpu      runs it too, on the 1 GB shapes, with the other GPU figures

It runs on the chapter module it is started from, so a learner can benchmark
their own code too. One run measures, per transport:

  staged    the chapter's design. The trainer publishes and goes on; each
            generator pulls when it finishes a (simulated) generation.
  blocking  the baseline. After publishing, the trainer waits until every
            generator holds the new weights, as with a process-group broadcast.

Per run: trainer-blocked time, the generators' pull time, freshness (time from
publish to a generator holding it, and how many versions behind the trainer it
was by then), versions never held, and publishes skipped; and the machine's
copy limit (memcpy on CPU; pinned device-to-host, host-to-device and
device-to-device on GPU). Training and generation are simulated with sleeps
("the accelerator is busy for step_ms"): the benchmark measures the sync
machinery, not model math. The JSON keys are documented in docs/appendix/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import statistics
import time
from types import ModuleType

import torch
from monarch.actor import Actor, endpoint, this_host

TIMEOUT = 600.0

#: Qwen2.5-0.5B: hidden 896, 24 layers, 14 query heads and 2 key/value heads of 64, MLP 4864,
#: vocabulary 151936, embedding tied to the LM head. "small" keeps the widths, cuts depth and vocabulary.
SIZES = {"0.5b": {"layers": 24, "vocab": 151936}, "small": {"layers": 7, "vocab": 32768},
         "tiny": {"layers": 2, "vocab": 8192}}
HIDDEN, KV, MLP = 896, 128, 4864


def size_for_gb(gb: float) -> str:
    """A name in SIZES for about `gb` GB of bf16 weights: the named cut nearest it (0.07, 0.27 or 0.99 GB),
    or, for other sizes, Qwen2.5-0.5B's widths with as many layers as fit ("<layers>x<vocab>")."""
    def nbytes(spec: dict) -> int:
        layer = HIDDEN * HIDDEN * 2 + KV * HIDDEN * 2 + HIDDEN * 2 + KV * 2 + 3 * MLP * HIDDEN + 2 * HIDDEN
        return 2 * (spec["vocab"] * HIDDEN + spec["layers"] * layer + HIDDEN)

    for name, spec in SIZES.items():
        if abs(nbytes(spec) / 1e9 - gb) <= 0.1 * gb:
            return name
    vocab = 151936 if gb >= 0.5 else 32768 if gb >= 0.15 else 8192
    layers = max(1, round((gb * 1e9 - nbytes({"vocab": vocab, "layers": 0})) / (nbytes({"vocab": 0, "layers": 1}))))
    return f"{layers}x{vocab}"


def qwen_shapes(size: str) -> dict[str, tuple[int, ...]]:
    """Qwen2.5-0.5B's parameter names and shapes (lm_head is tied to the embedding, so absent)."""
    spec = SIZES.get(size) or dict(zip(("layers", "vocab"), map(int, size.split("x"))))
    shapes = {"model.embed_tokens.weight": (spec["vocab"], HIDDEN)}
    for layer in range(spec["layers"]):
        prefix = f"model.layers.{layer}."
        shapes.update({
            prefix + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), prefix + "self_attn.q_proj.bias": (HIDDEN,),
            prefix + "self_attn.k_proj.weight": (KV, HIDDEN), prefix + "self_attn.k_proj.bias": (KV,),
            prefix + "self_attn.v_proj.weight": (KV, HIDDEN), prefix + "self_attn.v_proj.bias": (KV,),
            prefix + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            prefix + "mlp.gate_proj.weight": (MLP, HIDDEN), prefix + "mlp.up_proj.weight": (MLP, HIDDEN),
            prefix + "mlp.down_proj.weight": (HIDDEN, MLP),
            prefix + "input_layernorm.weight": (HIDDEN,), prefix + "post_attention_layernorm.weight": (HIDDEN,),
        })
    shapes["model.norm.weight"] = (HIDDEN,)
    return shapes


def qwen_shaped_state_dict(size: str, dtype: torch.dtype, device: str, seed: int | None = 0) -> dict[str, torch.Tensor]:
    """Weights with Qwen2.5-0.5B's names and shapes; random, or uninitialized when seed is None.

    The embedding and lm_head are one tensor under two names, as in the real model.
    """
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    state = {}
    for name, shape in qwen_shapes(size).items():
        state[name] = torch.empty(shape, dtype=dtype, device=device)
        if generator is not None:
            state[name].uniform_(-0.05, 0.05, generator=generator)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]
    return state


def _chapter(module_name: str) -> ModuleType:
    return importlib.import_module(module_name)


def best_copy_gbps(nbytes: int, copy, cuda: bool = False) -> float:
    """GB/s of the best of 3 runs of `copy()`, which moves `nbytes` (waiting for the GPU when `cuda`)."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        copy()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return nbytes / min(times) / 1e9


class BenchTrainer(Actor):
    """A trainer whose step is a sleep plus a tiny in-place update, then a publish."""

    def __init__(self, chapter: str, store, size: str, dtype: torch.dtype, device: str, staging: str):
        self.chapter = _chapter(chapter)
        self.device = device
        self.state = qwen_shaped_state_dict(size, dtype, device)
        self.store = store
        self.publisher = self.chapter.WeightPublisher(self.state, store, staging=staging, timeout=TIMEOUT)
        self.nbytes = self.publisher.layout.total_bytes

    def _optimizer_step(self, step: int) -> None:
        self.state["model.norm.weight"].fill_(step)  # a real step touches every weight; only order matters here
        if self.device == "cuda":
            torch.cuda.synchronize()

    @endpoint
    async def run(self, syncs: int, step_ms: float, generators=None) -> dict:
        """One warm-up step, then `syncs` measured ones. Without generators: staged mode; with them: blocking."""
        staging = self.publisher.staging
        blocked, published_at, skipped = [], {}, 0
        for step in range(syncs + 1):  # step 0 warms up (first touch of memory, first connections)
            time.sleep(step_ms / 1000)  # forward and backward: the accelerator is busy, weights are only read
            staged_before = len(staging.staging_s)
            started = time.perf_counter()
            await self.publisher.wait_staged()
            waited = time.perf_counter() - started
            self._optimizer_step(step)
            published_at[step + 1] = time.time()
            began = time.perf_counter()
            version = await self.publisher.publish(self.state, version=step + 1)
            took = waited + time.perf_counter() - began
            skipped += version is None
            if version is None and step in (0, syncs):  # warm-up and last versions must get out
                await self.publisher.publish_until_out(self.state, step + 1)
            if generators is not None:  # blocking: everyone holds the new version before training goes on
                await staging.finish()
                await asyncio.wait_for(generators.pull.call(), TIMEOUT)
                took = time.perf_counter() - started
            if step > 0:
                blocked.append(took)
            if step == 0:
                await staging.finish()
                del staging.staging_s[staged_before:]
        await staging.finish()
        return {"blocked_s": blocked, "published_at": published_at, "skipped": skipped,
                "staging_s": list(staging.staging_s), "nbytes": self.nbytes}

    @endpoint
    async def copy_limits(self) -> dict:
        """Best of 3 plain copies of the same number of bytes, in this process."""

        def best(copy) -> float:
            return best_copy_gbps(self.nbytes, copy, cuda=self.device == "cuda")

        host_a, host_b = torch.ones(self.nbytes, dtype=torch.uint8), torch.empty(self.nbytes, dtype=torch.uint8)
        limits = {"memcpy_gbps": best(lambda: host_b.copy_(host_a))}
        if self.device == "cuda":
            pinned = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True)
            gpu = torch.ones(self.nbytes, dtype=torch.uint8, device="cuda")
            limits["d2h_pinned_gbps"] = best(lambda: pinned.copy_(gpu, non_blocking=True))
            limits["h2d_pinned_gbps"] = best(lambda: gpu.copy_(pinned, non_blocking=True))
            other = torch.empty_like(gpu)
            limits["d2d_gbps"] = best(lambda: other.copy_(gpu))
        return limits

    @endpoint
    async def close(self) -> None:
        await self.publisher.close()


class BenchGenerator(Actor):
    """A generator whose 'generation' is a sleep; it pulls new weights between generations."""

    def __init__(self, chapter: str, store, size: str, dtype: torch.dtype, device: str, transport: str):
        self.weights = qwen_shaped_state_dict(size, dtype, device, seed=None)
        self.device = device
        self.reader = _chapter(chapter).SnapshotReader(store, self.weights, transport=transport, timeout=TIMEOUT)

    async def _timed_pull(self) -> tuple[int | None, float]:
        started = time.perf_counter()
        version = await self.reader.pull_and_load()
        return version, time.perf_counter() - started

    @endpoint
    async def pull(self) -> float:
        """Blocking mode: pull now (the trainer is waiting for us)."""
        return (await self._timed_pull())[1]

    @endpoint
    async def ready(self) -> None:
        """Touch our weights once, as a loaded model would have."""
        for tensor in self.weights.values():
            tensor.zero_()

    @endpoint
    async def follow(self, last_version: int, gen_ms: float) -> dict:
        """Staged mode: generate, pull if something newer is out, repeat until `last_version` is loaded.

        Version 1 is the trainer's warm-up and is left out of the figures.
        """
        stalls, loaded_at = [], {}
        deadline = time.monotonic() + TIMEOUT
        while self.reader.version < last_version and time.monotonic() < deadline:
            time.sleep(gen_ms / 1000)  # one generation with the weights we have: the accelerator is busy
            version, took = await self._timed_pull()
            if version is not None and version > 1:
                stalls.append(took)
                loaded_at[version] = time.time()
        return {"stall_s": stalls, "loaded_at": loaded_at, "transport": self.reader.last_transport}


def _hardware() -> dict:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu, "torch": torch.__version__}


def _ms(seconds: list[float]) -> float:
    return 1000 * statistics.mean(seconds) if seconds else float("nan")


def run_one(chapter: str, transport: str, mode: str, args, device: str) -> dict:
    """One fresh set of processes: a trainer (with its store) and the generators."""
    staging = "cuda" if transport == "cuda_ipc" else "cpu"
    procs = this_host().spawn_procs(per_host={"procs": 1 + args.generators})
    try:
        on_trainer = procs.slice(procs=0)
        store = on_trainer.spawn("store", _chapter(chapter).WeightStore)
        trainer = on_trainer.spawn("trainer", BenchTrainer, chapter, store, args.size, torch.bfloat16, device, staging)
        gens = procs.slice(procs=slice(1, 1 + args.generators)).spawn(
            "generators", BenchGenerator, chapter, store, args.size, torch.bfloat16, device, transport)
        limits = trainer.copy_limits.call_one().get(timeout=TIMEOUT)
        gens.ready.call().get(timeout=TIMEOUT)
        if mode == "blocking":
            trained = trainer.run.call_one(args.syncs, args.step_ms, gens).get(timeout=TIMEOUT)
            followed = None
        else:
            following = gens.follow.call(args.syncs + 1, args.gen_ms)
            trained = trainer.run.call_one(args.syncs, args.step_ms).get(timeout=TIMEOUT)
            followed = list(following.get(timeout=TIMEOUT).values())
        trainer.close.call_one().get(timeout=TIMEOUT)
    finally:
        procs.stop().get(timeout=TIMEOUT)
    nbytes = trained["nbytes"]
    result = {"transport": transport, "mode": mode, "syncs": args.syncs, "skipped": trained["skipped"],
              "trainer_blocked_ms": _ms(trained["blocked_s"]), "trainer_blocked_ms_max": 1000 * max(trained["blocked_s"]),
              "staging_gbps": nbytes / statistics.mean(trained["staging_s"]) / 1e9 if trained["staging_s"] else None,
              "copy_limits": limits, "nbytes": nbytes}
    if followed is not None:
        stalls = [s for f in followed for s in f["stall_s"]]
        published = trained["published_at"]
        fresh = [f["loaded_at"][v] - published[int(v)] for f in followed for v in f["loaded_at"]]
        # How far behind the trainer a generator was when it finished loading: versions published by then, minus
        # the one it loaded. And the measured versions (2 .. last) a generator never held at all.
        behind = [sum(1 for u, at in published.items() if at <= f["loaded_at"][v]) - int(v)
                  for f in followed for v in f["loaded_at"]]
        measured = set(range(2, args.syncs + 2))
        never_held = [len(measured - {int(v) for v in f["loaded_at"]}) for f in followed]
        result.update(generator_stall_ms=_ms(stalls), freshness_ms=_ms(fresh), gbps=nbytes / statistics.mean(stalls) / 1e9,
                      picked=sorted({f["transport"] for f in followed}), versions_behind=statistics.mean(behind),
                      versions_behind_max=max(behind), versions_never_held=statistics.mean(never_held))
    else:
        result.update(generator_stall_ms=result["trainer_blocked_ms"], freshness_ms=result["trainer_blocked_ms"], gbps=None,
                      picked=[transport], versions_behind=0.0, versions_behind_max=0, versions_never_held=0.0)
    result["pull_ms"] = result["generator_stall_ms"]
    return result


def main(chapter_module: str, argv: list[str]) -> dict:
    """Run the benchmark on the chapter module named `chapter_module` (exercises or solutions);
    print the table and answer the report (the JSON's content). With --sizes, one table per size, then
    the scaling table, and the report holds one such report per size under "sizes"."""
    transport_names = _chapter(chapter_module.rsplit(".", 1)[0] + ".ch07_transports").TRANSPORTS
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(prog=f"python -m {chapter_module} --bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="0.5b", help="Qwen2.5-0.5B shapes (0.5b, ~1 GB bf16), a 0.27 GB cut (small), "
                        "a 0.07 GB cut (tiny), or a size in GB")
    parser.add_argument("--sizes", default="", help="several sizes (names or GB, comma-separated, e.g. 0.07,0.27,0.99): "
                        "a table for each, then how trainer-blocked time, pull time and freshness scale")
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    parser.add_argument("--generators", type=int, default=2)
    parser.add_argument("--syncs", type=int, default=5, help="training steps, each followed by a publish")
    parser.add_argument("--step-ms", type=float, default=150.0 if cuda else 1000.0, help="simulated training step")
    parser.add_argument("--gen-ms", type=float, default=100.0, help="simulated generation between pulls")
    parser.add_argument("--transports", default="cuda_ipc,shm,rdma" if cuda else "shm,rdma")
    args = parser.parse_args(argv)
    device = "cuda" if cuda else "cpu"
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    bad = [t for t in transports if t not in transport_names or (t == "cuda_ipc" and not cuda)]
    if bad:
        parser.error(f"unknown or unavailable transports {bad}; choose from {list(transport_names)} (cuda_ipc needs a GPU)")
    sizes = [_size_name(s, parser) for s in (args.sizes or args.size).split(",") if s.strip()]

    hardware = _hardware()
    print(f"Weight-sync benchmark on {hardware['cpu']} ({hardware['cores']} cores), GPU: {hardware['gpu'] or 'none'}")
    reports = []
    for size in sizes:
        args.size = size
        reports.append(_run_size(chapter_module, args, transports, device, cuda, hardware))
    report = reports[0] if not args.sizes else {"hardware": hardware, "sizes": reports}
    if args.sizes:
        _print_scaling(reports, args)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)
        print(f"\nWrote {args.json}")
    return report


def _size_name(size: str, parser) -> str:
    size = size.strip()
    if size in SIZES:
        return size
    try:
        return size_for_gb(float(size))
    except ValueError:
        parser.error(f"size {size!r}: use one of {sorted(SIZES)} or a number of GB")


def _print_scaling(reports: list[dict], args) -> None:
    """One line per size and transport (staged mode): what grows with the bytes, against the step."""
    print(f"\nScaling (staged; step {args.step_ms:.0f} ms, generation {args.gen_ms:.0f} ms, {args.generators} generators, "
          f"{args.syncs} syncs):")
    header = (f"{'GB':>5} {'transport':<9} {'trainer-blocked ms':>19} {'pull ms':>8} {'pull/step':>9} {'freshness ms':>13} "
              f"{'behind':>7} {'never held':>11} {'skipped':>8}")
    print(header + "\n" + "-" * len(header))
    for report in reports:
        for r in report["results"]:
            if r["mode"] != "staged":
                continue
            print(f"{r['nbytes'] / 1e9:>5.2f} {r['transport']:<9} {r['trainer_blocked_ms']:>19.1f} {r['pull_ms']:>8.0f} "
                  f"{r['pull_ms'] / args.step_ms:>9.2f} {r['freshness_ms']:>13.0f} {r['versions_behind']:>7.2f} "
                  f"{r['versions_never_held']:>11.1f} {r['skipped']:>8}")
    print("behind: versions the trainer had published beyond the one a generator had just loaded (mean over loads); "
          "never held: measured versions a generator never loaded (mean per generator); skipped: publishes that "
          "found no free slot")


def _run_size(chapter_module: str, args, transports: list[str], device: str, cuda: bool, hardware: dict) -> dict:
    """Every transport, staged and blocking, at args.size: print its table, answer its report."""
    results = []
    for transport in transports:
        for mode in ("staged", "blocking"):
            print(f"  running {transport:<8} {mode:<8} ...", flush=True)
            results.append(run_one(chapter_module, transport, mode, args, device))
    nbytes = results[0]["nbytes"]
    limits = results[0]["copy_limits"]
    print(f"\nWeights: Qwen2.5-0.5B-shaped ({args.size}), {nbytes / 1e9:.2f} GB bf16 on {device}; "
          f"{args.generators} generators; {args.syncs} syncs; step {args.step_ms:.0f} ms; generation {args.gen_ms:.0f} ms")
    print("Copy limit: " + ", ".join(f"{k.removesuffix('_gbps')} {v:.1f} GB/s" for k, v in limits.items()))
    header = f"{'transport':<9} {'mode':<8} {'trainer-blocked ms':>19} {'gen stall ms':>13} {'freshness ms':>13} {'GB/s':>6} {'staging GB/s':>13} {'skipped':>8}"
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        gbps = f"{r['gbps']:.2f}" if r["gbps"] else "-"
        staging = f"{r['staging_gbps']:.1f}" if r["staging_gbps"] else "-"
        print(f"{r['transport']:<9} {r['mode']:<8} {r['trainer_blocked_ms']:>19.1f} {r['generator_stall_ms']:>13.1f} "
              f"{r['freshness_ms']:>13.1f} {gbps:>6} {staging:>13} {r['skipped']:>8}")
    print()
    summary = []
    for transport in transports:
        staged, blocking = (next(r for r in results if r["transport"] == transport and r["mode"] == m) for m in ("staged", "blocking"))
        ratio = staged["trainer_blocked_ms"] / blocking["trainer_blocked_ms"]
        line = {"transport": transport, "blocked_ratio": ratio, "blocked_ratio_ok": ratio <= 0.10}
        text = f"{transport}: trainer-blocked staged/blocking = {100 * ratio:.1f}% (target <= 10%)"
        if cuda and staged["staging_gbps"]:
            limit = limits["d2h_pinned_gbps"] if transport != "cuda_ipc" else limits.get("d2d_gbps")
            kind = "pinned D2H" if transport != "cuda_ipc" else "device-to-device"
            if limit:
                line["staging_vs_limit"] = staged["staging_gbps"] / limit
                line["staging_limit"] = kind
                text += f"; staging at {100 * line['staging_vs_limit']:.0f}% of the {kind} limit (target >= 90%)"
            line["blocked_ms_ok"] = staged["trainer_blocked_ms"] <= 5
            line["freshness_ok"] = staged["freshness_ms"] <= 50
            text += (f"; blocked {staged['trainer_blocked_ms']:.1f} ms (target <= 5 ms); "
                     f"freshness {staged['freshness_ms']:.0f} ms (target <= 50 ms)")
        summary.append(line)
        print(text)
    report = {"hardware": hardware, "config": {"size": args.size, "bytes": nbytes, "dtype": "bfloat16", "device": device,
              "generators": args.generators, "syncs": args.syncs, "step_ms": args.step_ms, "gen_ms": args.gen_ms},
              "copy_limits": limits, "results": results, "summary": summary}
    return report
