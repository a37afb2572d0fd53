"""Reporting a chapter's run: its counts, the first failure in short, and the hint for the TODO behind it.

`koans check`, `koans` and `koans watch` show runs this way; `koans verify --messages` shows what a
learner would read for each mutant with the same functions.
"""

from __future__ import annotations

import textwrap

from koans.course.edition_data import todos_of
from koans.course.manifest import Chapter, find_chapter
from koans.learn.runner import ChapterRun
from koans.learn.state import _rel
from koans.testkit.results import LIKELY_HANG_CAUSE


WIDTH = 96


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


def _header(chapter: Chapter, impl: str = "exercises") -> None:
    print(f"Chapter {chapter.number:02d}: {chapter.title}   ({_rel(chapter.source_file(impl))})", flush=True)


def impl_of(extra_args: tuple[str, ...]) -> str:
    """The code a run tests: exercises/, unless pytest's arguments chose another (`--impl solutions`)."""
    impl = "exercises"
    for i, arg in enumerate(extra_args):
        if arg == "--impl" and i + 1 < len(extra_args):
            impl = extra_args[i + 1]
        elif arg.startswith("--impl="):
            impl = arg.split("=", 1)[1]
    return impl


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
