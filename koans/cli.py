"""The `koans` command: a thin layer over pytest for working through the chapters.

    koans list          progress per chapter
    koans check N       run chapter N's tests against your exercises
    koans hint N        the hints for chapter N
    koans verify        (maintainers) every chapter gates its TODOs

Plain pytest works too: `pytest tests/test_ch01_hello_actor.py`.
"""

from __future__ import annotations

import argparse
import sys
import textwrap

from koans.manifest import CHAPTERS, PROJECT_ROOT, Chapter, find_chapter
from koans.runner import ChapterRun, run_chapter


def _status(run: ChapterRun) -> str:
    if run.timed_out:
        return "timed out"
    return "done" if run.passed else "pending"


def _show_failure(run: ChapterRun) -> None:
    failure = run.first_failure
    if failure is None:
        if run.timed_out:
            print("  The tests did not finish within the time limit; a stub may be blocking.")
        elif not run.tests:
            print("  No test ran. pytest said:\n" + textwrap.indent(run.output[-2000:], "    "))
        return
    print(f"  First failure: {failure['name']}")
    body = failure["note"] or failure["message"]
    print(textwrap.indent(body.strip()[-2500:], "    "))


def cmd_check(chapter: Chapter) -> int:
    source = chapter.source_file("exercises").relative_to(PROJECT_ROOT)
    print(f"Chapter {chapter.number:02d}: {chapter.title}   ({source})")
    run = run_chapter(chapter, "exercises")
    total = len(run.tests)
    print(f"  {run.count('passed')}/{total} tests pass" + (f", {run.count('skipped')} skipped" if run.count("skipped") else ""))
    if run.passed:
        print(f"  Chapter {chapter.number:02d} is done. Read docs/{chapter.doc_file.name} for the why, then go on.")
        return 0
    _show_failure(run)
    print(f"\n  Stuck? koans hint {chapter.number}")
    return 1


def cmd_list() -> int:
    print(f"{'ch':<4}{'title':<30}{'status':<10}tests")
    done = 0
    for chapter in CHAPTERS:
        run = run_chapter(chapter, "exercises")
        done += run.passed
        print(f"{chapter.number:02d}  {chapter.title:<30}{_status(run):<10}{run.count('passed')}/{len(run.tests)}", flush=True)
    width = 30
    filled = round(width * done / len(CHAPTERS))
    print(f"\n[{'#' * filled}{'.' * (width - filled)}] {done}/{len(CHAPTERS)} chapters done")
    return 0


def cmd_hint(chapter: Chapter) -> int:
    print(f"Chapter {chapter.number:02d}: {chapter.title}")
    for number, hint in enumerate(chapter.hints, start=1):
        print(textwrap.fill(hint, width=88, initial_indent=f"  {number}. ", subsequent_indent="     "))
    print(f"  The concepts: docs/{chapter.doc_file.name}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="koans", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("list", help="progress per chapter")
    for name, text in (("check", "run one chapter's tests"), ("hint", "show a chapter's hints")):
        sub.add_parser(name, help=text).add_argument("chapter", help="chapter number, e.g. 1")
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
        for chapter in CHAPTERS:  # no command: check the first chapter not yet done
            if not run_chapter(chapter, "exercises").passed:
                return cmd_check(chapter)
        print("Every chapter passes. Well done.")
        return 0
    except KeyError as err:
        print(f"koans: {err.args[0]}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
