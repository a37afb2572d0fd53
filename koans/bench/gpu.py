"""`koans bench --gpu [--out gpu.json]`: every GPU figure of the course, in one command.

  1. every test marked `gpu` (pinned staging, CUDA IPC, no torn read over 200
     syncs, staging="auto" on one shared GPU, a Qwen2.5-0.5B-shaped policy
     trained on one GPU), against solutions/;
  2. the chapter 07 weight-sync benchmark on Qwen2.5-0.5B's shapes (about
     1 GB of bf16): trainer-blocked ms per sync, freshness, staging GB/s
     against the copy limit measured in the same run;
  3. chapter 10 in lock step and async, on a Qwen2.5-0.5B-shaped policy with
     random weights: samples per second and their ratio.

It prints one table, and writes one JSON that records the hardware. The
targets are reported, not asserted. Without a GPU it runs what a CPU can
(nothing of the above means much there) and says what it skipped. It is
sized to stay within a 10-minute command on one GPU: its parts took about
4 minutes on one H100 (docs/appendix/benchmarks.md, GPU figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from koans.course.manifest import PROJECT_ROOT

TARGETS = {
    "trainer_blocked_ms": ("<=", 5.0, "trainer-blocked ms per 1 GB sync"),
    "freshness_ms": ("<=", 50.0, "same-host freshness, ms"),
    "staging_vs_limit": (">=", 0.90, "staging / pinned D2H limit"),
    "async_over_sync": (">=", 1.3, "ch10 async / sync samples per second"),
}


def _hardware() -> dict:
    import torch

    from koans.bench.weight_sync import _hardware as cpu_and_gpu

    info = cpu_and_gpu()
    try:
        from importlib.metadata import version

        info["torchmonarch"] = version("torchmonarch")
    except Exception:
        info["torchmonarch"] = None
    info["python"] = sys.version.split()[0]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        info["cuda"] = torch.version.cuda
    return info


def gpu_tests(impl: str = "solutions") -> dict:
    """Run every `gpu`-marked test in a pytest subprocess; answer the counts and each test's outcome."""
    with tempfile.TemporaryDirectory(prefix="koans-gpu-") as tmp:
        report = Path(tmp) / "results.json"
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", f"--impl={impl}", f"--koans-json={report}",
                               "-q", "-p", "no:cacheprovider", "tests"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                              timeout=480)
        tests = json.loads(report.read_text())["tests"] if report.is_file() else []
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")}
    return {"counts": counts, "seconds": time.monotonic() - started, "returncode": done.returncode,
            "tests": [{"name": t["name"], "outcome": t["outcome"], "message": t["message"][-400:]} for t in tests],
            "output_tail": (done.stdout + done.stderr)[-1500:]}


def weight_sync(impl: str = "solutions") -> dict:
    from koans.bench import weight_sync as bench_weight_sync

    return bench_weight_sync.main(f"{impl}.ch07_weight_sync", ["--size", "0.5b", "--transports", "cuda_ipc,shm",
                                                                "--syncs", "5", "--step-ms", "150", "--gen-ms", "20"])


def grpo(impl: str = "solutions", steps: int = 12) -> dict:
    """Chapter 10 on a Qwen2.5-0.5B-shaped policy: lock step, then async, on the same config."""
    import importlib

    grpo_chapter = importlib.import_module(f"{impl}.ch10_qwen_grpo")
    plumbing = importlib.import_module(f"{impl}.ch10_plumbing")
    config = grpo_chapter.RunConfig(model="random:qwen2.5-0.5b", dtype="bfloat16", steps=steps, max_new_tokens=16,
                                    groups_per_step=8, group_size=8, kl_coef=0.0, loss_mean="sequence",
                                    max_grad_norm=None)
    figures = {}
    for mode in ("sync", "async"):
        run = plumbing.train(config, mode, name=f"gpu_{mode}")
        summary = plumbing.summary(run, config)
        figures[mode] = {"samples_per_s": summary["samples_per_s"], "seconds": summary["seconds"],
                         "publish_ms": summary["publish_ms"], "load_ms": summary["load_ms"],
                         "busy": summary["busy"]}
    figures["async_over_sync"] = figures["async"]["samples_per_s"] / figures["sync"]["samples_per_s"]
    figures["config"] = {"model": config.model, "dtype": config.dtype, "steps": steps,
                         "samples_per_step": config.groups_per_step * config.group_size,
                         "generators": config.generators, "max_new_tokens": config.max_new_tokens}
    return figures


def _check(value, key: str) -> str:
    if value is None:
        return "-"
    sense, target, _ = TARGETS[key]
    ok = value <= target if sense == "<=" else value >= target
    return "met" if ok else "missed"


def table(report: dict) -> str:
    lines = [f"{'figure':<44}{'measured':>12}{'target':>10}  ", "-" * 76]

    def row(name: str, value, unit: str = "", key: str | None = None) -> None:
        shown = "skipped" if value is None else (f"{value:.3g}{unit}" if isinstance(value, float) else f"{value}{unit}")
        target = f"{TARGETS[key][0]} {TARGETS[key][1]:g}" if key else ""
        lines.append(f"{name:<44}{shown:>12}{target:>10}  {_check(value, key) if key else ''}")

    tests = report.get("gpu_tests")
    if tests:
        c = tests["counts"]
        row("gpu tests passed / failed / skipped", f"{c['passed']}/{c['failed'] + c['error']}/{c['skipped']}")
    sync = report.get("weight_sync")
    for transport in ("cuda_ipc", "shm"):
        staged = next((r for r in (sync or {}).get("results", []) if r["transport"] == transport and r["mode"] == "staged"), None)
        summary = next((s for s in (sync or {}).get("summary", []) if s["transport"] == transport), {})
        row(f"{transport}: trainer-blocked ms per sync", staged and staged["trainer_blocked_ms"], " ms", "trainer_blocked_ms")
        row(f"{transport}: freshness ms", staged and staged["freshness_ms"], " ms", "freshness_ms")
        if transport == "shm":
            row(f"{transport}: staging / pinned D2H limit", summary.get("staging_vs_limit"), "", "staging_vs_limit")
        else:
            row(f"{transport}: staging / device-to-device limit", summary.get("staging_vs_limit"), "")
    if sync:
        row("copy limit: pinned D2H GB/s", sync["copy_limits"].get("d2h_pinned_gbps"), " GB/s")
    grpo_figures = report.get("grpo")
    row("ch10 sync samples/s", grpo_figures and grpo_figures["sync"]["samples_per_s"])
    row("ch10 async samples/s", grpo_figures and grpo_figures["async"]["samples_per_s"])
    row("ch10 async / sync", grpo_figures and grpo_figures["async_over_sync"], "x", "async_over_sync")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="koans bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="run every GPU test and benchmark")
    parser.add_argument("--data-plane", action="store_true",
                        help="instead: chapter 07's pull, chapter 08's reshard and async depth (11, 12), each beside its "
                             "limit (koans/bench/data_plane.py; with --json FILE, --quick, --only rdma,reshard,async)")
    parser.add_argument("--out", default="gpu.json", help="where to write the JSON (default gpu.json)")
    parser.add_argument("--impl", choices=["solutions", "exercises"], default="solutions",
                        help="whose code to measure (default: the reference solutions)")
    parser.add_argument("--grpo-steps", type=int, default=12, help="chapter 10 steps per mode")
    args = parser.parse_args(argv)
    if not args.gpu:
        parser.error("say --gpu: `koans bench --gpu --out gpu.json` runs every GPU test and benchmark")
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # CUDA RDMA buffers want it
    import torch

    started = time.monotonic()
    report: dict = {"hardware": _hardware(), "targets": {k: {"sense": s, "value": v, "what": w}
                                                          for k, (s, v, w) in TARGETS.items()}, "skipped": []}
    cuda = torch.cuda.is_available()
    print(f"koans bench --gpu on {report['hardware']['cpu']} ({report['hardware']['cores']} cores), "
          f"GPU: {report['hardware']['gpu'] or 'none'}, torch {report['hardware']['torch']}, "
          f"torchmonarch {report['hardware']['torchmonarch']}\n", flush=True)
    print("1/3 gpu-marked tests ...", flush=True)
    report["gpu_tests"] = gpu_tests(args.impl)
    if not cuda:
        report["skipped"] += ["weight_sync: needs a CUDA GPU (the 1 GB benchmark measures GPU staging and CUDA IPC)",
                              "grpo: needs a CUDA GPU (a Qwen2.5-0.5B-shaped policy on a CPU measures nothing useful)"]
        report["gpu_tests"]["note"] = "no CUDA GPU visible: every gpu-marked test was skipped"
    else:
        print("2/3 weight sync, 1 GB ...", flush=True)
        report["weight_sync"] = weight_sync(args.impl)
        print("3/3 chapter 10, sync then async ...", flush=True)
        report["grpo"] = grpo(args.impl, args.grpo_steps)
    report["seconds"] = time.monotonic() - started
    print("\n" + table(report))
    for line in report["skipped"]:
        print(f"skipped: {line}")
    if not cuda:
        print("No CUDA GPU is visible here: run this on a GPU machine for the figures.")
    Path(args.out).write_text(json.dumps(report, indent=2, default=str))
    print(f"\nwrote {args.out} in {report['seconds']:.0f} s")
    failed = report["gpu_tests"]["counts"]["failed"] + report["gpu_tests"]["counts"]["error"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
