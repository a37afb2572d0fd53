"""The course in numbers, per chapter, for maintainers: `python -m koans.course`.

What a learner spends time on, per chapter:

  file     lines of the exercise file the learner edits
  read     lines a learner reads to do the TODOs: the exercise file outside its
           stub lines, plus the given modules the manifest lists under `reading`
           (every other given module says it may be skipped)
  doc      lines of the chapter's doc
  todos    TODO regions, and `code`: the lines of solution code inside them
  hints    progressive hints over all the chapter's TODOs
  model    estimated minutes, by the model below; `minutes` is the manifest's figure

The model (docs/appendix/course.md says why these rates):
    reading prose and code at 30 lines a minute, writing 24 seconds per line of
    solution code, and 1.5 minutes per TODO for running its tests and reading
    what they say.
tests/test_harness.py checks that the manifest's minutes stay within 25% of the
model's, and that the workshop track fits in 180 minutes.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from koans.manifest import CHAPTERS, PROJECT_ROOT, Chapter
from koans.stubgen import find_todos

READ_LINES_PER_MIN = 30
MIN_PER_CODE_LINE = 0.4
MIN_PER_TODO = 1.5


@dataclass(frozen=True)
class Figures:
    chapter: Chapter
    file: int
    read: int
    doc: int
    todos: int
    code: int
    hints: int

    @property
    def model_minutes(self) -> float:
        return (self.read + self.doc) / READ_LINES_PER_MIN + MIN_PER_CODE_LINE * self.code + MIN_PER_TODO * self.todos


def _lines(path) -> int:
    return len(path.read_text().splitlines())


def figures(chapter: Chapter, root=PROJECT_ROOT) -> Figures:
    solution = root / "solutions" / f"{chapter.module}.py"
    exercise = root / "exercises" / f"{chapter.module}.py"
    text = solution.read_text()
    todos = find_todos(text, str(solution))
    lines = text.splitlines()
    code = sum(1 for t in todos for line in lines[t.begin: t.end - 1]
               if line.strip() and not line.strip().startswith("#"))
    exercise_lines = exercise.read_text().splitlines()
    stubs = sum(1 for line in exercise_lines if 'raise NotImplementedError("TODO(' in line)
    read = len(exercise_lines) - stubs + sum(_lines(root / "exercises" / name) for name in chapter.reading)
    hints = sum(len(chapter.hints_for(t.key)) for t in todos)
    return Figures(chapter, len(exercise_lines), read, _lines(root / "docs" / chapter.doc_file.name), len(todos), code,
                   hints)


def table(rows: list[Figures]) -> str:
    header = f"{'ch':<5}{'track':<10}{'file':>5}{'read':>6}{'doc':>5}{'todos':>6}{'code':>5}{'hints':>6}{'model':>7}{'minutes':>8}"
    out = [header, "-" * len(header)]
    for f in rows:
        c = f.chapter
        out.append(f"{c.tag:<5}{c.track:<10}{f.file:>5}{f.read:>6}{f.doc:>5}{f.todos:>6}{f.code:>5}{f.hints:>6}"
                   f"{f.model_minutes:>7.0f}{c.minutes:>8}")
    for track in ("workshop", "elective"):
        mine = [f for f in rows if f.chapter.track == track]
        out.append(f"{track} total: {sum(f.chapter.minutes for f in mine)} min "
                   f"(model {sum(f.model_minutes for f in mine):.0f} min), {len(mine)} chapters")
    return "\n".join(out)


APPENDIX = PROJECT_ROOT / "docs" / "appendix" / "course.md"


def update_appendix(text: str) -> None:
    """Put `text` in place of the table in docs/appendix/course.md (the code block after its last heading)."""
    page = APPENDIX.read_text()
    start = page.index("```\nch   track")
    end = page.index("```", start + 3)
    APPENDIX.write_text(page[:start] + "```\n" + text + "\n" + page[end:])


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m koans.course", description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="also write the table into docs/appendix/course.md")
    args = parser.parse_args(argv)
    text = table([figures(c) for c in CHAPTERS])
    print(text)
    if args.update:
        update_appendix(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
