"""The TODO regions of a solution file, and the exercise (stub) text made from them.

A solution marks each piece the learner writes as a *region*:

    def greet(self, who):
        # >>> TODO(ch01): count this greeting and return the greeting text
        # Format: "Hello, <who>! I am <name> (greeting #<n>)."
        self.greetings_given += 1
        return f"Hello, {who}! ..."
        # <<< TODO

In the exercise the region becomes a stub. Comment lines at the top of the
region are guidance and stay; the code becomes one `raise`:

    def greet(self, who):
        # Format: "Hello, <who>! I am <name> (greeting #<n>)."
        raise NotImplementedError("TODO(ch01): count this greeting and return the greeting text")

Every line outside the regions is copied unchanged. Writing exercises/ from solutions/ is the
maintainers' `python -m koans.maintain.stubgen` (koans/maintain/stubgen.py).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

BEGIN = re.compile(r"^(?P<indent>[ \t]*)# >>> TODO\((?P<chapter>ch\d\d)\): (?P<summary>\S.*?)\s*$")
END = re.compile(r"^[ \t]*# <<< TODO\s*$")
CHAPTER_FILE = re.compile(r"^(ch\d\d)_\w+\.py$")
#: Code that can wait for something: a TODO whose solution has none of it cannot hang (pure arithmetic).
WAITS = re.compile(r"\bawait\b|\.get\(|\basync with\b|\.wait(_for)?\(|\bsleep\(")


class StubError(ValueError):
    """A solution file whose TODO markers cannot be turned into a stub."""


@dataclass(frozen=True)
class Todo:
    """One learner region of a solution file."""

    chapter: str  # "ch01"
    key: str  # qualified name of the enclosing function, e.g. "Greeter.greet"
    summary: str  # what to write, one line
    guidance: tuple[str, ...]  # comment lines kept in the exercise, indentation included
    indent: str
    begin: int  # 1-based line of the `# >>>` marker in the solution
    end: int  # 1-based line of the `# <<<` marker
    can_wait: bool = False  # the solution waits on something (await, .get, a condition): it could hang

    @property
    def message(self) -> str:
        return f"TODO({self.chapter}): {self.summary}"

    @property
    def stub_line(self) -> str:
        return f'{self.indent}raise NotImplementedError("{self.message}")'


def _function_spans(source: str, path: str) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function in `source`."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as err:
        raise StubError(f"{path}:{err.lineno}: the solution does not parse: {err.msg}") from None
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    spans.append((child.lineno, child.end_lineno or child.lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return spans


def _enclosing_function(spans: list[tuple[int, int, str]], line: int) -> str:
    inside = [(first, name) for first, last, name in spans if first < line <= last]
    return max(inside)[1] if inside else "<module>"


def find_todos(source: str, path: str = "<solution>") -> list[Todo]:
    """Parse the TODO regions of one solution file, checking the markers."""
    match = CHAPTER_FILE.match(Path(path).name)
    file_chapter = match.group(1) if match else None
    lines = source.splitlines()
    spans = _function_spans(source, path)
    todos: list[Todo] = []
    seen_keys: dict[str, int] = {}
    open_marker: tuple[int, re.Match[str]] | None = None
    for number, line in enumerate(lines, start=1):
        begin, end = BEGIN.match(line), END.match(line)
        if begin:
            if open_marker:
                raise StubError(f"{path}:{number}: a TODO region starts inside the one opened at line {open_marker[0]}")
            if file_chapter is None or begin["chapter"] != file_chapter:
                raise StubError(f"{path}:{number}: TODO({begin['chapter']}) in a file of chapter {file_chapter}")
            if '"' in begin["summary"] or "\\" in begin["summary"]:
                raise StubError(f"{path}:{number}: a TODO summary may not contain double quotes or backslashes")
            open_marker = (number, begin)
        elif end:
            if not open_marker:
                raise StubError(f"{path}:{number}: '# <<< TODO' without an opening '# >>> TODO(chNN): ...'")
            start, marker = open_marker
            body = lines[start : number - 1]
            guidance = []
            for body_line in body:
                if not body_line.lstrip().startswith("#"):
                    break
                guidance.append(body_line)
            if len(guidance) == len(body) or all(not b.strip() for b in body[len(guidance) :]):
                raise StubError(f"{path}:{start}: the TODO region has no code in it")
            key = _enclosing_function(spans, start)
            seen_keys[key] = seen_keys.get(key, 0) + 1
            if seen_keys[key] > 1:
                key = f"{key}#{seen_keys[key]}"
            can_wait = bool(WAITS.search("\n".join(body[len(guidance):])))
            todos.append(Todo(marker["chapter"], key, marker["summary"], tuple(guidance), marker["indent"], start, number,
                              can_wait))
            open_marker = None
        elif re.search(r"(>>>|<<<)\s*TODO", line):
            raise StubError(f"{path}:{number}: malformed TODO marker; expected '# >>> TODO(chNN): <summary>' or '# <<< TODO'")
    if open_marker:
        raise StubError(f"{path}:{open_marker[0]}: TODO region is never closed with '# <<< TODO'")
    return todos


def make_exercise(source: str, path: str = "<solution>", keep_solved: frozenset[str] = frozenset()) -> str:
    """The exercise text for one solution file.

    Regions whose key is in `keep_solved` keep their solution code (markers
    dropped); `koans verify` uses this to stub one TODO at a time.
    """
    todos = find_todos(source, path)
    lines = source.splitlines()
    out: list[str] = []
    cursor = 0
    for todo in todos:
        out.extend(lines[cursor : todo.begin - 1])
        if todo.key in keep_solved:
            out.extend(lines[todo.begin : todo.end - 1])
        else:
            out.extend(todo.guidance)
            out.append(todo.stub_line)
        cursor = todo.end
    out.extend(lines[cursor:])
    text = "\n".join(out) + ("\n" if source.endswith("\n") else "")
    try:
        ast.parse(text, filename=path)
    except SyntaxError as err:
        raise StubError(f"{path}: the generated exercise does not parse (line {err.lineno}: {err.msg})") from None
    return text


def expected_exercises(solutions_dir: Path) -> dict[str, str]:
    """File name -> exercise text, for every .py file of `solutions_dir`."""
    return {
        path.name: make_exercise(path.read_text(), str(path))
        for path in sorted(solutions_dir.glob("*.py"))
    }


def out_of_sync(solutions_dir: Path, exercises_dir: Path) -> list[str]:
    """Names of exercise files that differ from what the solutions generate."""
    expected = expected_exercises(solutions_dir)
    present = {p.name for p in exercises_dir.glob("*.py")}
    stale = [name for name, text in expected.items() if not (exercises_dir / name).is_file() or (exercises_dir / name).read_text() != text]
    extra = sorted(present - set(expected))
    return stale + [f"{name} (no matching solution)" for name in extra]
