"""The harness itself: stub generation, fault isolation, timeouts, process hygiene.

Not a chapter: these tests do not depend on --impl. They guard the promises
the chapters rely on: a stub that hangs fails with a pointer to its TODO, a
dying actor cannot end the session, and no Monarch process outlives it.
"""

import asyncio
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import types

import monarch.actor
import pytest

from koans.course.manifest import CHAPTERS, PROJECT_ROOT, find_chapter
from koans.course.todos import StubError, find_todos, make_exercise, out_of_sync
from koans.learn.runner import run_chapter
from koans.maintain.project_copy import copy_project_with_one_stub
from koans.testkit import code_under_test, explain, hangs, processes, results, time_limit
from koans.testkit.testing import run_on_virtual_clock

SOLUTION = textwrap.dedent(
    '''\
    class Greeter:
        def greet(self, who):
            # >>> TODO(ch01): return a greeting
            # Format: "Hello, <who>!"
            text = f"Hello, {who}!"
            return text
            # <<< TODO

        def other(self):
            return 1


    def helper():
        # >>> TODO(ch01): return two
        return 2
        # <<< TODO
    '''
)


def test_stubgen_replaces_regions_and_keeps_everything_else():
    exercise = make_exercise(SOLUTION, "ch01_example.py")
    assert exercise == textwrap.dedent(
        '''\
        class Greeter:
            def greet(self, who):
                # Format: "Hello, <who>!"
                raise NotImplementedError("TODO(ch01): return a greeting")

            def other(self):
                return 1


        def helper():
            raise NotImplementedError("TODO(ch01): return two")
        '''
    )


def test_stubgen_names_each_todo_by_its_function():
    todos = find_todos(SOLUTION, "ch01_example.py")
    assert [(t.key, t.summary, t.begin, t.end) for t in todos] == [
        ("Greeter.greet", "return a greeting", 3, 7),
        ("helper", "return two", 14, 16),
    ]


def test_stubgen_can_keep_chosen_regions_solved():
    exercise = make_exercise(SOLUTION, "ch01_example.py", keep_solved=frozenset({"helper"}))
    assert "return 2" in exercise and "TODO(ch01): return two" not in exercise
    assert 'NotImplementedError("TODO(ch01): return a greeting")' in exercise


@pytest.mark.parametrize(
    "bad, complaint",
    [
        ("def f():\n    # >>> TODO(ch01): x\n    return 1\n", "never closed"),
        ("def f():\n    return 1\n    # <<< TODO\n", "without an opening"),
        ("def f():\n    # >>> TODO(ch02): x\n    return 1\n    # <<< TODO\n", "in a file of chapter ch01"),
        ('def f():\n    # >>> TODO(ch01): say "hi"\n    return 1\n    # <<< TODO\n', "double quotes"),
        ("x = 1\n# >>> TODO(ch01): x\n# only a comment\n# <<< TODO\n", "no code"),
        ("def f():\n    # >>> TODO(ch01): a\n    # >>> TODO(ch01): b\n    return 1\n    # <<< TODO\n", "starts inside"),
        ("def f():\n    # >>>TODO(ch01) x\n    return 1\n", "malformed"),
    ],
)
def test_stubgen_rejects_malformed_markers_with_the_line(bad, complaint):
    with pytest.raises(StubError, match=complaint) as info:
        make_exercise(bad, "ch01_example.py")
    assert "ch01_example.py:" in str(info.value)


def test_exercises_are_in_sync_with_solutions():
    stale = out_of_sync(PROJECT_ROOT / "solutions", PROJECT_ROOT / "exercises")
    assert stale == [], f"regenerate with `python -m koans.maintain.stubgen`: {stale}"


def test_every_chapter_has_solution_exercise_tests_doc_and_todos():
    for chapter in CHAPTERS:
        for path in (chapter.source_file("solutions"), chapter.source_file("exercises"), chapter.test_file, chapter.doc_file):
            assert path.is_file(), f"{chapter.tag} is missing {path.relative_to(PROJECT_ROOT)}"
        most = 4 if chapter.track == "workshop" else 5  # an elective, with no 3-hour clock, may hold a fifth
        assert 1 <= len(code_under_test.chapter_todos(chapter)) <= most, f"{chapter.tag} should have 1-{most} TODOs"


def test_an_error_text_is_traced_back_to_its_todo():
    text = "ActorError: ...\nNotImplementedError: TODO(ch01): report this actor's pid, host name and torch device"
    assert [todo.key for todo in explain.todos_named_in_text(text)] == ["Greeter.whereabouts"]
    assert explain.todos_named_in_text("AssertionError: 3 != 4") == []


def test_monarch_fault_hook_is_replaced_and_deaths_are_reported_within_seconds():
    import monarch._rust_bindings.monarch_hyperactor.config as monarch_config

    assert monarch.actor.unhandled_fault_hook is processes.record_fault
    assert monarch_config.get_global_config()["get_actor_state_max_idle"] == processes.ACTOR_STATE_MAX_IDLE


def learner_copy(tmp_path, chapter, stubbed_key, edits):
    """A copy of the project where only `stubbed_key` is stubbed, then edited as a learner
    would: each (old, new) must be found in the chapter's exercise file."""
    copy_project_with_one_stub(chapter, stubbed_key, tmp_path)
    exercise = tmp_path / "exercises" / f"{chapter.module}.py"
    text = exercise.read_text()
    for old, new in edits:
        assert old in text, f"the test expects {old!r} in {exercise.name}"
        text = text.replace(old, new)
    exercise.write_text(text)


def stub_of(chapter, key):
    return next(todo for todo in code_under_test.chapter_todos(chapter) if todo.key == key).stub_line.strip()


def test_a_stub_that_never_returns_fails_within_its_timeout_naming_the_todo(tmp_path):
    chapter = find_chapter(1)
    stub = stub_of(chapter, "Greeter.greet")
    # A learner's endpoint that blocks forever, and the stub message left as a comment.
    learner_copy(tmp_path, chapter, "Greeter.greet", [(stub, f"import time; time.sleep(3600)  # {stub}")])

    run = run_chapter(chapter, "exercises", root=tmp_path, extra_args=("-k", "greet_returns"),
                      env={"KOANS_TIMEOUT": "3"}, time_limit_s=120)

    assert not run.timed_out, "the test session itself must never hang"
    [result] = run.tests
    assert result["outcome"] == "failed"
    assert result["note"].startswith("No reply before the timeout; check TODO(ch01): count this greeting")
    assert "exercises/ch01_hello_actor.py:" in result["note"] and "Greeter.greet" in result["note"]
    assert run.leftover_processes == []


def test_a_wait_without_timeout_is_stopped_by_the_test_time_limit(tmp_path):
    chapter = find_chapter(2)
    # A learner's sum_of_squares that waits with no timeout, on workers that never answer.
    learner_copy(tmp_path, chapter, "sum_of_squares", [
        (stub_of(chapter, "sum_of_squares"), "return sum(workers.sum_my_share.call(numbers).get().values())"),
        ("rank, size = current_rank().rank,", "import time; time.sleep(3600); rank, size = current_rank().rank,"),
    ])

    run = run_chapter(chapter, "exercises", root=tmp_path, extra_args=("-k", "sum_of_squares_combines"),
                      env={"KOANS_TEST_TIME_LIMIT": "5"}, time_limit_s=120)

    assert not run.timed_out
    [result] = run.tests
    assert result["outcome"] == "failed"
    assert result["note"].startswith("the test ran past its 5 s time limit and was stopped")
    assert "TODO(ch02): call sum_my_share on every worker" in result["note"]


def test_the_time_limit_ends_an_event_loop_even_when_asyncio_drops_its_first_alarm():
    """An exception raised inside an asyncio callback is logged and dropped by the loop, which
    goes on: a time limit that fired only once could leave a busy event loop running forever."""
    dropped = []

    def busy_callback():  # runs until an alarm lands in it (at most 5 s): a loop busy in its callbacks
        end = time.monotonic() + 5
        try:
            while time.monotonic() < end:
                time.sleep(0.01)
        except time_limit.TestTimeLimit:
            dropped.append("alarm")
            raise

    async def never_ends():
        loop = asyncio.get_running_loop()
        while True:
            loop.call_soon(busy_callback)
            await asyncio.sleep(0.001)

    with pytest.raises(time_limit.TestTimeLimit):  # not the TimeoutError of the 60 s backstop below
        with time_limit.time_limit(0.5):
            asyncio.run(asyncio.wait_for(never_ends(), 60))
    assert dropped, "the first alarm landed in a callback, where asyncio drops it"


def test_the_virtual_clock_moves_time_monotonic_and_time_time_on_its_own_thread_only():
    """A deadline kept with time.monotonic() or time.time() is as right on the tests' virtual clock as with
    the loop's own time(); a stand-in's worker thread (or Monarch's) still reads the real clocks."""
    real_monotonic, real_time = time.monotonic, time.time

    async def sleep_100_virtual_seconds():
        loop = asyncio.get_running_loop()
        before = time.monotonic(), time.time()
        await asyncio.sleep(100)
        after = time.monotonic(), time.time()
        read_on_a_worker = lambda: (time.monotonic(), time.clock_gettime(time.CLOCK_MONOTONIC))  # noqa: E731
        elsewhere = await loop.run_in_executor(None, read_on_a_worker)
        return after[0] - before[0], after[1] - before[1], elsewhere[0] - elsewhere[1]

    moved, wall_moved, other_thread = run_on_virtual_clock(sleep_100_virtual_seconds())
    assert (moved, wall_moved) == (pytest.approx(100), pytest.approx(100)), "both clocks moved with the sleep alone"
    assert other_thread == pytest.approx(0, abs=1), "another thread reads the real clock (two reads in a row)"
    assert (time.monotonic, time.time) == (real_monotonic, real_time), "the real clocks are back after the run"


def test_a_leaked_proc_mesh_fails_the_session_and_is_killed(tmp_path):
    copy_project_with_one_stub(find_chapter(1), "Greeter.greet", tmp_path)
    (tmp_path / "tests" / "test_leak.py").write_text(textwrap.dedent(
        """\
        from monarch.actor import this_host
        from koans.testkit.processes import procs_accept_new_actors

        def test_forgets_to_stop_its_procs():
            procs = this_host().spawn_procs(per_host={"procs": 2})
            assert procs_accept_new_actors(procs, timeout_s=60)
        """
    ))
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/test_leak.py", "-q", "-p", "no:cacheprovider"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180, env={**os.environ, "KOANS_LEAK_GRACE": "1"})

    assert "1 passed" in done.stdout, done.stdout[-2000:]
    assert done.returncode != 0, "a session that leaves Monarch processes behind must fail"
    assert "Monarch processes left behind" in done.stdout
    leaked = [int(pid) for pid in re.findall(r"^  pid (\d+):", done.stdout, flags=re.M)]
    assert len(leaked) == 2, done.stdout[-2000:]
    assert not any(processes.is_live(pid) for pid in leaked), "the leftovers were killed"


@pytest.mark.gpu
def test_gpu_marked_tests_run_only_where_cuda_is(device):
    assert device.type == "cuda"


def test_a_learner_file_that_does_not_compile_is_reported_with_its_line(tmp_path):
    chapter = find_chapter(1)
    learner_copy(tmp_path, chapter, "Greeter.greet", [("def start_one_process()", "def start_one_process(:")])

    run = run_chapter(chapter, "exercises", root=tmp_path, extra_args=("-k", "greet_returns"), time_limit_s=120)

    [result] = run.tests
    assert result["outcome"] == "error"
    assert "exercises/ch01_hello_actor.py does not compile: line" in result["message"]


def test_this_session_is_tagged_for_the_leftover_check():
    assert os.environ[processes.SESSION_TAG_ENV]


def test_a_failure_summary_keeps_the_whole_error_and_only_the_learners_frames():
    exercise = PROJECT_ROOT / "exercises" / "ch01_hello_actor.py"
    line = next(n for n, text in enumerate(exercise.read_text().splitlines(), 1) if "def greet" in text)
    remote = (
        "Actor call greeter.greet failed.\n"
        " Traceback of where the remote call failed (most recent call last):\n"
        '  File "/venv/lib/python3.11/site-packages/monarch/_src/actor/actor_mesh.py", line 1822, in handle_sync\n'
        "    result = the_method(*args, **kwargs)\n"
        f'  File "{exercise}", line {line}, in greet\n'
        "    self.greetings += 1\n"
        "AttributeError: 'Greeter' object has no attribute 'greetings'"
    )

    class ActorError(Exception):
        pass

    def call_the_actor():
        raise ActorError(remote)

    with pytest.raises(ActorError) as info:
        call_the_actor()
    summary = explain.failure_summary(info)

    assert summary["error"] == ("ActorError: Actor call greeter.greet failed.\n"
                                "AttributeError: 'Greeter' object has no attribute 'greetings'")
    files = [(frame["file"], frame["function"], frame["remote"]) for frame in summary["frames"]]
    assert files == [("tests/course/test_harness.py", "test_a_failure_summary_keeps_the_whole_error_and_only_the_learners_frames", False),
                     ("tests/course/test_harness.py", "call_the_actor", False),
                     ("exercises/ch01_hello_actor.py", "greet", True)], "no frames of Monarch or pytest"
    assert summary["frames"][-1]["line"] == line and summary["frames"][-1]["todo"] == "Greeter.greet"


def watching(name, chapter_number, marked=()):
    """A HangWatch (0.3 s) on this thread, watching a test of chapter `chapter_number`;
    (watch, notices, an Event set at the first notice)."""
    scope = code_under_test.scope_todos(find_chapter(chapter_number))
    by_key = {todo.key: todo for todo in scope}
    notices, noticed = [], threading.Event()

    def notify(text, data):
        notices.append((text, data))
        noticed.set()

    watch = hangs.HangWatch(0.3, notify).start()
    watch.test_started(hangs.WatchedTest(name, [by_key[key] for key in marked], scope, 120))
    return watch, notices, noticed


def test_the_hang_watch_names_the_todo_a_stuck_wait_is_for_once():
    watch, notices, noticed = watching("test_that_waits", 2, marked=["sum_of_squares"])

    def sum_of_squares():  # stands in for a learner's function whose wait (with no timeout) never ends
        threading.Timer(60, noticed.set).start()  # ends it, should the notice never come
        return noticed.wait()

    try:
        assert sum_of_squares(), "a wait that does not end is noticed"  # the pending wait: this line
        threading.Event().wait(1.0)  # a second notice would come in this time, and must not
    finally:
        watch.stop()
    watch_line = next(n for n, text in enumerate(open(__file__).read().splitlines(), 1)
                      if "the pending wait: this line" in text and "assert sum_of_squares()" in text)
    assert len(notices) == 1, notices
    text, data = notices[0]
    assert text.startswith("Still waiting after") and "test_that_waits, with nothing moving" in text
    assert f"It waits at   tests/course/test_harness.py:{watch_line}: assert sum_of_squares()" in text
    impl = os.environ.get("KOANS_IMPL", "exercises")
    assert "for sum_of_squares (TODO sum_of_squares)" in text and f"Look at {impl}/ch02_actor_mesh.py:" in text
    assert results.LIKELY_HANG_CAUSE in text and data["todos"] == ["sum_of_squares"]


def test_the_hang_watch_blames_no_todo_that_cannot_wait_nor_code_that_is_given():
    """Chapter 10's TODOs are arithmetic: a wait in its tests (here, one that calls no TODO) is not theirs."""
    watch, notices, _ = watching("test_a_run", 10, marked=["group_advantages", "grpo_loss"])
    never = threading.Event()
    threading.Timer(2.0, never.set).start()
    try:
        never.wait()  # stuck, with no timeout, calling no TODO: as a wait in given code would be
    finally:
        watch.stop()
    assert notices == []


def test_the_hang_watch_is_quiet_while_things_move_and_for_a_wait_with_a_timeout():
    watch, notices, _ = watching("test_that_polls", 2, marked=["sum_of_squares"])

    def sum_of_squares():  # returns at once: each call is progress
        return sum(x * x for x in range(1000))

    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            sum_of_squares()
    finally:
        watch.stop()
    assert notices == [], "polling is progress"

    watch, notices, _ = watching("test_that_waits_with_a_timeout", 2, marked=["sum_of_squares"])

    def sum_of_squares():  # noqa: F811 (a wait with a timeout: it ends by itself, and a timeout says more)
        return threading.Event().wait(2.0)

    try:
        sum_of_squares()
    finally:
        watch.stop()
    assert notices == [], "a wait with a timeout is not a hang"


def test_the_hang_watch_is_quiet_for_a_task_gathering_waits_that_have_timeouts():
    """A fan-out gathers calls that each wait with a timeout: the gathering task ends when they do."""
    watch, notices, _ = watching("test_fanout", 5, marked=["classify"])

    async def classify():  # stands in for a TODO that waits at most its timeout
        await asyncio.wait_for(asyncio.Event().wait(), 3.0)

    async def fanout():  # given code: it waits for every call at once
        await asyncio.gather(*(classify() for _ in range(2)), return_exceptions=True)

    try:
        asyncio.run(fanout())
    finally:
        watch.stop()
    assert notices == [], f"each gathered wait has a timeout, so the gathering one ends by itself: {notices}"


def test_the_hang_watch_sees_past_an_event_loop_to_the_task_that_is_stuck():
    """One task waits for ever for a TODO while the loop itself spins: noticed, naming that TODO."""
    watch, notices, _ = watching("test_async", 9, marked=["continuous_training"])

    class Endpoint:  # stands in for buffer.sample, never answering
        def call_one(self, *args):
            return asyncio.Event().wait()

    buffer = types.SimpleNamespace(sample=Endpoint())

    async def training():  # stands in for the learner's training loop
        await buffer.sample.call_one(4, 0)

    async def scenario():
        stuck = asyncio.create_task(training())
        deadline = time.monotonic() + 60
        while not notices and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stuck.cancel()

    try:
        asyncio.run(scenario())
    finally:
        watch.stop()
    assert notices, "the stuck task was noticed, though the other one kept polling"
    assert notices[0][1]["todos"] == ["ReplayBuffer.sample"], notices[0][0]


def test_the_course_model_is_the_fit_to_the_learners_study():
    from koans.course import model

    fitted = model.fit()
    assert [round(rate, 3) for rate in fitted] == [model.MIN_PER_DOC_LINE, model.MIN_PER_CODE_LINE,
                                                   model.MIN_PER_CLAUSE], "refit: python -m koans.course.model --fit"
    squared = [(model.model_minutes(*features) - minutes) ** 2 for features, minutes in model.LEARNER_STUDY.values()]
    # three studies of different learners disagree by more than three rates can absorb: 5.2 min over 33 rows
    assert (sum(squared) / len(squared)) ** 0.5 < 5.5, "the model predicts the learners' minutes within a few"


def test_the_workshop_fits_three_hours_and_each_estimate_follows_the_model():
    from koans.course.manifest import workshop
    from koans.course.model import figures

    assert sum(c.minutes for c in workshop()) <= 180, "the workshop track is built for 3 hours"
    modelled = sum(figures(chapter).model_minutes for chapter in workshop())
    assert modelled <= 180, f"by the model fitted to the learners' clock, the workshop takes {modelled:.0f} min"
    for chapter in CHAPTERS:
        model = figures(chapter).model_minutes
        assert abs(chapter.minutes - model) <= 0.25 * model, (
            f"{chapter.tag}: the manifest says {chapter.minutes} min, the model (koans/course/model.py) {model:.0f}")
        assert chapter.track in ("workshop", "elective")
        assert chapter.track == "workshop" or chapter.fits_after, f"{chapter.tag}: say where the elective fits"


def test_every_todo_has_at_least_two_hints_and_every_hint_a_todo():
    from koans.course.hints import HINTS

    for chapter in CHAPTERS:
        keys = [todo.key for todo in code_under_test.chapter_todos(chapter)]
        for key in keys:
            assert len(chapter.hints_for(key)) >= 2, f"{chapter.tag} {key}: fewer than two hints"
        assert set(HINTS.get(chapter.tag, {})) <= set(keys), f"{chapter.tag}: hints for TODOs that do not exist"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.tag)
def test_a_tests_hint_marker_names_a_hint_of_its_one_todo(chapter):
    """@pytest.mark.hint(N) says which hint fits the clause a test checks: N must be one of its TODO's hints,
    and the test must check one TODO (with several, the hint would not say whose)."""
    for path in chapter.test_file.parent.glob(f"test_{chapter.tag}_*.py"):
        text = path.read_text()
        for marks, name in re.findall(r"((?:^@pytest\.mark\.[^\n]*\n)+)(?:async )?def (test_\w+)", text, flags=re.M):
            hint = re.search(r"@pytest\.mark\.hint\((\d+)\)", marks)
            if not hint:
                continue
            todos = re.findall(r'"([\w.]+)"', " ".join(re.findall(r"@pytest\.mark\.todo\(([^)]*)\)", marks)))
            assert len(todos) == 1, f"{path.name}::{name}: a hint marker on a test of {len(todos)} TODOs ({todos})"
            count = len(chapter.hints_for(todos[0]))
            assert 1 <= int(hint[1]) <= count, f"{path.name}::{name}: hint {hint[1]}, but {todos[0]} has {count} hints"


CLAUSE_TABLE = re.compile(r"^# --- TODO \d+: (?P<key>[\w.]+) -+\n# Contract, clause by clause[^\n]*\n(?P<rows>(?:#  [^\n]*\n)+)",
                          re.M)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.tag)
def test_each_todos_clause_table_names_tests_that_exist_and_check_that_todo(chapter):
    """Each TODO's tests start with its contract, clause by clause, each naming the test that holds it
    (tests/test_chNN_*.py). A renamed or deleted test, or a table that forgets a TODO, fails here."""
    text = chapter.test_file.read_text()
    for path in chapter.test_file.parent.glob(f"test_{chapter.tag}_*.py"):
        text += "\n" + path.read_text() if path != chapter.test_file else ""
    tables = {m["key"]: re.sub(r"_\n#\s+", "_", m["rows"]) for m in CLAUSE_TABLE.finditer(text)}  # a name cut at "_"
    keys = [todo.key for todo in code_under_test.chapter_todos(chapter)]
    missing = [key for key in keys if key not in tables]
    assert not missing, f"{chapter.test_file.name}: no clause table for the TODO(s) {missing}"
    defined = set(re.findall(r"^def (test_\w+)\(", text, flags=re.M))
    for key, rows in tables.items():
        named = set(re.findall(r"\btest_\w+", rows))
        assert named, f"{key}: its clause table names no test"
        assert named <= defined, f"{key}: its clause table names tests that do not exist: {sorted(named - defined)}"


def bare_asserts(source: str) -> list[int]:
    """The lines of `assert` statements with no message: a failure there tells a learner nothing but the diff."""
    import ast

    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Assert) and node.msg is None]


def test_every_assert_of_a_chapter_test_says_what_broke():
    found = {path.name: lines for path in sorted((PROJECT_ROOT / "tests").glob("test_ch[0-9][0-9]_*.py"))
             if (lines := bare_asserts(path.read_text()))}
    assert not found, (f"asserts without a message in the chapter tests (file: lines): {found}; give each one a "
                       "sentence that says what differed and which clause of the TODO's contract it holds")


def test_the_bare_assert_check_finds_one():
    assert bare_asserts("def test_x():\n    assert 1 == 1, 'a message'\n    assert 2 == 2\n") == [3], (
        "the check must find the assert without a message, and only it")


def test_every_given_code_mutant_still_names_text_that_is_there():
    from mutants.given_code import MUTANTS, ROOT

    stale = [f"{m.file}: {m.why}" for m in MUTANTS if (ROOT / "solutions" / m.file).read_text().count(m.old) != 1]
    assert not stale, f"given-code mutants whose text is gone or repeated (update mutants/given_code.py): {stale}"
    assert all((ROOT / "tests" / m.tests).is_file() for m in MUTANTS), "each names a test file that exists"


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: c.tag)
def test_every_mutant_parses_differs_and_states_its_clause(chapter):
    """A wrong answer in mutants/ must be one a learner could run (it parses), must change its region, and must
    say which clause it breaks (what `koans verify --messages` looks for in the learner's message)."""
    from koans.maintain.mutants import apply_mutant, mutants_of

    path = str(chapter.source_file("solutions"))
    source = open(path).read()
    mutants = mutants_of(chapter)
    for mutant in mutants:
        apply_mutant(source, path, mutant)  # raises StubError if it does not parse or changes nothing
        assert mutant.clause.strip(), f"{chapter.tag} {mutant.todo}: {mutant.description!r} states no clause"


def test_a_mutant_that_does_not_parse_is_refused():
    from koans.maintain.mutants import Mutant, apply_mutant

    chapter = find_chapter(1)
    path = str(chapter.source_file("solutions"))
    broken = Mutant("Greeter.greet", "an indentation slip", "    x = 1\n  return x", clause="anything")
    with pytest.raises(StubError, match="does not parse"):
        apply_mutant(open(path).read(), path, broken)
