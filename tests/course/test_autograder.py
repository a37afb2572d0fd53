"""`koans autograder`: the Gradescope zip, unpacked into a folder laid out as /autograder is.

Gradescope unpacks the zip into /autograder/source, runs setup.sh once, then for each submission (in
/autograder/submission) runs run_autograder, which must leave /autograder/results/results.json.
$AUTOGRADER_ROOT stands in for /autograder here. setup.sh runs for real but for pip: a stand-in python
records the installs and runs everything else (the chapter users, the lock on judge/).

The helpers here are shared by tests/course/test_hostile_submissions.py.
"""

import json
import os
import stat
import subprocess
import sys
import zipfile

import pytest

from koans.course.edition_data import todos_of
from koans.course.manifest import CHAPTERS, PROJECT_ROOT, find_chapter
from koans.course.todos import make_exercise
from koans.grading import contain

pytestmark = pytest.mark.time_limit(900)
LIMIT_S = 800


def build(out, *args):
    done = subprocess.run([sys.executable, "-m", "koans", "autograder", "--out", str(out), *args], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=LIMIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def unpack(archive, into):
    """As unzip does: files with their Unix modes (run_autograder must be executable)."""
    with zipfile.ZipFile(archive) as zipped:
        for info in zipped.infolist():
            target = into / info.filename
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zipped.read(info))
            mode = info.external_attr >> 16
            if mode:
                target.chmod(stat.S_IMODE(mode))
    return into


def set_up(source, tmp_path):
    """Run setup.sh as Gradescope does, but with pip's installs recorded instead of made. Returns the installs."""
    calls = tmp_path / "pip-calls.txt"
    python = tmp_path / "python"
    python.write_text(f'#!/usr/bin/env bash\nif [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> {calls}; exit 0; fi\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    done = subprocess.run(["bash", str(source / "setup.sh")], cwd=source, capture_output=True, text=True,
                          timeout=LIMIT_S, env={**os.environ, "AUTOGRADER_ROOT": str(source.parent), "PYTHON": str(python)})
    assert done.returncode == 0, done.stdout + done.stderr
    return calls.read_text().splitlines() if calls.exists() else []


def run_autograder(source, files: dict, chapters: str, **env) -> dict:
    """Grade `files` (name -> text) through run_autograder, as Gradescope would; the results.json."""
    root = source.parent
    submission = root / "submission"
    if submission.exists():
        subprocess.run(["rm", "-rf", str(submission)], check=True)
    for name, text in files.items():
        (submission / name).parent.mkdir(parents=True, exist_ok=True)
        (submission / name).write_text(text)
    environment = {**os.environ, "AUTOGRADER_ROOT": str(root), "KOANS_CHAPTERS": chapters, "PYTHON": sys.executable,
                   **env}
    environment.pop("KOANS_IMPL", None)
    done = subprocess.run([str(source / "run_autograder")], cwd=root, env=environment, capture_output=True, text=True,
                          timeout=LIMIT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads((root / "results" / "results.json").read_text())


def in_todo(source, number: int, key: str, *body: str) -> tuple[str, int]:
    """Chapter `number`'s stub with TODO `key`'s stub replaced by `body` (at its indentation); the body's first line."""
    chapter = find_chapter(number)
    text = (source / "exercises" / f"{chapter.module}.py").read_text()
    stub = next(todo.stub_line for todo in todos_of(chapter) if todo.key == key)
    indent = stub[: len(stub) - len(stub.lstrip())]
    line = text[:text.index(stub)].count("\n") + 1
    return text.replace(stub, indent + ("\n" + indent).join(body), 1), line


def chapter_processes() -> list:
    """Every live process of a chapter's user (after a run, there must be none)."""
    import pwd

    found = []
    for chapter in CHAPTERS:
        try:
            uid = pwd.getpwnam(contain.chapter_user(chapter.tag)).pw_uid
        except KeyError:
            continue
        found += contain.processes_of(uid)
    return found


@pytest.fixture(scope="module")
def autograder_zip(tmp_path_factory):
    return build(tmp_path_factory.mktemp("zip") / "autograder.zip")


def test_the_zip_has_gradescopes_scripts_the_plan_and_the_judges_reference(autograder_zip):
    names = set(zipfile.ZipFile(autograder_zip).namelist())
    assert {"setup.sh", "run_autograder", "pyproject.toml", "conftest.py", "koans/cli.py", "koans/grading/judge.py",
            "koans/grading/plan.json", "tests/test_ch01_hello_actor.py", "exercises/ch01_hello_actor.py",
            "koans/edition.json", "judge/reference/solutions/ch01_hello_actor.py"} <= names
    assert not any("__pycache__" in name or name.startswith(".koans") for name in names)
    assert not any(name.startswith(("solutions/", "mutants/")) for name in names), \
        "the reference is only under judge/, which setup.sh locks to root and no chapter's tree holds"
    zipped = zipfile.ZipFile(autograder_zip)
    for script in ("setup.sh", "run_autograder"):
        assert (zipped.getinfo(script).external_attr >> 16) & 0o111, f"{script} must be executable"
    solution = PROJECT_ROOT / "solutions" / "ch01_hello_actor.py"
    assert zipped.read("exercises/ch01_hello_actor.py").decode() == make_exercise(solution.read_text(), str(solution)), \
        "students' files are graded against the original stubs, whatever the instructor's exercises/ holds"
    setup = zipped.read("setup.sh").decode()
    assert "torch==2.13.0" in setup and "--no-index --find-links" in setup and "koans.grading.contain users" in setup
    assert 'chmod -R go-rwx "$SOURCE/judge"' in setup
    plan = json.loads(zipped.read("koans/grading/plan.json"))
    assert set(plan) == {c.tag for c in CHAPTERS} and all(plan[c.tag] for c in CHAPTERS)
    assert any(t["gpu"] for t in plan["ch07"]) and all(t["todos"] for t in plan["ch01"]), "the plan keeps the marks"


def test_setup_installs_offline_from_the_wheels_in_the_zip(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"not really a wheel")
    source = unpack(build(tmp_path / "autograder.zip", "--wheels", str(wheels)), tmp_path / "root" / "source")
    assert (source / "wheels" / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").is_file()
    installs = [line for line in set_up(source, tmp_path) if " install " in f" {line} "]
    assert installs == [f"-m pip install --no-index --find-links {source}/wheels torch==2.13.0",
                        f"-m pip install --no-index --find-links {source}/wheels -e {source}"]
    if contain.is_root():
        assert stat.S_IMODE((source / "judge").stat().st_mode) == 0o700, "the reference is root's alone"
        assert all(contain.account_problem(c.tag) is None or "cannot run" in contain.account_problem(c.tag)
                   for c in CHAPTERS), "setup.sh made every chapter's user"


def test_run_autograder_grades_a_partly_solved_submission(autograder_zip, tmp_path):
    source = unpack(autograder_zip, tmp_path / "autograder" / "source")
    set_up(source, tmp_path)
    files = {"my-work/exercises/ch01_hello_actor.py": (PROJECT_ROOT / "solutions" / "ch01_hello_actor.py").read_text(),
             "my-work/exercises/ch02_actor_mesh.py": (source / "exercises" / "ch02_actor_mesh.py").read_text()}
    results = run_autograder(source, files, "1,2")
    assert set(results) >= {"score", "tests", "output"}
    assert "Graded 2 submitted file(s): ch01_hello_actor.py, ch02_actor_mesh.py" in results["output"]
    for entry in results["tests"]:
        assert set(entry) == {"name", "score", "max_score", "status", "output"}
        assert entry["status"] in ("passed", "failed")
    ch01 = [t for t in results["tests"] if t["name"].startswith("ch01")]
    ch02 = [t for t in results["tests"] if t["name"].startswith("ch02")]
    assert len(ch01) >= 9 and all(t["status"] == "passed" and t["score"] == t["max_score"] for t in ch01)
    assert sum(t["score"] for t in ch01) == pytest.approx(10.0, abs=0.01), "chapter 01: full marks"
    assert len(ch02) >= 12 and all(t["status"] == "failed" and t["score"] == 0 for t in ch02), "chapter 02: zero"
    assert all("TODO(ch02)" in t["output"] for t in ch02), "each failure says which TODO"
    assert results["score"] == pytest.approx(10.0, abs=0.01)
    assert sum(t["max_score"] for t in results["tests"]) == pytest.approx(20.0, abs=0.01)
    assert chapter_processes() == [], "nothing of the submission is left running"


def test_only_planned_tests_of_what_the_learner_writes_earn_points_and_a_skip_is_a_failure():
    """A test of given code earns nothing; a planned TODO test that skips itself, or never ran, fails; only a `gpu`
    test on a machine without one leaves the share, as the plan says before the run."""
    from koans.grading.score import POINTS_PER_CHAPTER, chapter_entries

    plan = [{"nodeid": "t::given", "name": "test_given", "todos": [], "gpu": False},
            {"nodeid": "t::claim", "name": "test_claim", "todos": ["WeightStore.claim"], "gpu": False},
            {"nodeid": "t::publish", "name": "test_publish", "todos": ["WeightPublisher.publish"], "gpu": False},
            {"nodeid": "t::skips", "name": "test_skips", "todos": ["WeightPublisher.publish"], "gpu": False},
            {"nodeid": "t::missing", "name": "test_missing", "todos": ["WeightStore.claim"], "gpu": False},
            {"nodeid": "t::cuda", "name": "test_on_a_gpu", "todos": ["WeightPublisher.publish"], "gpu": True}]
    report = {"collected": 5, "tests": [
        {"nodeid": "t::given", "outcome": "passed"}, {"nodeid": "t::claim", "outcome": "failed", "message": "x"},
        {"nodeid": "t::publish", "outcome": "passed"}, {"nodeid": "t::skips", "outcome": "skipped"},
        {"nodeid": "t::cuda", "outcome": "skipped"}, {"nodeid": "t::extra", "outcome": "passed"}]}
    entries = chapter_entries("ch07 weight_sync", 7, plan, report, timed_out=False, time_limit=60, refusals=[],
                              probe_failures={}, gpu=False)
    assert [e["name"] for e in entries] == [f"ch07 weight_sync: {n}" for n in
                                            ("test_claim", "test_publish", "test_skips", "test_missing")]
    assert [e["score"] for e in entries] == [0.0, POINTS_PER_CHAPTER / 4, 0.0, 0.0]
    assert "Skipped itself" in entries[2]["output"] and "did not run" in entries[3]["output"]
    judged = chapter_entries("ch07 weight_sync", 7, plan, report, timed_out=False, time_limit=60, refusals=[],
                             probe_failures={"WeightPublisher.publish": "case 1: 2 where the reference has 1"}, gpu=False)
    assert judged[1]["score"] == 0 and "judge's own check" in judged[1]["output"], "a probe that disagrees fails it"
    from koans.grading.judge import _read_report

    assert _read_report(b"[" * 100000 + b"]" * 100000) == {}, "a report nested to break the parser is no report"
    assert _read_report(json.dumps({"tests": [{"nodeid": ["x"], "outcome": "passed"}]}).encode()) == {}
    for ended, killed, why in ((-9, True, "Killed"), (137, True, "Killed"), (3, False, "exit status 3")):
        forged = chapter_entries("ch07 weight_sync", 7, plan, {"collected": 1, "tests": [
            {"nodeid": t["nodeid"], "outcome": "passed"} for t in plan]}, timed_out=False, time_limit=60, refusals=[],
            probe_failures={}, gpu=False, killed=killed, ended=ended)
        assert [e["score"] for e in forged] == [0.0] and why in forged[0]["output"], \
            f"a report from a session that did not end as pytest ends one counts for nothing ({ended})"
