"""Plumbing behind `conftest.py`: which code is under test, Monarch hygiene,
and failure messages that point the learner at a TODO.

Nothing here is an exercise. It is kept apart from conftest.py so the hooks
there stay short enough to read.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import importlib
import os
import re
import signal
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import monarch.actor
from monarch.actor import Actor, endpoint

from koans.manifest import CHAPTERS, IMPL_ENV, PROJECT_ROOT, Chapter, chapter_for_module, find_chapter
from koans.results import LIKELY_HANG_CAUSE
from koans.stubgen import Todo, find_todos

IMPLS = ("exercises", "solutions")
SESSION_TAG_ENV = "KOANS_SESSION_TAG"
TODO_IN_TEXT = re.compile(r"TODO\((ch\d\d)\): ")

# ---------------------------------------------------------------- code under test


def selected_impl(option: str | None) -> str:
    """`--impl` wins, then $KOANS_IMPL, then the learner's `exercises`."""
    impl = option or os.environ.get(IMPL_ENV) or "exercises"
    if impl == "solutions" and not (PROJECT_ROOT / "solutions").is_dir():
        from koans.edition import NO_SOLUTIONS

        raise ValueError(NO_SOLUTIONS.format(what="--impl solutions"))
    if impl not in IMPLS:
        raise ValueError(f"unknown implementation {impl!r}: use --impl exercises or --impl solutions")
    return impl


def import_chapter(chapter: Chapter, impl: str):
    """Import `<impl>.chNN_<slug>` from this checkout.

    The project root goes first on sys.path and on PYTHONPATH, so that the
    Monarch processes we spawn (which import the module to unpickle actor
    classes) load the very same files as this process.
    """
    root = str(PROJECT_ROOT)
    if sys.path[:1] != [root]:
        sys.path.insert(0, root)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if paths[:1] != [root]:
        os.environ["PYTHONPATH"] = os.pathsep.join([root] + [p for p in paths if p and p != root])
    module = importlib.import_module(f"{impl}.{chapter.module}")
    if Path(module.__file__).resolve() != chapter.source_file(impl).resolve():
        raise ImportError(
            f"{impl}.{chapter.module} was imported from {module.__file__}, not from this checkout "
            f"({chapter.source_file(impl)}). Run pytest from the project root."
        )
    return module


def import_failure_message(chapter: Chapter, impl: str, err: Exception) -> str:
    """Why `<impl>/chNN_*.py` could not be imported, pointing at the line."""
    path = chapter.source_file(impl).relative_to(PROJECT_ROOT)
    if isinstance(err, SyntaxError):
        return f"{path} does not compile: line {err.lineno}: {err.msg}\n    {(err.text or '').rstrip()}"
    frames = [f for f in traceback.extract_tb(err.__traceback__) if Path(f.filename).name == path.name]
    where = f":{frames[-1].lineno}" if frames else ""
    return f"{path}{where} fails while importing: {type(err).__name__}: {err}"


# ---------------------------------------------------------------- Monarch hygiene

recorded_faults: list[object] = []


def record_fault(failure) -> None:
    """Stand-in for Monarch's `unhandled_fault_hook`.

    The default hook calls sys.exit(1), which in a test session surfaces as a
    KeyboardInterrupt and ends every test after it. Here a failure is recorded
    (tests can inspect `recorded_faults`) and printed, and the session goes on.
    """
    recorded_faults.append(failure)
    first_line = str(failure).strip().splitlines()[0] if str(failure).strip() else repr(failure)
    print(f"[koans] Monarch reported a failure (recorded; the session goes on): {first_line[:200]}", file=sys.stderr)


#: How long Monarch waits for an actor's state before it counts the actor as dead. A killed process is
#: usually reported within one supervision poll, but now and then only when this query gives up: 30 s by
#: default, long enough for every caller to pile up on the dead replica. A busy actor still answers it
#: (the runtime does, not the actor's Python thread), so two seconds are safe, even with two test
#: suites sharing two cores.
ACTOR_STATE_MAX_IDLE = "2s"


def detect_deaths_quickly() -> None:
    """Let Monarch report a dead process within seconds, even on its slow path."""
    monarch.configure(get_actor_state_max_idle=ACTOR_STATE_MAX_IDLE)


def install_fault_hook() -> None:
    """Replace Monarch's fault hook, and start Monarch's client context now.

    Starting the context here prints Monarch's one-line log notice at the top
    of the session instead of inside the captured output of some test.
    """
    monarch.actor.unhandled_fault_hook = record_fault
    monarch.actor.context()


def new_session_tag() -> str:
    """Mark every process this session spawns, through the environment they inherit."""
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.environ[SESSION_TAG_ENV] = tag
    return tag


def is_live(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def tagged_processes(tag: str, skip=None) -> list[tuple[int, str]]:
    """(pid, command line) of live processes that inherited our session tag (but not those for
    which `skip(pid, command line)` is true)."""
    needle = f"{SESSION_TAG_ENV}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if is_live(int(entry.name)) and not (skip and skip(int(entry.name), cmdline)):
            found.append((int(entry.name), cmdline))
    return found


def leftover_processes(tag: str, grace_s: float | None = None, skip=None) -> list[tuple[int, str]]:
    """Processes of this session still alive after a grace period; they are then killed.

    A process may take a moment to exit after its mesh is stopped, so we wait
    `grace_s` (default $KOANS_LEAK_GRACE or 5 s) before calling anything a leak.
    `skip(pid, command line)` names the session's own helpers (koans.forkserver's).
    """
    if grace_s is None:
        grace_s = float(os.environ.get("KOANS_LEAK_GRACE", "5"))
    if not Path("/proc").is_dir():  # not Linux: nothing we can check
        return []
    deadline = time.monotonic() + grace_s
    alive = tagged_processes(tag, skip)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = tagged_processes(tag, skip)
    for pid, _ in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return alive


class TestTimeLimit(TimeoutError):
    """A test ran past its time limit: something in it waited without a timeout."""


TIME_LIMIT_REPEAT_S = 2.0  # see expire() below


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise TestTimeLimit in this (main) thread if the block runs past `seconds`.

    A backstop for waits that have no timeout of their own, such as a
    `.get()` in a learner's code. SIGALRM interrupts Monarch's waits too.
    """
    if seconds <= 0 or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return
    message = f"the test ran past its {seconds:g} s time limit and was stopped"
    alarms = 0

    def expire(signum, frame):
        # asyncio logs and drops an exception raised inside one of its callbacks, and goes on
        # running. So the alarm repeats while the block runs, and from the second one on it
        # also stops the event loop this thread is running, if any.
        nonlocal alarms
        alarms += 1
        signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_REPEAT_S)
        if alarms > 1:
            with contextlib.suppress(RuntimeError):  # no loop running here
                asyncio.get_running_loop().stop()
        raise TestTimeLimit(message)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except Exception as error:
        if alarms and not isinstance(error, TestTimeLimit):  # e.g. "Event loop stopped before Future completed"
            raise TestTimeLimit(message).with_traceback(error.__traceback__) from error
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Probe(Actor):
    @endpoint
    def ping(self) -> bool:
        return True


class ProcessFacts(Actor):
    """Where and how its process started (tests of koans/forkserver.py)."""

    @endpoint
    def facts(self, env_names: list[str]) -> dict:
        return {"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "path0": sys.path[0],
                "env": {name: os.environ.get(name) for name in env_names}, "torch_loaded": "torch" in sys.modules}


def process_imports(paths: list[Path]) -> list[str]:
    """What the Monarch processes of these test files or folders import (Chapter.process_imports,
    every chapter's for a folder, torch for a file of no chapter): a session's zygote preloads it."""
    chapters, modules = [], []
    for path in paths:
        chapter = chapter_for_module(path.stem) if path.is_file() else None
        if path.is_dir():
            chapters.extend(CHAPTERS)
        elif chapter is not None:
            chapters.append(chapter)
        else:
            modules.append("torch")
    for chapter in chapters:
        modules.extend(chapter.process_imports)
    return list(dict.fromkeys(modules))


def procs_accept_new_actors(procs, timeout_s: float = 5.0) -> bool:
    """Can we still spawn on `procs`?

    Once any actor on a ProcMesh has failed (its process died, or an exception
    escaped a `broadcast` endpoint, which has no caller to report to), Monarch
    refuses new spawns on that mesh.
    """
    try:
        procs.spawn(f"koans_probe_{uuid.uuid4().hex[:6]}", _Probe).ping.call().get(timeout=timeout_s)
        return True
    except Exception:
        return False


def stop_procs(procs, timeout_s: float = 15.0) -> None:
    """Stop a ProcMesh; on failure say so and leave the rest to the end-of-session check."""
    try:
        procs.stop().get(timeout=timeout_s)
    except Exception as err:  # a mesh with dead processes may refuse a clean stop
        print(f"[koans] stopping a ProcMesh failed ({type(err).__name__}: {err}); "
              "the end-of-session check will clean up", file=sys.stderr)


# ---------------------------------------------------------------- messages


@functools.lru_cache(maxsize=None)
def chapter_todos(chapter: Chapter) -> list[Todo]:
    """The chapter's TODOs, read from the solution (the source of truth)."""
    path = chapter.source_file("solutions")
    if not path.is_file():  # a student edition: no solutions/; koans/edition.json holds the TODOs
        from koans.edition import edition_todos

        return edition_todos(chapter.tag)
    return find_todos(path.read_text(), str(path))


def locate(todo: Todo, impl: str) -> str:
    """Where the learner finds this TODO now: 'exercises/ch01_x.py:42  (Greeter.greet)'.

    The line of the stub's `raise` while it is there, else the line of the
    function that held it (the learner has started on it).
    """
    path = find_chapter(todo.chapter).source_file(impl)
    lines = path.read_text().splitlines()
    stub = f'NotImplementedError("{todo.message}")'
    name = todo.key.split("#")[0].split(".")[-1]
    line = next((n for n, text in enumerate(lines, 1) if stub in text), None)
    started = ""
    if line is None:
        started = ", changed by you" if impl == "exercises" else ""
        if impl == "exercises" and _given_in_the_workshop(todo):
            started = ", given in the workshop: not your code"
        line = next((n for n, text in enumerate(lines, 1) if re.match(rf"\s*(async\s+)?def {re.escape(name)}\b", text)), 1)
    return f"{path.relative_to(PROJECT_ROOT)}:{line}  ({todo.key}{started})"


def _given_in_the_workshop(todo: Todo) -> bool:
    """Whether this is a stretch TODO that `koans workshop` gave as code, still exactly as given."""
    chapter = find_chapter(todo.chapter)
    if todo.key not in chapter.stretch:
        return False
    from koans import depth

    try:
        return depth.is_filled(chapter, todo.key, PROJECT_ROOT)
    except Exception:  # a student edition without the stretch code, or a file that does not parse
        return False


def todos_named_in_text(text: str) -> list[Todo]:
    """TODOs whose stub message appears in an error's text."""
    found = []
    for tag in sorted(set(TODO_IN_TEXT.findall(text))):
        try:
            todos = chapter_todos(find_chapter(tag))
        except (KeyError, OSError):
            continue
        found += [todo for todo in todos if todo.message in text]
    return found


def exception_chain(exc: BaseException | None, honour_suppress: bool = False):
    """`exc`, then its cause or context, and so on (each once). With `honour_suppress`, a context
    hidden by `raise ... from None` ends the chain, as in a printed traceback."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or (None if honour_suppress and exc.__suppress_context__ else exc.__context__)


def error_text(exc: BaseException) -> str:
    """The exception, its remote original (Monarch's ActorError.exception) and its causes."""
    parts = []
    for exc in exception_chain(exc):
        parts.append(f"{type(exc).__name__}: {exc}")
        remote = getattr(exc, "exception", None)
        if isinstance(remote, BaseException):
            parts.append(f"{type(remote).__name__}: {remote}")
    return "\n".join(parts)


def _test_line(excinfo, test_path: Path) -> str:
    """'tests/test_x.py:37: <source line>' for the test's own (innermost) frame."""
    found = ""
    for frame, lineno in traceback.walk_tb(excinfo.tb):
        if Path(frame.f_code.co_filename).resolve() == test_path.resolve():
            source = test_path.read_text().splitlines()[lineno - 1].strip()
            found = f"{test_path.relative_to(PROJECT_ROOT)}:{lineno}: {source}"
    return found


TIMEOUTS = (TimeoutError, asyncio.TimeoutError, concurrent.futures.TimeoutError)


def explain_failure(excinfo, test_path: Path, marked: list[Todo], impl: str,
                    scope: list[Todo] | None = None) -> tuple[str, bool, list[Todo]]:
    """A message that points at the TODO behind a failure.

    Returns (text, replaces_traceback, the TODOs the failure is about). A stub
    that was never written and a call that never answered get a short message
    instead of Monarch's long traceback; any other failure keeps its traceback
    and gets the pointer added. A test that checks several TODOs can say which
    one an assertion is about (koans.testing.checking); a timeout is pinned on
    the TODO its wait was for, never on one that cannot wait (plain arithmetic).
    """
    exc = excinfo.value
    text = error_text(exc)
    at_test = _test_line(excinfo, test_path)
    at_test = f"\n  from {at_test}" if at_test else ""
    scope = scope or marked
    known = {todo.key: todo for todo in [*scope, *marked]}
    about = [known[key] for key in blamed_todos(exc) if key in known] or marked

    def checks(todos: list[Todo]) -> str:
        listed = "\n".join(f"  {todo.message}\n    at {locate(todo, impl)}" for todo in todos)
        return f"This test checks:\n{listed}" if todos else "This test names no TODO."

    if "NotImplementedError" in text and TODO_IN_TEXT.search(text):
        todos = todos_named_in_text(text) or about
        if not todos:
            return "", False, []
        remote = "; raised in the actor, sent back to the caller" if "ActorError" in text or "Supervision" in text else ""
        also = "".join(f"\n  also not written: {todo.message}\n    at {locate(todo, impl)}" for todo in todos[1:])
        return (
            f"Not written yet: {todos[0].message}\n  at   {locate(todos[0], impl)}{remote}{at_test}{also}\n"
            "Write that part, then run this chapter again.",
            True, todos,
        )
    if "supervision events" in text:
        return (
            "Monarch refused to spawn on a ProcMesh that already had a failed actor."
            f"{at_test}\nAn earlier crash, or an exception inside a broadcast endpoint (which has no caller "
            "to report to, so it fails the actor), marks the whole mesh as failed. Spawn on a fresh ProcMesh."
            + (f"\n{checks(about)}" if about else ""),
            True, about,
        )
    if isinstance(exc, (TestTimeLimit, *TIMEOUTS)):
        no_timeout = isinstance(exc, TestTimeLimit)
        frames = _project_frames_of_traceback(excinfo.tb)
        culprit = find_culprit(frames, scope, own_first=no_timeout)
        if blamed_todos(exc):
            suspects = about
        elif culprit is not None:
            suspects = list(culprit.todos)
        else:
            suspects = [todo for todo in about if todo.can_wait]
        if culprit is not None:
            where = f"\n  it waited at {culprit.where()}\n    {culprit.waiting_for()}"
        elif frames:
            where = f"\n  it waited at {frames[0][0]}:{frames[0][1]}: {_source_line(frames[0][0], frames[0][1])}"
        else:
            where = ""
        if no_timeout:
            head = str(exc)
            why = ("A wait with no timeout never ended: look for a `.get()` without `timeout=`, "
                   "or an `await` on a call that never returns.")
        else:
            head = "No reply before the timeout" + (f"; check {suspects[0].message}" if suspects else "")
            why = ("A call this test made never returned. A stub that blocks, or waits for something that "
                   "never happens, is the usual cause.")
        if not suspects:
            why = ("It waited in code you were given, and none of the TODOs this test checks waits for "
                   "anything (each is a plain computation), so your code is unlikely to be the cause. A very "
                   "busy machine can make a run this slow: run the chapter again.")
        return f"{head}{where}{at_test}\n{why}\n{checks(suspects or about)}", True, suspects
    if about:
        return checks(about), False, about
    return "", False, []


# ---------------------------------------------------------------- what went wrong, in short

_TRACEBACK_HEADER = re.compile(r"^\s*Traceback\b.*:\s*$")
_TRACEBACK_FILE = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+?)\s*$')
LEARNER_DIRS = ("exercises", "solutions", "tests")


def project_path(filename: str) -> Path | None:
    """`filename` relative to the project when it is under exercises/, solutions/ or tests/, else None.

    Everything else (pytest, asyncio, Monarch, koans/, conftest.py) is plumbing a learner need not read.
    """
    try:
        relative = Path(filename).resolve().relative_to(PROJECT_ROOT.resolve())
    except (ValueError, OSError):
        return None
    return relative if relative.parts and relative.parts[0] in LEARNER_DIRS and len(relative.parts) > 1 else None


def _source_line(path: Path, lineno: int) -> str:
    import linecache

    return linecache.getline(str(PROJECT_ROOT / path), lineno).strip()


def _todo_of_function(path: Path, function: str) -> str | None:
    """The TODO key whose function this is, for a chapter file (`Greeter.greet` for `greet`)."""
    match = re.match(r"(ch\d\d)_", path.name)
    if not match or path.parts[0] == "tests":
        return None
    try:
        chapter = find_chapter(match.group(1))
    except KeyError:
        return None
    if path.name != f"{chapter.module}.py":
        return None
    for todo in chapter_todos(chapter):
        if todo.key.split("#")[0].split(".")[-1] == function:
            return todo.key
    return None


def _frame(path: Path, lineno: int, function: str, remote: bool) -> dict:
    return {"file": str(path), "line": lineno, "function": function, "source": _source_line(path, lineno),
            "remote": remote, "todo": _todo_of_function(path, function)}


def _strip_tracebacks(text: str, frames: list[dict], remote: bool) -> str:
    """`text` without the Python tracebacks inside it (Monarch puts the remote one in the message);
    their frames in exercises/ or tests/ go to `frames`."""
    kept, in_traceback = [], False
    for line in text.splitlines():
        if _TRACEBACK_HEADER.match(line):
            in_traceback = True
            continue
        if in_traceback and (line.startswith((" ", "\t")) or not line.strip()):
            found = _TRACEBACK_FILE.match(line)
            path = project_path(found["file"]) if found else None
            if path is not None:
                frames.append(_frame(path, int(found["line"]), found["function"], remote))
            continue
        in_traceback = False
        kept.append(line)
    return "\n".join(kept).strip()


def failure_summary(excinfo) -> dict:
    """What went wrong, without plumbing: the whole error message (of the exception, of its remote
    original and of its causes) and the frames of exercises/ and tests/ on the way to it.

    {"error": "ActorError: ...\\nAttributeError: ...",
     "frames": [{"file": "exercises/ch01_x.py", "line": 48, "function": "greet",
                 "source": "self.count += 1", "remote": True, "todo": "Greeter.greet"}, ...]}
    """
    frames: list[dict] = []
    lines: list[str] = []
    for exc in exception_chain(excinfo.value, honour_suppress=True):
        # The failure's own frames as pytest caught it; a cause's, from its own traceback.
        for frame, lineno in traceback.walk_tb(excinfo.tb if exc is excinfo.value else exc.__traceback__):
            path = project_path(frame.f_code.co_filename)
            if path is not None:
                frames.append(_frame(path, lineno, frame.f_code.co_name, False))
        remote = "ActorError" in type(exc).__name__ or "Supervision" in type(exc).__name__
        message = str(exc)
        if type(exc).__name__ == "Failed":  # pytest.fail(...): the message is the story
            text = message
        else:
            text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        for line in _strip_tracebacks(text, frames, remote).splitlines():
            if line.strip() and line not in lines:
                lines.append(line)
        original = getattr(exc, "exception", None)
        if isinstance(original, BaseException) and original is not exc:
            line = f"{type(original).__name__}: {original}"
            if not any(line.strip() == kept.strip() for kept in lines):
                lines += _strip_tracebacks(line, frames, True).splitlines()
    unique, seen_frames = [], set()
    for frame in frames:
        key = (frame["file"], frame["line"], frame["remote"])
        if key not in seen_frames:
            seen_frames.add(key)
            unique.append(frame)
    return {"error": "\n".join(lines), "frames": unique}


# ---------------------------------------------------------------- which TODO a wait is for

#: A call on one line: an endpoint (`x.name.call_one(`), a function (`name(`) or a method (`.name(`).
_CALLS = re.compile(r"\.(\w+)\.(?:call_one|call|choose|broadcast|stream)\(|(?<![\w.])(\w+)\(|\.(\w+)\(")


def scope_todos(chapter: Chapter) -> list[Todo]:
    """The TODOs a chapter's tests run: its own, then those of the chapters it builds on."""
    todos = list(chapter_todos(chapter))
    for number in chapter.builds_on:
        todos += chapter_todos(find_chapter(number))
    return todos


def _function_name(todo: Todo) -> str:
    return todo.key.split("#")[0].split(".")[-1]


def todos_called(line: str, todos: list[Todo]) -> list[Todo]:
    """The TODOs whose function or endpoint this line of code calls, in the order it calls them."""
    code = "" if line.lstrip().startswith("#") else line.split("  #", 1)[0]
    found = []
    for call in _CALLS.finditer(code):
        name = call.group(1) or call.group(2) or call.group(3)
        found += [todo for todo in todos if _function_name(todo) == name and todo not in found]
    return found


def todo_of_frame(path: Path, function: str, todos: list[Todo]) -> Todo | None:
    """The TODO whose own function this frame runs (a chapter file of exercises/ or solutions/), if any."""
    if path.parts[0] == "tests":
        return None
    for todo in todos:
        if path.name == f"{find_chapter(todo.chapter).module}.py" and _function_name(todo) == function:
            return todo
    return None


@dataclass(frozen=True)
class Culprit:
    """Where a wait is (path, line, function), and the TODOs it is most likely for, likeliest first."""

    path: Path
    line: int
    function: str
    todos: tuple[Todo, ...]
    called: Todo | None  # the TODO this line calls, when it calls one

    def where(self) -> str:
        return f"{self.path}:{self.line}: {_source_line(self.path, self.line)}"

    def waiting_for(self) -> str:
        if self.called is not None:
            return f"in {self.function}, for {_function_name(self.called)} (TODO {self.called.key})"
        return f"in {self.function} (TODO {self.todos[0].key})"


def find_culprit(frames: list[tuple[Path, int, str]], todos: list[Todo], own_first: bool = False) -> Culprit | None:
    """Walking out from the innermost frame (frames: innermost first), the first that waits in a TODO's
    own function or calls a TODO on its line. The TODO called comes first (what is waited for), then the
    function's own TODO; `own_first` swaps them (a wait with no timeout is the waiting function's fault)."""
    for path, line, function in frames:
        called = todos_called(_source_line(path, line), todos)
        own = todo_of_frame(path, function, todos)
        found = called[:1] + ([own] if own is not None and own not in called[:1] else [])
        if own_first and own is not None:
            found = [own] + [t for t in found if t is not own]
        if found:
            return Culprit(path, line, function, tuple(found), called[0] if called else None)
    return None


def _project_frames_of_traceback(tb) -> list[tuple[Path, int, str]]:
    """The traceback's frames in exercises/, solutions/ or tests/, innermost first."""
    found = []
    for frame, lineno in traceback.walk_tb(tb):
        path = project_path(frame.f_code.co_filename)
        if path is not None and frame.f_code.co_name != "<module>":
            found.append((path, lineno, frame.f_code.co_name))
    return found[::-1]


def blamed_todos(exc: BaseException) -> list[str]:
    """The TODO keys a test named for this failure with `koans.testing.checking(...)`, if it did."""
    for link in exception_chain(exc):
        keys = getattr(link, "koans_todos", None)
        if keys:
            return list(keys)
    return []


def blamed_hint(exc: BaseException) -> int | None:
    """The hint (1-based) a test named for this failure with `checking(..., hint=N)`, if it did."""
    for link in exception_chain(exc):
        if getattr(link, "koans_todos", None):
            return getattr(link, "koans_hint", None)
    return None


# ---------------------------------------------------------------- hang notices

#: CPU time (in clock ticks, 10 ms each) that the main thread may use in a window that counts as no progress.
_IDLE_TICKS = 5


def _thread_cpu_ticks(native_id: int | None) -> int:
    """utime + stime of one thread of this process, in clock ticks (0 where /proc cannot tell)."""
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def _event_loop_of(frame) -> asyncio.AbstractEventLoop | None:
    while frame is not None:
        if frame.f_code.co_name in ("run_forever", "_run_once", "run_until_complete"):
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, asyncio.AbstractEventLoop):
                return candidate
        frame = frame.f_back
    return None


def _stack(frame) -> list:
    """The frames from `frame` outwards."""
    found = []
    while frame is not None:
        found.append(frame)
        frame = frame.f_back
    return found


def _source_line_of(frame) -> str:
    import linecache

    return linecache.getline(frame.f_code.co_filename, frame.f_lineno)


def _project(frames: list) -> list[tuple[Path, int, str]]:
    """(path, line, function) of the frames of exercises/, solutions/ or tests/ among `frames`, in order."""
    found = []
    for frame in frames:
        path = project_path(frame.f_code.co_filename)
        if path is not None and frame.f_code.co_name != "<module>":
            found.append((path, frame.f_lineno, frame.f_code.co_name))
    return found


def _bounded(frames_inward: list) -> bool:
    """Whether a wait ends by itself: a frame inward of the innermost project frame (asyncio.wait_for,
    Monarch's Future.get, threading's Event.wait) holds a finite `timeout`. frames_inward: outermost first."""
    inner = [i for i, frame in enumerate(frames_inward) if project_path(frame.f_code.co_filename) is not None]
    for frame in frames_inward[inner[-1] + 1 if inner else 0:]:
        try:
            timeout = frame.f_locals.get("timeout")
        except Exception:  # a frame that cannot show its locals: no evidence of a bound
            continue
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < float("inf"):
            return True
    return False


@dataclass(frozen=True)
class Wait:
    """One pending wait of the main thread (its own, or an asyncio task's)."""

    signature: object  # changes whenever the wait moves on
    frames: list[tuple[Path, int, str]]  # its project frames, innermost first
    bounded: bool  # it has a timeout, so it ends by itself (and its TimeoutError names the TODO)


@dataclass(frozen=True)
class Look:
    """One look at this process: the main thread's pending waits, and the innermost frame of a chapter
    file that other threads (actors spawned in this process) are running, by (thread, frame object)."""

    waits: dict[object, Wait]
    running: dict[tuple[int, int], tuple[Path, int, str]]


def look_at_main_thread(skip_idents: set[int]) -> Look | None:
    main = threading.main_thread()
    frames = sys._current_frames()
    top = frames.get(main.ident)
    if top is None:
        return None
    waits = {}
    loop = _event_loop_of(top)
    if loop is None:  # plain waiting: the main thread's own stack; using CPU, or in a poll's sleep, is moving
        stack = _stack(top)
        signature = (tuple((id(f), f.f_lasti) for f in stack), _thread_cpu_ticks(main.native_id) // _IDLE_TICKS)
        if "sleep(" in _source_line_of(top):
            signature = (signature, time.monotonic())
        waits["main"] = Wait(signature, _project(stack), _bounded(stack[::-1]))
    else:  # an event loop: where each of its tasks is suspended, and on what (the loop's own frames come and go)
        try:
            tasks = list(asyncio.all_tasks(loop))
        except RuntimeError:
            return None
        for task in tasks:
            chain, coro = [], task.get_coro()
            while coro is not None:
                frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
                if frame is not None:
                    chain.append(frame)
                coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
            signature = (id(getattr(task, "_fut_waiter", None)), tuple((id(f), f.f_lasti) for f in chain))
            waits[id(task)] = Wait(signature, _project(chain[::-1]), _bounded(chain))
        for task in tasks:  # a task gathering others waits as long as they do: bounded if each of them is
            children = getattr(getattr(task, "_fut_waiter", None), "_children", None)
            if children and id(task) in waits and all(
                    child.done() or (id(child) in waits and waits[id(child)].bounded) for child in children):
                waits[id(task)] = replace(waits[id(task)], bounded=True)
    running = {}
    for ident, frame in frames.items():
        if ident == main.ident or ident in skip_idents:
            continue
        inner = [f for f in _stack(frame)
                 if project_path(f.f_code.co_filename) is not None and f.f_code.co_name != "<module>"]
        if inner and project_path(inner[0].f_code.co_filename).parts[0] != "tests":
            running[(ident, id(inner[0]))] = _project(inner[:1])[0]
    return Look({key: wait for key, wait in waits.items() if wait.frames}, running)


@dataclass(frozen=True)
class WatchedTest:
    name: str
    marked: list[Todo]  # the TODOs it is marked with
    scope: list[Todo]  # every TODO its code can run (its chapter's and earlier ones')
    limit_s: float | None = None  # its time limit


def describe_hang(test: WatchedTest, waited_s: float, culprit: Culprit, main_wait: Culprit | None,
                  running: list[tuple[Path, int, str]]) -> str:
    checks = f" (it checks TODO {', '.join(t.key for t in test.marked)})" if test.marked else ""
    lines = [f"Still waiting after {waited_s:.0f} s in {test.name}, with nothing moving{checks}."]
    shown = main_wait or culprit
    lines.append(f"  It waits at   {shown.where()}")
    if shown.todos:
        lines.append(f"                {shown.waiting_for()}")
    for path, line, function in running[:3]:
        lines.append(f"  Still running {path}:{line}: {_source_line(path, line)}   (in {function}, in this process)")
    lines.append(f"  Likely cause: {LIKELY_HANG_CAUSE}.")
    impl = os.environ.get(IMPL_ENV, "exercises")
    lines.append("  Look at " + "\n      and ".join(locate(todo, impl) for todo in culprit.todos))
    if test.limit_s:
        lines.append(f"  (The test's time limit stops it after {test.limit_s:g} s.)")
    return "\n".join(lines)


class HangWatch:
    """A watchdog thread for the waits that cannot end by themselves. It reports once (per test), through
    `notify(text, data)`, when for `after_s` seconds with nothing moving:
      - the main thread (or one of its asyncio tasks) waits, with no timeout, in a TODO's function or
        for a TODO it calls; or
      - a TODO's own code has been running in another thread of this process (an actor spawned here).
    A wait with a timeout ends by itself, and its TimeoutError names the TODO (explain_failure). A wait
    in given code (a fixture, plumbing, process shutdown) is not the learner's: the time limit decides.

    Nothing moving, for one wait: the same objects at the same places, awaiting the same future; for the
    main thread's own wait, also next to no CPU used and no poll's sleep (polling is progress).
    """

    def __init__(self, after_s: float, notify):
        self.after_s = after_s
        self.notify = notify
        self._lock = threading.Lock()
        self._test: WatchedTest | None = None
        self._noticed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="koans-hang-watch", daemon=True)

    def start(self) -> "HangWatch":
        if self.after_s > 0:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def test_started(self, test: WatchedTest) -> None:
        with self._lock:
            self._test, self._noticed = test, False

    def test_finished(self) -> None:
        with self._lock:
            self._test, self._noticed = None, False

    def _culprit(self, look: Look, since: dict, now: float, test: WatchedTest) -> tuple[Culprit, float] | None:
        """The learner's wait stuck longest (past after_s), and for how long; None if there is none."""
        stuck = [(started, key) for key, (_, started) in since.items() if now - started >= self.after_s]
        for started, key in sorted(stuck, key=lambda pair: pair[0]):
            if key in look.waits:
                wait = look.waits[key]
                culprit = None if wait.bounded else find_culprit(wait.frames, test.scope)
            else:
                path, line, function = look.running[key]
                own = todo_of_frame(path, function, test.scope)
                culprit = Culprit(path, line, function, (own,), None) if own is not None else None
            if culprit is not None:
                return culprit, now - started
        return None

    def _main_wait(self, look: Look, test: WatchedTest) -> Culprit | None:
        """Where the main thread waits (its first wait), to show beside learner code running elsewhere."""
        for wait in look.waits.values():
            path, line, function = wait.frames[0]
            return find_culprit(wait.frames, test.scope) or Culprit(path, line, function, (), None)
        return None

    def _watch(self) -> None:
        since: dict[object, tuple[object, float]] = {}  # per wait or running frame: (signature, since when)
        watched = None
        while not self._stop.wait(0.25):
            with self._lock:
                test = None if self._noticed else self._test
            if test is not watched:
                since, watched = {}, test
            if test is None:
                continue
            try:
                look = look_at_main_thread({threading.get_ident()})
                if look is None:
                    continue
                now = time.monotonic()
                current = {key: wait.signature for key, wait in look.waits.items()}
                current.update({key: key for key in look.running})
                since = {key: (signature, since[key][1] if since.get(key, (None,))[0] == signature else now)
                         for key, signature in current.items()}
                found = self._culprit(look, since, now, test)
                if found is None:
                    continue
                culprit, waited = found
                with self._lock:
                    if self._test is not test or self._noticed:
                        continue
                    self._noticed = True
                running = list(look.running.values())
                main_wait = self._main_wait(look, test) if (culprit.path, culprit.line, culprit.function) in running else None
                data = {"name": test.name, "todos": [t.key for t in culprit.todos], "waited_s": round(waited, 1),
                        "waiting_at": [str(culprit.path), culprit.line, culprit.function]}
                self.notify(describe_hang(test, waited, culprit, main_wait, running), data)
            except Exception as err:  # a notice must never break the session
                print(f"[koans] hang notice failed: {type(err).__name__}: {err}", file=sys.stderr)
