"""Plausible wrong answers to the TODOs, for `koans verify --mutants` (maintainers).

A koans course is only as good as its tests' power to tell a right answer
from a wrong one that runs. Each chapter's mistakes live in
`mutants/chNN_<slug>.py` (outside exercises/, so learners do not meet them)
as a list of `Mutant(todo_key, description, code, clause)`: the code that a
learner might plausibly have written in that TODO's region, instead of the
solution, and the clause of the contract it breaks.

`koans verify --mutants` applies each mutant alone (every other TODO keeps
its solution), runs the chapter's tests, and passes only if a test marked
with that TODO fails. `koans verify --messages` also checks that what the
learner is shown names the clause: one of the phrases in `clause` (" | "
between alternatives) appears in the failure's message, case and spacing aside.
"""

from __future__ import annotations

import importlib.util
import os
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from koans.course.manifest import PROJECT_ROOT, Chapter
from koans.course.todos import StubError, find_todos
from koans.maintain.project_copy import copy_project_with_exercise

# $KOANS_MUTANTS_DIR: run a set of wrong answers kept elsewhere (an independent set, written
# without reading the tests) through the same check: `KOANS_MUTANTS_DIR=DIR koans verify --mutants=only`.
MUTANTS_DIR = Path(os.environ.get("KOANS_MUTANTS_DIR") or PROJECT_ROOT / "mutants")


@dataclass(frozen=True)
class Mutant:
    todo: str  # the TODO key, e.g. "Service.route"
    description: str  # the mistake, in one line
    code: str  # what replaces the solution's code in that TODO's region (indentation is fixed up)
    # The clause it breaks, as words a right message must use: alternatives between " | ", e.g. "cursor | next replica".
    # Written from the mistake, not copied from the message; empty = not yet stated (counted as not named).
    clause: str = ""


def _plain(text: str) -> str:
    """Lower case, backticks and quotes dropped, runs of spacing as one space: how phrases are compared."""
    return " ".join(re.sub(r"[`'\"]", "", text).lower().split())


def names_clause(mutant: Mutant, message: str) -> bool:
    """Whether `message` (what the learner is shown) names the clause that `mutant` breaks."""
    shown = _plain(message)
    return any(_plain(phrase) in shown for phrase in mutant.clause.split(" | ") if phrase.strip())


def mutants_of(chapter: Chapter) -> list[Mutant]:
    """The chapter's mutants, from mutants/chNN_<slug>.py (none if the file is missing)."""
    path = MUTANTS_DIR / f"{chapter.module}.py"
    if not path.is_file():
        return []
    spec = importlib.util.spec_from_file_location(f"koans_mutants_{chapter.tag}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.MUTANTS)


def apply_mutant(source: str, path: str, mutant: Mutant) -> str:
    """The solution `source` with the region of `mutant.todo` replaced by the mutant's code.

    Every other region keeps its solution; markers are dropped.
    """
    todos = find_todos(source, path)
    target = next((t for t in todos if t.key == mutant.todo), None)
    if target is None:
        raise StubError(f"{path}: no TODO {mutant.todo!r} for the mutant {mutant.description!r}")
    lines = source.splitlines()
    mutated = textwrap.dedent(mutant.code).strip("\n").splitlines()
    if [line.strip() for line in mutated] == [line.strip() for line in lines[target.begin: target.end - 1]
                                              if not line.strip().startswith("#")]:
        raise StubError(f"{path}: the mutant {mutant.description!r} of {mutant.todo!r} is the solution itself: "
                        "its change did not apply")
    out, cursor = [], 0
    for todo in todos:
        out.extend(lines[cursor: todo.begin - 1])
        if todo is target:
            out.extend(textwrap.indent(textwrap.dedent(mutant.code).strip("\n"), todo.indent).splitlines())
        else:
            out.extend(lines[todo.begin: todo.end - 1])
        cursor = todo.end
    out.extend(lines[cursor:])
    mutated_source = "\n".join(out) + "\n"
    try:  # a wrong answer that does not even parse is no plausible one: its "catch" would prove nothing
        compile(mutated_source, path, "exec")
    except SyntaxError as err:
        raise StubError(f"{path}:{err.lineno}: the mutant {mutant.description!r} of {mutant.todo!r} does not parse "
                        f"({err.msg}): fix its code (indentation included)") from None
    return mutated_source


def write_mutated_copy(chapter: Chapter, mutant: Mutant, into: Path) -> None:
    """A copy of the project in `into` whose exercises are the solutions, with `mutant` applied."""
    copy_project_with_exercise(chapter, lambda text, path: apply_mutant(text, path, mutant), into)
