"""`koans edition DIR`: the folder an instructor publishes to a class. It must hold no reference answer, and
everything a learner uses must work in it as in this repository.

The leak check is independent of koans/grading/edition.py's own: every TODO body of solutions/ (read with the same
TODO-region machinery as stubgen and verify, whitespace collapsed) is looked for in every file of the
edition, and in every hint as `koans hint` shows it. One exception, said here: a body that the repository's
own pristine exercises hold as given code (ch06_plumbing.py gives ch01's one-line start_one_process) is
given to every learner anyway, so it is not counted as a leak of the edition.
"""

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from koans.cli import EDITION_HIDES
from koans.course.manifest import CHAPTERS, PROJECT_ROOT
from koans.course.todos import expected_exercises, find_todos

pytestmark = pytest.mark.time_limit(300)


def reference_bodies() -> dict[str, str]:
    bodies = {}
    for path in sorted((PROJECT_ROOT / "solutions").glob("ch*.py")):
        lines = path.read_text().splitlines()
        for todo in find_todos(path.read_text(), str(path)):
            bodies[f"{todo.chapter} {todo.key}"] = " ".join(" ".join(lines[todo.begin + len(todo.guidance): todo.end - 1]).split())
    return bodies


def given_anyway() -> str:
    return " ".join("\n".join(expected_exercises(PROJECT_ROOT / "solutions").values()).split())


def leaks(folder: Path, bodies: dict[str, str]) -> list[str]:
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if path.suffix == ".json":  # what a JSON file's strings say, unescaped
            text += " " + " ".join(strings(json.loads(text)))
        text = " ".join(text.split())
        found += [f"{path.relative_to(folder)}: {name}" for name, body in bodies.items() if body in text]
    return found


def strings(data) -> list[str]:
    if isinstance(data, str):
        return [data]
    if isinstance(data, dict):
        return [s for value in data.values() for s in strings(value)]
    if isinstance(data, list):
        return ["\n".join(data)] if all(isinstance(v, str) for v in data) else [s for v in data for s in strings(v)]
    return []


def make_edition(into: Path, *flags: str) -> Path:
    done = subprocess.run([sys.executable, "-m", "koans", "edition", str(into), *flags], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return into


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    return make_edition(tmp_path_factory.mktemp("class") / "course")


def learner(edition: Path, *command: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a command in the edition as a learner would (the edition's own koans and exercises first on the path)."""
    # Keep what else the path holds (where Monarch may be installed), but never the course's own repository.
    kept = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if entry and Path(entry).resolve() != PROJECT_ROOT.resolve()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(edition), *kept]), "KOANS_CHAPTERS": ""}
    env.pop("KOANS_IMPL", None)
    done = subprocess.run([sys.executable, *command], cwd=edition, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    print(f"$ {' '.join(command)}  -> exit {done.returncode}\n{(done.stdout + done.stderr)[-1500:]}")
    return done


def test_the_edition_holds_no_reference_answer(edition):
    assert not (edition / "solutions").exists() and not (edition / "mutants").exists()
    assert not list(edition.rglob("test_autograder.py")) and not list(edition.rglob("instructors.md"))
    assert not (edition / "tests" / "course").exists(), "the course's own tests stay in the repository"
    shipped = sorted(p.name for p in (edition / "tests").rglob("test_*.py"))
    chapter_tests = sorted(p.name for p in (PROJECT_ROOT / "tests").glob("test_ch[0-9][0-9]_*.py"))
    assert shipped == sorted(chapter_tests + ["test_monarch_claims.py"]), "the chapters' tests and the claims test, only"
    bodies = reference_bodies()
    assert len(bodies) >= 40
    exempt = {name for name, body in bodies.items() if body in given_anyway()}
    assert exempt <= {"ch01 start_one_process"}, f"given code holds more reference bodies than expected: {exempt}"
    found = leaks(edition, {name: body for name, body in bodies.items() if name not in exempt})
    assert not found, f"reference TODO bodies in the student edition: {found}"
    hints = runpy.run_path(str(edition / "koans" / "course" / "hints.py"))["HINTS"]
    shown = [" ".join(h.split()) for per_todo in hints.values() for todo_hints in per_todo.values() for h in todo_hints]
    assert not [name for name, body in bodies.items() if name not in exempt and any(body in h for h in shown)]
    for chapter in CHAPTERS:  # the exercises are the pristine stubs
        name = f"{chapter.module}.py"
        assert (edition / "exercises" / name).read_text() == expected_exercises(PROJECT_ROOT / "solutions")[name]


def test_the_readme_flow_works_in_the_edition(edition):
    readme = (edition / "README.md").read_text()
    assert "pip install -e . && koans" in readme and "&& python -m solutions" not in readme
    assert "--impl solutions\n" not in readme
    done = learner(edition, "-m", "pytest", "tests/test_ch04_controllers.py", "-q", "-p", "no:cacheprovider")
    assert done.returncode == 1 and "TODO(ch04)" in done.stdout, "plain pytest tests the learner's stubs"
    done = learner(edition, "-m", "koans", "list")
    assert done.returncode == 0 and "Hello, actor" in done.stdout and "Multi-turn episodes" in done.stdout
    done = learner(edition, "-m", "koans", "hint", "1")
    assert done.returncode == 0 and "Greeter.greet" in done.stdout
    done = learner(edition, "-m", "koans", "check", "1")
    assert done.returncode != 0 and 'TODO(ch01): count this greeting' in done.stdout + done.stderr
    done = learner(edition, "-m", "exercises.ch01_hello_actor", timeout=180)
    assert done.returncode == 1 and "The demo stopped at a TODO that is not written yet" in done.stderr
    done = learner(edition, "-m", "koans", "reset", "1", "--yes")
    assert done.returncode == 0 and "already the pristine stub" in done.stdout


def test_maintainer_commands_say_plainly_that_the_solutions_are_not_there(edition):
    for command in (["verify", "1"], ["autograder"], ["edition", "x"]):
        done = learner(edition, "-m", "koans", *command)
        assert done.returncode == 2 and "student edition" in done.stderr, command
    done = learner(edition, "-m", "pytest", "tests/test_ch01_hello_actor.py", "--impl", "solutions", "-q")
    assert done.returncode != 0 and "student edition" in done.stdout + done.stderr
    done = learner(edition, "-m", "koans", "workshop")
    assert done.returncode == 2 and "without the stretch TODOs' code" in done.stderr, done.stderr


def test_the_workshop_edition_holds_only_the_stretch_code(tmp_path):
    course = make_edition(tmp_path / "workshop", "--workshop")
    bodies = reference_bodies()
    stretch = {f"{c.tag} {key}" for c in CHAPTERS for key in c.stretch}
    exempt = {name for name, body in bodies.items() if body in given_anyway()}
    found = leaks(course, {name: body for name, body in bodies.items() if name not in exempt})
    assert {f.split(": ", 1)[1] for f in found} == stretch, found
    assert all(f.startswith("koans/edition.json: ") for f in found), found
    done = learner(course, "-m", "koans", "workshop")
    assert done.returncode == 0, done.stderr
    chapter = next(c for c in CHAPTERS if c.stretch)
    assert "GIVEN in the workshop" in (course / "exercises" / f"{chapter.module}.py").read_text()


# --- The edition points only at what it holds ----------------------------------------------------------------

#: Paths of other repositories that the docs cite (`owner/repo` `path`): not this course's files.
CITED_ELSEWHERE = {"docs/en/advanced/low-precision.md",  # vllm-project/vime, docs/11
                   "docs/source/examples/grpo_actor.py"}  # meta-pytorch/monarch, docs/09
TOP_FOLDERS = ("tests", "solutions", "mutants", "exercises", "docs", "koans", ".ci")
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*[\w/])" % "|".join(re.escape(t) for t in TOP_FOLDERS))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def learner_facing(edition: Path) -> list[Path]:
    """What a learner reads: the README, the docs, the exercises, the chapter tests, the hints."""
    return ([edition / "README.md", edition / "koans" / "course" / "hints.py"] + sorted((edition / "docs").rglob("*.md"))
            + sorted((edition / "exercises").glob("*.py")) + sorted((edition / "tests").glob("test_*.py")))


def dangling(edition: Path, files: list[Path], help_text: str = "") -> list[str]:
    """'file: path' for each path or relative link that names a file the edition does not hold."""
    found = []
    for path, text in [(p, p.read_text()) for p in files] + [(edition / "koans --help", help_text)]:
        where = str(path.relative_to(edition))
        for ref in (m.group(1).rstrip("./") for m in PATH.finditer(text)):
            if not any(mark in ref for mark in ("NN", "<", "*", "{")) and ref not in CITED_ELSEWHERE \
                    and not (edition / ref).exists():
                found.append(f"{where}: {ref}")
        if path.suffix == ".md":
            for link in (m.group(1) for m in LINK.finditer(text)):
                if "://" not in link and not link.startswith("mailto:") and not (path.parent / link).exists():
                    found.append(f"{where}: link {link}")
        if "python -m solutions." in text or "from solutions." in text:
            found.append(f"{where}: runs or imports solutions")
    return found


def test_every_path_the_edition_names_is_in_it(edition):
    help_text = learner(edition, "-m", "koans", "--help").stdout
    found = dangling(edition, learner_facing(edition), help_text)
    assert not found, "the edition sends learners to files it does not hold:\n  " + "\n  ".join(found)
    assert (edition / "tests" / "test_monarch_claims.py").is_file(), "the Monarch claims the docs cite are shipped"
    for command in EDITION_HIDES + ("workshop",):
        assert f"koans {command}" not in help_text, f"`koans --help` lists {command}, which this edition cannot run"


def test_the_path_check_finds_a_dangling_path(edition, tmp_path):
    """The check above, on a doc that names a maintainers' test, a missing page, and a reference module."""
    doc = edition / "docs" / "zz_scratch.md"
    doc.write_text("See tests/course/test_harness.py, [the page](appendix/nowhere.md#x) and `python -m solutions.ch01_x`.\n")
    try:
        found = dangling(edition, [doc])
    finally:
        doc.unlink()
    assert found == ["docs/zz_scratch.md: tests/course/test_harness.py", "docs/zz_scratch.md: link appendix/nowhere.md",
                     "docs/zz_scratch.md: runs or imports solutions"], found


def test_a_graded_edition_keeps_the_hints_its_instructor_chose(tmp_path):
    course = make_edition(tmp_path / "graded", "--hints", "2")
    hints = runpy.run_path(str(course / "koans" / "course" / "hints.py"))["HINTS"]
    counts = {len(todo_hints) for per_todo in hints.values() for todo_hints in per_todo.values()}
    assert counts == {2}, f"--hints 2 keeps exactly the first 2 hints of every TODO, got counts {counts}"
    ours = runpy.run_path(str(PROJECT_ROOT / "koans" / "course" / "hints.py"))["HINTS"]
    assert hints["ch10"]["grpo_loss"] == ours["ch10"]["grpo_loss"][:2], "the first two, in order, unchanged"
    done = learner(course, "-m", "koans", "hint", "1", "Greeter.greet")
    assert done.returncode == 0 and "hint 1 of 2" in done.stdout, done.stdout
