"""Two depths of the same chapters: the workshop and self-study.

Self-study and grading run every TODO. The workshop (3 hours) runs each
chapter's core TODOs and gives the stretch ones (the manifest's `stretch`)
as code: `koans workshop` writes each stretch TODO's solution in place of
its stub, in the learner's own exercise files, and marks it.

    def sample(self, ...):
        # (the TODO's contract comment stays)
        # GIVEN in the workshop, a stretch TODO: `koans workshop --off` puts its stub back
        self.learner_version = max(...)
        ...

Only a stub that is still there is filled, and only a filled region that is
still exactly as given is stubbed again, so a learner's own code is never
overwritten. The tests of a stretch TODO are the same at both depths.
"""

from __future__ import annotations

from pathlib import Path

from koans.course.edition_data import stretch_code, todos_of
from koans.course.manifest import Chapter

GIVEN_MARK = "# GIVEN in the workshop, a stretch TODO: `koans workshop --off` puts its stub back"


def _solution_code(chapter: Chapter, key: str, root: Path) -> tuple[object, list[str]]:
    """The TODO, and the code lines of its region in the solution (its guidance comments left out)."""
    todo = next(t for t in todos_of(chapter) if t.key == key)
    solution = root / "solutions" / f"{chapter.module}.py"
    if not solution.is_file():  # a student edition: built with --workshop, it holds the stretch code
        return todo, stretch_code(chapter.tag, key)
    lines = solution.read_text().splitlines()
    return todo, lines[todo.begin + len(todo.guidance): todo.end - 1]


def fill_text(chapter: Chapter, text: str, root: Path) -> tuple[str, list[str]]:
    """`text` (an exercise file) with each stretch TODO whose stub is still there given as code; and their keys."""
    filled = []
    for key in chapter.stretch:
        todo, code = _solution_code(chapter, key, root)
        if todo.stub_line + "\n" not in text:
            continue  # written already (or given before): leave it
        given = "\n".join([todo.indent + GIVEN_MARK, *code]) + "\n"
        text = text.replace(todo.stub_line + "\n", given, 1)
        filled.append(key)
    return text, filled


def fill(chapter: Chapter, root: Path) -> list[str]:
    """Give the stretch TODOs whose stub is still in the chapter's exercise file as code; their keys."""
    path = root / "exercises" / f"{chapter.module}.py"
    text, filled = fill_text(chapter, path.read_text(), root)
    if filled:
        path.write_text(text)
    return filled


def unfill(chapter: Chapter, root: Path) -> tuple[list[str], list[str]]:
    """Put back the stub of each stretch TODO still exactly as `fill` gave it. (stubbed, left as edited)."""
    path = root / "exercises" / f"{chapter.module}.py"
    text = path.read_text()
    stubbed, edited = [], []
    for key in chapter.stretch:
        todo, code = _solution_code(chapter, key, root)
        given = "\n".join([todo.indent + GIVEN_MARK, *code]) + "\n"
        if given in text:
            text = text.replace(given, todo.stub_line + "\n", 1)
            stubbed.append(key)
        elif todo.indent + GIVEN_MARK in text:
            edited.append(key)
    if stubbed:
        path.write_text(text)
    return stubbed, edited


def is_filled(chapter: Chapter, key: str, root: Path) -> bool:
    """Whether this stretch TODO's region holds the code `fill` gave it (unchanged)."""
    todo, code = _solution_code(chapter, key, root)
    given = "\n".join([todo.indent + GIVEN_MARK, *code]) + "\n"
    return given in (root / "exercises" / f"{chapter.module}.py").read_text()
