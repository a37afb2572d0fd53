"""What this checkout holds: the course's own repository (solutions/ is there), or a student edition
(koans/edition.json holds what the runner would read from solutions/: each TODO, each stub, and with
--workshop the stretch TODOs' code). Everything that reads TODOs or stubs asks here; building an
edition is the instructor's koans/grading/edition.py.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from koans.course.manifest import PROJECT_ROOT, Chapter, find_chapter
from koans.course.todos import Todo, find_todos, make_exercise

DATA_NAME = "edition.json"
NO_SOLUTIONS = ("{what} needs the reference solutions, and this is the student edition of the course: "
                "it holds none (no solutions/, no mutants/). Run it in the course's own repository.")

class EditionError(RuntimeError):
    """The edition cannot be built, or it lacks what a command needs."""


def _data() -> dict:
    path = PROJECT_ROOT / "koans" / DATA_NAME
    try:
        return json.loads(path.read_text())
    except OSError:
        raise EditionError(f"{path} is missing: this is neither the course repository (no solutions/) "
                           "nor a complete student edition") from None


def is_student_edition(root: Path = PROJECT_ROOT) -> bool:
    return not (root / "solutions").is_dir() and (root / "koans" / DATA_NAME).is_file()


def edition_todos(tag: str) -> list:
    """A chapter's TODOs (koans.course.todos.Todo), as the solutions define them, from koans/edition.json."""
    return [Todo(**{**entry, "guidance": tuple(entry["guidance"])}) for entry in _data()["todos"].get(tag, [])]


def has_stretch_code() -> bool:
    return (PROJECT_ROOT / "solutions").is_dir() or bool(_data().get("stretch"))


def stretch_code(tag: str, key: str) -> list[str]:
    """The code `koans workshop` gives for a stretch TODO (an edition built with --workshop holds it)."""
    code = _data().get("stretch", {}).get(tag, {}).get(key)
    if code is None:
        raise EditionError("this student edition was built for grading, without the stretch TODOs' code that "
                           "`koans workshop` gives: write them yourself (they are tested either way), or ask "
                           "for the workshop's edition (koans edition DIR --workshop)")
    return code


def pristine_stub(chapter: Chapter) -> str:
    """The chapter's exercise file as it was given: from solutions/ here, from koans/edition.json in an edition."""
    solution = chapter.source_file("solutions")
    if solution.is_file():
        return make_exercise(solution.read_text(), str(solution))
    return _data()["stubs"][f"{chapter.module}.py"]


def todos_of(chapter: Chapter) -> list[Todo]:
    """The chapter's TODOs (koans.course.todos.Todo objects), read from its solution, or from
    koans/edition.json in a student edition. This does not import Monarch, so the CLI stays quick."""
    return _todos_of_tag(chapter.tag)


@functools.lru_cache(maxsize=None)
def _todos_of_tag(tag: str) -> list[Todo]:
    path = find_chapter(tag).source_file("solutions")
    if not path.is_file():  # a student edition: no solutions/; koans/edition.json holds the TODOs
        return edition_todos(tag)
    return find_todos(path.read_text(), str(path))
