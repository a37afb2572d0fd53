"""What pytest tells the `koans` runner: per-test results as JSON, and live progress.

`pytest --koans-json PATH` writes every test's result at the end of the session.
`pytest --koans-progress PATH` appends one JSON object per line while the
session runs, so the runner can show a hang notice, or each test as it
finishes, before pytest is done:

    {"event": "collected", "count": 9}
    {"event": "start", "nodeid": ..., "name": ..., "todos": ["Greeter.greet"]}
    {"event": "done", "nodeid": ..., "name": ..., "outcome": "failed", ...}  (the test's full entry)
    {"event": "hang", "name": ..., "todos": [...], "text": "Still waiting after 10 s ..."}
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

#: What a wait that never ends usually is: said by the hang notice (koans.testkit.hangs) and by the runner (koans.learn.show).
LIKELY_HANG_CAUSE = "a missing `await`/`.get()`, or an endpoint that never returns"


def _open(path: Path, mode: str):
    """`open(path, mode)`; for /dev/fd/N, the inherited descriptor N itself (the grader's pipes cannot be
    opened again by path once the process has dropped to another user)."""
    if path.parent == Path("/dev/fd") and path.name.isdigit():
        return os.fdopen(os.dup(int(path.name)), mode)
    return open(path, mode)


class ResultLog:
    """Collects one entry per test from its setup/call/teardown reports."""

    def __init__(self, path: str | None):
        self.path = Path(path) if path else None
        self.tests: dict[str, dict] = {}
        self.collected: int | None = None
        self.warnings: list[dict] = []  # each distinct warning once, in the order they came
        self.probes: dict | None = None  # the grader's probes, answered (koans.grading.probes)

    def warn(self, category: str, message: str, where: str) -> None:
        entry = {"category": category, "message": message, "where": where}
        if not any(w["category"] == category and w["message"] == message for w in self.warnings):
            self.warnings.append(entry)

    def add(self, name: str, report, todo_keys: list[str], marked: list[str] | None = None) -> None:
        """`todo_keys`: what a failure is about (else the marked TODOs); `marked`: the test's own marks."""
        entry = self.tests.setdefault(
            report.nodeid,
            {"nodeid": report.nodeid, "name": name, "outcome": "passed", "message": "", "note": "",
             "summary": None, "duration_s": 0.0, "todos": todo_keys, "hint": None,
             "marked": marked if marked is not None else todo_keys},
        )
        entry["duration_s"] += report.duration
        if report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
            entry["message"] = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        elif report.failed and entry["outcome"] not in ("failed", "error"):  # the first failure of a test is its story
            entry["outcome"] = "failed" if report.when == "call" else "error"
            entry["message"] = str(report.longrepr)
            entry["note"] = getattr(report, "koans_note", "")
            entry["summary"] = getattr(report, "koans_summary", None)
            entry["todos"] = todo_keys  # what the failure is about (the marked TODOs, or those it names)
            entry["hint"] = getattr(report, "koans_hint", None)

    def entry(self, nodeid: str) -> dict | None:
        return self.tests.get(nodeid)

    def write(self, leftover_processes) -> None:
        if self.path is None:
            return
        if self.path.parent != Path("/dev/fd"):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"tests": list(self.tests.values()), "collected": self.collected, "warnings": self.warnings,
                "leftover_processes": [pid for pid, _ in leftover_processes]}
        if self.probes is not None:
            data["probes"] = self.probes
        with _open(self.path, "w") as out:
            out.write(json.dumps(data, indent=2))


class ProgressLog:
    """Appends JSON-lines events to a file (from any thread); does nothing without a path."""

    def __init__(self, path: str | None):
        self.path = Path(path) if path else None
        self._lock = threading.Lock()

    def event(self, kind: str, **data) -> None:
        if self.path is None:
            return
        line = json.dumps({"event": kind, **data}) + "\n"
        with self._lock, _open(self.path, "a") as out:
            out.write(line)
            out.flush()


def read_events(path: Path, offset: int = 0) -> tuple[list[dict], int]:
    """The complete event lines of a progress file from `offset`, and the offset after them."""
    try:
        with open(path, "rb") as src:
            src.seek(offset)
            chunk = src.read()
    except OSError:
        return [], offset
    end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next read
    events = []
    for line in chunk[:end].splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events, offset + end
