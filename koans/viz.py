"""`koans viz`: one self-contained HTML page showing who was busy when, and what asynchrony buys.

Input: a chapter 10 timeline, as Chrome trace JSON. `python -m solutions.ch10_qwen_grpo`
writes one to .koans/ch10_trace.json on every run (and to --trace PATH if asked).

The page has two parts:

  measured   the lanes of the run as recorded: generate, train, sync, and the idle gaps
  replay     the same measured durations, rescheduled under a chosen bound on policy lag:

               max lag 0 (lock step)           max lag 2
               gen0  |GG    GG    GG  |        gen0  |GGGGGGGGGGGG|
               gen1  |GG    GG    GG  |        gen1  |GGGGGGGGGGGG|
               train |  TTww  TTww  TT|        train |  TTwwTTwwTT|

             A slider moves the bound from 0 to N; the page reports samples per second,
             the GPU-busy fraction (the share of GPU time spent generating or training,
             with one GPU per role) and each role's busy fraction.

The replay is a small discrete-event schedule (in the page's JavaScript):
groups are made in order, B per training step; a group for step s may start
once version s - max_lag is published; step s trains once its B groups are
done and the previous step has published. Nothing else is modelled, so the
replay shows the effect of the lag bound alone.

No CDN, no network: the data and the code are inline.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from koans.manifest import PROJECT_ROOT

DEFAULT_TRACE = PROJECT_ROOT / ".koans" / "ch10_trace.json"


class TraceError(ValueError):
    """A trace file that cannot be drawn; the message says what to do."""


def read_trace(path: Path) -> list[dict]:
    """The spans of a Chrome trace JSON, as {actor, kind, start, end, info} with times in seconds."""
    if not path.is_file():
        raise TraceError(f"no trace at {path}. Write one with: python -m solutions.ch10_qwen_grpo --trace {path} "
                         f"(every chapter 10 run also writes {DEFAULT_TRACE})")
    try:
        events = json.loads(path.read_text())["traceEvents"]
    except (ValueError, KeyError, TypeError) as err:
        raise TraceError(f"{path} is not a Chrome trace JSON with 'traceEvents' ({err}); "
                         "pass the file that chapter 10's --trace wrote") from None
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [{"actor": names.get(e["tid"], str(e["tid"])), "kind": e["name"], "start": e["ts"] / 1e6,
              "end": (e["ts"] + e["dur"]) / 1e6, "info": e.get("args", {})} for e in events if e.get("ph") == "X"]
    if not any(s["kind"] == "train" for s in spans) or not any(s["kind"] == "generate" for s in spans):
        raise TraceError(f"{path} has no 'train' and 'generate' spans: is it a chapter 10 timeline?")
    return sorted(spans, key=lambda s: s["start"])


def durations(spans: list[dict]) -> dict:
    """What the replay reuses: measured durations per kind, and the shape of a step."""

    def of(kind: str, role: str) -> list[float]:
        return [s["end"] - s["start"] for s in spans if s["kind"] == kind and s["actor"].startswith(role)]

    trains = [s for s in spans if s["kind"] == "train"]
    groups = int(statistics.median(s["info"].get("groups", 1) for s in trains))
    samples = int(statistics.median(s["info"].get("samples", groups) for s in trains))
    return {"generate": of("generate", "generator"), "pull": of("sync", "generator") or [0.0],
            "train": of("train", "trainer"), "publish": of("sync", "trainer") or [0.0],
            "generators": len({s["actor"] for s in spans if s["actor"].startswith("generator")}),
            "groups_per_step": groups, "samples_per_group": max(1, samples // max(groups, 1))}


def build_page(spans: list[dict], source: str = "", max_lag: int = 4) -> str:
    """The HTML page, with the spans and durations inline."""
    data = {"spans": spans, "durations": durations(spans), "source": source, "maxLag": max_lag}
    template = (Path(__file__).parent / "viz_page.html").read_text()
    return template.replace("/*DATA*/null", json.dumps(data))


def main(trace: str | None, out: str, max_lag: int = 4) -> int:
    path = Path(trace) if trace else DEFAULT_TRACE
    try:
        spans = read_trace(path)
    except TraceError as err:
        print(f"koans viz: {err}")
        return 2
    Path(out).write_text(build_page(spans, str(path), max_lag))
    print(f"koans viz: wrote {out} from {path} ({len(spans)} spans). Open it in a browser; no network needed.")
    return 0
