"""Syntax errors, before pytest: the first exercise file that does not compile, and the TODO it is in."""

from __future__ import annotations

import re
from pathlib import Path

from koans.course.edition_data import todos_of
from koans.course.manifest import Chapter, find_chapter
from koans.learn.state import _rel


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
