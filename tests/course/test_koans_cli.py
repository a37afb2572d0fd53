"""The `koans` runner, used as a learner and an instructor would: as a command, on a project copy.

The shared copy has chapter 01 solved (its solution copied into exercises/) and
chapter 02 untouched; $KOANS_CHAPTERS=1,2 keeps the runner to those two. Tests
that only read share one copy and one run of `koans`; tests that edit files get
their own copy. Nothing here sleeps a fixed time and then asserts: each wait is
on a line of output or a file, with a generous limit, so a loaded machine is
slower, never wrong.
"""

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from koans.course.manifest import CHAPTERS, PROJECT_ROOT, find_chapter
from koans.course.todos import make_exercise
from koans.maintain.project_copy import copy_project

COPIED = ("conftest.py", "pyproject.toml", "koans", "solutions", "exercises", "tests", "docs")
CH02_MINUTES = find_chapter(2).minutes
ENV = {"KOANS_CHAPTERS": "1,2"}
LIMIT_S = 240  # for any one command: generous, for a loaded machine
GREET_STUB = re.compile(r'raise NotImplementedError\("TODO\(ch01\): count this greeting[^"]*"\)')


def make_copy(root, solved=(1,)):
    copy_project(root, COPIED)
    for number in solved:
        name = find_chapter(number).source_file("solutions").name
        shutil.copy2(root / "solutions" / name, root / "exercises" / name)
    return root


def edit_greet(root, body):
    """Write `body` in place of Greeter.greet's stub, as a learner would."""
    exercise = root / "exercises" / "ch01_hello_actor.py"
    text = exercise.read_text()
    assert GREET_STUB.search(text), "the test expects Greeter.greet's stub"
    exercise.write_text(GREET_STUB.sub(lambda _: body, text, count=1))


def environment(**extra):
    env = {**os.environ, **ENV, **extra}
    env.pop("KOANS_IMPL", None)
    return {k: v for k, v in env.items() if v is not None}


def koans(root, *args, stdin=None, timeout=LIMIT_S, **env):
    done = subprocess.run([sys.executable, "-m", "koans", *args], cwd=root, env=environment(**env), input=stdin,
                          capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def koans_at_a_terminal(root, *args, answer: str, timeout=LIMIT_S):
    """`koans ARGS` with a terminal (a pty) for its input, which answers `answer`; (code, output)."""
    import pty

    leader, follower = pty.openpty()
    try:
        os.write(leader, answer.encode())
        done = subprocess.run([sys.executable, "-m", "koans", *args], cwd=root, env=environment(), stdin=follower,
                              capture_output=True, text=True, timeout=timeout)
    finally:
        os.close(leader)
        os.close(follower)
    return done.returncode, done.stdout + done.stderr


class Follow:
    """A running `koans` command whose output is read as it comes (a thread drains the pipe)."""

    def __init__(self, root, *args, **env):
        self.process = subprocess.Popen([sys.executable, "-m", "koans", *args], cwd=root, env=environment(**env),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def text(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def wait_for(self, needle: str, timeout: float = LIMIT_S) -> str:
        """Block until `needle` is in the output; the output so far."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while needle not in "".join(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and not self._reader.is_alive()):
                    break
                self._changed.wait(min(left, 1.0))
            return "".join(self.lines)

    def finish(self, timeout: float = LIMIT_S) -> tuple[int, str]:
        try:
            code = self.process.wait(timeout=timeout)
        finally:
            self.stop()
        self._reader.join(timeout=10)
        return code, self.text

    def stop(self) -> None:
        """Ends the command if it still runs (SIGTERM: koans then stops its pytest too)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def flat(text):
    return " ".join(text.split())


# Each test runs the runner, which runs pytest on chapters in subprocesses: allow for a slow machine.
pytestmark = pytest.mark.time_limit(600)


def collected(test_file: str) -> int:
    """How many tests pytest collects from tests/<test_file>."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           f"tests/{test_file}"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=LIMIT_S)
    return int(re.search(r"(\d+) tests? collected", done.stdout)[1])


@functools.cache
def ch01_all() -> str:
    """Chapter 01's tests, all passed: "N/N"."""
    count = collected("test_ch01_hello_actor.py")
    return f"{count}/{count}"


@pytest.fixture(scope="module")
def ch02_tests() -> int:
    return collected("test_ch02_actor_mesh.py")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    return make_copy(tmp_path_factory.mktemp("learner"))


@pytest.fixture(scope="module")
def first_walk(project):
    """`koans` once on the shared copy: runs chapter 01 (passes) and chapter 02 (to its first failure)."""
    return koans(project)


def state_of(root):
    return json.loads((root / ".koans" / "state.json").read_text())


def test_koans_walks_the_track_and_explains_the_first_failure(project, first_walk, ch02_tests):
    code, out = first_walk
    assert code == 1, out
    assert "Chapter 01: Hello, actor" in out and f"{ch01_all()} tests pass: done." in out
    assert "Chapter 02: Actor meshes and adverbs" in out
    assert f"0/{ch02_tests} tests pass; stopped at the first failure ({ch02_tests - 1} not run)" in out, (
        "how many passed, and that it stopped")
    assert "First failure: test_call_reaches_every_actor" in out
    assert "Not written yet: TODO(ch02)" in out and "exercises/ch02_actor_mesh.py:" in out, "which TODO, and where"
    first_hint = find_chapter(2).hints_for("Worker.whoami")[0]
    assert f"Hint for Worker.whoami (1 of 3): {flat(first_hint)}" in flat(out), "the failing TODO's first hint"


def test_koans_does_not_rerun_a_chapter_that_passed_and_did_not_change(project, first_walk):
    ran_at = state_of(project)["results"]["ch01"]["at"]
    code, out = koans(project)
    assert code == 1
    assert f"Chapter 01: Hello, actor: done ({ch01_all()}; unchanged since it passed)" in out
    assert state_of(project)["results"]["ch01"]["at"] == ran_at, "chapter 01 was not run again"
    assert "First failure: test_call_reaches_every_actor" in out, "a chapter not done is run again"


def test_list_shows_both_tracks_from_recorded_results_at_once(project, first_walk, ch02_tests):
    before = (project / ".koans" / "state.json").read_text()
    started = time.monotonic()
    code, out = koans(project, "list", KOANS_CHAPTERS=None)  # every chapter, both tracks
    took = time.monotonic() - started
    assert code == 0
    assert (project / ".koans" / "state.json").read_text() == before, "list runs nothing"
    assert took < 30, f"list must answer from the record, not run chapters ({took:.1f} s)"
    workshop, electives = out.index("Workshop track"), out.index("Electives")
    assert workshop < electives
    minutes = {track: sum(c.minutes for c in CHAPTERS if c.track == track) for track in ("workshop", "elective")}
    assert f"~{minutes['workshop']} min in all" in out[workshop:electives]
    assert f"~{minutes['elective']} min in all" in out[electives:]
    rows = {line.split()[0]: line for line in out.splitlines() if re.match(r"\s+\d\d\s", line)}
    expected = [f"{c.number:02d}" for c in CHAPTERS if c.track == "workshop"] + [
        f"{c.number:02d}" for c in CHAPTERS if c.track == "elective"]
    assert list(rows) == expected, "workshop first, then electives"
    for number, line in rows.items():
        cells = re.split(r"\s{2,}", line.strip())
        assert len(cells) == 5, f"columns run together: {line!r}"
        assert cells[0] == number and cells[1] == find_chapter(number).title
    assert re.split(r"\s{2,}", rows["01"].strip())[2:] == [str(find_chapter(1).minutes), "done", ch01_all()]
    assert re.split(r"\s{2,}", rows["02"].strip())[2:] == [str(CH02_MINUTES), "pending", f"0/{ch02_tests}"]
    assert re.split(r"\s{2,}", rows["04"].strip())[2:] == [str(find_chapter(4).minutes), "not run", "-"]


def test_list_marks_a_chapter_stale_when_its_files_change_and_refresh_reruns_only_it(project, first_walk, tmp_path,
                                                                                     ch02_tests):
    shutil.copytree(project, tmp_path / "copy", ignore=shutil.ignore_patterns("__pycache__"))
    root = tmp_path / "copy"
    test_file = root / "tests" / "test_ch01_hello_actor.py"
    test_file.write_text(test_file.read_text() + "\n# a change\n")
    code, out = koans(root, "list")
    assert code == 0
    assert re.search(rf"01\s+Hello, actor\s+{find_chapter(1).minutes}\s+done \(stale\)\s+{ch01_all()}", out), out
    assert re.search(rf"02\s+Actor meshes and adverbs\s+{CH02_MINUTES}\s+pending\s+0/{ch02_tests}", out), out
    assert "Workshop track: 1 of 2 done (1 changed since they passed" in out, "a stale pass still counts as done"
    recorded = state_of(root)["results"]["ch02"]
    code, out = koans(root, "list", "--refresh")
    assert "running chapter 01" in out and "running chapter 02" not in out, "only what changed is re-run"
    assert "1 chapter(s) re-run; 1 unchanged since their last run" in out
    assert state_of(root)["results"]["ch02"] == recorded
    assert re.search(rf"01\s+Hello, actor\s+{find_chapter(1).minutes}\s+done\s+{ch01_all()}", out), out


def test_hint_steps_through_the_hints_of_the_failing_todo(project, first_walk):
    hints = find_chapter(2).hints_for("Worker.whoami")
    _, first = koans(project, "hint", "2")
    _, second = koans(project, "hint", "2")
    assert "hint 1 of 3 for Worker.whoami" in first and "hint 2 of 3 for Worker.whoami" in second
    assert flat(hints[0]) in flat(first) and flat(hints[1]) not in flat(first)
    assert flat(hints[0]) in flat(second) and flat(hints[1]) in flat(second)


def test_hint_jumps_to_the_hint_that_fits_the_clause_that_failed(project, first_walk, tmp_path):
    """A failure that names the hint fitting its clause (@pytest.mark.hint) brings `koans hint` there at once."""
    shutil.copytree(project, tmp_path / "copy", ignore=shutil.ignore_patterns("__pycache__"))
    root = tmp_path / "copy"
    state = state_of(root)
    state["results"]["ch02"]["first_failure"] = {"name": "test_x", "todos": ["Worker.whoami"], "hint": 3}
    state.pop("hints_shown", None)  # none asked for yet
    (root / ".koans" / "state.json").write_text(json.dumps(state))
    hints = find_chapter(2).hints_for("Worker.whoami")
    _, first = koans(root, "hint", "2")
    assert "hint 3 of 3 for Worker.whoami" in first and "fits the clause that failed" in first, first
    assert all(flat(hint) in flat(first) for hint in hints), "the hints before it are shown too"
    _, again = koans(root, "hint", "2")
    assert "hint 3 of 3" in again and "all of them were shown before" in again, again


def test_hint_names_a_todo_and_lists_the_others_on_a_passing_chapter(project, first_walk):
    hints = find_chapter(1).hints_for("Greeter.whereabouts")
    code, out = koans(project, "hint", "1", "whereabouts")
    assert code == 0 and f"hint 1 of {len(hints)} for Greeter.whereabouts" in out and flat(hints[0]) in flat(out)
    assert "The chapter's other TODOs: Greeter.greet, start_one_process, spawn_greeter" in out
    code, out = koans(project, "hint", "1")
    assert code == 0 and "(the chapter passes; name a TODO to see its hints)" in out
    code, out = koans(project, "hint", "1", "nothing_like_it")
    assert code == 2 and "no TODO 'nothing_like_it'" in out and "Greeter.greet, Greeter.whereabouts" in out


def test_check_v_runs_every_test_and_shows_each(project, first_walk, ch02_tests):
    code, out = koans(project, "check", "2", "-v")
    assert code == 1, out
    shown = re.findall(r"^\s+(?:failed|passed|error)\s+(test_\w+)", out, flags=re.M)
    assert len(shown) == ch02_tests and f"0/{ch02_tests} tests pass" in out and "stopped at the first failure" not in out


def test_python_warnings_are_shown_once(tmp_path):
    root = make_copy(tmp_path, solved=(5,))
    exercise = root / "exercises" / "ch05_supervision.py"
    exercise.write_text(exercise.read_text().replace("await asyncio.wait_for(future, timeout)",
                                                     "future.get(timeout=timeout)", 1))
    code, out = koans(root, "check", "5", "--", "-k", "waiting_lets_other_tasks_run", KOANS_CHAPTERS="5")
    assert code == 1, out
    warned = "Python warned: UserWarning: Blocking get() was called from a running asyncio event loop"
    assert flat(out).count(warned) == 1, out


def test_check_takes_v_and_passes_arguments_after_dashes_to_pytest(project, first_walk):
    recorded = state_of(project)["results"]["ch02"]
    code, out = koans(project, "check", "2", "-v", "--", "-k", "sum_of_squares")
    assert code == 1, out
    assert re.search(r"^\s+failed\s+test_\w*sum_of_squares", out, flags=re.M), "-v shows each test as it finishes"
    assert re.search(r"First failure: test_\w*sum_of_squares", out), "-k reached pytest"
    assert state_of(project)["results"]["ch02"] == recorded, "a run with pytest arguments is not recorded"


def test_a_filtered_check_that_passes_does_not_call_the_chapter_done(project, first_walk):
    code, out = koans(project, "check", "1", "--", "-k", "greet")
    assert code == 0, out
    assert "is done" not in out and "koans check 1 runs them all" in out, out


def test_list_says_when_tests_were_skipped_for_want_of_a_gpu():
    from koans.learn.check import _list_row

    row = _list_row(find_chapter(1), {"status": "done", "passed": 8, "total": 10, "skipped": 2}, True)
    assert row[-1] == "8/10 (2 skipped: no GPU here)", row


def test_an_unknown_chapter_is_a_clear_error(project):
    code, out = koans(project, "check", "99")
    assert code == 2 and "no chapter '99'" in out and "1 (hello_actor)" in out


def test_a_syntax_error_is_one_line_naming_its_todo_and_pytest_does_not_run(tmp_path):
    root = make_copy(tmp_path, solved=())
    edit_greet(root, 'self.greetings_given += 1\n        return (f"Hello, {who}!"')
    line = next(n for n, text in enumerate((root / "exercises" / "ch01_hello_actor.py").read_text().splitlines(), 1)
                if 'return (f"Hello, {who}!"' in text)
    code, out = koans(root, "check", "1")
    assert code == 1
    assert out.strip() == f"exercises/ch01_hello_actor.py:{line}: '(' was never closed  (in TODO Greeter.greet)"
    assert state_of(root)["results"]["ch01"]["status"] == "syntax error"
    # A chapter checks the files of the chapters it builds on (06 builds on 05).
    supervision = root / "exercises" / "ch05_supervision.py"
    supervision.write_text(supervision.read_text().replace("def classify(", "def classify(:", 1))
    code, out = koans(root, "check", "6")
    assert code == 1 and out.startswith("exercises/ch05_supervision.py:") and "(in TODO classify)" in out, out


def test_reset_restores_the_stub_and_undo_brings_back_the_learners_version(tmp_path):
    root = make_copy(tmp_path)
    exercise = root / "exercises" / "ch01_hello_actor.py"
    solved = exercise.read_text()
    code, out = koans_at_a_terminal(root, "reset", "1", answer="n\n")
    assert code == 1 and "Nothing changed" in out and exercise.read_text() == solved, "asks first; 'n' keeps the file"
    assert "koans reset 1 --undo brings it back" in out, "the question names the chapter"
    code, out = koans(root, "reset", "1", stdin="")  # no terminal to ask at
    assert code == 2 and "koans reset 1 --yes" in out and "Traceback" not in out, out
    assert exercise.read_text() == solved
    code, out = koans(root, "reset", "1", "--undo")
    assert code == 1 and "nothing to undo" in out, "no reset yet: a clear refusal"
    code, out = koans(root, "reset", "1", "--yes")
    assert code == 0 and "koans reset 1 --undo" in out
    solution = root / "solutions" / "ch01_hello_actor.py"
    assert exercise.read_text() == make_exercise(solution.read_text(), str(solution)), "the stub is back"
    backups = list((root / ".koans" / "backups").rglob("ch01_hello_actor.py"))
    assert len(backups) == 1 and backups[0].read_text() == solved, "the learner's version is kept"
    code, out = koans(root, "reset", "1", "--undo")
    assert code == 0 and str(backups[0].relative_to(root)) in out, "says which backup"
    assert exercise.read_text() == solved, "the learner's version is back"
    code, out = koans(root, "reset", "1", "--undo")
    assert code == 1 and "nothing to undo" in out


def test_watch_shows_the_whole_error_then_on_a_pass_checks_the_next_chapter(tmp_path):
    root = make_copy(tmp_path, solved=())
    edit_greet(root, 'self.greetings += 1\n        return f"Hello, {who}! I am {self.name} (greeting #{self.greetings})."')
    watcher = Follow(root, "watch", "--interval", "0.2", "--max-checks", "2")
    try:
        before = watcher.wait_for("Watching exercises/")
        assert "Watching exercises/" in before, before
        # The whole error, and the learner's own line: nothing of it is cut away.
        assert "AttributeError: 'Greeter' object has no attribute 'greetings'" in before, before
        assert re.search(r"exercises/ch01_hello_actor.py:\d+ +\(in greet, TODO Greeter.greet, in the actor\)\n"
                         r" +self.greetings \+= 1", before), before
        assert "site-packages" not in before, "no frames of Monarch or pytest"
        shutil.copy2(root / "solutions" / "ch01_hello_actor.py", root / "exercises" / "ch01_hello_actor.py")
        code, out = watcher.finish()
    finally:
        watcher.stop()
    after = out[len(before):]
    assert code == 0
    assert "Changed: ch01_hello_actor.py. Checking again" in after
    assert f"{ch01_all()} tests pass: done." in after
    assert after.index(f"{ch01_all()} tests pass: done.") < after.index("Chapter 02: Actor meshes and adverbs"), \
        "once chapter 01 passes, chapter 02 is checked at once"
    assert "First failure: test_call_reaches_every_actor" in after


def test_a_hang_is_noticed_once_while_it_runs_and_grade_times_it_out(tmp_path):
    root = make_copy(tmp_path, solved=())
    edit_greet(root, "import time; time.sleep(3600)")
    grading = Follow(root, "grade", "--chapters", "1", "--out", "r.json", "--time-limit", "8")
    checking = Follow(root, "check", "1", KOANS_HANG_NOTICE_S="3", KOANS_TEST_TIME_LIMIT="7", KOANS_TIMEOUT="60")
    try:
        notice = checking.wait_for("Likely cause")
        assert "Chapter 01: Hello, actor" in notice and "First failure" not in notice, "shown while pytest runs"
        assert "Still waiting after" in notice and "test_greet_returns_the_greeting" in notice
        assert "TODO Greeter.greet" in notice, "the TODO the running test checks"
        assert re.search(r"It waits at +tests/test_ch01_hello_actor.py:\d+: .*\.get\(", notice), notice
        assert "exercises/ch01_hello_actor.py:" in notice and "time.sleep(3600)" in notice, "the learner's frame"
        assert "a missing `await`/`.get()`, or an endpoint that never returns" in notice
        code, out = checking.finish()
        grade_code, _ = grading.finish()
    finally:
        checking.stop()
        grading.stop()
    assert code == 1
    assert out.count("Still waiting after") == 1, "noticed once"
    assert out.count("the test ran past its 7 s time limit") == 1, "the timeout is said once"
    results = json.loads((root / "r.json").read_text())
    assert grade_code == 0 and results["score"] == 0 and results["tests"][0]["status"] == "failed"
    assert "Timed out" in results["tests"][0]["output"]


def test_workshop_gives_the_stretch_todos_and_off_takes_back_only_what_it_gave(tmp_path):
    from koans.course.depth import GIVEN_MARK
    from koans.testkit.code_under_test import chapter_todos

    root = make_copy(tmp_path, solved=())
    mesh, loops = root / "exercises" / "ch02_actor_mesh.py", root / "exercises" / "ch09_async_loops.py"
    stub = loops.read_text()
    whoami = next(t for t in chapter_todos(find_chapter(2)) if t.key == "Worker.whoami")
    assert whoami.stub_line in mesh.read_text()
    mesh.write_text(mesh.read_text().replace(whoami.stub_line, whoami.indent + "return {}  # mine, half done", 1))
    code, out = koans(root, "workshop", KOANS_CHAPTERS=None)
    assert code == 0 and "chapter 09: ReplayBuffer.sample: given" in out, out
    assert "chapter 02: Worker.whoami: left as you wrote it" in out, "a learner's own code is never replaced"
    assert GIVEN_MARK in loops.read_text() and "await self.arrived.wait_for(enough)" in loops.read_text()
    assert 'NotImplementedError("TODO(ch09): `steps` training steps' in loops.read_text(), "core TODOs stay stubs"
    code, out = koans(root, "reset", "9", "--yes", KOANS_CHAPTERS=None)
    assert code == 0 and GIVEN_MARK not in out and "already the pristine stub" in out, "at this depth, that is its stub"
    given = loops.read_text()
    loops.write_text(given + "\n# a learner's note\n")
    code, out = koans(root, "reset", "9", "--yes", KOANS_CHAPTERS=None)
    assert code == 0 and loops.read_text() == given, "at workshop depth, reset puts back the stub with the given code"
    code, out = koans(root, "reset", "9", "--undo", KOANS_CHAPTERS=None)
    assert code == 0 and "you had edited it" not in out, f"the file was the workshop's stub, not edited: {out}"
    assert loops.read_text().endswith("# a learner's note\n")
    loops.write_text(given)
    code, out = koans(root, "workshop", "--off", KOANS_CHAPTERS=None)
    assert code == 0 and "chapter 09: ReplayBuffer.sample: its stub is back" in out, out
    assert loops.read_text() == stub, "exactly the stub again"
    assert "return {}  # mine, half done" in mesh.read_text()


def test_a_check_with_pytests_impl_names_the_file_it_tests(capsys):
    """`koans check N -- --impl solutions` tests solutions/: its header names that file, not the exercise."""
    from koans.learn.show import _header, impl_of

    assert impl_of(("--impl", "solutions")) == impl_of(("-x", "--impl=solutions")) == "solutions"
    assert impl_of(("-x",)) == impl_of(()) == "exercises"
    _header(find_chapter(1), impl_of(("--impl", "solutions")))
    assert "(solutions/ch01_hello_actor.py)" in capsys.readouterr().out
