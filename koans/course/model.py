"""The course in numbers, per chapter, for maintainers: `python -m koans.course.model`.

What a learner spends time on, per chapter:

  read     lines of code to read: the exercise file outside its stub lines (a stretch TODO given
           in the workshop counts here), plus given modules the manifest lists under `reading`
  doc      lines of the chapter's doc; in the workshop, up to its "## Going further" heading
  code     lines of solution code inside the TODOs the learner writes
  clauses  the clauses of those TODOs' contracts (summary and comment, cut at . ; :), each a
           thing to get right and, often, one more run of the tests
  model    estimated minutes (below); `minutes` is the manifest's figure

The model, fitted to two studies of learners' own clock (docs/appendix/course.md):

    minutes = read / 60  +  0.123 x doc  +  0.528 x code  +  0.248 x clauses

The reading rate of given code (60 lines a minute, skimmed once) is fixed; the other three
rates are fitted, non-negative, by least squares to the learners' estimates for the chapters
as they read them (`python -m koans.course.model --fit` does it again from LEARNER_STUDY below).

Workshop chapters are estimated at the workshop's depth (stretch TODOs given, docs up to
"Going further"); electives at full depth. tests/course/test_harness.py checks that the manifest's
minutes stay within 25% of the model's, and that the workshop track fits in 180 minutes.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from koans.course.manifest import CHAPTERS, PROJECT_ROOT, Chapter
from koans.course.todos import Todo, find_todos

READ_LINES_PER_MIN = 60  # given code, skimmed once: a fixed prior, not fitted
MIN_PER_DOC_LINE = 0.123
MIN_PER_CODE_LINE = 0.528
MIN_PER_CLAUSE = 0.248

GOING_FURTHER = "## Going further"

#: The learners' studies: a row -> ((read, doc, code, clauses) of the chapter as they did it, their minutes).
#: Study 1: three learners did the chapters as new users and each estimated a person's time; minutes are the
#: middle of their range (chapter 10 without the flaky test; chapter 11 with its lab). Full depth.
#: Study 2: four learners, at the course as it stood at commit 336c36f: workshop chapters at workshop depth
#: (stretch TODOs given, docs up to "Going further"), electives at full depth; their clock, in minutes.
#: Study 3: new users (PyTorch users new to Monarch) on the student edition at commit e6c7282, which has no
#: workshop code: workshop chapters with every TODO written (stretch ones too), docs up to "Going further";
#: electives at full depth; the middle of each range of their clock, in minutes.
LEARNER_STUDY: dict[str, tuple[tuple[int, int, int, int], float]] = {
    "1/ch01": ((76, 105, 6, 7), 17.5),
    "1/ch02": ((80, 119, 15, 11), 25.0),
    "1/ch03": ((180, 108, 18, 10), 22.5),
    "1/ch04": ((103, 75, 7, 7), 13.5),
    "1/ch05": ((147, 98, 16, 17), 22.5),
    "1/ch06": ((159, 102, 31, 18), 30.0),
    "1/ch07": ((223, 125, 35, 26), 40.0),
    "1/ch08": ((136, 140, 34, 15), 40.0),
    "1/ch09": ((144, 118, 35, 15), 35.0),
    "1/ch10": ((169, 147, 18, 20), 40.0),
    "1/ch11": ((124, 134, 27, 20), 42.5),
    "2/ch01": ((76, 66, 6, 7), 16.0),
    "2/ch02": ((88, 65, 6, 5), 19.0),
    "2/ch03": ((180, 64, 18, 10), 23.0),
    "2/ch04": ((103, 79, 7, 7), 14.0),
    "2/ch05": ((148, 65, 16, 17), 27.0),
    "2/ch06": ((165, 61, 31, 18), 35.0),
    "2/ch07": ((284, 64, 21, 21), 35.0),
    "2/ch08": ((142, 151, 35, 16), 50.0),
    "2/ch09": ((158, 62, 21, 11), 25.0),
    "2/ch10": ((177, 67, 18, 20), 30.0),
    "2/ch11": ((124, 153, 27, 21), 50.0),
    "2/ch12": ((118, 154, 31, 18), 50.0),
    "3/ch01": ((78, 46, 6, 7), 15.0),
    "3/ch02": ((85, 46, 12, 13), 15.0),
    "3/ch03": ((181, 50, 18, 11), 22.5),
    "3/ch04": ((104, 80, 7, 8), 12.0),
    "3/ch05": ((159, 69, 13, 23), 32.5),
    "3/ch06": ((166, 45, 31, 20), 25.0),
    "3/ch07": ((272, 52, 35, 31), 27.0),
    "3/ch09": ((148, 51, 35, 21), 32.5),
    "3/ch10": ((240, 46, 18, 29), 30.0),
    "3/ch11": ((165, 250, 27, 37), 46.0),
}


def clauses(todo: Todo) -> int:
    """The clauses of a TODO's contract: its summary and comment, cut at sentence, ';' and ':' ends."""
    text = todo.summary + " " + " ".join(line.strip().lstrip("#").strip() for line in todo.guidance)
    return len([part for part in re.split(r"[.;:]\s", text) if part.strip()])


def model_minutes(read: int, doc: int, code: int, clause_count: int) -> float:
    return (read / READ_LINES_PER_MIN + MIN_PER_DOC_LINE * doc + MIN_PER_CODE_LINE * code
            + MIN_PER_CLAUSE * clause_count)


@dataclass(frozen=True)
class Figures:
    chapter: Chapter
    depth: str  # "workshop" or "full"
    read: int
    doc: int
    todos: int  # the TODOs the learner writes
    code: int
    clauses: int

    @property
    def model_minutes(self) -> float:
        return model_minutes(self.read, self.doc, self.code, self.clauses)


def _lines(path) -> int:
    return len(path.read_text().splitlines())


def doc_lines(chapter: Chapter, depth: str, root=PROJECT_ROOT) -> int:
    """The doc's lines; in the workshop, those before its "## Going further" heading."""
    lines = (root / "docs" / chapter.doc_file.name).read_text().splitlines()
    if depth == "workshop" and GOING_FURTHER in lines:
        return lines.index(GOING_FURTHER)
    return len(lines)


def figures(chapter: Chapter, depth: str | None = None, root=PROJECT_ROOT) -> Figures:
    """A chapter's figures at `depth` (default: the workshop's for workshop chapters, else full)."""
    depth = depth or ("workshop" if chapter.track == "workshop" else "full")
    solution = root / "solutions" / f"{chapter.module}.py"
    lines = solution.read_text().splitlines()
    todos = find_todos("\n".join(lines) + "\n", str(solution))
    given = set(chapter.stretch) if depth == "workshop" else set()

    def code_lines(todo: Todo) -> int:
        return sum(1 for line in lines[todo.begin: todo.end - 1] if line.strip() and not line.strip().startswith("#"))

    exercise_lines = (root / "exercises" / f"{chapter.module}.py").read_text().splitlines()
    stubs = sum(1 for line in exercise_lines if 'raise NotImplementedError("TODO(' in line)
    read = (len(exercise_lines) - stubs + sum(code_lines(t) for t in todos if t.key in given)
            + sum(_lines(root / "exercises" / name) for name in chapter.reading))
    written = [t for t in todos if t.key not in given]
    return Figures(chapter, depth, read, doc_lines(chapter, depth, root), len(written),
                   sum(code_lines(t) for t in written), sum(clauses(t) for t in written))


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None if the system is singular."""
    n = len(vector)
    rows = [row[:] + [value] for row, value in zip(matrix, vector)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < 1e-12:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(n):
            if r != col:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col])]
    return [rows[i][n] / rows[i][i] for i in range(n)]


def fit(study=LEARNER_STUDY) -> tuple[float, float, float]:
    """Minutes per doc line, code line and clause: exact non-negative least squares on the learners'
    study, with the reading rate fixed. With three rates, every set of rates left free is tried
    (the others held at 0), and the best fit whose rates are all >= 0 wins."""
    features = [(doc, code, count) for (read, doc, code, count), _ in study.values()]
    targets = [minutes - read / READ_LINES_PER_MIN for (read, _, _, _), minutes in study.values()]
    best, best_error = (0.0, 0.0, 0.0), float("inf")
    for mask in range(1, 8):
        free = [i for i in range(3) if mask >> i & 1]
        normal = [[sum(f[i] * f[j] for f in features) for j in free] for i in free]
        right = [sum(f[i] * y for f, y in zip(features, targets)) for i in free]
        solved = _solve(normal, right)
        if solved is None or min(solved) < 0:
            continue
        rates = [0.0, 0.0, 0.0]
        for i, value in zip(free, solved):
            rates[i] = value
        error = sum((sum(r * v for r, v in zip(rates, f)) - y) ** 2 for f, y in zip(features, targets))
        if error < best_error:
            best, best_error = (rates[0], rates[1], rates[2]), error
    return best


def fit_report() -> str:
    rates = fit()
    lines = [f"fitted: {rates[0]:.3f} min per doc line, {rates[1]:.3f} per code line, {rates[2]:.3f} per clause "
             f"(reading given code: {READ_LINES_PER_MIN} lines a minute, fixed)",
             f"{'study/ch':<9}{'learners':>6}{'model':>7}"]
    squared = 0.0
    for row, ((read, doc, code, count), minutes) in LEARNER_STUDY.items():
        model = read / READ_LINES_PER_MIN + rates[0] * doc + rates[1] * code + rates[2] * count
        squared += (model - minutes) ** 2
        lines.append(f"{row:<7}{minutes:>8.1f}{model:>7.1f}")
    lines.append(f"root-mean-square error: {(squared / len(LEARNER_STUDY)) ** 0.5:.1f} min")
    return "\n".join(lines)


def table(rows: list[Figures]) -> str:
    header = (f"{'ch':<5}{'track':<10}{'depth':<10}{'read':>5}{'doc':>5}{'todos':>6}{'code':>5}{'clauses':>8}"
              f"{'model':>7}{'minutes':>8}")
    out = [header, "-" * len(header)]
    for f in rows:
        c = f.chapter
        out.append(f"{c.tag:<5}{c.track:<10}{f.depth:<10}{f.read:>5}{f.doc:>5}{f.todos:>6}{f.code:>5}{f.clauses:>8}"
                   f"{f.model_minutes:>7.0f}{c.minutes:>8}")
    for track in ("workshop", "elective"):
        mine = [f for f in rows if f.chapter.track == track]
        out.append(f"{track} total: {sum(f.chapter.minutes for f in mine)} min "
                   f"(model {sum(f.model_minutes for f in mine):.0f} min), {len(mine)} chapters")
    return "\n".join(out)


APPENDIX = PROJECT_ROOT / "docs" / "appendix" / "course.md"


def update_appendix(text: str) -> None:
    """Put `text` in place of the table in docs/appendix/course.md (the code block that starts with its header)."""
    page = APPENDIX.read_text()
    start = page.index("```\nch   track")
    end = page.index("```", start + 3)
    APPENDIX.write_text(page[:start] + "```\n" + text + "\n" + page[end:])


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m koans.course.model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="also write the table into docs/appendix/course.md")
    parser.add_argument("--fit", action="store_true", help="fit the rates to the learners' study again, and compare")
    args = parser.parse_args(argv)
    if args.fit:
        print(fit_report())
        return 0
    text = table([figures(c) for c in CHAPTERS])
    print(text)
    if args.update:
        update_appendix(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
