"""The `koans` runner, used as a learner and an instructor would: as a command, on a project copy.

The copy has chapter 01 solved (its solution copied into exercises/) and chapter
02 untouched. $KOANS_CHAPTERS=1,2 keeps the runner to those two, to stay fast.
"""

import json
import shutil
import subprocess
import sys
import time

import pytest

from koans.manifest import find_chapter
from koans.stubgen import make_exercise
from koans.verify import copy_project

COPIED = ("conftest.py", "pyproject.toml", "koans", "solutions", "exercises", "tests", "docs")
ENV = {"KOANS_CHAPTERS": "1,2"}


def make_copy(root):
    copy_project(root, COPIED)
    shutil.copy2(root / "solutions" / "ch01_hello_actor.py", root / "exercises" / "ch01_hello_actor.py")
    return root


def koans(root, *args, stdin=None, timeout=300):
    import os

    env = {**os.environ, **ENV}
    env.pop("KOANS_IMPL", None)
    done = subprocess.run([sys.executable, "-m", "koans", *args], cwd=root, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


# Each test runs the runner, which runs pytest on chapters in subprocesses: allow for a slow machine.
pytestmark = pytest.mark.time_limit(600)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_copy(tmp_path_factory.mktemp("learner"))


def test_koans_says_which_chapters_are_done_and_explains_the_first_failure(project):
    code, out = koans(project)
    assert code == 1
    assert "Chapter 01: Hello, actor: done (9/9)" in out
    assert "Chapter 02: Actor meshes and adverbs" in out and "First failure: test_call_reaches_every_actor" in out
    assert "Not written yet: TODO(ch02)" in out and "exercises/ch02_actor_mesh.py:" in out, "which TODO, and where"
    assert "Hint: " + find_chapter(2).hints[0][:40] in " ".join(out.split()).replace(" Hint:", "\nHint:"), "the first hint"


def test_list_shows_progress(project):
    code, out = koans(project, "list")
    assert code == 0
    lines = out.splitlines()
    assert any(line.startswith("01") and "done" in line and line.endswith("9/9") for line in lines), out
    assert any(line.startswith("02") and "pending" in line and line.endswith("0/12") for line in lines), out
    assert "[" + "#" * 15 + "." * 15 + "] 1/2 chapters done" in out


def test_check_reports_pass_and_fail_with_exit_codes(project):
    code, out = koans(project, "check", "1")
    assert code == 0 and "9/9 tests pass" in out and "Chapter 01 is done" in out
    code, out = koans(project, "check", "2")
    assert code == 1 and "0/12 tests pass" in out and "TODO(ch02)" in out


def test_hint_shows_one_more_hint_each_time(project):
    hints = find_chapter(2).hints
    _, first = koans(project, "hint", "2")
    _, second = koans(project, "hint", "2")
    assert "hint 1 of 4" in first and "hint 2 of 4" in second
    flat_first, flat_second = " ".join(first.split()), " ".join(second.split())
    assert hints[0][:50] in flat_first and hints[1][:50] not in flat_first
    assert hints[0][:50] in flat_second and hints[1][:50] in flat_second


def test_an_unknown_chapter_is_a_clear_error(project):
    code, out = koans(project, "check", "99")
    assert code == 2 and "no chapter '99'" in out and "1 (hello_actor)" in out


def test_grade_writes_gradescope_results(project):
    code, out = koans(project, "grade", "--out", "results.json", "--time-limit", "240")
    assert code == 0, out
    results = json.loads((project / "results.json").read_text())
    assert set(results) >= {"score", "tests", "output"}
    assert results["score"] == pytest.approx(10.0, abs=0.01), "chapter 01 solved: its 10 points; chapter 02: none"
    for entry in results["tests"]:
        assert set(entry) == {"name", "score", "max_score", "status", "output"}
        assert entry["status"] in ("passed", "failed")
    ch02 = [t for t in results["tests"] if t["name"].startswith("ch02")]
    assert len(ch02) == 12 and all(t["status"] == "failed" and t["score"] == 0 for t in ch02)
    assert all("TODO(ch02)" in t["output"] for t in ch02), "each failure says which TODO"
    assert sum(t["max_score"] for t in results["tests"]) == pytest.approx(20.0, abs=0.01)


def test_grade_times_out_a_hanging_chapter_as_a_failure(tmp_path):
    root = make_copy(tmp_path)
    exercise = root / "exercises" / "ch01_hello_actor.py"
    exercise.write_text(exercise.read_text().replace("        self.greetings_given += 1\n",
                                                     "        self.greetings_given += 1\n        import time; time.sleep(3600)\n", 1))
    code, out = koans(root, "grade", "--chapters", "1", "--out", "r.json", "--time-limit", "20")
    results = json.loads((root / "r.json").read_text())
    assert results["score"] == 0 and results["tests"][0]["status"] == "failed"
    assert "Timed out" in results["tests"][0]["output"]


def test_watch_rechecks_when_an_exercise_changes(tmp_path):
    import os

    root = make_copy(tmp_path)
    env = {**os.environ, **ENV}
    env.pop("KOANS_IMPL", None)
    watcher = subprocess.Popen([sys.executable, "-m", "koans", "watch", "--interval", "0.2", "--max-checks", "2"],
                               cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = ""
        deadline = time.monotonic() + 240
        while "Watching exercises/" not in seen and time.monotonic() < deadline:
            seen += watcher.stdout.readline()
        assert "Watching exercises/" in seen, seen
        target = root / "exercises" / "ch02_actor_mesh.py"
        target.write_text(target.read_text() + "\n# an edit\n")
        out, _ = watcher.communicate(timeout=240)
        seen += out
    finally:
        watcher.kill()
    assert "Changed: ch02_actor_mesh.py. Checking again" in seen
    assert seen.count("Chapter 02: Actor meshes and adverbs") == 2, "checked once at start and once after the edit"


def test_reset_restores_the_stub_and_keeps_the_learners_version(tmp_path):
    root = make_copy(tmp_path)
    exercise = root / "exercises" / "ch01_hello_actor.py"
    solved = exercise.read_text()
    code, out = koans(root, "reset", "1", stdin="n\n")
    assert code == 1 and "Nothing changed" in out and exercise.read_text() == solved, "asks first; 'n' keeps the file"
    code, out = koans(root, "reset", "1", "--yes")
    assert code == 0
    solution = root / "solutions" / "ch01_hello_actor.py"
    assert exercise.read_text() == make_exercise(solution.read_text(), str(solution)), "the stub is back"
    backups = list((root / ".koans" / "backups").rglob("ch01_hello_actor.py"))
    assert len(backups) == 1 and backups[0].read_text() == solved, "the learner's version is kept"
