"""The `koans` command: a thin layer over pytest for working through the chapters.

    koans               check chapters in order; stop at the first failure and explain it
    koans list          progress per chapter, with a progress bar
    koans check N       run chapter N's tests against your exercises
    koans hint N        the next of chapter N's hints (one more each time you ask)
    koans watch         re-check the current chapter whenever an exercise file changes
    koans reset N       put chapter N's stub back (asks first; --yes to skip asking)
    koans grade         score every chapter (Gradescope results.json)
    koans viz           an HTML page of chapter 10's timeline, with a sync-to-async slider
    koans verify        (maintainers) every chapter gates its TODOs

Plain pytest works too: `pytest tests/test_ch01_hello_actor.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import textwrap
import time
from pathlib import Path

from koans.manifest import PROJECT_ROOT, Chapter, find_chapter, selected_chapters
from koans.runner import ChapterRun, run_chapter


def _root() -> Path:
    return PROJECT_ROOT


def _state_file() -> Path:
    return _root() / ".koans" / "state.json"


def _load_state() -> dict:
    try:
        return json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return {}


def _save_state(state: dict) -> None:
    _state_file().parent.mkdir(parents=True, exist_ok=True)
    _state_file().write_text(json.dumps(state, indent=2))


def _fingerprint(chapter: Chapter) -> str:
    """Changes whenever anything the chapter's result depends on changes (later chapters import earlier ones)."""
    digest = hashlib.sha256()
    for path in sorted((_root() / "exercises").glob("*.py")) + [chapter.test_file, _root() / "conftest.py"]:
        if path.is_file():
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def _run(chapter: Chapter, use_cache: bool = False, extra_args: tuple[str, ...] = ()) -> ChapterRun:
    """Run a chapter against exercises/. With use_cache, a chapter that passed and has not changed is not rerun."""
    state = _load_state()
    key = _fingerprint(chapter)
    cached = state.get("passed", {}).get(chapter.tag)
    if use_cache and cached and cached["fingerprint"] == key:
        return ChapterRun(chapter, "exercises", 0, cached["tests"])
    run = run_chapter(chapter, "exercises", extra_args=extra_args)
    if run.passed:
        state.setdefault("passed", {})[chapter.tag] = {"fingerprint": key, "tests": run.tests}
    else:
        state.setdefault("passed", {}).pop(chapter.tag, None)
    _save_state(state)
    return run


def _plain_assertion(message: str) -> str:
    """The `E ...` lines of a pytest failure: the assertion and its explanation, without the traceback."""
    lines = [line[1:].strip() for line in message.splitlines() if line.startswith("E ")]
    return "\n".join(lines[:8])


def _show_failure(run: ChapterRun, hint: str | None) -> None:
    failure = run.first_failure
    if failure is None:
        if run.timed_out:
            print("  The tests did not finish within the chapter's time limit: a stub may be blocking or waiting forever.")
        elif not run.tests:
            print("  No test ran. pytest said:\n" + textwrap.indent(run.output[-2000:], "    "))
        return
    print(f"  First failure: {failure['name']}")
    note = failure["note"].strip()
    if note.startswith("Not written yet") or not failure["message"]:
        print(textwrap.indent(note[-2500:], "    "))
    else:
        assertion = _plain_assertion(failure["message"])
        print(textwrap.indent(assertion or failure["message"].strip()[-1500:], "    "))
        if note:
            print(textwrap.indent(note[-1500:], "    "))
    if hint:
        print(textwrap.fill(hint, width=88, initial_indent="  Hint: ", subsequent_indent="        "))


def _hint_for(chapter: Chapter, failure: dict | None) -> str | None:
    """The hint about the failing test's TODO (one that names its function, as `name(`), else the first."""
    names = [key.rsplit(".", 1)[-1] + "(" for key in (failure or {}).get("todos", [])]
    for name in names:
        for hint in chapter.hints:
            if name in hint:
                return hint
    return chapter.hints[0] if chapter.hints else None


def cmd_check(chapter: Chapter, use_cache: bool = False, run: ChapterRun | None = None) -> int:
    source = chapter.source_file("exercises").relative_to(_root())
    print(f"Chapter {chapter.number:02d}: {chapter.title}   ({source})")
    if chapter.gpu_missing():
        print("  skipped: this chapter needs a CUDA GPU and none is visible here")
        return 0
    run = run or _run(chapter, use_cache)
    total = len(run.tests)
    skipped = run.count("skipped")
    print(f"  {run.count('passed')}/{total} tests pass" + (f", {skipped} skipped (they need a GPU)" if skipped else ""))
    if run.passed:
        print(f"  Chapter {chapter.number:02d} is done. Read docs/{chapter.doc_file.name} for the why.")
        return 0
    _show_failure(run, _hint_for(chapter, run.first_failure))
    print(f"\n  More help: koans hint {chapter.number}    Full pytest output: pytest {chapter.test_file.relative_to(_root())}")
    return 1


def cmd_next() -> int:
    """Check chapters in order: say so for each one done, stop at the first that is not."""
    for chapter in selected_chapters():
        if chapter.gpu_missing():
            print(f"Chapter {chapter.number:02d}: skipped (needs a CUDA GPU; none is visible here)")
            continue
        run = _run(chapter, use_cache=True)
        if run.passed:
            print(f"Chapter {chapter.number:02d}: {chapter.title}: done ({run.count('passed')}/{len(run.tests)})")
            continue
        print()
        return cmd_check(chapter, run=run)
    print("\nEvery chapter passes. Well done.")
    return 0


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = round(width * done / total) if total else 0
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def cmd_list() -> int:
    print(f"{'ch':<4}{'title':<44}{'status':<10}tests")
    done = 0
    for chapter in selected_chapters():
        if chapter.gpu_missing():
            print(f"{chapter.number:02d}  {chapter.title:<44}{'skipped':<10}needs a CUDA GPU", flush=True)
            continue
        run = _run(chapter, use_cache=True)
        done += run.passed
        status = "timed out" if run.timed_out else ("done" if run.passed else "pending")
        print(f"{chapter.number:02d}  {chapter.title:<44}{status:<10}{run.count('passed')}/{len(run.tests)}", flush=True)
    print(f"\n{_bar(done, len(selected_chapters()))} chapters done")
    return 0


def cmd_hint(chapter: Chapter) -> int:
    """Show one more hint than last time (all of them once they have all been shown)."""
    state = _load_state()
    shown = state.setdefault("hints_shown", {}).get(chapter.tag, 0)
    upto = min(shown + 1, len(chapter.hints))
    state["hints_shown"][chapter.tag] = upto
    _save_state(state)
    print(f"Chapter {chapter.number:02d}: {chapter.title}  (hint {upto} of {len(chapter.hints)})")
    for number, hint in enumerate(chapter.hints[:upto], start=1):
        print(textwrap.fill(hint, width=88, initial_indent=f"  {number}. ", subsequent_indent="     "))
    if upto < len(chapter.hints):
        print(f"  Ask again for the next one: koans hint {chapter.number}")
    print(f"  The concepts: docs/{chapter.doc_file.name}")
    return 0


def _current_chapter() -> tuple[Chapter, ChapterRun | None]:
    """The first chapter not done yet, with its run (None when every chapter is done)."""
    for chapter in selected_chapters():
        if chapter.gpu_missing():
            continue
        run = _run(chapter, use_cache=True)
        if not run.passed:
            return chapter, run
    return selected_chapters()[-1], None


def _mtimes() -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in sorted((_root() / "exercises").glob("*.py"))}


def cmd_watch(interval: float, max_checks: int | None) -> int:
    """Poll modification times (works on every filesystem, no inotify) and re-check on change."""
    chapter, run = _current_chapter()
    cmd_check(chapter, use_cache=True, run=run)
    print(f"\nWatching exercises/ (every {interval:g} s). Save a file to re-check; Ctrl-C to stop.", flush=True)
    seen, checks = _mtimes(), 1
    try:
        while max_checks is None or checks < max_checks:
            time.sleep(interval)
            now = _mtimes()
            if now == seen:
                continue
            changed = sorted(Path(p).name for p in now if now.get(p) != seen.get(p))
            seen = now
            print(f"\nChanged: {', '.join(changed)}. Checking again...", flush=True)
            if cmd_check(chapter) == 0:
                chapter, _ = _current_chapter()
                print(f"\nNext up: chapter {chapter.number:02d}.", flush=True)
            checks += 1
    except KeyboardInterrupt:
        print("\nStopped watching.")
    return 0


def cmd_reset(chapter: Chapter, yes: bool) -> int:
    """Put the chapter's stub back; the learner's version is kept in .koans/backups."""
    from koans.stubgen import make_exercise

    solution = chapter.source_file("solutions")
    target = chapter.source_file("exercises")
    stub = make_exercise(solution.read_text(), str(solution))
    if target.is_file() and target.read_text() == stub:
        print(f"{target.relative_to(_root())} is already the pristine stub.")
        return 0
    if not yes:
        answer = input(f"Replace {target.relative_to(_root())} with the original stub? Your version is kept in "
                       ".koans/backups. [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing changed.")
            return 1
    backup = _root() / ".koans" / "backups" / time.strftime("%Y%m%d-%H%M%S") / target.name
    if target.is_file():
        backup.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(target, backup)
    target.write_text(stub)
    state = _load_state()
    state.get("passed", {}).pop(chapter.tag, None)
    state.get("hints_shown", {}).pop(chapter.tag, None)
    _save_state(state)
    print(f"Chapter {chapter.number:02d} is back to its stub. Your version: {backup.relative_to(_root())}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="koans", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n")[1])
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("list", help="progress per chapter")
    for name, text in (("check", "run one chapter's tests"), ("hint", "show the next of a chapter's hints")):
        sub.add_parser(name, help=text).add_argument("chapter", help="chapter number, e.g. 1")
    watch = sub.add_parser("watch", help="re-check the current chapter when an exercise changes")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between looks at the files")
    watch.add_argument("--max-checks", type=int, default=None, help=argparse.SUPPRESS)  # for tests
    reset = sub.add_parser("reset", help="restore a chapter's stub")
    reset.add_argument("chapter")
    reset.add_argument("--yes", action="store_true", help="do not ask")
    grade = sub.add_parser("grade", help="score every chapter into a Gradescope results.json")
    grade.add_argument("--out", default="results.json")
    grade.add_argument("--time-limit", type=float, default=None, help="seconds per chapter (default 600)")
    grade.add_argument("--chapters", default="", help="only these, e.g. 1,2,3 (default: every chapter)")
    viz = sub.add_parser("viz", help="draw chapter 10's timeline as an HTML page, with a max-lag slider")
    viz.add_argument("--trace", default=None, help="Chrome trace JSON from chapter 10 (default: its last run)")
    viz.add_argument("--out", default="viz.html")
    viz.add_argument("--max-lag", type=int, default=4, help="the slider's upper end")
    sub.add_parser("verify", help="maintainers: every chapter gates its TODOs", add_help=False)
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "verify":
            from koans.verify import main as verify_main

            return verify_main(rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if args.command == "check":
            return cmd_check(find_chapter(args.chapter))
        if args.command == "hint":
            return cmd_hint(find_chapter(args.chapter))
        if args.command == "list":
            return cmd_list()
        if args.command == "watch":
            return cmd_watch(args.interval, args.max_checks)
        if args.command == "reset":
            return cmd_reset(find_chapter(args.chapter), args.yes)
        if args.command == "grade":
            from koans.grade import grade

            chapters = tuple(find_chapter(c) for c in args.chapters.split(",")) if args.chapters else None
            return grade(Path(args.out), args.time_limit, chapters)
        if args.command == "viz":
            from koans.viz import main as viz_main

            return viz_main(args.trace, args.out, args.max_lag)
        return cmd_next()
    except KeyError as err:
        print(f"koans: {err.args[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
