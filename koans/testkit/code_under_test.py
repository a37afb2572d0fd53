"""Which code is under test, and its TODOs: `--impl exercises|solutions` (or $KOANS_IMPL), importing
the chapter's module from this checkout, and saying briefly why it does not import.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
import traceback
from pathlib import Path

from koans.course.edition_data import NO_SOLUTIONS, edition_todos
from koans.course.manifest import IMPL_ENV, PROJECT_ROOT, Chapter, find_chapter
from koans.course.todos import Todo, find_todos

IMPLS = ("exercises", "solutions")


def selected_impl(option: str | None) -> str:
    """`--impl` wins, then $KOANS_IMPL, then the learner's `exercises`."""
    impl = option or os.environ.get(IMPL_ENV) or "exercises"
    if impl == "solutions" and not (PROJECT_ROOT / "solutions").is_dir():
        raise ValueError(NO_SOLUTIONS.format(what="--impl solutions"))
    if impl not in IMPLS:
        raise ValueError(f"unknown implementation {impl!r}: use --impl exercises or --impl solutions")
    return impl


def import_chapter(chapter: Chapter, impl: str):
    """Import `<impl>.chNN_<slug>` from this checkout.

    The project root goes first on sys.path and on PYTHONPATH, so that the
    Monarch processes we spawn (which import the module to unpickle actor
    classes) load the very same files as this process.
    """
    root = str(PROJECT_ROOT)
    if sys.path[:1] != [root]:
        sys.path.insert(0, root)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if paths[:1] != [root]:
        os.environ["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p and p != root])
    module = importlib.import_module(f"{impl}.{chapter.module}")
    if Path(module.__file__).resolve() != chapter.source_file(impl).resolve():
        raise ImportError(
            f"{impl}.{chapter.module} was imported from {module.__file__}, not from this checkout "
            f"({chapter.source_file(impl)}). Run pytest from the project root."
        )
    return module


def import_failure_message(chapter: Chapter, impl: str, err: Exception) -> str:
    """Why `<impl>/chNN_*.py` could not be imported, pointing at the line."""
    path = chapter.source_file(impl).relative_to(PROJECT_ROOT)
    if isinstance(err, SyntaxError):
        return f"{path} does not compile: line {err.lineno}: {err.msg}\n    {(err.text or '').rstrip()}"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename).name == path.name]
    where = f":{frames[-1].lineno}" if frames else ""
    return f"{path}{where} fails while importing: {type(err).__name__}: {err}"


@functools.lru_cache(maxsize=None)
def chapter_todos(chapter: Chapter) -> list[Todo]:
    """The chapter's TODOs, read from the solution (the source of truth)."""
    path = chapter.source_file("solutions")
    if not path.is_file():  # a student edition: no solutions/; koans/edition.json holds the TODOs
        return edition_todos(chapter.tag)
    return find_todos(path.read_text(), str(path))


def scope_todos(chapter: Chapter) -> list[Todo]:
    """The TODOs a chapter's tests run: its own, then those of the chapters it builds on."""
    todos = list(chapter_todos(chapter))
    for number in chapter.builds_on:
        todos += chapter_todos(find_chapter(number))
    return todos
