"""pytest wiring for monarch-rl-koans.

- Which code is under test: `--impl exercises` (default, what you edit) or
  `--impl solutions` (the reference). $KOANS_IMPL does the same for tools that
  cannot pass options. Tests get the chapter module from the `chapter` fixture
  and never import `exercises` or `solutions` themselves.
- Monarch processes start fast: forked from a warm Python that imported what
  they need (torch, for most chapters) once (koans/testkit/forkserver.py), not started cold.
- Monarch hygiene: a crashing actor process must not end the session, process
  death is detected within seconds, and no Monarch process may outlive the session
  (checked at the end; a leftover fails the run).
- Nothing hangs: every test body has a time limit (120 s, or
  @pytest.mark.time_limit(s), or $KOANS_TEST_TIME_LIMIT) on top of the
  timeouts of its own waits.
- Failures point at the TODO behind them (see koans/testkit/explain.py).
- For the `koans` runner: per-test results as JSON (--koans-json), live
  progress events (--koans-progress), and a notice when the running test has
  waited, with nothing moving and no timeout, in or for a TODO for a while
  ($KOANS_HANG_NOTICE_S, default 10 s), saying where (koans.testkit.hangs.HangWatch).
"""

import asyncio
import contextlib
import gc
import importlib
import os
import re
import sys

# Supervision polls every 500 ms instead of every ~10 s, so tests that kill a
# process see the failure quickly. Must be set before any process is spawned.
# (`koans check` asks for 100 ms: koans.learn.runner.SUPERVISION_POLL says why.)
os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "500ms")
# Messages are acknowledged every 500 ms by default; with that, a ProcMesh.stop()
# took about 0.5 s here, and 0.03-0.07 s with 50 ms (2 cores, torchmonarch 0.7.0).
# The tests stop hundreds of meshes.
os.environ.setdefault("HYPERACTOR_MESSAGE_ACK_TIME_INTERVAL", "50ms")

import pytest  # noqa: E402

from koans.course.manifest import IMPL_ENV, chapter_for_module  # noqa: E402
from koans.testkit import code_under_test, explain, hangs, processes  # noqa: E402
from koans.testkit.results import ProgressLog, ResultLog  # noqa: E402
from koans.testkit.time_limit import time_limit  # noqa: E402
from koans.testkit.zygote import Zygote  # noqa: E402

SESSION_TAG = processes.new_session_tag()
processes.detect_deaths_quickly()
ZYGOTE: Zygote | None = None


def pytest_addoption(parser):
    group = parser.getgroup("koans")
    group.addoption("--impl", choices=code_under_test.IMPLS, default=None, help="code under test (default: exercises, or $KOANS_IMPL)")
    group.addoption("--koans-tracebacks", action="store_true", help="keep full tracebacks for unwritten TODOs and timeouts")
    group.addoption("--koans-json", metavar="PATH", default=None, help="write per-test results as JSON (used by the koans CLI)")
    group.addoption("--koans-progress", metavar="PATH", default=None,
                    help="append progress events as JSON lines while the session runs (used by the koans CLI)")
    group.addoption("--koans-only-todo", metavar="KEY", default=None,
                    help="run only the tests marked with this TODO (koans verify --mutants: is the mutant caught?)")
    group.addoption("--koans-plan", metavar="PATH", default=None,
                    help="write each collected test's TODO and gpu marks as JSON (the grader's plan, koans.grading.plan)")
    group.addoption("--koans-probe", metavar="PATH", default=None,
                    help="after the tests, answer the grader's probes in PATH with the chapter's code (koans.grading.probes)")


def pytest_configure(config):
    try:
        impl = code_under_test.selected_impl(config.getoption("--impl"))
    except ValueError as err:  # an unknown --impl, or --impl solutions in the student edition
        raise pytest.UsageError(str(err)) from None
    os.environ[IMPL_ENV] = impl  # seen by helpers and by the processes we spawn
    config.koans_impl = impl
    config.koans_results = ResultLog(config.getoption("--koans-json"))
    config.koans_progress = ProgressLog(config.getoption("--koans-progress"))
    _CONFIG["config"] = config
    # Monarch processes fork from a warm Python that has imported what they need (koans/testkit/forkserver.py):
    # a process then starts in a fraction of a second instead of seconds. Before Monarch's client starts.
    global ZYGOTE
    asked = [config.invocation_params.dir / arg.split("::")[0] for arg in config.args]
    ZYGOTE = config.koans_zygote = Zygote.start(preload=processes.process_imports(asked))
    processes.install_fault_hook()  # starts Monarch's client: this host forks its processes from the zygote
    Zygote.only_existing_hosts()


def pytest_report_header(config):
    return f"koans: testing {config.koans_impl}/  (choose with --impl exercises|solutions)"


def _marked_todos(item):
    """The TODOs a test names with @pytest.mark.todo(...); unknown names are an error."""
    keys = [key for mark in item.iter_markers("todo") for key in mark.args]
    if not keys:
        return []
    chapter = chapter_for_module(item.path.stem)
    known = {todo.key: todo for todo in code_under_test.chapter_todos(chapter)} if chapter else {}
    unknown = [key for key in keys if key not in known]
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.todo names {unknown}, not TODOs of this chapter: {sorted(known)}")
    return [known[key] for key in keys]


def pytest_collection_modifyitems(config, items):
    only = config.getoption("--koans-only-todo")
    if only is not None:
        unmarked = [item for item in items if only not in {todo.key for todo in _marked_todos(item)}]
        if unmarked:
            config.hook.pytest_deselected(items=unmarked)
            items[:] = [item for item in items if item not in unmarked]
    cuda = None
    for item in items:
        _marked_todos(item)  # fail fast on a marker that names no TODO
        if item.get_closest_marker("gpu"):
            if cuda is None:
                import torch

                cuda = torch.cuda.is_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU; none is visible here"))


@pytest.fixture(scope="module")
def chapter(request):
    """The module of this test file's chapter, from the implementation under test."""
    found = chapter_for_module(request.path.stem)
    if found is None:
        raise LookupError(f"{request.path.name} is not a chapter test file (expected tests/test_chNN_<slug>.py)")
    try:
        return code_under_test.import_chapter(found, request.config.koans_impl)
    except Exception as err:  # the learner's file does not even import: say where, briefly
        pytest.fail(code_under_test.import_failure_message(found, request.config.koans_impl, err), pytrace=False)


@pytest.fixture(scope="module")
def plumbing(chapter):
    """The chapter's given plumbing module (chNN_plumbing.py), from the same implementation as `chapter`."""
    package, name = chapter.__name__.rsplit(".", 1)
    return importlib.import_module(f"{package}.{name[:4]}_plumbing")


@pytest.fixture
def aio():
    """`aio.run(coroutine)`: one asyncio event loop for the whole test, so that background tasks
    (a Service's recoveries) live on between calls. Closed after the test's other fixtures."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture(scope="module")
def module_aio():
    """Like `aio`, shared by the tests of one module (for module-scoped actors such as a job)."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture(scope="session")
def device():
    """CUDA when this machine has it, else CPU."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(scope="session")
def shared_procs():
    """`shared_procs(procs=4)` -> a ProcMesh of that shape, shared across tests.

    Starting a process that imports torch costs seconds on a small machine, so
    tests that do not break their processes share them (each test spawns its
    own actors on them). After any Monarch failure the mesh is probed, and
    replaced if it no longer accepts new actors. Stopped at session end.
    """
    from monarch.actor import this_host

    meshes, faults_seen = {}, {}

    def get(**per_host):
        key = tuple(sorted(per_host.items()))
        procs = meshes.get(key)
        if procs is not None and faults_seen[key] != len(processes.recorded_faults):
            if not processes.procs_accept_new_actors(procs):
                processes.stop_procs(procs)
                procs = None
        if procs is None:
            procs = meshes[key] = this_host().spawn_procs(per_host=per_host)
        faults_seen[key] = len(processes.recorded_faults)
        return procs

    yield get
    for procs in meshes.values():
        processes.stop_procs(procs)


@pytest.fixture
def test_tag(request):
    """This test's name as an identifier, for actor and controller names of its own
    (two tests must not share a name: stopping one mesh would disturb the other's)."""
    return re.sub(r"\W", "_", request.node.name)


@pytest.fixture
def fresh_procs():
    """`fresh_procs(procs=2)` -> a new ProcMesh, stopped after the test.

    For tests that kill processes: a mesh with a dead process cannot be reused.
    """
    from monarch.actor import this_host

    made = []

    def make(**per_host):
        made.append(this_host().spawn_procs(per_host=per_host))
        return made[-1]

    def forget(procs):
        """The test ended every process of `procs` itself: there is nothing left to stop."""
        made.remove(procs)

    make.forget = forget
    yield make
    for procs in made:
        processes.stop_procs(procs)


def _time_limit(item) -> float:
    marker = item.get_closest_marker("time_limit")
    return marker.args[0] if marker else float(os.environ.get("KOANS_TEST_TIME_LIMIT", "120"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Every test body runs under a time limit, a backstop for waits without a timeout."""
    with time_limit(_time_limit(item)):
        return (yield)


# ---------------------------------------------------------------- progress and hang notices


def pytest_sessionstart(session):
    config = session.config

    def notify(text, data):
        config.koans_progress.event("hang", text=text, **data)
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capture = config.pluginmanager.get_plugin("capturemanager")
        if reporter is None or config.getoption("--koans-progress"):
            return  # the koans runner shows it
        # Plain pytest: on the terminal, now, past the capture of the test's output (the test is stuck anyway).
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            reporter.write_line("")
            for line in ("koans: " + text).splitlines():
                reporter.write_line(line, yellow=True)

    config.koans_hang_watch = hangs.HangWatch(float(os.environ.get("KOANS_HANG_NOTICE_S", "10")), notify).start()


def pytest_collection_finish(session):
    session.config.koans_results.collected = len(session.items)
    session.config.koans_progress.event("collected", count=len(session.items))
    plan = session.config.getoption("--koans-plan")
    if plan:
        from koans.grading.plan import write_plan

        write_plan(plan, [(item.nodeid, item.name, [t.key for t in _marked_todos(item)],
                           item.get_closest_marker("gpu") is not None) for item in session.items])


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    config = item.config
    todos = _marked_todos(item)
    chapter = chapter_for_module(item.path.stem)
    if chapter is not None:  # a learner's chapter: say where a hang waits
        config.koans_hang_watch.test_started(
            hangs.WatchedTest(item.name, todos, code_under_test.scope_todos(chapter), _time_limit(item)))
    config.koans_progress.event("start", nodeid=item.nodeid, name=item.name, todos=[t.key for t in todos])
    try:
        return (yield)  # setup, call and teardown, each reported
    finally:
        config.koans_hang_watch.test_finished()
        entry = config.koans_results.entry(item.nodeid)
        if entry is not None:
            config.koans_progress.event("done", **entry)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    # pytest parses the test's source to draw the traceback. On CPython 3.11 a garbage
    # collection that runs Monarch finalizers in the middle of that parse can break it
    # ("AST constructor recursion depth mismatch", an INTERNALERROR that ends the session).
    # So, for a failure (only a failure's report is drawn), collect first and keep the collector off.
    failing = call.excinfo is not None
    if failing:
        gc.collect()
        gc.disable()
    try:
        report = yield
    finally:
        if failing:
            gc.enable()
    todos = marked = _marked_todos(item)
    if report.failed and call.excinfo is not None:
        chapter = chapter_for_module(item.path.stem)
        scope = code_under_test.scope_todos(chapter) if chapter else todos
        text, replace, about = explain.explain_failure(call.excinfo, item.path, todos, item.config.koans_impl, scope)
        if about:  # the failure is about these: the runner's hint follows them
            todos = about
            hint_marker = item.get_closest_marker("hint")  # the hint that fits this test's clause
            report.koans_hint = explain.blamed_hint(call.excinfo.value) or (
                hint_marker.args[0] if hint_marker and len(marked) == 1 and list(about) == marked else None)
        report.koans_note = text
        try:
            report.koans_summary = explain.failure_summary(call.excinfo)
        except Exception:  # a summary is a courtesy; never let it break the report
            report.koans_summary = None
        if text and replace and not item.config.getoption("--koans-tracebacks"):
            report.longrepr = text
        elif text:
            report.sections.append(("koans: where to look", text))
    item.config.koans_results.add(item.name, report, [todo.key for todo in todos], [todo.key for todo in marked])
    return report


def pytest_warning_recorded(warning_message, when, nodeid, location):
    """Kept for the koans runner, which shows each warning once (pytest's summary is not shown there)."""
    config = _CONFIG.get("config")
    if config is not None:
        config.koans_results.warn(warning_message.category.__name__, str(warning_message.message),
                                  f"{warning_message.filename}:{warning_message.lineno}")


_CONFIG: dict = {}


def pytest_sessionfinish(session, exitstatus):
    watch = getattr(session.config, "koans_hang_watch", None)
    if watch is not None:
        watch.stop()
    leftovers = processes.leftover_processes(SESSION_TAG, skip=ZYGOTE and ZYGOTE.is_helper)
    if ZYGOTE is not None:
        ZYGOTE.stop()  # after the check: the processes it forked die with it
    session.config.koans_leftovers = leftovers
    if leftovers:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    probe = session.config.getoption("--koans-probe")
    if probe and session.items:
        from koans.grading.probes import answer_in_session

        session.config.koans_results.probes = answer_in_session(probe, session.items[0].path.stem,
                                                                session.config.koans_impl)
    session.config.koans_results.write(leftovers)
    session.config.koans_session = session


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Under the koans runner, leave at once: its results are written and every Monarch process is
    gone (checked above), and Python's own shutdown, with torch, transformers and Monarch loaded,
    would add a second or more to each `koans check`. Plain pytest shuts down as usual."""
    session = getattr(config, "koans_session", None)
    if config.getoption("--koans-json") and session is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(session.exitstatus))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    leftovers = getattr(config, "koans_leftovers", [])
    if leftovers:
        terminalreporter.section("koans: Monarch processes left behind", red=True)
        for pid, cmdline in leftovers:
            terminalreporter.line(f"  pid {pid}: {cmdline[:120]}")
        terminalreporter.line(
            "They were still running when the session ended and have now been killed. "
            "A test or fixture made a ProcMesh and never stopped it: stop it in a fixture "
            "teardown or a `finally:` with `procs.stop().get(timeout=...)`."
        )
    else:
        terminalreporter.line("koans: no Monarch process left behind")
