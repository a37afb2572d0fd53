"""`koans edition DIR`: the student edition, a folder to publish to a class, with no reference answer in it.

    koans edition DIR [--workshop]

It holds the exercises as pristine stubs, the chapter tests, the docs, the runner with its hints and
the given code; no solutions/, no mutants/, no maintainers' tests. `git init` it and publish it.
Everything a learner uses works in it as in this repository (`koans`, `check`, `hint`, `watch`,
`list`, `reset`, `workshop`, each chapter's demo on the learner's code, plain `pytest`); maintainer
commands that need the solutions say so.

What the runner reads from solutions/ here (each TODO's key, summary and guidance) goes into
koans/edition.json instead, which the runner reads wherever solutions/ is missing (koans/course/edition_data.py);
two lines (PATCHES) are rewritten in the copy (the build stops if one no longer applies). With --workshop the edition also holds the code of the
stretch TODOs, which `koans workshop` gives at the workshop's depth: the only reference code it
then holds, by design; leave it out for a graded class. The build ends by scanning every file of
the edition for every other TODO's reference body, and fails if one is there.

The autograder zip (koans.grading.package) is this edition, without --workshop, plus the grader's plan, the judge's
reference (locked to root by setup.sh) and Gradescope's scripts.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from koans.course.edition_data import DATA_NAME, EditionError, todos_of
from koans.course.manifest import CHAPTERS, PROJECT_ROOT
from koans.course.todos import expected_exercises, find_todos

#: (file, text it holds in this repository, what the edition has instead). Each must match exactly once.
PATCHES: tuple[tuple[str, str, str], ...] = (
    ("koans/learn/viz.py", "python -m solutions.", "python -m exercises."),
    ("pyproject.toml", '"exercises", "solutions"]', '"exercises"]'),
)


# ---------------------------------------------------------------- building one


def edition_data(root: Path = PROJECT_ROOT, stubs: dict[str, str] | None = None) -> dict:
    """What koans/edition.json holds for the runner where solutions/ is missing: each TODO, each stub."""
    stubs = stubs if stubs is not None else expected_exercises(root / "solutions")
    data: dict = {"todos": {}, "stubs": {c.source_file("exercises").name: stubs[c.source_file("exercises").name]
                                         for c in CHAPTERS}}
    for chapter in CHAPTERS:
        data["todos"][chapter.tag] = [
            {"chapter": t.chapter, "key": t.key, "summary": t.summary, "guidance": list(t.guidance), "indent": t.indent,
             "begin": t.begin, "end": t.end, "can_wait": t.can_wait} for t in todos_of(chapter)]
    return data


def reference_bodies(root: Path = PROJECT_ROOT) -> dict[str, str]:
    """'chNN Key' -> the code of that TODO in the solution, whitespace collapsed (guidance comments left out)."""
    bodies = {}
    for path in sorted((root / "solutions").glob("ch*.py")):
        lines = path.read_text().splitlines()
        for todo in find_todos("\n".join(lines) + "\n", str(path)):
            bodies[f"{todo.chapter} {todo.key}"] = " ".join(
                " ".join(lines[todo.begin + len(todo.guidance): todo.end - 1]).split())
    return bodies


def _strings(data) -> list[str]:
    if isinstance(data, str):
        return [data]
    if isinstance(data, dict):
        return [s for value in data.values() for s in _strings(value)]
    if isinstance(data, list):
        return ["\n".join(data)] if all(isinstance(v, str) for v in data) else [s for v in data for s in _strings(v)]
    return []


def find_leaks(folder: Path, bodies: dict[str, str]) -> list[str]:
    """'file: chNN Key' for each reference body found in a text file under `folder` (whitespace collapsed)."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and ".git" not in p.parts):
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if path.suffix == ".json":  # what its strings say, unescaped (a list of lines read as one text)
            try:
                text += " " + " ".join(_strings(json.loads(text)))
            except ValueError:
                pass
        text = " ".join(text.split())
        found += [f"{path.relative_to(folder)}: {name}" for name, body in bodies.items() if body in text]
    return found


def _edition_readme(readme: str) -> str:
    """The README for learners: setup of the edition, then the repository's README without its maintainer parts."""
    start = readme.index("## What this is")
    end = readme.index("## For maintainers") if "## For maintainers" in readme else len(readme)
    body = readme[start:end] + (readme[readme.index("## Notes"):] if "## Notes" in readme[end:] else "")
    paragraphs = [p for p in body.split("\n\n") if not p.startswith("For instructors:")]
    body = "\n\n".join(paragraphs)
    body = "\n".join(line for line in body.splitlines() if not re.match(r"(solutions|mutants|tests/course)/\s", line))
    body = body.replace(", and `--impl solutions` tests the reference", "")
    head = ("# monarch-rl-koans\n\n"
            "Set up, then start: `koans` walks you through the chapters, one failing test at a time.\n\n"
            "```bash\npython3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . "
            "&& koans\n```\n\n"
            "This is the course's student edition: the exercises, their tests, the docs and the runner, with no "
            "reference solutions: every demo the docs show (`python -m exercises.chNN_<topic>`) runs on your code, "
            "and `pytest --impl solutions` says that the reference is not here.\n\n")
    torch_note = next((p for p in readme.split("\n\n") if p.startswith("`pip install torch==2.13.0` comes first")), "")
    return head + (torch_note + "\n\n" if torch_note else "") + body


#: In the edition's docs: the reference's module paths become the learner's (the same given code is there).
DOC_REWRITES: tuple[tuple[str, str], ...] = (("python -m solutions.", "python -m exercises."),
                                             ("from solutions.", "from exercises."),
                                             ("`solutions/__init__.py`", "`exercises/__init__.py`"),
                                             ("solutions/ch", "exercises/ch"),
                                             (" --impl solutions", ""))
#: A doc's part for maintainers alone, left out of the edition: between these two lines.
MAINTAINERS_ONLY = re.compile(r"\n<!-- maintainers -->\n.*?\n<!-- /maintainers -->\n", re.S)
#: What a default (graded or self-study) edition says instead of the workshop's sentences.
WORKSHOP_ONLY: tuple[tuple[str, str, str], ...] = (
    ("docs/00_overview.md",
     "In the workshop, `koans workshop` first gives each chapter's stretch TODOs as code; self-study and grading "
     "write those too.",
     "In this edition you write every TODO, the stretch ones too."),
)


def _edition_docs(out: Path, workshop: bool) -> None:
    """The docs as a learner of this edition reads them: its own paths, no maintainers' parts."""
    for path in sorted((out / "docs").rglob("*.md")):
        text = MAINTAINERS_ONLY.sub("\n", path.read_text())
        text = re.sub(r"\s+\(the reference: `python -m solutions\.[\w<>]+`\)", "", text)
        for old, new in DOC_REWRITES:
            text = text.replace(old, new)
        path.write_text(text)
    if not workshop:
        for name, old, new in WORKSHOP_ONLY:
            path = out / name
            text = path.read_text()
            if text.count(old) != 1:
                raise EditionError(f"cannot build the edition: {name} no longer holds the workshop's sentence "
                                   f"({old[:60]!r}); update WORKSHOP_ONLY in koans/grading/edition.py")
            path.write_text(text.replace(old, new))


def _keep_hints(path: Path, keep: int) -> int:
    """Keep the first `keep` hints of every TODO in the edition's koans/course/hints.py; answer how many were left out."""
    import ast

    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    hints = next(node.value for node in tree.body if isinstance(node, ast.AnnAssign) and node.target.id == "HINTS")
    longer = [node for per_todo in hints.values for node in per_todo.values if len(node.elts) > keep]
    for node in sorted(longer, key=lambda n: -n.lineno):
        kept = ", ".join(json.dumps(ast.literal_eval(element)) for element in node.elts[:keep])
        first, last = node.lineno - 1, node.end_lineno - 1
        prefix, suffix = lines[first][:node.col_offset], lines[last][node.end_col_offset:]
        lines[first:last + 1] = [f"{prefix}({kept},){suffix}"]
    path.write_text("\n".join(lines) + "\n")
    return sum(len(node.elts) - keep for node in longer)


HINT_WITHOUT_CODE = ("(This edition leaves out the hint that spelled out this TODO's code: the hints before it and "
                     "the TODO's comment are enough.)")


def _strip_answer_hints(path: Path, bodies: dict[str, str]) -> list[str]:
    """Rewrite each hint of koans/course/hints.py that holds a TODO's code verbatim; 'chNN Key: hint n' for each."""
    import ast

    text = path.read_text()
    lines = text.splitlines()
    replaced = []
    tree = ast.parse(text)
    hints = next(node.value for node in tree.body if isinstance(node, ast.AnnAssign) and node.target.id == "HINTS")
    edits = []
    for tag_node, per_todo in zip(hints.keys, hints.values):
        for key_node, tuple_node in zip(per_todo.keys, per_todo.values):
            for n, element in enumerate(tuple_node.elts, 1):
                hint = " ".join(ast.literal_eval(element).split())
                if any(body in hint for body in bodies.values()):
                    edits.append(element)
                    replaced.append(f"{tag_node.value} {key_node.value}: hint {n}")
    for element in sorted(edits, key=lambda e: -e.lineno):
        first, last = element.lineno - 1, element.end_lineno - 1
        prefix, suffix = lines[first][:element.col_offset], lines[last][element.end_col_offset:]
        lines[first:last + 1] = [prefix + json.dumps(HINT_WITHOUT_CODE) + suffix]
    if edits:
        path.write_text("\n".join(lines) + "\n")
    return replaced


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


def build(out: Path, workshop: bool = False, root: Path = PROJECT_ROOT, quiet: bool = False,
          hints: int | None = None) -> list[str]:
    """Write the student edition into `out` (new or empty); its files, relative to `out`. `hints`: keep only the
    first `hints` hints of every TODO (a graded class: 2 leaves out the last, near-code hint of each); None: all."""
    if out.exists() and any(out.iterdir()):
        raise EditionError(f"{out} is not empty; the edition goes into a new folder")
    if out.resolve() == root.resolve() or root.resolve() in out.resolve().parents:
        raise EditionError(f"{out} is inside the repository; build the edition outside it")
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("conftest.py", "pyproject.toml", ".gitignore"):
        if (root / name).is_file():
            _copy(root / name, out / name)
    shutil.copytree(root / "koans", out / "koans", ignore=skip)
    shutil.copytree(root / "docs", out / "docs", ignore=skip)
    (out / "docs" / "appendix" / "instructors.md").unlink(missing_ok=True)  # the grader's workings: not for learners
    (out / "docs" / "appendix" / "maintainers.md").unlink(missing_ok=True)  # the repository's map: not for learners
    def maintainers_tests(folder: str, names: list[str]) -> set[str]:  # the chapter tests and their data stay
        course_tests = {"course"} if Path(folder) == root / "tests" else set()  # tests/course/: the course's own
        return course_tests | {n for n in names if (n.startswith("test_") and n.endswith(".py")
                                     and not re.match(r"test_ch\d\d_", n) and n != "test_monarch_claims.py")
                or n in ("__pycache__", "make_snapshots.py") or n.endswith(".pyc")}  # the snapshots' maker reads solutions/

    shutil.copytree(root / "tests", out / "tests", ignore=maintainers_tests)
    stubs = expected_exercises(root / "solutions")
    for name, text in stubs.items():
        (out / "exercises").mkdir(exist_ok=True)
        if name.endswith("_plumbing.py"):  # given code, where a docstring points at the reference's demo
            text = re.sub(r"\s*\(the reference: python -m solutions\.\w+\)", "", text)
        (out / "exercises" / name).write_text(text)
    (out / "README.md").write_text(_edition_readme((root / "README.md").read_text()))
    _edition_docs(out, workshop)

    data = edition_data(root, stubs)
    if workshop:
        data["stretch"] = {}
        for chapter in CHAPTERS:
            lines = (root / "solutions" / f"{chapter.module}.py").read_text().splitlines()
            for todo in todos_of(chapter):
                if todo.key in chapter.stretch:
                    data["stretch"].setdefault(chapter.tag, {})[todo.key] = lines[todo.begin + len(todo.guidance): todo.end - 1]
    (out / "koans" / DATA_NAME).write_text(json.dumps(data, indent=1))

    for name, old, new in PATCHES:
        path = out / name
        text = path.read_text()
        count = text.count(old)
        if count == 0 or (count > 1 and not old.startswith("python -m")):
            raise EditionError(f"cannot build the edition: {name} no longer holds the text koans/grading/edition.py "
                               f"rewrites ({old.strip()[:60]!r}); update PATCHES to match it")
        path.write_text(text.replace(old, new))

    bodies = reference_bodies(root)
    # Given code that holds a TODO's code verbatim is given to every learner anyway (the repository's exercises
    # hold it too): such a body is not a leak of the edition's making, and is told apart here.
    given = " ".join("\n".join(text for name, text in stubs.items()).split())
    bodies = {name: body for name, body in bodies.items() if body not in given}
    if hints is not None:
        _keep_hints(out / "koans" / "course" / "hints.py", hints)
    stripped = _strip_answer_hints(out / "koans" / "course" / "hints.py", bodies)
    allowed = {f"{c.tag} {key}" for c in CHAPTERS for key in c.stretch} if workshop else set()
    leaks = [leak for leak in find_leaks(out, bodies) if not (leak.split(": ", 1)[1] in allowed
                                                            and leak.startswith(f"koans/{DATA_NAME}"))]
    if leaks:
        raise EditionError("the edition would hold reference answers; nothing may be published:\n  " + "\n  ".join(leaks))
    if not quiet and stripped:
        print("left out the hints that spelled out a TODO's code: " + ", ".join(stripped))
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    if not quiet:
        print(f"wrote the student edition to {out} ({len(files)} files; no solutions/, no mutants/"
              + (", the stretch TODOs' code for `koans workshop`" if workshop else ", no reference code at all")
              + f").\nPublish it: cd {out} && git init && git add . && git commit -m 'Course'")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="koans edition", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="a new folder")
    parser.add_argument("--workshop", action="store_true",
                        help="also hold the stretch TODOs' code, which `koans workshop` gives (not for a graded class)")
    parser.add_argument("--hints", type=int, default=None, metavar="N",
                        help="keep only the first N hints of every TODO (a graded class: 2, which leaves out each "
                             "TODO's last hint, the one closest to code); default: every hint")
    args = parser.parse_args(argv)
    if args.hints is not None and args.hints < 1:
        parser.error(f"--hints {args.hints}: keep at least 1 hint per TODO (every TODO has 2 or more)")
    try:
        build(Path(args.out), args.workshop, hints=args.hints)
    except EditionError as err:
        print(f"koans edition: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
