"""`koans autograder`: the Gradescope zip, unpacked into a folder laid out as /autograder is.

Gradescope unpacks the zip into /autograder/source, runs setup.sh once, then
for each submission (in /autograder/submission) runs run_autograder, which
must leave /autograder/results/results.json. $AUTOGRADER_ROOT stands in for
/autograder here. setup.sh is not run for real (it installs packages): a stand-in
python records what it would have run.
"""

import json
import os
import stat
import subprocess
import sys
import zipfile

import pytest

from koans.manifest import PROJECT_ROOT
from koans.stubgen import make_exercise

pytestmark = pytest.mark.time_limit(600)
LIMIT_S = 480


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


@pytest.fixture(scope="module")
def autograder_zip(tmp_path_factory):
    return build(tmp_path_factory.mktemp("zip") / "autograder.zip")


def test_the_zip_has_gradescopes_scripts_and_pristine_exercises(autograder_zip):
    names = set(zipfile.ZipFile(autograder_zip).namelist())
    assert {"setup.sh", "run_autograder", "pyproject.toml", "conftest.py", "koans/cli.py", "koans/autograder.py",
            "tests/test_ch01_hello_actor.py", "exercises/ch01_hello_actor.py", "koans/edition.json"} <= names
    assert not any("__pycache__" in name or name.startswith(".koans") for name in names)
    assert not any(name.startswith(("solutions/", "mutants/")) for name in names), \
        "the grading image holds no reference answers where submitted code could read them"
    zipped = zipfile.ZipFile(autograder_zip)
    for script in ("setup.sh", "run_autograder"):
        assert (zipped.getinfo(script).external_attr >> 16) & 0o111, f"{script} must be executable"
    solution = PROJECT_ROOT / "solutions" / "ch01_hello_actor.py"
    assert zipped.read("exercises/ch01_hello_actor.py").decode() == make_exercise(solution.read_text(), str(solution)), \
        "students' files are graded against the original stubs, whatever the instructor's exercises/ holds"
    setup = zipped.read("setup.sh").decode()
    assert "torch==2.13.0" in setup and "--no-index --find-links" in setup and "useradd" in setup


def test_setup_installs_offline_from_the_wheels_in_the_zip(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"not really a wheel")
    source = unpack(build(tmp_path / "autograder.zip", "--wheels", str(wheels)), tmp_path / "root" / "source")
    assert (source / "wheels" / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").is_file()
    calls = tmp_path / "calls.txt"
    python = tmp_path / "python"  # records what setup.sh asks of python instead of installing anything
    python.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
    python.chmod(0o755)
    done = subprocess.run(["bash", str(source / "setup.sh")], cwd=source, capture_output=True, text=True,
                          timeout=LIMIT_S, env={**os.environ, "AUTOGRADER_ROOT": str(tmp_path / "root"), "PYTHON": str(python)})
    assert done.returncode == 0, done.stdout + done.stderr
    installs = [line for line in calls.read_text().splitlines() if " install " in f" {line} "]
    assert installs == [f"-m pip install --no-index --find-links {source}/wheels torch==2.13.0",
                        f"-m pip install --no-index --find-links {source}/wheels -e {source}"]


def test_run_autograder_grades_a_partly_solved_submission(autograder_zip, tmp_path):
    root = tmp_path / "autograder"
    source = unpack(autograder_zip, root / "source")
    submission = root / "submission" / "my-work" / "exercises"  # students upload folders as they like
    submission.mkdir(parents=True)
    (submission / "ch01_hello_actor.py").write_text((PROJECT_ROOT / "solutions" / "ch01_hello_actor.py").read_text())
    (submission / "ch02_actor_mesh.py").write_text((source / "exercises" / "ch02_actor_mesh.py").read_text())
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "KOANS_CHAPTERS": "1,2", "PYTHON": sys.executable}
    env.pop("KOANS_IMPL", None)
    done = subprocess.run([str(source / "run_autograder")], cwd=root, env=env, capture_output=True, text=True,
                          timeout=LIMIT_S)
    assert done.returncode == 0, done.stdout + done.stderr

    results = json.loads((root / "results" / "results.json").read_text())
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


def test_only_tests_of_what_the_learner_writes_earn_points():
    """A test of given code (marked with no TODO) passes against the stubs too: it earns nothing, so a blank
    submission scores 0. (`koans verify` checks that every marked test fails against the stubs.)"""
    from koans.grade import POINTS_PER_CHAPTER, _chapter_entries
    from koans.manifest import find_chapter
    from koans.runner import ChapterRun

    def test(name, outcome, marked):
        return {"name": name, "outcome": outcome, "todos": marked, "marked": marked, "note": "", "message": "x"}

    chapter = find_chapter(7)
    run = ChapterRun(chapter, "exercises", returncode=1, tests=[
        test("test_given_staging", "passed", []),
        test("test_claim", "failed", ["WeightStore.claim"]),
        test("test_publish", "passed", ["WeightPublisher.publish"]),
        test("test_on_a_gpu", "skipped", ["WeightPublisher.publish"]),
    ])
    entries = _chapter_entries(chapter, run, 60)
    assert [e["name"] for e in entries] == ["ch07 weight_sync: test_claim", "ch07 weight_sync: test_publish"]
    assert [e["score"] for e in entries] == [0.0, POINTS_PER_CHAPTER / 2]
    assert sum(e["max_score"] for e in entries) == POINTS_PER_CHAPTER
