"""Which tests make up each chapter's share, decided before anything submitted runs.

`collect()` asks pytest for every chapter's tests, on the pristine stubs, with the marks that matter:
the TODOs a test is marked with (only those tests earn points), and whether it needs a GPU. The
autograder zip carries the result (koans/grading/plan.json), so the judge knows, before a chapter
runs, which tests it expects and which of them leave the share (those marked `gpu`, on a machine
without one). Whatever a run reports about a test that is not in the plan is ignored; a planned test
that did not run, or skipped itself, counts as failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from koans.course.manifest import CHAPTERS, PROJECT_ROOT, Chapter

PLAN_FILE = Path("koans") / "grading" / "plan.json"


def write_plan(path: str, items: list[tuple[str, str, list[str], bool]]) -> None:
    """What conftest writes under --koans-plan: one entry per collected test."""
    Path(path).write_text(json.dumps([{"nodeid": nodeid, "name": name, "todos": todos, "gpu": gpu}
                                      for nodeid, name, todos, gpu in items], indent=1))


def collect(root: Path = PROJECT_ROOT, chapters: tuple[Chapter, ...] = CHAPTERS) -> dict[str, list[dict]]:
    """{chapter tag: [{"nodeid", "name", "todos", "gpu"}, ...]} for the tests at `root`, on its stubs."""
    with tempfile.TemporaryDirectory(prefix="koans-plan-") as tmp:
        out = Path(tmp) / "plan.json"
        files = [str(root / "tests" / chapter.test_file.name) for chapter in chapters]
        env = {k: v for k, v in os.environ.items() if k != "KOANS_IMPL"}
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               "--impl=exercises", f"--koans-plan={out}", *files], cwd=root, env=env,
                              capture_output=True, text=True, timeout=600)
        if not out.is_file():
            raise RuntimeError(f"collecting the chapters' tests failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        items = json.loads(out.read_text())
    plan = {chapter.tag: [] for chapter in chapters}
    for item in items:
        stem = Path(item["nodeid"].split("::")[0]).stem
        for chapter in chapters:
            if chapter.test_file.stem == stem:
                plan[chapter.tag].append(item)
    return plan


def load(root: Path = PROJECT_ROOT) -> dict[str, list[dict]] | None:
    path = root / PLAN_FILE
    return json.loads(path.read_text()) if path.is_file() else None
