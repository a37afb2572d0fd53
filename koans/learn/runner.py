"""Run one chapter's tests in a pytest subprocess and read back the results.

The `koans` CLI, `koans grade` and `koans verify` all go through here. A
subprocess keeps each run's Monarch processes and imports apart, and a time
limit means a learner's hanging stub can never hang the runner.

While pytest runs, the runner follows its progress events (conftest.py writes
them with --koans-progress) and hands each to `on_event`, so the CLI can show
a hang notice, or each test as it finishes, before the run is over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from koans.course.manifest import IMPL_ENV, PROJECT_ROOT, Chapter
from koans.testkit import forkserver
from koans.testkit.results import read_events
from koans.testkit.time_limit import CHAPTER_TIME_LIMIT_S

# One chapter's session polls supervision every 100 ms (conftest's default is 500 ms): a death is
# seen sooner, which made `koans check 6` about 2 s faster on 2 cores. Each live mesh is polled,
# so over the whole suite, with many meshes alive at once, 100 ms cost more than it saved
# (365 s against 252 s, measured on 2 cores).
SUPERVISION_POLL = ("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "100ms")


@dataclass
class ChapterRun:
    chapter: Chapter
    impl: str
    returncode: int
    tests: list[dict] = field(default_factory=list)
    output: str = ""
    timed_out: bool = False
    leftover_processes: list[int] = field(default_factory=list)
    collected: int | None = None  # tests pytest collected (more than ran when it stopped at a failure)
    running: dict | None = None  # the test that was running when the time limit struck
    hangs: list[dict] = field(default_factory=list)  # hang notices, as they were sent
    syntax_error: str | None = None  # set by the CLI instead of running pytest at all
    warnings: list[dict] = field(default_factory=list)  # Python warnings the run raised, each once
    time_limit_s: float = CHAPTER_TIME_LIMIT_S

    def count(self, outcome: str) -> int:
        return sum(1 for t in self.tests if t["outcome"] == outcome)

    @property
    def total(self) -> int:
        return max(self.collected or 0, len(self.tests))

    @property
    def passed(self) -> bool:
        """Every test passed (skips allowed), and the session itself was clean."""
        return (
            not self.timed_out
            and self.syntax_error is None
            and self.returncode == 0
            and bool(self.tests)
            and all(t["outcome"] in ("passed", "skipped") for t in self.tests)
        )

    @property
    def stopped_early(self) -> bool:
        """It stopped at the first failure, so some tests did not run."""
        return self.first_failure is not None and len(self.tests) < self.total

    @property
    def first_failure(self) -> dict | None:
        return next((t for t in self.tests if t["outcome"] in ("failed", "error")), None)


def _kill(process: subprocess.Popen) -> None:
    """Kill pytest and whatever it started (it leads its own process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        process.kill()
    process.wait()


def run_chapter(
    chapter: Chapter,
    impl: str = "exercises",
    root: Path = PROJECT_ROOT,
    extra_args: tuple[str, ...] = (),
    time_limit_s: float = CHAPTER_TIME_LIMIT_S,
    env: dict[str, str] | None = None,
    first_failure_only: bool = False,
    on_event: Callable[[dict], None] | None = None,
) -> ChapterRun:
    """Run `tests/test_chNN_*.py` of the project at `root` against `impl`.

    With `first_failure_only`, pytest stops at the first failing test (`-x`): the tests of a
    chapter follow its TODOs, so the first failure is the next thing to write.
    """
    with tempfile.TemporaryDirectory(prefix="koans-") as tmp:
        report, progress, log = Path(tmp) / "results.json", Path(tmp) / "progress.jsonl", Path(tmp) / "output.txt"
        pytest_args = [
            str(root / "tests" / chapter.test_file.name),
            f"--impl={impl}", f"--koans-json={report}", f"--koans-progress={progress}", "-q", "-p", "no:cacheprovider",
            *(["-x"] if first_failure_only else []), *extra_args,
        ]
        command = [sys.executable, "-m", "pytest", *pytest_args]
        if os.environ.get(forkserver.SHARED_ENV):  # koans verify's warm process: fork the session from it
            command = [sys.executable, "-S", forkserver.__file__, "pytest", *pytest_args]
        run_env = {**os.environ, **(env or {})}
        run_env.pop(IMPL_ENV, None)  # the --impl option decides
        run_env.setdefault(*SUPERVISION_POLL)
        run = ChapterRun(chapter, impl, returncode=-1, time_limit_s=time_limit_s)
        done_tests: dict[str, dict] = {}
        offset, deadline = 0, time.monotonic() + time_limit_s

        def follow() -> None:
            nonlocal offset
            events, offset = read_events(progress, offset)
            for event in events:
                kind = event.get("event")
                if kind == "collected":
                    run.collected = event["count"]
                elif kind == "start":
                    run.running = event
                elif kind == "done":
                    run.running = None
                    done_tests[event["nodeid"]] = {k: v for k, v in event.items() if k != "event"}
                elif kind == "hang":
                    run.hangs.append(event)
                if on_event is not None:
                    on_event(event)

        with open(log, "w") as output:
            process = subprocess.Popen(command, cwd=root, env=run_env, stdout=output, stderr=subprocess.STDOUT,
                                       text=True, start_new_session=True)
            try:
                while process.poll() is None:
                    follow()
                    if time.monotonic() > deadline:
                        run.timed_out = True
                        _kill(process)
                        break
                    time.sleep(0.1)
            except BaseException:  # Ctrl-C, say: leave nothing running
                _kill(process)
                raise
        follow()
        run.returncode = process.returncode if not run.timed_out else -1
        run.output = log.read_text(errors="replace")
        if report.is_file() and not run.timed_out:
            data = json.loads(report.read_text())
            run.tests = data["tests"]
            run.collected = data.get("collected", run.collected)
            run.leftover_processes = data["leftover_processes"]
            run.warnings = data.get("warnings", [])
            run.running = None
        else:  # killed: what finished before that
            run.tests = list(done_tests.values())
    return run
