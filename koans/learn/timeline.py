"""Per-actor timelines: who was busy with what, and when.

Each actor keeps a `Recorder` and wraps its work in spans:

    with self.recorder.span("generate", version=3):
        ...

The spans of all actors are merged by the caller (they share the host's
clock) and shown as an ASCII chart, or written as Chrome trace JSON for
Perfetto (https://ui.perfetto.dev). Chapters 09 and 10 use it.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Span:
    actor: str  # e.g. "generator0", "learner"
    kind: str  # e.g. "generate", "score", "train", "sync"
    start: float  # time.time() seconds
    end: float
    info: dict = field(default_factory=dict)


class Recorder:
    """Collects one actor's spans."""

    def __init__(self, actor: str):
        self.actor = actor
        self.spans: list[Span] = []

    @contextmanager
    def span(self, kind: str, **info):
        start = time.time()
        try:
            yield info  # the body may add to `info`, e.g. info["loss"] = ...
        finally:
            self.spans.append(Span(self.actor, kind, start, time.time(), dict(info)))


def merge(*span_lists: list[Span]) -> list[Span]:
    """All spans, ordered by start time."""
    return sorted((s for spans in span_lists for s in spans), key=lambda s: (s.start, s.end))


def busy_fraction(spans: list[Span], actor: str) -> float:
    """Share of the whole run's wall time in which `actor` was inside a span."""
    if not spans:
        return 0.0
    begin, finish = min(s.start for s in spans), max(s.end for s in spans)
    mine = sorted((s.start, s.end) for s in spans if s.actor == actor)
    busy, reach = 0.0, begin
    for start, end in mine:  # union of intervals
        start = max(start, reach)
        if end > start:
            busy += end - start
            reach = end
    return busy / max(finish - begin, 1e-9)


def ascii_timeline(spans: list[Span], width: int = 64, symbols: dict[str, str] | None = None) -> str:
    """One lane per actor; each column is a slice of time, marked by what the actor did then."""
    if not spans:
        return "(no spans recorded)"
    symbols = symbols or {"generate": "G", "score": "s", "train": "T", "sync": "w", "publish": "p"}
    begin, finish = min(s.start for s in spans), max(s.end for s in spans)
    column = (finish - begin) / width or 1e-9
    actors = sorted({s.actor for s in spans})
    lines = []
    for actor in actors:
        lane = [" "] * width
        for s in spans:
            if s.actor != actor:
                continue
            first = int((s.start - begin) / column)
            last = max(first, min(width - 1, int((s.end - begin) / column)))
            for i in range(first, last + 1):
                lane[min(i, width - 1)] = symbols.get(s.kind, s.kind[:1])
        lines.append(f"{actor:>12} |{''.join(lane)}|")
    legend = "  ".join(f"{v}={k}" for k, v in symbols.items() if any(s.kind == k for s in spans))
    lines.append(f"{'':>12}  0 s{' ' * (width - 12)}{finish - begin:6.1f} s")
    lines.append(f"{'':>12}  {legend}; blank = idle")
    return "\n".join(lines)


def chrome_trace(spans: list[Span]) -> dict:
    """The spans as Chrome trace events (open the JSON in Perfetto or chrome://tracing)."""
    actors = sorted({s.actor for s in spans})
    events = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": i, "args": {"name": a}} for i, a in enumerate(actors)]
    for s in spans:
        events.append({"name": s.kind, "ph": "X", "pid": 1, "tid": actors.index(s.actor),
                       "ts": s.start * 1e6, "dur": (s.end - s.start) * 1e6, "args": s.info})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(spans: list[Span], path: str) -> None:
    with open(path, "w") as out:
        json.dump(chrome_trace(spans), out)


def to_dicts(spans: list[Span]) -> list[dict]:
    return [asdict(s) for s in spans]
