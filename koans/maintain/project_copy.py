"""Copies of the project for `koans verify`: the project as it is, with exercises/ = solutions/ except
one chapter file made otherwise (one TODO stubbed, a mutant applied, the workshop's depth).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from koans.course.manifest import PROJECT_ROOT, Chapter
from koans.course.todos import make_exercise
from koans.testkit.code_under_test import chapter_todos

COPIED = ("conftest.py", "pyproject.toml", "koans", "solutions", "tests")


def copy_project(into: Path, names: tuple[str, ...] = COPIED) -> None:
    """Copy these top-level files and folders of the project into `into` (no caches)."""
    for name in names:
        source = PROJECT_ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, into / name)


def copy_project_with_exercise(chapter: Chapter, make_text, into: Path) -> None:
    """Copy the project into `into`, with exercises = solutions except the chapter's own file, which
    becomes `make_text(solution_text, solution_path)`."""
    copy_project(into)
    shutil.copytree(PROJECT_ROOT / "solutions", into / "exercises", ignore=shutil.ignore_patterns("__pycache__"))
    solution = PROJECT_ROOT / "solutions" / f"{chapter.module}.py"
    (into / "exercises" / solution.name).write_text(make_text(solution.read_text(), str(solution)))


def copy_project_with_one_stub(chapter: Chapter, todo_key: str, into: Path) -> None:
    """Copy the project into `into`, with exercises = solutions except one stubbed TODO."""
    keys = {todo.key for todo in chapter_todos(chapter)}
    copy_project_with_exercise(
        chapter, lambda text, path: make_exercise(text, path, keep_solved=frozenset(keys - {todo_key})), into)
