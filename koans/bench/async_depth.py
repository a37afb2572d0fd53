"""How much latency async generation hides: chapter 11's environment latency and chapter 12's tools.

    python -m koans.bench.async_depth [--quick] [--impl solutions|exercises] [--json PATH]

Two figures, each a measured value against its limit:

  async_share_of_0ms_at_100ms_ch11   chapter 11's latency lab at its default depth: async samples/s with
                                     every rollout waiting 100 ms on its environment, against async with no
                                     wait (the rate the CPU allows). 1.0: the latency is hidden entirely.
                                     Three pairs of runs, 0 ms then 100 ms, and the median of each side.
  async_vs_lockstep_ch12             chapter 12 at its tool latency and default depth: async episodes/s
                                     against lock step's, from a policy trained to call the tool.

Each figure's config says how it was measured; max_lag / mean_lag are the versions behind the learner of
the groups trained, which the buffer keeps within max_lag_bound. The chapter code comes from --impl
(default: $KOANS_IMPL, else exercises: the learner's, once its TODOs are done).
quick=True runs a few steps of each (a smoke test: the numbers mean little), and chapter 12 from the
warm-started policy instead of a trained one.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics

from koans.bench.kv_recompute import cpu_name
from koans.testkit.code_under_test import import_chapter, selected_impl
from koans.course.manifest import find_chapter


def _plumbing(number: int, impl: str, name: str):
    import_chapter(find_chapter(number), impl)  # the chapter first: it puts this checkout on the path
    import importlib

    return importlib.import_module(f"{impl}.{name}")


def ch11_figure(impl: str, quick: bool = False, rounds: int = 3) -> dict:
    """`rounds` pairs of runs in one job, 0 ms then 100 ms, one after the other, so that a machine slowing down
    for a while slows both sides of some pair rather than one side of the only one; the medians of each side."""
    lab = _plumbing(11, impl, "ch11_plumbing")
    depth, steps, rounds = lab.DEFAULT_DEPTH, (4 if quick else 32), (1 if quick else rounds)
    rows = asyncio.run(lab.latency_experiment([0, 100] * rounds, steps, [depth]))
    zeros, slows = rows[0::2], rows[1::2]
    zero, slow = (statistics.median(r["async_samples_per_s"] for r in side) for side in (zeros, slows))
    return {"name": "async_share_of_0ms_at_100ms_ch11", "value": slow, "limit": zero, "ratio": slow / zero,
            "unit": "samples/s",
            "config": {"depth": depth, "batch_groups": zeros[0]["batch_groups"], "group_size": 8, "latency_ms": 100,
                       "steps": steps, "rounds": rounds, "statistic": "median of the rounds",
                       "rounds_samples_per_s": [[round(z["async_samples_per_s"], 1), round(w["async_samples_per_s"], 1)]
                                                for z, w in zip(zeros, slows)],
                       "max_lag_bound": slows[0]["max_lag_bound"], "max_lag": max(r["max_lag"] for r in slows),
                       "mean_lag": round(statistics.mean(r["mean_lag"] for r in slows), 3),
                       "dropped": sum(r["dropped"] for r in slows),
                       "lockstep_samples_per_s_at_100ms": statistics.median(r["sync_samples_per_s"] for r in slows),
                       "impl": impl, "quick": quick, "cpu": cpu_name(), "cores": os.cpu_count()}}


def ch12_figure(impl: str, quick: bool = False) -> dict:
    lab = _plumbing(12, impl, "ch12_plumbing")
    if quick:  # the warm start alone: it rarely calls the tool, so this times little of the tools' latency
        base = lab.warm_start(str(lab.LAST_TRACE.with_name("ch12_base_seed0")), 0)
    else:
        base = lab.trained_policy(0)
    config = lab.ToolsConfig(seed=0, base=base)
    steps = 3 if quick else 30
    rows = asyncio.run(lab.depth_sweep(config, [config.loops], steps, zero=False, name="bench12", quiet=True))
    sync, run = rows
    latency = dataclasses.asdict(config.latency)
    return {"name": "async_vs_lockstep_ch12", "value": run["episodes_per_s"], "limit": sync["episodes_per_s"],
            "ratio": run["episodes_per_s"] / sync["episodes_per_s"], "unit": "episodes/s",
            "config": {"depth": config.loops, "groups_per_step": config.groups_per_step,
                       "group_size": config.group_size, "tool_latency": latency, "tools": config.tools,
                       "slots": config.slots, "generators": config.generators, "steps": steps,
                       "max_lag_bound": run["max_lag_bound"], "max_lag": run["max_lag"],
                       "mean_lag": round(run["mean_lag"], 3), "dropped": run["dropped"],
                       "lockstep_step_phases_s": {k: round(v, 4) for k, v in sync.get("phases_s", {}).items()},
                       "policy": "warm start" if quick else "trained", "impl": impl, "quick": quick,
                       "cpu": cpu_name(), "cores": os.cpu_count()}}


def data_plane_figures(quick: bool = False, impl: str | None = None) -> list[dict]:
    """[chapter 11's async share of its 0 ms rate at 100 ms, chapter 12's async against lock step]."""
    impl = selected_impl(impl)
    return [ch11_figure(impl, quick), ch12_figure(impl, quick)]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m koans.bench.async_depth", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few steps of each: a smoke test")
    parser.add_argument("--impl", default=None, choices=("exercises", "solutions"))
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    figures = data_plane_figures(args.quick, args.impl)
    for figure in figures:
        print(f"{figure['name']}: {figure['value']:.1f} / {figure['limit']:.1f} {figure['unit']} = "
              f"{figure['ratio']:.2f}   {figure['config']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(figures, handle, indent=2)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
