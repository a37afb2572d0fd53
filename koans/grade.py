"""`koans grade`: score the exercises as an autograder would.

Writes a Gradescope results.json:

    {"score": 37.5, "output": "...",
     "tests": [{"name": "ch01 test_greet_returns_the_greeting", "score": 1.11,
                "max_score": 1.11, "status": "passed", "output": ""}, ...]}

Every chapter is worth POINTS_PER_CHAPTER, shared evenly among the tests of
what the learner writes: those marked with a TODO (tests of given code earn
nothing, and tests skipped for want of a GPU are left out of the share). Each chapter runs
in its own pytest subprocess with a time limit, so grading never hangs: a
chapter that runs out of time scores 0, with a message that says so; so does one whose session
ended before every test had run.

`koans grade` scores this checkout's exercises/ as they are. For work you do not trust, use the
autograder's path (koans.autograder), which grades only the TODO regions, after a static check.
"""

from __future__ import annotations

import json
from pathlib import Path

from koans.manifest import Chapter, selected_chapters
from koans.runner import CHAPTER_TIME_LIMIT_S, ChapterRun, run_chapter

POINTS_PER_CHAPTER = 10.0


def _chapter_entries(chapter: Chapter, run: ChapterRun, time_limit: float) -> list[dict]:
    prefix = f"{chapter.tag} {chapter.slug}"
    if run.timed_out:
        running = f" ({run.running['name']} was running)" if run.running else ""
        where = ("\n" + run.hangs[0]["text"]) if run.hangs else ""  # where it waited, if the watchdog saw it
        return [{"name": f"{prefix}: all tests", "score": 0.0, "max_score": POINTS_PER_CHAPTER, "status": "failed",
                 "output": f"Timed out: the chapter's tests did not finish within {time_limit:.0f} s{running}. A stub "
                           "may be waiting forever; run `koans check "
                           f"{chapter.number}` to see where.{where}"}]
    if run.collected is not None and len(run.tests) < run.collected:
        # The session ended before every test had run (the code under test exited or killed the process):
        # the tests that ran are no fair sample of the chapter, so they earn nothing.
        return [{"name": f"{prefix}: all tests", "score": 0.0, "max_score": POINTS_PER_CHAPTER, "status": "failed",
                 "output": f"The test session ended after {len(run.tests)} of its {run.collected} tests: the code "
                           "under test ended the process early. Run `koans check "
                           f"{chapter.number}` to see where.\n" + run.output[-1500:]}]
    # Only tests of what the learner writes earn points: those marked with a TODO (`koans verify` checks
    # that each fails against the pristine stubs). A test of given code proves nothing about the learner.
    graded = [t for t in run.tests if t["outcome"] != "skipped" and t.get("marked")]
    if not graded:
        why = "every test was skipped (they need a GPU)" if run.tests else "no test ran:\n" + run.output[-1500:]
        return [{"name": f"{prefix}: all tests", "score": 0.0, "max_score": 0.0 if run.tests else POINTS_PER_CHAPTER,
                 "status": "passed" if run.tests else "failed", "output": why}]
    share = POINTS_PER_CHAPTER / len(graded)
    entries = []
    for test in graded:
        ok = test["outcome"] == "passed"
        entries.append({"name": f"{prefix}: {test['name']}", "score": round(share if ok else 0.0, 4),
                        "max_score": round(share, 4), "status": "passed" if ok else "failed",
                        "output": "" if ok else (test["note"] or test["message"])[-2000:]})
    return entries


def grade(out: Path, time_limit: float | None = None, chapters: tuple[Chapter, ...] | None = None) -> int:
    time_limit = time_limit or CHAPTER_TIME_LIMIT_S
    chapters = chapters or selected_chapters()
    entries, lines = [], []
    for chapter in chapters:
        if chapter.gpu_missing():
            entries.append({"name": f"{chapter.tag} {chapter.slug}: all tests", "score": 0.0, "max_score": 0.0,
                            "status": "passed", "output": "skipped: this chapter needs a CUDA GPU and none is visible"})
            lines.append(f"{chapter.tag}: skipped (needs a GPU)")
            continue
        run = run_chapter(chapter, "exercises", time_limit_s=time_limit)
        mine = _chapter_entries(chapter, run, time_limit)
        entries += mine
        got, of = sum(e["score"] for e in mine), sum(e["max_score"] for e in mine)
        lines.append(f"{chapter.tag}: {got:.1f} / {of:.1f}" + (" (timed out)" if run.timed_out else ""))
        print(lines[-1], flush=True)
    score = round(sum(e["score"] for e in entries), 2)
    total = round(sum(e["max_score"] for e in entries), 2)
    result = {"score": score, "output": f"Total {score} / {total}\n" + "\n".join(lines), "tests": entries}
    out.write_text(json.dumps(result, indent=2))
    print(f"Total {score} / {total}; wrote {out}")
    return 0
