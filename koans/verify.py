"""`koans verify`: prove that every chapter's tests really gate its TODOs.

For maintainers and CI. Each check must hold, else the exit code is 1:

  sync        exercises/ equals what koans.stubgen generates from solutions/
  solutions   (with --solutions) every chapter passes against solutions/
  exercises   every chapter fails against exercises/, and every failing test
              points at a TODO, of this chapter or of one it builds on (no bare
              harness errors)
  each TODO   for every single TODO, a copy of the project in which only that
              TODO is stubbed (all others solved) fails the chapter's tests, and
              the first failing test is one marked with that TODO: no TODO can
              be skipped without a test noticing and naming it
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from koans.harness import chapter_todos
from koans.manifest import CHAPTERS, PROJECT_ROOT, Chapter, find_chapter
from koans.runner import run_chapter
from koans.stubgen import make_exercise, out_of_sync

COPIED = ("conftest.py", "pyproject.toml", "koans", "solutions", "tests")


def _say(ok: bool, text: str) -> bool:
    print(f"  [{'ok' if ok else 'FAIL'}] {text}", flush=True)
    return ok


def check_sync() -> bool:
    stale = out_of_sync(PROJECT_ROOT / "solutions", PROJECT_ROOT / "exercises")
    return _say(not stale, "exercises/ in sync with solutions/" + (f": stale {stale}; run python -m koans.stubgen" if stale else ""))


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
    ok = bool(failing) and not harness_errors and not run.timed_out
    detail = f"{len(failing)}/{len(run.tests)} tests fail, each pointing at a TODO"
    if harness_errors:
        detail = f"these failures do not point at a TODO: {harness_errors}"
    if not failing:
        detail = "no test fails: the stubs are not gated\n" + run.output[-2000:]
    return _say(ok, f"{chapter.tag} fails against exercises/ ({detail})")


def copy_project(into: Path, names: tuple[str, ...] = COPIED) -> None:
    """Copy these top-level files and folders of the project into `into` (no caches)."""
    for name in names:
        source = PROJECT_ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, into / name)


def copy_project_with_one_stub(chapter: Chapter, todo_key: str, into: Path) -> None:
    """Copy the project into `into`, with exercises = solutions except one stubbed TODO."""
    copy_project(into)
    shutil.copytree(PROJECT_ROOT / "solutions", into / "exercises", ignore=shutil.ignore_patterns("__pycache__"))
    solution = PROJECT_ROOT / "solutions" / f"{chapter.module}.py"
    keys = {todo.key for todo in chapter_todos(chapter)}
    (into / "exercises" / solution.name).write_text(
        make_exercise(solution.read_text(), str(solution), keep_solved=frozenset(keys - {todo_key}))
    )


def check_each_todo(chapter: Chapter) -> bool:
    ok = True
    for todo in chapter_todos(chapter):
        with tempfile.TemporaryDirectory(prefix=f"koans-{chapter.tag}-") as tmp:
            copy_project_with_one_stub(chapter, todo.key, Path(tmp))
            run = run_chapter(chapter, "exercises", root=Path(tmp), extra_args=("-x",))
        first = run.first_failure
        if first is None:
            outcome = "timed out before any test failed" if run.timed_out else "fails NO TEST"
            ok &= _say(False, f"{chapter.tag} {todo.key}: stubbing only this TODO {outcome}")
        else:
            # The first failure must be a test marked with this TODO, so that its
            # message names the right TODO and `koans` leads the learner to it.
            named = todo.key in first["todos"]
            ok &= _say(named, f"{chapter.tag} {todo.key}: stubbing only this TODO fails {first['name']}"
                       + ("" if named else f", which is not marked @pytest.mark.todo({todo.key!r})"))
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="koans verify", description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", help="chapter numbers (default: all)")
    parser.add_argument("--solutions", action="store_true", help="also run every chapter against solutions/")
    parser.add_argument("--no-each-todo", action="store_true", help="skip the one-TODO-at-a-time check")
    args = parser.parse_args(argv)
    chapters = [find_chapter(c) for c in args.chapters] if args.chapters else list(CHAPTERS)

    print("koans verify")
    ok = check_sync()
    for chapter in chapters:
        print(f"{chapter.tag} {chapter.title}")
        if args.solutions:
            ok &= check_solutions(chapter)
        ok &= check_exercises(chapter)
        if not args.no_each_todo:
            ok &= check_each_todo(chapter)
    print("verify: all checks hold" if ok else "verify: some checks FAILED (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
