"""`koans edition DIR`: the folder an instructor publishes to a class. It must hold no reference answer, and
everything a learner uses must work in it as in this repository.

The leak check is independent of koans/edition.py's own: every TODO body of solutions/ (read with the same
TODO-region machinery as stubgen and verify, whitespace collapsed) is looked for in every file of the
edition, and in every hint as `koans hint` shows it. One exception, said here: a body that the repository's
own pristine exercises hold as given code (ch06_plumbing.py gives ch01's one-line start_one_process) is
given to every learner anyway, so it is not counted as a leak of the edition.
"""

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from koans.manifest import CHAPTERS, PROJECT_ROOT
from koans.stubgen import expected_exercises, find_todos

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
    bodies = reference_bodies()
    assert len(bodies) >= 40
    exempt = {name for name, body in bodies.items() if body in given_anyway()}
    assert exempt <= {"ch01 start_one_process"}, f"given code holds more reference bodies than expected: {exempt}"
    found = leaks(edition, {name: body for name, body in bodies.items() if name not in exempt})
    assert not found, f"reference TODO bodies in the student edition: {found}"
    hints = runpy.run_path(str(edition / "koans" / "hints.py"))["HINTS"]
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
    assert done.returncode == 2 and "without the stretch TODOs' code" in done.stderr


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
