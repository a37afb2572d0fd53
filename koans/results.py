"""Per-test results as JSON, for the `koans` runner (`pytest --koans-json PATH`)."""

from __future__ import annotations

import json
from pathlib import Path


class ResultLog:
    """Collects one entry per test from its setup/call/teardown reports."""

    def __init__(self, path: str | None):
        self.path = Path(path) if path else None
        self.tests: dict[str, dict] = {}

    def add(self, name: str, report, todo_keys: list[str]) -> None:
        if self.path is None:
            return
        entry = self.tests.setdefault(
            report.nodeid,
            {"nodeid": report.nodeid, "name": name, "outcome": "passed", "message": "", "note": "",
             "duration_s": 0.0, "todos": todo_keys},
        )
        entry["duration_s"] += report.duration
        if report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"
            entry["message"] = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        elif report.failed:
            entry["outcome"] = "failed" if report.when == "call" else "error"
            entry["message"] = str(report.longrepr)
            entry["note"] = getattr(report, "koans_note", "")

    def write(self, leftover_processes) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"tests": list(self.tests.values()), "leftover_processes": [pid for pid, _ in leftover_processes]}
        self.path.write_text(json.dumps(data, indent=2))
