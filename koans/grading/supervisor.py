"""What Gradescope's run_autograder starts: it always leaves a results.json, whatever happens to the judge.

    python -m koans.grading.supervisor --root /autograder

It runs the judge (koans.grading.judge) as a child, as root, with the grading image's reference
solutions, and waits for it within a deadline. Submitted code never runs here, nor in the judge: it
runs in the chapters' boxes, as other users, who cannot signal either process. If the judge ends
without a complete results.json (it crashed, the kernel killed it, it ran past the deadline), the
supervisor writes one: the chapters the judge had finished keep their scores, and the output says
what happened.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

DEADLINE_S = float(os.environ.get("KOANS_GRADING_DEADLINE_S", "5400"))


def _complete(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "score" in data and isinstance(data.get("tests"), list) else None


def _end_the_submission(judge) -> None:
    """Whatever the judge left running ends here: its own helpers, and every process of a chapter's user."""
    import signal

    from koans.grading.contain import chapter_user, is_root, kill_user_processes
    from koans.course.manifest import CHAPTERS

    if judge is not None:
        try:
            os.killpg(judge.pid, signal.SIGKILL)
        except OSError:
            pass
    if not is_root():
        return
    import pwd

    for chapter in CHAPTERS:
        try:
            kill_user_processes(pwd.getpwnam(chapter_user(chapter.tag)).pw_uid)
        except KeyError:
            pass


def supervise(root: Path, deadline_s: float = DEADLINE_S) -> int:
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)
    source = root / "source"
    reference = source / "judge" / "reference"
    try:  # the kernel's OOM killer ends a chapter's processes first (they are at +1000), never these
        Path("/proc/self/oom_score_adj").write_text("-1000")
    except OSError:
        pass
    command = [sys.executable, "-m", "koans.grading.judge", "--submission", str(root / "submission"),
               "--results", str(results)]
    if (reference / "solutions").is_dir():
        command += ["--reference", str(reference)]
    started, what, judge = time.monotonic(), None, None
    try:
        judge = subprocess.Popen(command, cwd=source, start_new_session=True)
        try:
            code = judge.wait(timeout=deadline_s)
            if code != 0:
                what = f"the grader stopped with exit status {code}"
        except subprocess.TimeoutExpired:
            judge.kill()
            judge.wait()
            what = f"the grader ran past its deadline ({deadline_s:.0f} s)"
    except OSError as err:
        what = f"the grader could not start: {err}"
    _end_the_submission(judge)
    data = _complete(results)
    if data is not None and what is None:
        return 0
    data = data or {"score": 0.0, "tests": [], "output": ""}
    data["output"] = (f"The grading did not finish: {what or 'no results came back'}, after "
                      f"{time.monotonic() - started:.0f} s. The chapters graded before that keep their scores; "
                      "the others are not in these results.\n" + data.get("output", ""))
    results.write_text(json.dumps(data, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m koans.grading.supervisor")
    parser.add_argument("--root", default=os.environ.get("AUTOGRADER_ROOT", "/autograder"))
    args = parser.parse_args(argv)
    return supervise(Path(args.root))


if __name__ == "__main__":
    sys.exit(main())
