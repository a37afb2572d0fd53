"""`koans check N`, `koans` (walking the track) and `koans list`: run chapters, record and show their results."""

from __future__ import annotations

import os
import textwrap

from koans.course.manifest import CHAPTERS, Chapter, electives, selected_chapters, workshop
from koans.learn.runner import ChapterRun, run_chapter
from koans.learn.show import _counts, _header, _show_warnings, impl_of, show_run
from koans.learn.state import _fingerprint, _load_state, _record, _recorded
from koans.learn.syntax import syntax_problem

# ---------------------------------------------------------------- running a chapter


class _Live:
    """Prints what a running chapter reports while it runs: a hang notice (once), and with
    verbose each test as it finishes."""

    def __init__(self, verbose: bool):
        self.verbose = verbose
        self.hang_shown = False

    def __call__(self, event: dict) -> None:
        kind = event.get("event")
        if kind == "hang" and not self.hang_shown:
            self.hang_shown = True
            print(textwrap.indent(event["text"], "  "), flush=True)
        elif kind == "done" and self.verbose:
            print(f"    {event['outcome']:<8} {event['name']}  ({event.get('duration_s', 0):.1f} s)", flush=True)


def _run(chapter: Chapter, *, announce: bool = False, first_failure_only: bool = True,
         extra_args: tuple[str, ...] = (), verbose: bool = False) -> ChapterRun:
    """Run a chapter against exercises/ and record the result (unless pytest got extra arguments,
    which may leave tests out). A file that does not compile is reported without running pytest.
    With `announce`, the chapter's header is printed first when its file compiles."""
    fingerprint = _fingerprint(chapter)
    problem = syntax_problem(chapter)
    if problem is None and announce:
        _header(chapter, impl_of(extra_args))
    if problem:
        run = ChapterRun(chapter, "exercises", returncode=2, syntax_error=problem)
    else:
        detail = ("--koans-tracebacks", "--tb=short") if verbose else ()  # the traceback too, each frame short
        run = run_chapter(chapter, "exercises", extra_args=detail + extra_args, first_failure_only=first_failure_only,
                          on_event=_Live(verbose))
    if not extra_args:
        _record(chapter, run, fingerprint)
    return run


def cmd_check(chapter: Chapter, verbose: bool = False, extra_args: tuple[str, ...] = ()) -> int:
    if chapter.gpu_missing():
        print(f"Chapter {chapter.number:02d}: skipped: this chapter needs a CUDA GPU and none is visible here")
        return 0
    run = _run(chapter, announce=True, extra_args=extra_args, verbose=verbose, first_failure_only=not verbose)
    return show_run(chapter, run, verbose, extra_args)


# ---------------------------------------------------------------- the track


def _track() -> tuple[tuple[Chapter, ...], bool]:
    """The chapters `koans` walks: those of $KOANS_CHAPTERS in its order, else the workshop track."""
    if os.environ.get("KOANS_CHAPTERS", "").strip():
        return selected_chapters(), True
    return workshop(), False


def _short(chapter: Chapter) -> str:
    return chapter.title.split(":")[0]


def _is_done(chapter: Chapter, state: dict | None = None) -> bool:
    entry, fresh = _recorded(chapter, state)
    return bool(entry) and fresh and entry.get("status") == "done"


def _elective_after(chapter: Chapter) -> None:
    for elective in electives():
        if elective.fits_after == chapter.number and not _is_done(elective):
            print(f"  Elective: chapter {elective.number:02d}, {_short(elective)} (~{elective.minutes} min), "
                  f"fits here: koans check {elective.number}")


def walk(quiet_when_unchanged: bool = False) -> int:
    """Check the track in order: a chapter that passed and has not changed since is not re-run.
    Stop at the first chapter not done and explain its first failure. 0 when all are done."""
    chapters, explicit = _track()
    for chapter in chapters:
        if chapter.gpu_missing():
            print(f"Chapter {chapter.number:02d}: skipped (needs a CUDA GPU; none is visible here)")
            continue
        entry, fresh = _recorded(chapter)
        if entry and fresh and entry.get("status") == "done":
            if not quiet_when_unchanged:
                print(f"Chapter {chapter.number:02d}: {chapter.title}: done "
                      f"({entry.get('passed')}/{entry.get('total')}; unchanged since it passed)")
                _elective_after(chapter)
            continue
        run = _run(chapter, announce=True)
        if run.passed:
            print(f"  {_counts(run)}: done.", flush=True)
            _show_warnings(run)
            _elective_after(chapter)
            continue
        return show_run(chapter, run)
    if explicit:
        print("\nEvery chapter you chose ($KOANS_CHAPTERS) passes. Well done.")
        return 0
    print("\nThe workshop track is done: every chapter passes. Well done.")
    todo = [e for e in electives() if not _is_done(e)]
    if todo:
        print("Electives, when you want more:")
        for elective in todo:
            print(f"  chapter {elective.number:02d}, {_short(elective)} (~{elective.minutes} min): "
                  f"koans check {elective.number}")
    return 0


# ---------------------------------------------------------------- list


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...], right: set[int]) -> list[str]:
    """Columns as wide as their widest cell, two spaces apart, so they never run together."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return lines


def _list_row(chapter: Chapter, entry: dict | None, fresh: bool) -> tuple[str, ...]:
    if entry is None:
        status, tests = "not run", "-"
    else:
        status = entry.get("status", "pending") + ("" if fresh else " (stale)")
        tests = f"{entry.get('passed', 0)}/{entry.get('total', 0)}"
        if entry.get("skipped"):
            tests += f" ({entry['skipped']} skipped: no GPU here)"
    if chapter.gpu_missing():
        status = "needs a GPU"
    return (f"{chapter.number:02d}", chapter.title, str(chapter.minutes), status, tests)


def cmd_list(refresh: bool = False) -> int:
    """Both tracks, from the recorded results (nothing runs, unless refresh)."""
    chosen = set(selected_chapters())
    if refresh:
        state = _load_state()
        changed = [c for c in CHAPTERS if c in chosen and not c.gpu_missing() and not _recorded(c, state)[1]]
        for chapter in changed:
            print(f"running chapter {chapter.number:02d} (changed since its last run, or never run) ...", flush=True)
            _run(chapter, first_failure_only=False)
        kept = len([c for c in CHAPTERS if c in chosen]) - len(changed)
        print(f"{len(changed)} chapter(s) re-run; {kept} unchanged since their last run, kept as recorded.\n")
    state = _load_state()
    recorded = {c: _recorded(c, state) for c in CHAPTERS if c in chosen}  # (entry, fresh): each fingerprint once
    header = ("#", "chapter", "min", "status", "tests")
    for name, track in (("Workshop track", workshop()), ("Electives", electives())):
        chapters = [c for c in track if c in chosen]
        if not chapters:
            continue
        rows = [_list_row(c, *recorded[c]) for c in chapters]
        done = [c for c in chapters if recorded[c][0] and recorded[c][0].get("status") == "done"]
        stale = sum(1 for c in done if not recorded[c][1])
        note = f" ({stale} changed since they passed: koans list --refresh re-checks them)" if stale else ""
        print(f"{name}: {len(done)} of {len(chapters)} done{note}, ~{sum(c.minutes for c in chapters)} min in all")
        for line in _table(rows, header, right={2, 4}):
            print("  " + line)
        print()
    stale = [c for c, (entry, fresh) in recorded.items() if entry and not fresh]
    print("Results as last recorded by koans / koans check / koans watch"
          + ("; stale: files changed since." if stale else ".")
          + " Re-run the ones that changed: koans list --refresh")
    return 0
