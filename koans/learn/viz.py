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

from koans.course.manifest import PROJECT_ROOT

DEFAULT_TRACE = PROJECT_ROOT / ".koans" / "ch10_trace.json"
#: Where the page goes unless --out says otherwise: beside the run's files, which git ignores.
DEFAULT_PAGE = PROJECT_ROOT / ".koans" / "viz.html"
#: What `python -m solutions.ch10_qwen_grpo --compare` measured last: samples/s in lock step and async.
DEFAULT_COMPARE = PROJECT_ROOT / ".koans" / "ch10_compare.json"


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
            "generators": len({s["actor"].split(" (")[0] for s in spans if s["actor"].startswith("generator")}),
            "groups_per_step": groups, "samples_per_group": max(1, samples // max(groups, 1))}


def build_page(spans: list[dict], source: str = "", max_lag: int = 4, measured: dict | None = None) -> str:
    """The HTML page, with the spans and durations inline; `measured`: {"sync", "async", "machine"} samples/s."""
    data = {"spans": spans, "durations": durations(spans), "source": source, "maxLag": max_lag, "measured": measured}
    template = (Path(__file__).parent / "viz_page.html").read_text()
    return template.replace("/*DATA*/null", json.dumps(data))


def read_measured(path: Path = DEFAULT_COMPARE) -> dict | None:
    try:
        data = json.loads(path.read_text())
        return {"sync": float(data["sync"]), "async": float(data["async"]), "machine": str(data.get("machine", "?"))}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def sweep_page(report: dict, source: str = "") -> str:
    """chapter 11's sweep as a static page: reward against max lag, one line per correction, and the table."""
    lags, corrections = report["lags"], report["corrections"]
    cells = report["cells"]
    colors = {"none": "#9c755f", "clip": "#4e79a7", "tis": "#f28e2b", "decoupled": "#e15759"}
    values = [cells[f"{lag}/{c}"]["mean"] for lag in lags for c in corrections]
    low, high = min(values + [0.0]), max(values + [0.05])
    width, height, left, bottom = 640, 300, 50, 30
    x = {lag: left + i * (width - left - 20) / max(1, len(lags) - 1) for i, lag in enumerate(lags)}

    def y(value: float) -> float:
        return 10 + (high - value) / (high - low) * (height - bottom - 10)

    svg = [f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" id="sweep-chart">']
    for lag in lags:
        svg.append(f'<text x="{x[lag]:.0f}" y="{height - 8}" font-size="12" text-anchor="middle">lag {lag}</text>')
    for value in (low, (low + high) / 2, high):
        svg.append(f'<text x="4" y="{y(value) + 4:.0f}" font-size="11">{value:.2f}</text>')
    for correction in corrections:
        points = " ".join(f"{x[lag]:.1f},{y(cells[f'{lag}/{correction}']['mean']):.1f}" for lag in lags)
        svg.append(f'<polyline fill="none" stroke="{colors.get(correction, "#777")}" stroke-width="2" points="{points}"/>')
    svg.append("</svg>")
    rows = "".join(
        f"<tr><td>{lag}</td>" + "".join(
            f"<td>{cells[f'{lag}/{c}']['mean']:.2f} &plusmn; {cells[f'{lag}/{c}']['spread']:.2f}</td>" for c in corrections)
        + f"<td>{sum(cells[f'{lag}/{c}']['mean_ess'] for c in corrections) / len(corrections):.2f}</td></tr>"
        for lag in lags)
    legend = " ".join(f'<span style="color:{colors.get(c, "#777")}">&#9632; {c}</span>' for c in corrections)
    return f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>koans viz: the staleness sweep</title>
<style>body {{ font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 900px; }}
td, th {{ padding: 3px 12px 3px 0; text-align: left; }}</style></head><body>
<h1>Chapter 11: final reward against max lag</h1>
<p>{source}: {report['steps']} steps per run, {len(report['seeds'])} seeds, the same samples per run. {legend}</p>
{''.join(svg)}
<table id="sweep-table"><tr><th>max lag</th>{''.join(f'<th>{c}</th>' for c in corrections)}<th>ESS</th></tr>{rows}</table>
</body></html>"""


def main(trace: str | None, out: str | None = None, max_lag: int = 4, sweep: str | None = None) -> int:
    out = out or str(DEFAULT_PAGE)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    if sweep:
        try:
            report = json.loads(Path(sweep).read_text())
            page = sweep_page(report, sweep)
        except (OSError, ValueError, KeyError, TypeError) as err:
            print(f"koans viz: {sweep} is not a chapter 11 sweep ({type(err).__name__}: {err}); write one with: "
                  "python -m solutions.ch11_staleness --sweep --json ch11_sweep.json")
            return 2
        Path(out).write_text(page)
        print(f"koans viz: wrote {out} from {sweep}. Open it in a browser; no network needed.")
        return 0
    path = Path(trace) if trace else DEFAULT_TRACE
    try:
        spans = read_trace(path)
    except TraceError as err:
        print(f"koans viz: {err}")
        return 2
    Path(out).write_text(build_page(spans, str(path), max_lag, read_measured()))
    print(f"koans viz: wrote {out} from {path} ({len(spans)} spans). Open it in a browser; no network needed.")
    return 0
