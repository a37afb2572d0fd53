"""A chapter's points, from the plan, the run's report, the guards' refusals and the judge's probes.

Every chapter is worth POINTS_PER_CHAPTER, shared evenly among its planned tests marked with a TODO
(koans.grading.plan: tests of given code earn nothing; tests marked `gpu` leave the share on a machine
without a GPU, and only those). A planned test passes only if the run reports it passed and the judge's
own probe of every TODO it is marked with agreed with the reference. A chapter scores 0, with the reason,
when a guard refused something at run time, when it ran out of time, or when its session ended before
every test ran.
"""

from __future__ import annotations

POINTS_PER_CHAPTER = 10.0


def whole_chapter(prefix: str, output: str, max_score: float = POINTS_PER_CHAPTER, passed: bool = False) -> dict:
    return {"name": f"{prefix}: all tests", "score": max_score if passed else 0.0, "max_score": max_score,
            "status": "passed" if passed else "failed", "output": output[-4000:]}


def chapter_entries(prefix: str, number: int, planned: list[dict], report: dict, *, timed_out: bool,
                    time_limit: float, refusals: list[str], probe_failures: dict[str, str], gpu: bool,
                    running: str | None = None, output: str = "", killed: bool = False,
                    ended: int | None = 0) -> list[dict]:
    """The chapter's entries of a Gradescope results.json."""
    if refusals:
        return [whole_chapter(prefix, "Refused at run time: the submitted code did something no TODO needs, so the "
                                      "chapter scores 0. Found:\n  " + "\n  ".join(refusals[:20]))]
    if timed_out:
        where = f" ({running} was running)" if running else ""
        return [whole_chapter(prefix, f"Timed out: the chapter's tests did not finish within {time_limit:.0f} s{where}. "
                                      f"A stub may be waiting forever; run `koans check {number}` to see where.")]
    if killed:
        return [whole_chapter(prefix, "Killed: the kernel ended the chapter's tests (SIGKILL) before they finished, "
                                      "most likely at the memory limit of the chapter's box. Run `koans check "
                                      f"{number}` to see how much your code allocates.\n" + output[-1500:])]
    if ended not in (0, 1):
        return [whole_chapter(prefix, f"The test session did not end as pytest ends one (exit status {ended}), so its "
                                      "report counts for nothing. Run `koans check "
                                      f"{number}` to see what ends it.\n" + output[-1500:])]
    tests = {t.get("nodeid"): t for t in report.get("tests", []) if isinstance(t, dict)}
    collected = report.get("collected")
    if not tests and not report:
        return [whole_chapter(prefix, "No test ran (the run left no report):\n" + output[-1500:])]
    if isinstance(collected, int) and len(tests) < collected:
        return [whole_chapter(prefix, f"The test session ended after {len(tests)} of its {collected} tests: the code "
                                      f"under test ended the process early. Run `koans check {number}` to see where.\n"
                                      + output[-1500:])]
    graded = [t for t in planned if t["todos"] and not (t["gpu"] and not gpu)]
    if not graded:
        return [whole_chapter(prefix, "every test of this chapter needs a GPU, and none is visible", 0.0, True)]
    share = round(POINTS_PER_CHAPTER / len(graded), 4)
    last_share = round(POINTS_PER_CHAPTER - share * (len(graded) - 1), 4)  # the shares add up to exactly 10
    entries = []
    for number, test in enumerate(graded, 1):
        mine = last_share if number == len(graded) else share
        ran = tests.get(test["nodeid"])
        judged = [f"TODO {todo}: {probe_failures[todo]}" for todo in test["todos"] if todo in probe_failures]
        outcome = ran.get("outcome") if isinstance(ran, dict) else None
        ok = outcome == "passed" and not judged
        if ok:
            text = ""
        elif outcome == "passed":
            text = ("The test passed, but the judge's own check on fresh inputs did not: the answers differ from the "
                    "reference's.\n" + "\n".join(judged))
        elif outcome == "skipped":
            text = ("Skipped itself: a test of a TODO that skips counts as failed (which tests leave the share is "
                    "decided before the run: only GPU tests, on a machine without one).")
        elif ran is None:
            text = "This test did not run."
        else:
            text = str(ran.get("note") or ran.get("message") or "failed")
        entries.append({"name": f"{prefix}: {test['name']}", "score": mine if ok else 0.0, "max_score": mine,
                        "status": "passed" if ok else "failed", "output": text[-2000:]})
    return entries
