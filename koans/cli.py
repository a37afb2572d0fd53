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
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import textwrap
import time
from pathlib import Path

from koans.manifest import (
    CHAPTERS, PROJECT_ROOT, Chapter, electives, find_chapter, fingerprint_files, selected_chapters, todos_of, workshop,
)
from koans.results import LIKELY_HANG_CAUSE
from koans.runner import CHAPTER_TIME_LIMIT_S, ChapterRun, run_chapter

WIDTH = 96

# ---------------------------------------------------------------- state: .koans/state.json
#
#   {"results":     {"ch01": {"fingerprint", "status", "passed", "total", "first_failure", ...}},
#    "hints_shown": {"ch01": {"Greeter.greet": 2}},
#    "resets":      {"ch01": {"backup": ".koans/backups/20250101-120000/ch01_hello_actor.py", "at": ...}}}


def _root() -> Path:
    return PROJECT_ROOT


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(_root()))
    except ValueError:
        return str(path)


def _state_file() -> Path:
    return _root() / ".koans" / "state.json"


def _load_state() -> dict:
    try:
        state = json.loads(_state_file().read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _save_state(state: dict) -> None:
    _state_file().parent.mkdir(parents=True, exist_ok=True)
    temporary = _state_file().with_suffix(".tmp")
    temporary.write_text(json.dumps(state, indent=2))
    temporary.replace(_state_file())


def _fingerprint(chapter: Chapter) -> str:
    """Changes whenever a file the chapter's result depends on changes (koans.manifest.fingerprint_files)."""
    digest = hashlib.sha256()
    for path in fingerprint_files(chapter):
        digest.update(_rel(path).encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<missing>")
        digest.update(b"\0")
    return digest.hexdigest()


def _recorded(chapter: Chapter, state: dict | None = None) -> tuple[dict | None, bool]:
    """The chapter's last recorded result, and whether its files are unchanged since."""
    entry = (state if state is not None else _load_state()).get("results", {}).get(chapter.tag)
    if not isinstance(entry, dict):
        return None, False
    return entry, entry.get("fingerprint") == _fingerprint(chapter)


def _status_of(run: ChapterRun) -> str:
    if run.syntax_error:
        return "syntax error"
    if run.timed_out:
        return "timed out"
    return "done" if run.passed else "pending"


def _record(chapter: Chapter, run: ChapterRun, fingerprint: str) -> None:
    failure = run.first_failure
    entry = {
        "fingerprint": fingerprint, "status": _status_of(run), "passed": run.count("passed"),
        "skipped": run.count("skipped"), "total": run.total, "stopped_early": run.stopped_early,
        "first_failure": ({"name": failure["name"], "todos": failure.get("todos", []), "hint": failure.get("hint")}
                          if failure else None),
        "syntax_error": run.syntax_error, "at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if run.timed_out and run.running:
        entry["first_failure"] = {"name": run.running.get("name"), "todos": run.running.get("todos", [])}
    state = _load_state()
    state.setdefault("results", {})[chapter.tag] = entry
    _save_state(state)


# ---------------------------------------------------------------- syntax errors, before pytest


def _function_extent(lines: list[str], key: str) -> tuple[int, int] | None:
    """1-based (first, last) lines of the function of a TODO key in text that may not parse."""
    parts = key.split("#")[0].split(".")
    start = 0
    if len(parts) > 1:  # Class.method: look for the method after its class
        found = next((n for n, text in enumerate(lines) if re.match(rf"\s*class {re.escape(parts[-2])}\b", text)), None)
        if found is None:
            return None
        start = found
    pattern = re.compile(rf"(\s*)(async\s+)?def {re.escape(parts[-1])}\b")
    for index in range(start, len(lines)):
        match = pattern.match(lines[index])
        if not match:
            continue
        indent, last = len(match.group(1)), index
        for later in range(index + 1, len(lines)):
            text = lines[later]
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            if len(text) - len(text.lstrip()) <= indent:
                break
            last = later
        return index + 1, last + 1
    return None


def todo_at_line(chapter: Chapter, path: Path, lineno: int) -> str | None:
    """The TODO whose region holds this line of the chapter's exercise: the stub (its guidance
    and its `raise`) while it is there, else the function the learner is writing it in."""
    if path.name != chapter.source_file("exercises").name or not path.is_file():
        return None
    lines = path.read_text(errors="replace").splitlines()
    todos = todos_of(chapter)
    for todo in todos:
        stub = f'raise NotImplementedError("{todo.message}")'
        at = next((n for n, text in enumerate(lines, 1) if stub in text), None)
        if at is not None and at - len(todo.guidance) <= lineno <= at:
            return todo.key
    for todo in todos:
        extent = _function_extent(lines, todo.key)
        if extent and extent[0] <= lineno <= extent[1]:
            return todo.key
    return None


def syntax_problem(chapter: Chapter) -> str | None:
    """One line for the first exercise file (the chapter's, or of a chapter it builds on) that
    does not compile: `exercises/chNN_x.py:LINE: <message>  (in TODO <key>)`."""
    owners = [chapter] + [find_chapter(n) for n in chapter.builds_on]
    for owner in owners:
        for path in [owner.source_file("exercises"), *owner.given_files("exercises")]:
            if not path.is_file():
                continue
            try:
                compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
            except SyntaxError as err:
                lineno = err.lineno or 1
                key = todo_at_line(owner, path, lineno)
                where = f"in TODO {key}" if key else "not in a TODO: code you were given"
                return f"{_rel(path)}:{lineno}: {err.msg}  ({where})"
            except ValueError as err:  # null bytes and the like
                return f"{_rel(path)}:1: {err}"
    return None


# ---------------------------------------------------------------- running a chapter


def _stubbed(chapter: Chapter) -> list[str]:
    """Keys of the chapter's TODOs whose stub is still in the exercise file."""
    path = chapter.source_file("exercises")
    text = path.read_text(errors="replace") if path.is_file() else ""
    return [todo.key for todo in todos_of(chapter) if f'NotImplementedError("{todo.message}")' in text]


def _default_todo(chapter: Chapter) -> str | None:
    stubbed = _stubbed(chapter)
    keys = [todo.key for todo in todos_of(chapter)]
    return stubbed[0] if stubbed else (keys[0] if keys else None)


def failing_todo(chapter: Chapter, failure: dict | None) -> str | None:
    """The TODO behind a failure: of those it is about (likeliest first: the failing check's, else the
    test's marked ones), the first still stubbed, else the first; for an unmarked test, the first stub
    left. It may be a TODO of a chapter this one builds on."""
    known = {todo.key for number in (chapter.number, *chapter.builds_on) for todo in todos_of(find_chapter(number))}
    about = [key for key in ((failure or {}).get("todos") or []) if key in known]
    if not about:
        return _default_todo(chapter)
    stubbed = set(_stubbed(chapter))
    return next((key for key in about if key in stubbed), about[0])


def hints_of(chapter: Chapter, key: str) -> tuple[str, ...]:
    """The hints of TODO `key`, of this chapter or of one it builds on."""
    for number in (chapter.number, *chapter.builds_on):
        hints = find_chapter(number).hints_for(key)
        if hints:
            return hints
    return ()


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
        _header(chapter)
    if problem:
        run = ChapterRun(chapter, "exercises", returncode=2, syntax_error=problem)
    else:
        detail = ("--koans-tracebacks", "--tb=short") if verbose else ()  # the traceback too, each frame short
        run = run_chapter(chapter, "exercises", extra_args=detail + extra_args, first_failure_only=first_failure_only,
                          on_event=_Live(verbose))
    if not extra_args:
        _record(chapter, run, fingerprint)
    return run


# ---------------------------------------------------------------- reporting a run


def _fill(text: str, first: str, rest: str) -> str:
    return textwrap.fill(" ".join(text.split()), width=WIDTH, initial_indent=first, subsequent_indent=rest)


def _counts(run: ChapterRun) -> str:
    skipped = run.count("skipped")
    text = f"{run.count('passed')}/{run.total} tests pass"
    if skipped:
        text += f", {skipped} skipped (they need a GPU)"
    if run.stopped_early:
        text += f"; stopped at the first failure ({run.total - len(run.tests)} not run)"
    return text


def _show_summary(summary: dict) -> None:
    for frame in summary.get("frames", []):
        todo = f", TODO {frame['todo']}" if frame.get("todo") else ""
        remote = ", in the actor" if frame.get("remote") else ""
        print(f"    {frame['file']}:{frame['line']}  (in {frame['function']}{todo}{remote})")
        if frame.get("source"):
            print(f"        {frame['source']}")
    if summary.get("error"):
        print(textwrap.indent(summary["error"], "    "))


def _show_failure(chapter: Chapter, run: ChapterRun, verbose: bool) -> None:
    failure = run.first_failure
    if run.timed_out:
        running = f"; {run.running['name']} was running" if run.running else ""
        print(f"  The tests did not finish within the chapter's time limit ({run.time_limit_s:g} s){running}.")
        if not run.hangs:  # a hang notice, already shown while the tests ran, said where and why
            print(f"  Something waits forever: {LIKELY_HANG_CAUSE}.")
    if failure is None:
        if not run.timed_out and not run.tests:
            print("  No test ran. pytest said:\n" + textwrap.indent(run.output[-3000:], "    "))
        elif not run.timed_out:
            print("  Every test that ran passed, but pytest failed the session. It said:\n"
                  + textwrap.indent(run.output[-3000:], "    "))
        return
    print(f"  First failure: {failure['name']}")
    note, message = failure.get("note", "").strip(), failure.get("message", "").strip()
    if verbose and message:
        print(textwrap.indent(message, "    "))
        if note and note != message:
            print(textwrap.indent(note, "    "))
    elif note and (note == message or note.startswith("Not written yet") or not message):
        print(textwrap.indent(note, "    "))  # the note already is the whole story (it replaced the traceback)
    elif failure.get("summary"):
        _show_summary(failure["summary"])
        if note:
            print(textwrap.indent(note, "    "))
    else:
        print(textwrap.indent(message, "    "))
        if note:
            print(textwrap.indent(note, "    "))


def _show_hint(chapter: Chapter, failure: dict | None) -> None:
    """The TODO's first hint, or the one the failing check named as the best fit."""
    key = failing_todo(chapter, failure)
    hints = hints_of(chapter, key) if key else ()
    if hints:
        number = (failure or {}).get("hint") or 1
        number = number if 1 <= number <= len(hints) else 1
        print(_fill(hints[number - 1], f"  Hint for {key} ({number} of {len(hints)}): ", "    "))


def _header(chapter: Chapter) -> None:
    print(f"Chapter {chapter.number:02d}: {chapter.title}   ({_rel(chapter.source_file('exercises'))})", flush=True)


def _show_warnings(run: ChapterRun, limit: int | None = 3) -> None:
    """Python's warnings, each once: often the one line that says what is wrong (a blocking get() in async code)."""
    for warning in run.warnings[:limit]:
        text = " ".join(warning["message"].split())
        print(_fill(text[:400] + ("..." if len(text) > 400 else ""), f"  Python warned: {warning['category']}: ", "    "))
    if limit is not None and len(run.warnings) > limit:
        print(f"  ... and {len(run.warnings) - limit} more warning(s): koans check {run.chapter.number} -v")


def show_run(chapter: Chapter, run: ChapterRun, verbose: bool = False, extra_args: tuple[str, ...] = ()) -> int:
    """Print a chapter's result (its header is printed before it runs); 0 if it passed. A run with pytest
    arguments may have left tests out, so its pass is never announced as the chapter done."""
    if run.syntax_error:
        print(run.syntax_error)
        return 1
    print(f"  {_counts(run)}")
    _show_warnings(run, None if verbose else 3)
    if run.passed and extra_args:
        print(f"  The tests that ran pass. With pytest arguments ({' '.join(extra_args)}) some of the chapter's "
              f"tests may not have run, so it is not marked done: koans check {chapter.number} runs them all.")
        return 0
    if run.passed:
        print(f"  Chapter {chapter.number:02d} is done. Read docs/{chapter.doc_file.name} for the why.")
        return 0
    _show_failure(chapter, run, verbose)
    if not run.tests and not run.timed_out:
        return 1  # pytest's own words say it all (no test selected, a collection error)
    _show_hint(chapter, run.first_failure or (run.running if run.timed_out else None))
    test_file = _rel(chapter.test_file)
    print(f"\n  More hints: koans hint {chapter.number}    Every detail: koans check {chapter.number} -v"
          f"    Plain pytest: pytest {test_file}")
    return 1


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


# ---------------------------------------------------------------- hint


def find_todo(chapter: Chapter, name: str) -> str:
    """The key of the chapter's TODO called `name`: its key, or the last part of it ("route" for
    "Service.route"), in any case. KeyError, listing the chapter's TODOs, if none or several match."""
    keys = [todo.key for todo in todos_of(chapter)]
    wanted = name.strip().lower()
    found = [key for key in keys if key.lower() == wanted] or [key for key in keys if key.lower().split(".")[-1] == wanted]
    if len(found) != 1:
        raise KeyError(f"chapter {chapter.number:02d} has no TODO {name!r}" if not found else
                       f"{name!r} names several TODOs of chapter {chapter.number:02d}: {', '.join(found)}")
    return found[0]


def cmd_hint(chapter: Chapter, name: str | None = None) -> int:
    """One more hint for a TODO: the one named, else the one the chapter is stuck on (its recorded first
    failure's TODO; else the first TODO still stubbed; else its first TODO). Lists the chapter's TODOs."""
    state = _load_state()
    entry, fresh = _recorded(chapter, state)
    failure = (entry or {}).get("first_failure")
    try:
        key = find_todo(chapter, name) if name else failing_todo(chapter, failure)
    except KeyError as err:
        print(f"koans: {err.args[0]}. Its TODOs: {', '.join(t.key for t in todos_of(chapter))}", file=sys.stderr)
        return 2
    hints = hints_of(chapter, key) if key else ()
    if not hints:
        print(f"Chapter {chapter.number:02d} has no hints. The concepts: docs/{chapter.doc_file.name}")
        return 0
    shown = state.setdefault("hints_shown", {})
    if not isinstance(shown.get(chapter.tag), dict):
        shown[chapter.tag] = {}
    before = shown[chapter.tag].get(key, 0)
    # The first failure may have named the hint that fits the clause it broke: show up to that one at once.
    fits = (failure or {}).get("hint") if not name and failure and key in (failure.get("todos") or []) else None
    upto = min(max(before + 1, fits if isinstance(fits, int) else 0), len(hints))
    shown[chapter.tag][key] = upto
    _save_state(state)
    if name:
        why = ""
    elif failure and key in (failure.get("todos") or []):
        why = f" (the TODO of {failure['name']}, its first failure)"
    elif entry and fresh and entry.get("status") == "done":
        why = " (the chapter passes; name a TODO to see its hints)"
    else:
        why = ""
    if before >= len(hints):
        why += " (all of them were shown before)"
    elif isinstance(fits, int) and fits > before + 1 and upto == fits:
        why += " (the one that fits the clause that failed)"
    print(f"Chapter {chapter.number:02d}: hint {upto} of {len(hints)} for {key}{why}")
    for number, hint in enumerate(hints[:upto], start=1):
        print(_fill(hint, f"  {number}. ", "     "))
    if upto < len(hints):
        print(f"  Ask again for the next one: koans hint {chapter.number} {key.split('.')[-1]}")
    else:
        print(f"  That was the last hint for {key}. The concepts: docs/{chapter.doc_file.name}")
    others = [todo.key for todo in todos_of(chapter) if todo.key != key]
    if others:
        print(f"  The chapter's other TODOs: {', '.join(others)}  (koans hint {chapter.number} TODO)")
    return 0


# ---------------------------------------------------------------- watch


def _snapshot() -> dict[str, tuple[int, int]]:
    found = {}
    for path in sorted((_root() / "exercises").glob("*.py")):
        try:
            stat = path.stat()
        except OSError:
            continue
        found[str(path)] = (stat.st_mtime_ns, stat.st_size)
    return found


def cmd_watch(interval: float, max_checks: int | None) -> int:
    """Poll modification times (works on every filesystem, no inotify) and re-check on change.

    The files are looked at BEFORE each check, so a save made while a check runs is seen next time.
    """
    seen = _snapshot()
    walk()
    print(f"\nWatching exercises/ (every {interval:g} s). Save a file to re-check; Ctrl-C to stop.", flush=True)
    checks = 1
    try:
        while max_checks is None or checks < max_checks:
            time.sleep(interval)
            now = _snapshot()
            if now == seen:
                continue
            changed = sorted(Path(p).name for p in set(now) | set(seen) if now.get(p) != seen.get(p))
            seen = now
            print(f"\nChanged: {', '.join(changed)}. Checking again...", flush=True)
            walk(quiet_when_unchanged=True)
            checks += 1
            print("\nWatching exercises/ for your next save (Ctrl-C to stop).", flush=True)
    except KeyboardInterrupt:
        print("\nStopped watching.")
    return 0


# ---------------------------------------------------------------- reset


def _reset_stub(chapter: Chapter, state: dict) -> str:
    """The text `koans reset` puts back: the pristine stub, with the stretch TODOs given at workshop depth."""
    from koans.edition import pristine_stub

    stub = pristine_stub(chapter)
    if state.get("depth") == "workshop" and chapter.stretch:  # the workshop's stub: stretch TODOs given
        from koans import depth

        stub, _ = depth.fill_text(chapter, stub, _root())
    return stub


def cmd_reset(chapter: Chapter, yes: bool) -> int:
    """Put the chapter's stub back; the learner's version is kept in .koans/backups."""
    target = chapter.source_file("exercises")
    state = _load_state()
    stub = _reset_stub(chapter, state)
    if target.is_file() and target.read_text() == stub:
        print(f"{_rel(target)} is already the pristine stub.")
        return 0
    if not yes:
        question = (f"Replace {_rel(target)} with the original stub? Your version is kept in "
                    f".koans/backups (koans reset {chapter.number} --undo brings it back). [y/N] ")
        if not sys.stdin.isatty():
            print(f"koans reset {chapter.number}: nothing changed. There is no terminal to ask whether to replace "
                  f"{_rel(target)}; run `koans reset {chapter.number} --yes` to replace it without asking.",
                  file=sys.stderr)
            return 2
        try:
            answer = input(question)
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing changed.")
            return 1
    backup = _backup(target)
    target.write_text(stub)
    state.get("hints_shown", {}).pop(chapter.tag, None)
    if backup:
        state.setdefault("resets", {})[chapter.tag] = {"backup": _rel(backup), "at": time.strftime("%Y-%m-%d %H:%M:%S")}
    _save_state(state)
    print(f"Chapter {chapter.number:02d} is back to its stub. Your version: {_rel(backup) if backup else '(none)'}"
          f"\n  To bring it back: koans reset {chapter.number} --undo")
    return 0


def _backup(target: Path) -> Path | None:
    if not target.is_file():
        return None
    folder = _root() / ".koans" / "backups" / time.strftime("%Y%m%d-%H%M%S")
    backup, n = folder / target.name, 1
    while backup.exists():
        n += 1
        backup = folder.with_name(f"{folder.name}-{n}") / target.name
    backup.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(target, backup)
    return backup


def cmd_undo_reset(chapter: Chapter) -> int:
    """Bring back the version that the last `koans reset N` saved."""
    state = _load_state()
    record = state.get("resets", {}).get(chapter.tag)
    record = {"backup": record, "at": None} if isinstance(record, str) else (record or {})
    saved = record.get("backup")
    backup = _root() / saved if saved else None
    if backup is None or not backup.is_file():
        print(f"koans: nothing to undo for chapter {chapter.number:02d}: no `koans reset {chapter.number}` "
              "saved a version of it" + (f" (its backup {saved} is gone)" if saved else "") + ".", file=sys.stderr)
        return 1
    target = chapter.source_file("exercises")
    current_is_stub = target.is_file() and target.read_text() == _reset_stub(chapter, state)
    kept = None if current_is_stub else _backup(target)
    shutil.copy2(backup, target)
    state["resets"].pop(chapter.tag, None)
    _save_state(state)
    when = f" (saved by koans reset {chapter.number} at {record['at']})" if record.get("at") else ""
    print(f"Chapter {chapter.number:02d}: brought back your version from {saved}{when}.")
    if kept:
        print(f"  What was there (not the stub: you had edited it) is kept in {_rel(kept)}")
    return 0


# ---------------------------------------------------------------- workshop depth


def cmd_workshop(off: bool) -> int:
    """Give the stretch TODOs as code (the workshop's depth), or put their stubs back (--off)."""
    from koans import depth
    from koans.edition import has_stretch_code, stretch_code

    state = _load_state()
    chapters = [c for c in selected_chapters() if c.stretch]
    if not off and chapters and not has_stretch_code():
        try:
            stretch_code(chapters[0].tag, chapters[0].stretch[0])
        except Exception as err:  # the graded edition: say so plainly
            print(f"koans workshop: {err}", file=sys.stderr)
            return 2
    if off:
        for chapter in chapters:
            stubbed, edited = depth.unfill(chapter, _root())
            for key in stubbed:
                print(f"  chapter {chapter.number:02d}: {key}: its stub is back")
            for key in edited:
                print(f"  chapter {chapter.number:02d}: {key}: you changed the given code, so it is left as it is")
        state["depth"] = "self-study"
        _save_state(state)
        print("Self-study depth: you write every TODO, the stretch ones too.")
        return 0
    print("Workshop depth: each chapter's stretch TODOs are given as code, marked GIVEN, so the workshop fits "
          "in 3 hours.\nTheir tests still run; self-study and grading write them too (koans workshop --off).")
    for chapter in chapters:
        filled = depth.fill(chapter, _root())
        for key in chapter.stretch:
            how = "given" if key in filled else ("given already" if depth.is_filled(chapter, key, _root())
                                                else "left as you wrote it")
            print(f"  chapter {chapter.number:02d}: {key}: {how}")
    state["depth"] = "workshop"
    _save_state(state)
    return 0


# ---------------------------------------------------------------- main


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
    from koans.edition import NO_SOLUTIONS, has_stretch_code, is_student_edition

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
            from koans.edition import main as edition_main

            return edition_main(rest)
        if args.command == "verify":
            from koans.verify import main as verify_main

            return verify_main(rest)
        if args.command == "bench":
            if "--data-plane" in rest:
                from koans.bench_data_plane import main as data_plane_main

                return data_plane_main([arg for arg in rest if arg != "--data-plane"])
            from koans.bench_gpu import main as bench_main

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
            from koans.viz import main as viz_main

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
