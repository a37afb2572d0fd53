"""Failure messages that point the learner at a TODO: which TODO a failure is about, where it is now,
and what went wrong in short (the whole error, only the learner's frames).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re
import traceback
from pathlib import Path

from koans.course import depth
from koans.course.manifest import PROJECT_ROOT, find_chapter
from koans.course.todos import Todo
from koans.testkit.code_under_test import chapter_todos
from koans.testkit.time_limit import TestTimeLimit
from koans.testkit.waits import find_culprit, project_frames_of_traceback, project_path, source_line

TODO_IN_TEXT = re.compile(r"TODO\((ch\d\d)\): ")


def locate(todo: Todo, impl: str) -> str:
    """Where the learner finds this TODO now: 'exercises/ch01_x.py:42  (Greeter.greet)'.

    The line of the stub's `raise` while it is there, else the line of the
    function that held it (the learner has started on it).
    """
    path = find_chapter(todo.chapter).source_file(impl)
    lines = path.read_text().splitlines()
    stub = f'NotImplementedError("{todo.message}")'
    name = todo.key.split("#")[0].split(".")[-1]
    line = next((n for n, text in enumerate(lines, 1) if stub in text), None)
    started = ""
    if line is None:
        started = ", changed by you" if impl == "exercises" else ""
        if impl == "exercises" and _given_in_the_workshop(todo):
            started = ", given in the workshop: not your code"
        line = next((n for n, text in enumerate(lines, 1) if re.match(rf"\s*(async\s+)?def {re.escape(name)}\b", text)), 1)
    return f"{path.relative_to(PROJECT_ROOT)}:{line}  ({todo.key}{started})"


def _given_in_the_workshop(todo: Todo) -> bool:
    """Whether this is a stretch TODO that `koans workshop` gave as code, still exactly as given."""
    chapter = find_chapter(todo.chapter)
    if todo.key not in chapter.stretch:
        return False
    try:
        return depth.is_filled(chapter, todo.key, PROJECT_ROOT)
    except Exception:  # a student edition without the stretch code, or a file that does not parse
        return False


def todos_named_in_text(text: str) -> list[Todo]:
    """TODOs whose stub message appears in an error's text."""
    found = []
    for tag in sorted(set(TODO_IN_TEXT.findall(text))):
        try:
            todos = chapter_todos(find_chapter(tag))
        except (KeyError, OSError):
            continue
        found += [todo for todo in todos if todo.message in text]
    return found


def exception_chain(exc: BaseException | None, honour_suppress: bool = False):
    """`exc`, then its cause or context, and so on (each once). With `honour_suppress`, a context
    hidden by `raise ... from None` ends the chain, as in a printed traceback."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or (None if honour_suppress and exc.__suppress_context__ else exc.__context__)


def error_text(exc: BaseException) -> str:
    """The exception, its remote original (Monarch's ActorError.exception) and its causes."""
    parts = []
    for exc in exception_chain(exc):
        parts.append(f"{type(exc).__name__}: {exc}")
        remote = getattr(exc, "exception", None)
        if isinstance(remote, BaseException):
            parts.append(f"{type(remote).__name__}: {remote}")
    return "\n".join(parts)


def _test_line(excinfo, test_path: Path) -> str:
    """'tests/test_x.py:37: <source line>' for the test's own (innermost) frame."""
    found = ""
    for frame, lineno in traceback.walk_tb(excinfo.tb):
        if Path(frame.f_code.co_filename).resolve() == test_path.resolve():
            source = test_path.read_text().splitlines()[lineno - 1].strip()
            found = f"{test_path.relative_to(PROJECT_ROOT)}:{lineno}: {source}"
    return found


TIMEOUTS = (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)


def explain_failure(excinfo, test_path: Path, marked: list[Todo], impl: str,
                    scope: list[Todo] | None = None) -> tuple[str, bool, list[Todo]]:
    """A message that points at the TODO behind a failure.

    Returns (text, replaces_traceback, the TODOs the failure is about). A stub
    that was never written and a call that never answered get a short message
    instead of Monarch's long traceback; any other failure keeps its traceback
    and gets the pointer added. A test that checks several TODOs can say which
    one an assertion is about (koans.testkit.testing.checking); a timeout is pinned on
    the TODO its wait was for, never on one that cannot wait (plain arithmetic).
    """
    exc = excinfo.value
    text = error_text(exc)
    at_test = _test_line(excinfo, test_path)
    at_test = f"\n  from {at_test}" if at_test else ""
    scope = scope or marked
    known = {todo.key: todo for todo in [*scope, *marked]}
    about = [known[key] for key in blamed_todos(exc) if key in known] or marked

    def checks(todos: list[Todo]) -> str:
        listed = "\n".join(f"  {todo.message}\n    at {locate(todo, impl)}" for todo in todos)
        return f"This test checks:\n{listed}" if todos else "This test names no TODO."

    if "NotImplementedError" in text and TODO_IN_TEXT.search(text):
        todos = todos_named_in_text(text) or about
        if not todos:
            return "", False, []
        remote = "; raised in the actor, sent back to the caller" if "ActorError" in text or "Supervision" in text else ""
        also = "".join(f"\n  also not written: {todo.message}\n    at {locate(todo, impl)}" for todo in todos[1:])
        return (
            f"Not written yet: {todos[0].message}\n  at   {locate(todos[0], impl)}{remote}{at_test}{also}\n"
            "Write that part, then run this chapter again.",
            True, todos,
        )
    if "supervision events" in text:
        return (
            "Monarch refused to spawn on a ProcMesh that already had a failed actor."
            f"{at_test}\nAn earlier crash, or an exception inside a broadcast endpoint (which has no caller "
            "to report to, so it fails the actor), marks the whole mesh as failed. Spawn on a fresh ProcMesh."
            + (f"\n{checks(about)}" if about else ""),
            True, about,
        )
    if isinstance(exc, (TestTimeLimit, *TIMEOUTS)):
        no_timeout = isinstance(exc, TestTimeLimit)
        frames = project_frames_of_traceback(excinfo.tb)
        culprit = find_culprit(frames, scope, own_first=no_timeout)
        if blamed_todos(exc):
            suspects = about
        elif culprit is not None:
            suspects = list(culprit.todos)
        else:
            suspects = [todo for todo in about if todo.can_wait]
        if culprit is not None:
            where = f"\n  it waited at {culprit.where()}\n    {culprit.waiting_for()}"
        elif frames:
            where = f"\n  it waited at {frames[0][0]}:{frames[0][1]}: {source_line(frames[0][0], frames[0][1])}"
        else:
            where = ""
        if no_timeout:
            head = str(exc)
            why = ("A wait with no timeout never ended: look for a `.get()` without `timeout=`, "
                   "or an `await` on a call that never returns.")
        else:
            head = "No reply before the timeout" + (f"; check {suspects[0].message}" if suspects else "")
            why = ("A call this test made never returned. A stub that blocks, or waits for something that "
                   "never happens, is the usual cause.")
        if not suspects:
            why = ("It waited in code you were given, and none of the TODOs this test checks waits for "
                   "anything (each is a plain computation), so your code is unlikely to be the cause. A very "
                   "busy machine can make a run this slow: run the chapter again.")
        return f"{head}{where}{at_test}\n{why}\n{checks(suspects or about)}", True, suspects
    if about:
        return checks(about), False, about
    return "", False, []


# ---------------------------------------------------------------- what went wrong, in short

_TRACEBACK_HEADER = re.compile(r"^\s*Traceback\b.*:\s*$")
_TRACEBACK_FILE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+?)\s*$')


def _todo_of_function(path: Path, function: str) -> str | None:
    """The TODO key whose function this is, for a chapter file (`Greeter.greet` for `greet`)."""
    match = re.match(r"(ch\d\d)_", path.name)
    if not match or path.parts[0] == "tests":
        return None
    try:
        chapter = find_chapter(match.group(1))
    except KeyError:
        return None
    if path.name != f"{chapter.module}.py":
        return None
    for todo in chapter_todos(chapter):
        if todo.key.split("#")[0].split(".")[-1] == function:
            return todo.key
    return None


def _frame(path: Path, lineno: int, function: str, remote: bool) -> dict:
    return {"file": str(path), "line": lineno, "function": function, "source": source_line(path, lineno),
            "remote": remote, "todo": _todo_of_function(path, function)}


def _strip_tracebacks(text: str, frames: list[dict], remote: bool) -> str:
    """`text` without the Python tracebacks inside it (Monarch puts the remote one in the message);
    their frames in exercises/ or tests/ go to `frames`."""
    kept, in_traceback = [], False
    for line in text.splitlines():
        if _TRACEBACK_HEADER.match(line):
            in_traceback = True
            continue
        if in_traceback and (line.startswith((" ", "\t")) or not line.strip()):
            found = _TRACEBACK_FILE.match(line)
            path = project_path(found["file"]) if found else None
            if path is not None:
                frames.append(_frame(path, int(found["line"]), found["function"], remote))
            continue
        in_traceback = False
        kept.append(line)
    return "\n".join(kept).strip()


def failure_summary(excinfo) -> dict:
    """What went wrong, without plumbing: the whole error message (of the exception, of its remote
    original and of its causes) and the frames of exercises/ and tests/ on the way to it.

    {"error": "ActorError: ...\\nAttributeError: ...",
     "frames": [{"file": "exercises/ch01_x.py", "line": 48, "function": "greet",
                 "source": "self.count += 1", "remote": True, "todo": "Greeter.greet"}, ...]}
    """
    frames: list[dict] = []
    lines: list[str] = []
    for exc in exception_chain(excinfo.value, honour_suppress=True):
        # The failure's own frames as pytest caught it; a cause's, from its own traceback.
        for frame, lineno in traceback.walk_tb(excinfo.tb if exc is excinfo.value else exc.__traceback__):
            path = project_path(frame.f_code.co_filename)
            if path is not None:
                frames.append(_frame(path, lineno, frame.f_code.co_name, False))
        remote = "ActorError" in type(exc).__name__ or "Supervision" in type(exc).__name__
        message = str(exc)
        if type(exc).__name__ == "Failed":  # pytest.fail(...): the message is the story
            text = message
        else:
            text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        for line in _strip_tracebacks(text, frames, remote).splitlines():
            if line.strip() and line not in lines:
                lines.append(line)
        original = getattr(exc, "exception", None)
        if isinstance(original, BaseException) and original is not exc:
            line = f"{type(original).__name__}: {original}"
            if not any(line.strip() == kept.strip() for kept in lines):
                lines += _strip_tracebacks(line, frames, True).splitlines()
    unique, seen_frames = [], set()
    for frame in frames:
        key = (frame["file"], frame["line"], frame["remote"])
        if key not in seen_frames:
            seen_frames.add(key)
            unique.append(frame)
    return {"error": "\n".join(lines), "frames": unique}


def blamed_todos(exc: BaseException) -> list[str]:
    """The TODO keys a test named for this failure with `koans.testkit.testing.checking(...)`, if it did."""
    for link in exception_chain(exc):
        keys = getattr(link, "koans_todos", None)
        if keys:
            return list(keys)
    return []


def blamed_hint(exc: BaseException) -> int | None:
    """The hint (1-based) a test named for this failure with `checking(..., hint=N)`, if it did."""
    for link in exception_chain(exc):
        if getattr(link, "koans_todos", None):
            return getattr(link, "koans_hint", None)
    return None
