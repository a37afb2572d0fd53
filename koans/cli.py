"""The `koans` command: a thin layer over pytest for working through the chapters.

    koans                  walk the workshop track in order; stop at the first chapter not done,
                           show its first failing test and a hint (passed chapters are not re-run)
    koans list             both tracks, each chapter's last recorded result (instant); --refresh
                           re-runs the chapters that changed since their last run
    koans check N          run chapter N's tests, stopping at the first failure
                           (-v: every test, each as it finishes, and the first failure's whole traceback;
                            koans check N -- ARGS: pass ARGS to pytest)
    koans hint N [TODO]    the next hint for the TODO chapter N is stuck on, or for the TODO named
                           (one more each time you ask)
    koans watch            re-check whenever an exercise file changes; on a pass, go on to the next chapter
    koans reset N          put chapter N's stub back (asks first; --yes to skip asking; --undo brings yours back)
    koans workshop         the 3-hour workshop's depth: the stretch TODOs are given as code (--off: write them too)
    koans grade            score every chapter (Gradescope results.json)
    koans autograder       build the Gradescope autograder zip (setup.sh, run_autograder, the student edition)
    koans edition DIR      (instructors) the student edition: a folder to publish to a class, with no solutions
    koans viz              an HTML page of chapter 10's timeline, with a sync-to-async slider
    koans verify           (maintainers) every chapter gates its TODOs; --mutants: and fails every wrong answer
    koans bench --gpu      (maintainers) every GPU test and benchmark, into one JSON (--out gpu.json)
    koans bench --data-plane  (maintainers) pulls, resharding, async depth, each beside its limit (--json F)

Results are kept in .koans/state.json. $KOANS_CHAPTERS=1,2 restricts the runner to those chapters.
Plain pytest works too: `pytest tests/test_ch01_hello_actor.py`.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
from pathlib import Path

from koans.course.edition_data import NO_SOLUTIONS, has_stretch_code, is_student_edition
from koans.course.manifest import PROJECT_ROOT, find_chapter
from koans.learn.check import cmd_check, cmd_list, walk
from koans.learn.hint import cmd_hint
from koans.learn.reset import cmd_reset, cmd_undo_reset
from koans.learn.watch import cmd_watch
from koans.learn.workshop import cmd_workshop
from koans.testkit.time_limit import CHAPTER_TIME_LIMIT_S

# The parser and the dispatch only: the learner's commands are in koans/learn/ (check, hint, watch, reset,
# workshop, viz), the instructor's in koans/grading/, the maintainer's in koans/maintain/, benchmarks in
# koans/bench/. docs/appendix/maintainers.md maps them.

#: The commands a student edition neither lists nor runs: they need the reference, or are the instructor's.
EDITION_HIDES = ("grade", "autograder", "edition", "verify", "bench")


def _commands_text(hidden: tuple[str, ...]) -> str:
    """This module's docstring after its first paragraph, less the lines of the `hidden` commands."""
    kept, skipping = [], False
    for line in "\n\n".join(__doc__.split("\n\n")[1:]).splitlines():
        command = re.match(r"    koans (\w+)", line)
        if command or not line.startswith("     "):
            skipping = bool(command and command.group(1) in hidden)
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds, so a running chapter's pytest is stopped too


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv and (argv[:1] == ["check"]):
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    # A student edition lists only what it can do: no maintainers' or instructors' commands, and no `workshop`
    # where it holds no stretch code; asked for one anyway, it says why not.
    hidden = (EDITION_HIDES + (() if has_stretch_code() else ("workshop",))) if is_student_edition() else ()
    if argv[:1] and argv[0] in hidden:
        what = ("this edition was built without the stretch TODOs' code that `koans workshop` gives (it is for "
                "self-study or a graded class), so you write those TODOs too. A workshop's edition is built with "
                "`koans edition DIR --workshop`." if argv[0] == "workshop"
                else NO_SOLUTIONS.format(what="koans " + argv[0]))
        print(f"koans: {what}", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="koans", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=_commands_text(hidden))
    sub = parser.add_subparsers(dest="command")
    listing = sub.add_parser("list", help="both tracks, with each chapter's last result")
    listing.add_argument("--refresh", action="store_true", help="first re-run the chapters that changed since their last run")
    check = sub.add_parser("check", help="run one chapter's tests (koans check N -- ARGS passes ARGS to pytest)")
    check.add_argument("chapter", help="chapter number, e.g. 1")
    check.add_argument("-v", "--verbose", action="store_true",
                       help="run every test, each shown as it finishes; the first failure's whole traceback")
    hint = sub.add_parser("hint", help="the next hint for a TODO (the one the chapter is stuck on, or the one named)")
    hint.add_argument("chapter")
    hint.add_argument("todo", nargs="?", default=None, help='a TODO of the chapter, e.g. "route" or "Service.route"')
    watch = sub.add_parser("watch", help="re-check when an exercise changes")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between looks at the files")
    watch.add_argument("--max-checks", type=int, default=None, help=argparse.SUPPRESS)  # for tests
    reset = sub.add_parser("reset", help="restore a chapter's stub")
    reset.add_argument("chapter")
    reset.add_argument("--yes", action="store_true", help="do not ask")
    reset.add_argument("--undo", action="store_true", help="bring back the version the last reset saved")
    if "workshop" not in hidden:
        workshop_depth = sub.add_parser("workshop", help="give the stretch TODOs as code, for the 3-hour workshop")
        workshop_depth.add_argument("--off", action="store_true", help="put the stretch TODOs' stubs back (self-study)")
    if not hidden:
        grade = sub.add_parser("grade", help="score every chapter into a Gradescope results.json")
        grade.add_argument("--out", default="results.json")
        grade.add_argument("--time-limit", type=float, default=None,
                           help=f"seconds per chapter (default {CHAPTER_TIME_LIMIT_S:g})")
        grade.add_argument("--chapters", default="", help="only these, e.g. 1,2,3 (default: every chapter)")
        autograder = sub.add_parser("autograder", help="build the Gradescope autograder zip")
        autograder.add_argument("--out", default="autograder.zip")
        autograder.add_argument("--wheels", default=None,
                                help="a folder of wheels to put in the zip, for an offline setup.sh")
    viz = sub.add_parser("viz", help="draw chapter 10's timeline as an HTML page, with a max-lag slider")
    viz.add_argument("--trace", default=None, help="Chrome trace JSON from chapter 10 (default: its last run)")
    viz.add_argument("--out", default=None, help="the page to write (default: .koans/viz.html, which git ignores)")
    viz.add_argument("--max-lag", type=int, default=4, help="the slider's upper end")
    viz.add_argument("--sweep", default=None, metavar="JSON", help="draw chapter 11's sweep instead (its --json file)")
    if not hidden:
        sub.add_parser("verify", help="maintainers: every chapter gates its TODOs (--mutants: and every wrong answer)",
                       add_help=False)
        sub.add_parser("bench", help="koans bench --gpu: every GPU test and benchmark, into one JSON; koans bench "
                       "--data-plane: pulls, resharding and async against their limits", add_help=False)
        sub.add_parser("edition", help="instructors: write the student edition (no solutions) into a new folder",
                       add_help=False)
    args, rest = parser.parse_known_args(argv)
    try:
        if args.command == "edition":
            from koans.grading.edition import main as edition_main

            return edition_main(rest)
        if args.command == "verify":
            from koans.maintain.verify import main as verify_main

            return verify_main(rest)
        if args.command == "bench":
            if "--data-plane" in rest:
                from koans.bench.data_plane import main as data_plane_main

                return data_plane_main([arg for arg in rest if arg != "--data-plane"])
            from koans.bench.gpu import main as bench_main

            return bench_main(rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}"
                         + ("  (pytest's arguments go after --: koans check N -- ARGS)" if args.command == "check" else ""))
        if args.command == "check":
            return cmd_check(find_chapter(args.chapter), args.verbose, tuple(passthrough))
        if args.command == "hint":
            return cmd_hint(find_chapter(args.chapter), args.todo)
        if args.command == "list":
            return cmd_list(args.refresh)
        if args.command == "watch":
            return cmd_watch(args.interval, args.max_checks)
        if args.command == "reset":
            if args.undo:
                return cmd_undo_reset(find_chapter(args.chapter))
            return cmd_reset(find_chapter(args.chapter), args.yes)
        if args.command == "workshop":
            return cmd_workshop(args.off)
        if args.command == "grade":
            from koans.grading.judge import grade_submission

            chapters = tuple(find_chapter(c) for c in args.chapters.split(",")) if args.chapters else None
            grade_submission(PROJECT_ROOT / "exercises", Path(args.out), chapters, args.time_limit,
                             reference=PROJECT_ROOT if (PROJECT_ROOT / "solutions").is_dir() else None)
            return 0
        if args.command == "autograder":
            from koans.grading.package import build

            return build(Path(args.out), Path(args.wheels) if args.wheels else None)
        if args.command == "viz":
            from koans.learn.viz import main as viz_main

            return viz_main(args.trace, args.out, args.max_lag, args.sweep)
        return walk()
    except KeyError as err:
        print(f"koans: {err.args[0]}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `koans list | head`: the reader left; nothing more to say
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
