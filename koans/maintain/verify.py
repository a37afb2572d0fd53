"""`koans verify`: prove that every chapter's tests really gate its TODOs.

For maintainers and CI. Each check must hold, else the exit code is 1:

  sync        exercises/ equals what koans.maintain.stubgen generates from solutions/
  solutions   (with --solutions) every chapter passes against solutions/
  exercises   every chapter fails against exercises/, every failing test points
              at a TODO, of this chapter or of one it builds on (no bare harness
              errors), and no test marked with a TODO passes (a blank submission
              scores 0)
  workshop    at the workshop's depth (koans workshop: stretch TODOs given), a
              chapter still fails on its core TODOs, and only on them
  each TODO   for every single TODO, a copy of the project in which only that
              TODO is stubbed (all others solved) fails the chapter's tests, and
              the first failing test is one marked with that TODO: no TODO can
              be skipped without a test noticing and naming it
  mutants     (with --mutants) every plausible wrong answer in mutants/ (koans/maintain/mutants.py),
              applied alone, fails a test marked with its TODO (only those tests run); a
              table per chapter. CI runs them all; --mutants=sample takes the first
              mutant of each TODO.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from koans.course.depth import fill_text
from koans.course.manifest import CHAPTERS, PROJECT_ROOT, Chapter, find_chapter
from koans.course.todos import make_exercise, out_of_sync
from koans.learn.runner import run_chapter
from koans.learn.show import _show_failure, _show_hint
from koans.maintain.mutants import mutants_of, names_clause, write_mutated_copy
from koans.maintain.project_copy import copy_project_with_exercise, copy_project_with_one_stub
from koans.testkit.code_under_test import chapter_todos
from koans.testkit.zygote import Zygote

def _say(ok: bool, text: str) -> bool:
    print(f"  [{'ok' if ok else 'FAIL'}] {text}", flush=True)
    return ok


def _indented_tail(output: str, lines: int = 40) -> str:
    return "\n".join("      | " + line for line in output.rstrip().splitlines()[-lines:])


def check_sync() -> bool:
    stale = out_of_sync(PROJECT_ROOT / "solutions", PROJECT_ROOT / "exercises")
    return _say(not stale, "exercises/ in sync with solutions/" + (f": stale {stale}; run python -m koans.maintain.stubgen" if stale else ""))


def check_solutions(chapter: Chapter) -> bool:
    started = time.monotonic()
    run = run_chapter(chapter, "solutions")
    took = time.monotonic() - started
    detail = f"{run.count('passed')} passed, {run.count('skipped')} skipped in {took:.1f}s"
    if not run.passed:
        detail += "\n" + run.output[-3000:]
    return _say(run.passed, f"{chapter.tag} passes against solutions/ ({detail})")


def check_exercises(chapter: Chapter) -> bool:
    run = run_chapter(chapter, "exercises")
    failing = [t for t in run.tests if t["outcome"] in ("failed", "error")]
    # A fixture may stop at an earlier chapter's TODO (chapter 10 runs on 03, 06, 07 and 09):
    # that error still points at a TODO. Only failures that name none are harness errors.
    harness_errors = [t["name"] for t in failing if "TODO(" not in t["note"]]
    # Grading counts only tests marked with a TODO: none may pass against the stubs (a blank submission scores 0).
    free_points = [t["name"] for t in run.tests if t["outcome"] == "passed" and t.get("marked")]
    ok = bool(failing) and not harness_errors and not free_points and not run.timed_out
    detail = f"{len(failing)}/{len(run.tests)} tests fail, each pointing at a TODO; no marked test passes"
    if harness_errors:
        detail = f"these failures do not point at a TODO: {harness_errors}"
    if free_points:
        detail = f"these tests are marked with a TODO, yet pass against the stubs (points for nothing): {free_points}"
    if not failing:
        detail = "no test fails: the stubs are not gated\n" + run.output[-2000:]
    return _say(ok, f"{chapter.tag} fails against exercises/ ({detail})")


def check_workshop_depth(chapter: Chapter) -> bool:
    """At the workshop's depth (stretch TODOs given), the chapter still fails on its stubs, and every
    failing test is marked with a core TODO (never only with a stretch one, which is given)."""
    with tempfile.TemporaryDirectory(prefix=f"koans-workshop-{chapter.tag}-") as tmp:
        copy_project_with_exercise(
            chapter, lambda text, path: fill_text(chapter, make_exercise(text, path), PROJECT_ROOT)[0], Path(tmp))
        for name in ("exercises",):  # the other chapters at their stubs too, as a learner has them
            for other in CHAPTERS:
                if other is not chapter:
                    solution = PROJECT_ROOT / "solutions" / f"{other.module}.py"
                    (Path(tmp) / name / solution.name).write_text(make_exercise(solution.read_text(), str(solution)))
        run = run_chapter(chapter, "exercises", root=Path(tmp))
    failing = [t for t in run.tests if t["outcome"] in ("failed", "error")]
    core = {todo.key for todo in chapter_todos(chapter)} - set(chapter.stretch)
    stray = [t["name"] for t in failing if t["todos"] and not set(t["todos"]) & core
             and set(t["todos"]) <= set(chapter.stretch)]
    ok = bool(failing) and not stray and not run.timed_out
    detail = f"{len(failing)}/{len(run.tests)} tests fail, on core TODOs"
    if stray:
        detail = f"these fail on a stretch TODO, though it is given: {stray}"
    if not failing:
        detail = "no test fails: the core TODOs are not gated"
    return _say(ok, f"{chapter.tag} at the workshop's depth (stretch {', '.join(chapter.stretch)} given) ({detail})")


def check_each_todo(chapter: Chapter) -> bool:
    def run_one(todo):
        with tempfile.TemporaryDirectory(prefix=f"koans-{chapter.tag}-") as tmp:
            copy_project_with_one_stub(chapter, todo.key, Path(tmp))
            return run_chapter(chapter, "exercises", root=Path(tmp), first_failure_only=True)

    ok = True
    todos = chapter_todos(chapter)
    with ThreadPoolExecutor(max_workers=_jobs()) as pool:  # reported in the TODOs' order
        for todo, run in zip(todos, pool.map(run_one, todos)):
            first = run.first_failure
            if first is None:
                outcome = "timed out before any test failed" if run.timed_out else "fails NO TEST"
                ok &= _say(False, f"{chapter.tag} {todo.key}: stubbing only this TODO {outcome}")
                print(_indented_tail(run.output), flush=True)
            else:
                # The first failure must be a test marked with this TODO, so that its
                # message names the right TODO and `koans` leads the learner to it.
                named = todo.key in first["todos"]
                ok &= _say(named, f"{chapter.tag} {todo.key}: stubbing only this TODO fails {first['name']}"
                           + ("" if named else f", which is not marked @pytest.mark.todo({todo.key!r})"))
                if not named:
                    print(_indented_tail(run.output), flush=True)
    return ok


#: `koans verify --messages` fails a chapter whose messages name the broken clause for fewer of its mutants.
MESSAGE_FLOOR = 0.95


def _jobs() -> int:
    """Test sessions run at once ($KOANS_VERIFY_JOBS, default 2): each spends much of its time waiting
    (Monarch replies, process deaths), so two overlap well even on 2 cores."""
    return max(1, int(os.environ.get("KOANS_VERIFY_JOBS", "2")))


def check_mutants(chapter: Chapter, sample: bool, messages: bool = False) -> tuple[bool, dict]:
    """Apply each mutant of the chapter alone; each must fail a test marked with its TODO."""
    mutants = mutants_of(chapter)
    if sample:
        firsts: dict[str, object] = {}
        for mutant in mutants:
            firsts.setdefault(mutant.todo, mutant)
        mutants = list(firsts.values())
    ok, caught, started = True, 0, time.monotonic()
    env = {"KOANS_TIMEOUT": "10", "KOANS_TEST_TIME_LIMIT": "60"}  # a mutant that hangs fails sooner

    def run_one(mutant):
        mutant_started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"koans-mutant-{chapter.tag}-") as tmp:
            write_mutated_copy(chapter, mutant, Path(tmp))
            run = run_chapter(chapter, "exercises", root=Path(tmp), first_failure_only=True, env=env,
                              extra_args=("--koans-only-todo", mutant.todo))  # caught = a test marked with it fails
        return run, time.monotonic() - mutant_started

    named = 0
    with ThreadPoolExecutor(max_workers=_jobs()) as pool:  # reported in the mutants' order
        runs = pool.map(run_one, mutants)
        for mutant, (run, seconds) in zip(mutants, runs):
            ok, caught = _report_mutant(chapter, mutant, run, seconds, ok, caught)
            if messages and run.first_failure is not None:
                named += _show_learner_view(chapter, mutant, run)
    row = {"chapter": chapter.tag, "mutants": len(mutants), "caught": caught, "seconds": time.monotonic() - started}
    if messages:
        row["named"] = named
    return ok, row


def _report_mutant(chapter: Chapter, mutant, run, seconds: float, ok: bool, caught: int) -> tuple[bool, int]:
    """Say whether one mutant was caught (a test marked with its TODO failed first); answer ok and caught so far."""
    first = run.first_failure
    hit = first is not None and mutant.todo in first["todos"]
    if first is None:
        why = "timed out before any test failed" if run.timed_out else "NO TEST FAILS"
    else:
        why = f"fails {first['name']}" + ("" if hit else f", which is not marked with {mutant.todo!r}")
    ok &= _say(hit, f"{chapter.tag} {mutant.todo}: {mutant.description}: {why} ({seconds:.0f} s)")
    if not hit:  # CI keeps only this log: show why
        print(_indented_tail(run.output), flush=True)
    return ok, caught + hit


def _show_learner_view(chapter: Chapter, mutant, run) -> bool:
    """What `koans check` would show a learner who wrote this mutant (the failure and the hint it points to),
    and whether the failure's words name the clause the mutant breaks (`Mutant.clause`)."""
    import contextlib
    import io

    failure, hint = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(failure):
        _show_failure(chapter, run, verbose=False)
    with contextlib.redirect_stdout(hint):
        _show_hint(chapter, run.first_failure)
    named = names_clause(mutant, failure.getvalue())
    verdict = "names the clause" if named else (
        f"DOES NOT NAME the clause ({mutant.clause!r})" if mutant.clause else "states no clause (mutants/ file)")
    shown = (failure.getvalue() + hint.getvalue()).rstrip().splitlines()
    print("\n".join(["      | " + line for line in shown] + [f"      = {verdict}"]), flush=True)
    return named


def mutant_table(rows: list[dict]) -> str:
    """Mutants caught per chapter; with --messages, also how many of the messages name the broken clause."""
    named = all("named" in row for row in rows)
    lines = [f"{'chapter':<9}{'mutants':>8}{'caught':>8}{'seconds':>9}" + (f"{'named':>8}{'share':>8}" if named else "")]
    total = {k: sum(r.get(k, 0) for r in rows) for k in ("mutants", "caught", "seconds", "named")}
    for row in rows + [dict(total, chapter="all")]:
        line = f"{row['chapter']:<9}{row['mutants']:>8}{row['caught']:>8}{row['seconds']:>9.0f}"
        if named:
            line += f"{row['named']:>8}{row['named'] / max(1, row['mutants']):>8.0%}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="koans verify", description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="chapter numbers (default: all)")
    parser.add_argument("--solutions", action="store_true", help="also run every chapter against solutions/")
    parser.add_argument("--no-each-todo", action="store_true", help="skip the one-TODO-at-a-time check")
    parser.add_argument("--mutants", nargs="?", const="all", choices=["all", "sample", "only"],
                        help="also apply every plausible wrong answer in mutants/ (sample: the first per TODO; "
                             "only: mutants alone, no other check)")
    parser.add_argument("--messages", action="store_true",
                        help="under each mutant caught, what `koans check` shows its learner, and whether it names the clause "
                             "the mutant breaks; the table gets the share named per chapter")
    args = parser.parse_args(argv)
    chapters = [find_chapter(c) for c in args.chapters] if args.chapters else list(CHAPTERS)

    print("koans verify")
    # Every test session below is forked from this one warm process, and so are its Monarch processes:
    # hundreds of sessions, none of which imports torch again (koans/testkit/forkserver.py).
    # Sessions run two at a time: torch's thread pools, each as wide as the machine, would spin against each
    # other (a 7 s session took 78 s on 2 cores). Each session's torch gets its share of the cores instead.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _jobs())))
    Zygote.start_shared(list(dict.fromkeys(m for chapter in chapters for m in chapter.process_imports)))
    ok = check_sync()
    rows = []
    for chapter in chapters:
        print(f"{chapter.tag} {chapter.title}")
        if args.mutants != "only":
            if args.solutions:
                ok &= check_solutions(chapter)
            ok &= check_exercises(chapter)
            if chapter.stretch:
                ok &= check_workshop_depth(chapter)
            if not args.no_each_todo:
                ok &= check_each_todo(chapter)
        if args.mutants:
            held, row = check_mutants(chapter, sample=args.mutants == "sample", messages=args.messages)
            ok &= held
            rows.append(row)
    if rows:
        print("\nmutants caught, per chapter:\n" + mutant_table(rows))
    if args.messages and rows:  # what a learner reads must name what they broke, in every chapter
        short = [row["chapter"] for row in rows if row["named"] < MESSAGE_FLOOR * row["mutants"]]
        ok &= _say(not short, f"every chapter's messages name the broken clause for {MESSAGE_FLOOR:.0%} of its "
                              f"mutants or more" + (f"; not {', '.join(short)} (see DOES NOT NAME above)" if short else ""))
    print("verify: all checks hold" if ok else "verify: some checks FAILED (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
