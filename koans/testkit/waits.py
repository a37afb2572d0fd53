"""Which TODO a wait is for: the frames of exercises/, solutions/ and tests/ on the way to a wait, and
the TODO each runs or calls. The failure messages (explain.py) and the hang notices (hangs.py) use it.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from pathlib import Path

from koans.course.manifest import PROJECT_ROOT, find_chapter
from koans.course.todos import Todo

LEARNER_DIRS = ("exercises", "solutions", "tests")


def project_path(filename: str) -> Path | None:
    """`filename` relative to the project when it is under exercises/, solutions/ or tests/, else None.

    Everything else (pytest, asyncio, Monarch, koans/, conftest.py) is plumbing a learner need not read.
    """
    try:
        relative = Path(filename).resolve().relative_to(PROJECT_ROOT.resolve())
    except (ValueError, OSError):
        return None
    return relative if relative.parts and relative.parts[0] in LEARNER_DIRS and len(relative.parts) > 1 else None


def source_line(path: Path, lineno: int) -> str:
    """The line `lineno` of a project file, stripped."""
    import linecache

    return linecache.getline(str(PROJECT_ROOT / path), lineno).strip()


#: A call on one line: an endpoint (`x.name.call_one(`), a function (`name(`) or a method (`.name(`).
_CALLS = re.compile(r"\.(\w+)\.(?:call_one|call|choose|broadcast|stream)\(|(?<![\w.])(\w+)\(|\.(\w+)\(")


def _function_name(todo: Todo) -> str:
    return todo.key.split("#")[0].split(".")[-1]


def todos_called(line: str, todos: list[Todo]) -> list[Todo]:
    """The TODOs whose function or endpoint this line of code calls, in the order it calls them."""
    code = "" if line.lstrip().startswith("#") else line.split("  #", 1)[0]
    found = []
    for call in _CALLS.finditer(code):
        name = call.group(1) or call.group(2) or call.group(3)
        found += [todo for todo in todos if _function_name(todo) == name and todo not in found]
    return found


def todo_of_frame(path: Path, function: str, todos: list[Todo]) -> Todo | None:
    """The TODO whose own function this frame runs (a chapter file of exercises/ or solutions/), if any."""
    if path.parts[0] == "tests":
        return None
    for todo in todos:
        if path.name == f"{find_chapter(todo.chapter).module}.py" and _function_name(todo) == function:
            return todo
    return None


@dataclass(frozen=True)
class Culprit:
    """Where a wait is (path, line, function), and the TODOs it is most likely for, likeliest first."""

    path: Path
    line: int
    function: str
    todos: tuple[Todo, ...]
    called: Todo | None  # the TODO this line calls, when it calls one

    def where(self) -> str:
        return f"{self.path}:{self.line}: {source_line(self.path, self.line)}"

    def waiting_for(self) -> str:
        if self.called is not None:
            return f"in {self.function}, for {_function_name(self.called)} (TODO {self.called.key})"
        return f"in {self.function} (TODO {self.todos[0].key})"


def find_culprit(frames: list[tuple[Path, int, str]], todos: list[Todo], own_first: bool = False) -> Culprit | None:
    """Walking out from the innermost frame (frames: innermost first), the first that waits in a TODO's
    own function or calls a TODO on its line. The TODO called comes first (what is waited for), then the
    function's own TODO; `own_first` swaps them (a wait with no timeout is the waiting function's fault)."""
    for path, line, function in frames:
        called = todos_called(source_line(path, line), todos)
        own = todo_of_frame(path, function, todos)
        found = called[:1] + ([own] if own is not None and own not in called[:1] else [])
        if own_first and own is not None:
            found = [own] + [t for t in found if t is not own]
        if found:
            return Culprit(path, line, function, tuple(found), called[0] if called else None)
    return None


def project_frames_of_traceback(tb) -> list[tuple[Path, int, str]]:
    """The traceback's frames in exercises/, solutions/ or tests/, innermost first."""
    found = []
    for frame, lineno in traceback.walk_tb(tb):
        path = project_path(frame.f_code.co_filename)
        if path is not None and frame.f_code.co_name != "<module>":
            found.append((path, lineno, frame.f_code.co_name))
    return found[::-1]
