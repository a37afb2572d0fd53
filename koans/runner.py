"""Run one chapter's tests in a pytest subprocess and read back the results.

The `koans` CLI and `koans verify` both go through here. A subprocess keeps
each run's Monarch processes and imports apart, and a time limit means a
learner's hanging stub can never hang the runner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from koans.manifest import IMPL_ENV, PROJECT_ROOT, Chapter

CHAPTER_TIME_LIMIT_S = float(os.environ.get("KOANS_CHAPTER_TIME_LIMIT", "600"))


@dataclass
class ChapterRun:
    chapter: Chapter
    impl: str
    returncode: int
    tests: list[dict] = field(default_factory=list)
    output: str = ""
    timed_out: bool = False
    leftover_processes: list[int] = field(default_factory=list)

    def count(self, outcome: str) -> int:
        return sum(1 for t in self.tests if t["outcome"] == outcome)

    @property
    def passed(self) -> bool:
        """Every test passed (skips allowed), and the session itself was clean."""
        return (
            not self.timed_out
            and self.returncode == 0
            and bool(self.tests)
            and all(t["outcome"] in ("passed", "skipped") for t in self.tests)
        )

    @property
    def first_failure(self) -> dict | None:
        return next((t for t in self.tests if t["outcome"] in ("failed", "error")), None)


def run_chapter(
    chapter: Chapter,
    impl: str = "exercises",
    root: Path = PROJECT_ROOT,
    extra_args: tuple[str, ...] = (),
    time_limit_s: float = CHAPTER_TIME_LIMIT_S,
    env: dict[str, str] | None = None,
) -> ChapterRun:
    """Run `tests/test_chNN_*.py` of the project at `root` against `impl`."""
    with tempfile.TemporaryDirectory(prefix="koans-") as tmp:
        report = Path(tmp) / "results.json"
        command = [
            sys.executable, "-m", "pytest", str(root / "tests" / chapter.test_file.name),
            f"--impl={impl}", f"--koans-json={report}", "-q", "-p", "no:cacheprovider", *extra_args,
        ]
        run_env = {**os.environ, **(env or {})}
        run_env.pop(IMPL_ENV, None)  # the --impl option decides
        try:
            done = subprocess.run(command, cwd=root, env=run_env, capture_output=True, text=True, timeout=time_limit_s)
        except subprocess.TimeoutExpired as expired:
            output = (expired.stdout or b"").decode(errors="replace") if isinstance(expired.stdout, bytes) else (expired.stdout or "")
            return ChapterRun(chapter, impl, returncode=-1, output=output, timed_out=True)
        data = json.loads(report.read_text()) if report.is_file() else {"tests": [], "leftover_processes": []}
    return ChapterRun(
        chapter, impl, done.returncode, data["tests"], done.stdout + done.stderr,
        leftover_processes=data["leftover_processes"],
    )
