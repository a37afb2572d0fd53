"""The data plane at its limit, in one command: each figure beside a limit measured in the same run.

    koans bench --data-plane [--quick] [--only rdma,reshard,async] [--json FILE]

Three benchmarks, each in its own module (run alone, they print more):

  rdma      chapter 07's snapshot pull against ONE raw read_into of the same bytes (koans/bench/rdma.py)
  reshard   chapter 08's overlap reshard against torch's redistribute and a raw read (koans/bench/reshard.py)
  async     chapter 11's async share of its 0 ms rate at 100 ms, and chapter 12's async against lock step
            (koans/bench/async_depth.py)

Every figure is {"name", "value", "limit", "ratio", "unit", "config"}: `ratio` is throughput over the
limit's for the pulls and the async figures, and time over the baseline's for `reshard_vs_*`. The JSON
also records the machine and the time it was measured. No test asserts a speed: these are measured, and
docs/appendix/benchmarks.md keeps them with their commands. `--quick` is a smoke test (small sizes, a few
steps): its numbers mean little.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys

BENCHES = ("rdma", "reshard", "async")


def measure(name: str, quick: bool) -> list[dict]:
    if name == "rdma":
        from koans.bench.rdma import data_plane_figures
    elif name == "reshard":
        from koans.bench.reshard import data_plane_figures
    else:
        from koans.bench.async_depth import data_plane_figures
    return data_plane_figures(quick=quick)


def machine() -> dict:
    import monarch
    import torch

    from koans.bench.kv_recompute import cpu_name

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
            "torch": torch.__version__, "torchmonarch": getattr(monarch, "__version__", "?"),
            "load_average_at_start": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="koans bench --data-plane", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few steps: a smoke test")
    parser.add_argument("--only", default=",".join(BENCHES), help=f"a comma-separated subset of {', '.join(BENCHES)}")
    parser.add_argument("--json", metavar="FILE", help="write the figures (and the machine) here")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(BENCHES))
    if unknown:
        parser.error(f"--only: no benchmark {', '.join(unknown)}; choose from {', '.join(BENCHES)}")
    os.environ.setdefault("KOANS_IMPL", "solutions")  # the reference code, unless the caller chose otherwise
    report = {"machine": machine(), "started": datetime.datetime.now().isoformat(timespec="seconds"),
              "quick": args.quick, "figures": []}
    for name in chosen:
        print(f"== {name}", flush=True)
        for figure in measure(name, args.quick):
            report["figures"].append(figure)
            print(f"  {figure['name']:<36} {figure['value']:>10.4g} {figure['unit']:<11} limit {figure['limit']:>10.4g}"
                  f"   ratio {figure['ratio']:.2f}", flush=True)
    report["load_average_at_end"] = os.getloadavg()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2, default=str)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
